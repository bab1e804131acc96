"""``rtpool status``: the master's status snapshot as tables (one shot or ``--watch``) or JSON.

The snapshot comes over the protocol (``CLUSTER_STATUS``, :meth:`Client.status`), so the
command needs only the master's address and a client token, not its HTTP listener; it is the
same snapshot the dashboard shows (one source of truth, schema in ``docs/operations.md``).
This module only fetches and draws it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List

from ._status_resources import CLASS_COLUMNS, class_rows, worker_resources

__all__ = ["add_arguments", "render", "run"]

_HELP = """\
Show a master's workers, queues, rates, latencies, deadlines and users: one table and exit,
a live view (--watch, Ctrl-C to leave) or JSON for scripts (--json). The token is the
client token: from --token-file, else $RTPOOL_TOKEN, else DATA_DIR/client.token (a master
on this machine).

examples:
  rtpool status
  RTPOOL_TOKEN=... rtpool status --master 10.0.0.5:7070 --watch
  rtpool status --json | jq '.workers[].name'
"""

#: At most this many rows per table in the terminal views (--json has them all).
DEFAULT_MAX_ROWS = 20


def add_arguments(parser: argparse.ArgumentParser, default_data_dir: Callable[[], str]) -> None:
    """Add the ``rtpool status`` options to its subparser."""
    parser.description = _HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--master",
        default=os.environ.get("RTPOOL_MASTER") or "127.0.0.1:7070",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="master address; several (a leader and its standbys) separated by commas: the "
        "leader answers (default: $RTPOOL_MASTER, else 127.0.0.1:7070)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="read the client token from PATH (without it: $RTPOOL_TOKEN, else "
        "DATA_DIR/client.token)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help=f"where a local master keeps client.token (default: {default_data_dir()})",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="connect with TLS (the master checked against the system trust store or --ca-file)",
    )
    parser.add_argument(
        "--ca-file",
        default=None,
        metavar="PEM",
        help="certificate(s) to trust, e.g. a --tls-self-signed master's cert.pem (implies --tls)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the snapshot as JSON and exit")
    out.add_argument("--watch", action="store_true", help="live view until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="--watch: seconds between refreshes, 0.2 to 60 (default: 1)",
    )
    parser.add_argument(
        "--max-rows",
        type=int,
        default=DEFAULT_MAX_ROWS,
        metavar="N",
        help=f"most rows per table, the rest summed up in one line (default: {DEFAULT_MAX_ROWS})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds to wait for the master (connect and answer; default: 10)",
    )
    parser.set_defaults(data_dir_default=default_data_dir)


def _token(args: argparse.Namespace) -> str | None:
    env = os.environ.get("RTPOOL_TOKEN")
    if args.token_file is not None:
        with open(args.token_file, encoding="utf-8") as f:
            return f.read().strip()
    if env:
        return env
    path = os.path.join(args.data_dir or args.data_dir_default(), "client.token")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _fail(message: str) -> int:
    print(f"rtpool status: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    """Run ``rtpool status`` with parsed arguments; return the exit code."""
    if not 0.2 <= args.interval <= 60:
        return _fail(f"--interval must be 0.2 to 60 seconds, got {args.interval:g}")
    if args.max_rows < 1:
        return _fail(f"--max-rows must be at least 1, got {args.max_rows}")
    try:
        token = _token(args)
    except OSError as exc:
        return _fail(f"cannot read the client token from --token-file {args.token_file}: {exc}")
    if not token:
        return _fail(
            "no client token: set RTPOOL_TOKEN or pass --token-file (a master keeps it in its "
            "data dir as client.token)"
        )
    from . import Client
    from .errors import RtpoolError

    try:
        client = Client(
            args.master,
            token,
            connect_timeout=args.timeout,
            tls=args.tls,
            ca_file=args.ca_file,
            reconnect_timeout=0 if not args.watch else 60.0,
        )
    except (RtpoolError, ValueError) as exc:  # ValueError: a bad --master, named in it
        return _fail(str(exc))
    try:
        if args.watch:
            return _watch(client, args)
        snapshot = client.status(args.timeout)
        if args.json:
            json.dump(snapshot, sys.stdout, indent=2, default=str)
            print()
        else:
            from rich.console import Console

            Console().print(render(snapshot, args.max_rows))
        return 0
    except (RtpoolError, TimeoutError) as exc:
        return _fail(str(exc) or type(exc).__name__)
    except KeyboardInterrupt:
        return 130  # Ctrl-C while waiting for the answer: no traceback
    finally:
        client.close()


def _watch(client: Any, args: argparse.Namespace) -> int:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    from .errors import RtpoolError

    console = Console()
    # Live redraws from the last renderable at most 4 times a second; the fetches are paced
    # by --interval, so a slow master is asked once per interval at most.
    with Live(Text("asking the master..."), console=console, auto_refresh=False) as live:
        try:
            while True:
                started = time.monotonic()
                try:
                    view = render(client.status(args.timeout), args.max_rows)
                except (RtpoolError, TimeoutError) as exc:
                    view = Group(Text(f"{time.strftime('%H:%M:%S')} no answer: {exc}", "red"))
                live.update(view, refresh=True)
                time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
        except KeyboardInterrupt:
            pass
    return 0


# -- drawing -------------------------------------------------------------------------------


def _us(v: Any) -> str:
    if v is None:
        return "-"
    if v < 1000:
        return f"{v:.0f} µs"
    if v < 1e6:
        return f"{v / 1000:.2f} ms" if v < 1e4 else f"{v / 1000:.1f} ms"
    return f"{v / 1e6:.2f} s"


def _secs(v: Any) -> str:
    if v is None:
        return "-"
    a = abs(v)
    text = f"{a:.1f} s" if a < 60 else f"{a / 60:.1f} min" if a < 3600 else f"{a / 3600:.1f} h"
    return f"{text} ago" if v < 0 else f"in {text}"


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"


#: Columns of text (left-aligned); the others hold numbers.
_TEXT_COLUMNS = frozenset(
    {"stage", "name", "host", "user", "id", "class", "state", "resources (used/total); labels"}
)


def _table(title: str, columns: List[str], rows: List[List[Any]], total: int) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", title_style="bold", expand=False)
    for name in columns:
        justify = "left" if name in _TEXT_COLUMNS else "right"
        table.add_column(name, justify=justify, no_wrap=True)
    for row in rows:
        # Text, not markup: worker and user names come from peers ("[red]" stays literal).
        table.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in row))
    if total > len(rows):
        table.add_row(f"... {total - len(rows)} more", *[""] * (len(columns) - 1))
    if not total:
        table.add_row("(none)", *[""] * (len(columns) - 1))
    return table


def _summary(s: Dict[str, Any]) -> Any:
    from rich.text import Text

    m, t, d = s.get("master") or {}, s.get("totals") or {}, s.get("deadlines") or {}
    workers = s.get("workers") or []
    up = m.get("uptime_s")
    head = Text.assemble(
        ("master ", "bold"),
        (str(m.get("address", "?")), "bold cyan"),
        f"  v{m.get('version', '?')}  pid {m.get('pid', '?')}",
        f"  up {_secs(up)[3:] if up is not None else '-'}",
        f"  journal {(m.get('journal') or {}).get('fsync', 'on')}"
        if m.get("journal")
        else "  no journal",
        "  realtime" if m.get("realtime") else "",
    )
    rate = (s.get("rates") or {}).get("tasks_per_s")
    slots = sum(w.get("slots") or 0 for w in workers)
    missed = d.get("missed") or 0
    line = Text.assemble(
        f"workers {len(workers)} ({slots} slots)   queued {_n(t.get('queued'))}   ",
        f"running {_n(t.get('running'))}   done {_n(t.get('done'))}   ",
        ("throughput ", ""),
        (f"{rate or 0:,.1f} tasks/s", "bold"),
        "   deadlines met ",
        (_n(d.get("met")), "green"),
        " missed ",
        (_n(d.get("missed")), "bold red" if missed else ""),
    )
    return Text("\n").join([head, line, _held(t, m.get("journal"))])


def _held(t: Dict[str, Any], journal: Dict[str, Any] | None) -> Any:
    """What holds the master's memory: results not acknowledged (sent to a connected client,
    or kept for a detached one until the result TTL) and the journal's queue and buffer."""
    from rich.text import Text

    parts = [
        f"held: results {_bytes(t.get('result_bytes'))}",
        f" (unacked {_bytes(t.get('unacked_bytes'))})",
    ]
    if journal:
        parts.append(
            f"   journal queue {_bytes(journal.get('queued_bytes'))}"
            f", buffer {_bytes(journal.get('buffer_bytes'))}"
        )
    return Text.assemble(*parts)


def _bytes(v: Any) -> str:
    if v is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v} B"


def render(s: Dict[str, Any], max_rows: int = DEFAULT_MAX_ROWS) -> Any:
    """The snapshot ``s`` as a rich renderable: a summary, then latency, lateness, workers,
    packages and users tables (each at most ``max_rows`` rows)."""
    from rich.console import Group

    lat = s.get("latency") or {}
    stages = [("submit → assign", "submit_to_assign"), ("assign → result", "assign_to_result")]
    lat_rows = [
        [name]
        + [_us((lat.get(key) or {}).get(f)) for f in ("p50_us", "p99_us", "p999_us", "max_us")]
        + [_n((lat.get(key) or {}).get("count"))]
        for name, key in stages
    ]
    parts = [_summary(s)]
    parts.append(_table("latency", ["stage", "p50", "p99", "p99.9", "max", "count"], lat_rows, 2))
    lateness = _lateness(s.get("deadlines") or {})
    if lateness:
        parts.append(lateness)
    workers = s.get("workers") or []
    parts.append(
        _table(
            "workers",
            [
                "name",
                "host",
                "slots",
                "running",
                "credits",
                "done",
                "tasks/s",
                "exec",
                "seen",
                "resources (used/total); labels",
            ],
            [
                [
                    str(w.get("name") or f"#{w.get('id')}"),
                    str(w.get("host") or ""),
                    _n(w.get("slots")),
                    _n(w.get("running")),
                    _n(w.get("credits")),
                    _n(w.get("done")),
                    _n(w.get("tasks_per_s")),
                    "-" if w.get("exec_s") is None else f"{w['exec_s']:.1f} s",
                    _secs(-(w.get("last_seen_s") or 0)),
                    worker_resources(w),
                ]
                for w in workers[:max_rows]
            ],
            len(workers),
        )
    )
    classes = s.get("resource_classes") or []
    if classes:  # (none: every package is in the default class, the totals above)
        parts.append(
            _table("resource classes", CLASS_COLUMNS, class_rows(classes[:max_rows]), len(classes))
        )
    packages = s.get("packages") or []
    total = len(packages) + (s.get("packages_omitted") or 0)
    parts.append(_table("packages", _PACKAGE_COLUMNS, _package_rows(packages[:max_rows]), total))
    users = s.get("users") or []
    parts.append(
        _table(
            "users",
            ["user", "queued", "running", "done", "quota used"],
            [
                [
                    str(u.get("user")),
                    _n(u.get("queued")),
                    _n(u.get("running")),
                    _n(u.get("done")),
                    f"{u.get('used_s') or 0:.1f} s"
                    + (f" of {u['quota_s']:g} s" if u.get("quota_s") else ""),
                ]
                for u in users[:max_rows]
            ],
            len(users),
        )
    )
    return Group(*parts)


_PACKAGE_COLUMNS = [
    "id",
    "user",
    "done",
    "queued",
    "running",
    "failed",
    "prio",
    "deadline",
    "met",
    "missed",
]


def _package_rows(packages: List[Dict[str, Any]]) -> List[List[Any]]:
    from rich.text import Text

    rows = []
    for p in packages:
        missed = p.get("missed")
        rows.append(
            [
                str(p.get("id")),
                str(p.get("user") or ""),
                f"{p.get('done') or 0}/{p.get('tasks') or 0}",
                _n(p.get("queued")),
                _n(p.get("running")),
                _n(p.get("failed")),
                str(p.get("priority", "")),
                "none" if p.get("deadline_in_s") is None else _secs(p["deadline_in_s"]),
                _n(p.get("met")),
                Text(_n(missed), "bold red" if missed else ""),
            ]
        )
    return rows


def _lateness(d: Dict[str, Any]) -> Any:
    """One line: the late results per lateness bucket, empty buckets left out (None when no
    result was late)."""
    from rich.text import Text

    raw = d.get("lateness") or []
    cells, prev = [], None
    for b in raw:
        le, n = b.get("le_s"), b.get("count") or 0
        if n:
            cells.append(f"≤{_le(le)}: {n}" if le is not None else f">{_le(prev)}: {n}")
        prev = le
    if not cells:
        return None
    return Text("late results by lateness: " + ", ".join(cells))


def _le(le: Any) -> str:
    try:
        v = float(le)
    except (TypeError, ValueError):
        return str(le)
    return f"{v * 1000:g}ms" if v < 1 else f"{v:g}s"
