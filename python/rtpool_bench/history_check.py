"""The history checker of issue 28 (Jepsen's ``total-queue`` idea: what went in must come out,
once), over the histories :mod:`rtpool_bench.history` records.

For one run (every ``client-*.jsonl`` of a directory) it proves, task by task:

* **lost**: a task of an acknowledged package (an ``ack`` event) with no result. A task whose
  future failed (``ResultsLost``, say) is lost too; the errors are listed;
* **duplicated**: a task with more than one result event;
* **wrong**: a result whose value is not :func:`~rtpool_bench.history.expected_value` of its
  own task (another task's value, or garbage);
* **phantom**: a result for a task never submitted (no ``invoke`` of its package, or an index
  past the package's size);

and counts apart the tasks of unacknowledged submissions (``submit_error``, or an ``invoke``
with neither ``ack`` nor error: the client died), which may or may not complete: ``indeterminate
done`` and ``indeterminate not done``. A run is valid when lost, duplicated, wrong and phantom
are all 0 and every history ends with its ``end`` event.

``python -m rtpool_bench.history_check DIR`` (also ``rtpool bench history check DIR``) prints
the verdict table and exits 0 when valid, 1 when not, 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Tuple

from .history import expected_value

Task = Tuple[int, int, int]
#: How many examples of each anomaly a verdict keeps (the counts are always complete).
EXAMPLES = 10


@dataclass
class Verdict:
    """What :func:`check` found in one run; ``valid`` is the whole answer."""

    clients: int = 0
    packages: int = 0
    acknowledged_packages: int = 0
    #: Tasks owed (those of acknowledged packages) and how many came back, once and right.
    owed: int = 0
    ok: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    phantom: int = 0
    indeterminate_done: int = 0
    indeterminate_not_done: int = 0
    #: Histories without their ``end`` event (a client that died or was stopped early).
    unfinished_clients: List[int] = field(default_factory=list)
    #: A few examples of each anomaly, as ``[c, p, i]`` (wrong and phantom: with the value).
    examples: Dict[str, list] = field(default_factory=dict)
    #: Errors of the failed futures of owed tasks, and how often each came.
    lost_errors: Dict[str, int] = field(default_factory=dict)
    #: Every acknowledged package with a lost task, as ``[c, p]``.
    lost_packages: List[list] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """No acknowledged task lost, none duplicated, no wrong value, no phantom, and every
        history complete."""
        return not (
            self.lost or self.duplicated or self.wrong or self.phantom or self.unfinished_clients
        )

    def to_dict(self) -> Dict[str, object]:
        return {**asdict(self), "valid": self.valid}

    def _example(self, kind: str, item: list) -> None:
        got = self.examples.setdefault(kind, [])
        if len(got) < EXAMPLES:
            got.append(item)


def read_histories(directory: Path) -> List[dict]:
    """Every event of every ``client-*.jsonl`` in ``directory``.

    Raises:
        FileNotFoundError: No history file in ``directory``.
        ValueError: A line is not a JSON event (named by file and line number).
    """
    files = sorted(Path(directory).glob("client-*.jsonl"))
    if not files:
        raise FileNotFoundError(
            f"no client-*.jsonl history in {directory}; record one with `rtpool bench history run`"
        )
    events = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except ValueError as e:
                    raise ValueError(
                        f"{path}:{no}: not a history event ({e}): {line[:200]!r}"
                    ) from e
                if not isinstance(ev, dict) or "type" not in ev or "c" not in ev:
                    raise ValueError(
                        f"{path}:{no}: not a history event (no type or c): {line[:200]!r}"
                    )
                events.append(ev)
    return events


def check(events: Iterable[dict]) -> Verdict:
    """Judge one run's events (of every client, in any order)."""
    v = Verdict()
    sizes: Dict[Tuple[int, int], int] = {}
    acked, failed_submit = set(), set()
    results: Dict[Task, List[object]] = {}
    errors: Dict[Task, List[str]] = {}
    clients, ended = set(), set()
    for ev in events:
        kind, c = ev["type"], ev["c"]
        clients.add(c)
        if kind == "invoke":
            sizes[(c, ev["p"])] = ev["n"]
        elif kind == "ack":
            acked.add((c, ev["p"]))
        elif kind == "submit_error":
            failed_submit.add((c, ev["p"]))
        elif kind == "result":
            results.setdefault((c, ev["p"], ev["i"]), []).append(ev["value"])
        elif kind == "fail":
            errors.setdefault((c, ev["p"], ev["i"]), []).append(ev["error"])
        elif kind == "end":
            ended.add(c)
    v.clients, v.packages = len(clients), len(sizes)
    v.unfinished_clients = sorted(clients - ended)
    for (c, p, i), values in sorted(results.items()):
        if i >= sizes.get((c, p), 0) or i < 0:
            v.phantom += 1
            v._example("phantom", [c, p, i, values[0]])
            continue
        if len(values) > 1:
            v.duplicated += 1
            v._example("duplicated", [c, p, i, len(values)])
        bad = [x for x in values if x != expected_value(c, p, i)]
        if bad:
            v.wrong += 1
            v._example("wrong", [c, p, i, bad[0]])
    for (c, p), n in sorted(sizes.items()):
        owed = (c, p) in acked
        v.acknowledged_packages += owed
        for i in range(n):
            values = results.get((c, p, i), [])
            good = len(values) == 1 and values[0] == expected_value(c, p, i)
            if not owed:
                if values:
                    v.indeterminate_done += 1
                else:
                    v.indeterminate_not_done += 1
                continue
            v.owed += 1
            v.ok += good
            if not values:
                v.lost += 1
                v._example("lost", [c, p, i])
                if [c, p] not in v.lost_packages[-1:]:
                    v.lost_packages.append([c, p])
                for e in errors.get((c, p, i), ["no result and no error"]):
                    name = e.split(":", 1)[0]
                    v.lost_errors[name] = v.lost_errors.get(name, 0) + 1
    return v


def check_dir(directory: Path) -> Verdict:
    """:func:`check` of the histories in ``directory``."""
    return check(read_histories(directory))


ROWS = (
    ("clients", "client histories"),
    ("packages", "packages submitted"),
    ("acknowledged_packages", "packages acknowledged"),
    ("owed", "tasks owed (acknowledged)"),
    ("ok", "delivered once, right value"),
    ("lost", "LOST"),
    ("duplicated", "DUPLICATED"),
    ("wrong", "WRONG value"),
    ("phantom", "PHANTOM (never submitted)"),
    ("indeterminate_done", "unacknowledged, completed"),
    ("indeterminate_not_done", "unacknowledged, not completed"),
)


def render(v: Verdict, title: str = "history check") -> str:
    """The verdict as a plain-text table, anomalies named with examples."""
    width = max(len(label) for _, label in ROWS)
    lines = [f"{title}: {'VALID' if v.valid else 'INVALID'}"]
    for key, label in ROWS:
        lines.append(f"  {label:<{width}}  {getattr(v, key):>9}")
    if v.unfinished_clients:
        lines.append(f"  histories without an end event: clients {v.unfinished_clients}")
    for kind, items in v.examples.items():
        lines.append(f"  {kind} e.g. (c, p, i, ...): {items}")
    if v.lost_errors:
        lines.append(f"  errors of lost tasks: {v.lost_errors}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``check DIR [--json]``: 0 valid, 1 invalid, 2 unreadable histories."""
    ap = argparse.ArgumentParser(
        prog="python -m rtpool_bench.history_check",
        description="Check the histories of a run: 0 lost, 0 duplicated, 0 wrong, 0 phantom.",
    )
    ap.add_argument("verb", nargs="?", choices=("check",), default="check", help="check (default)")
    ap.add_argument("dir", type=Path, help="the directory of client-*.jsonl histories")
    ap.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    args = ap.parse_args(argv)
    try:
        v = check_dir(args.dir)
    except (OSError, ValueError) as e:
        print(f"history check: {e}", file=sys.stderr)
        return 2
    print(json.dumps(v.to_dict()) if args.json else render(v, f"history check of {args.dir}"))
    return 0 if v.valid else 1


if __name__ == "__main__":
    sys.exit(main())
