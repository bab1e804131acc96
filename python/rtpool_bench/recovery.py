"""``rtpool bench recovery`` and ``rtpool bench journal``: what the reliability machinery costs.

* ``recovery worker-loss``: a worker running a task is killed (``kill -9``: its connection
  closes) or frozen (``SIGSTOP``: it goes silent and its lease expires); the time from the
  signal to the task starting on the other worker, per round, against the ``--lease-ms``.
* ``recovery restart``: a master with a journal of ``--packages`` finished packages and a few
  live ones is killed with ``kill -9`` and restarted on the same data dir and port: time from
  the restart to ``listening on``, the journal replay (records, ms, records/s, from the
  master's log), and the time until a live package's last result reaches its (reconnected)
  client.
* ``journal``: sequential no-op round trips on four LocalClusters run side by side, without a
  journal and with ``--fsync off``, ``batch`` and ``always``, interleaved in blocks (in a
  shuffled order each round) so a noisy neighbour hits all alike; percentiles and the ratio of
  each to the no-journal cluster.

Every loop is bounded by a count and a time budget; every process started here is stopped here,
by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from .stats import (
    machine_info,
    new_histogram,
    percentile,
    record_ns,
    safe_ratio,
    summarize_histogram,
)
from .tasks import noop

RESULT_TIMEOUT_S = 60.0


def wait_marker_task(marker_dir: str, round_no: int, release: str) -> int:
    """Writes ``<marker_dir>/<round>-<pid>`` with the start time, then waits for ``release``."""
    import os as _os
    import time as _time

    start = _time.time()
    path = _os.path.join(marker_dir, f"{round_no}-{_os.getpid()}")
    with open(path + ".tmp", "w") as f:
        f.write(repr(start))
    _os.replace(path + ".tmp", path)
    end = _time.monotonic() + 120
    while not _os.path.exists(release) and _time.monotonic() < end:
        _time.sleep(0.005)
    return _os.getpid()


# --- processes -------------------------------------------------------------------------------


class _Master:
    """An ``rtpool master`` subprocess (its own process group), restartable on its port."""

    def __init__(self, data_dir: Path, log: Path, args: List[str], listen: str = "127.0.0.1:0"):
        self.data_dir, self.log, self.args = data_dir, log, args
        self.address = ""
        self.proc: subprocess.Popen | None = None
        self.started_ns = 0
        self.listening_ns = 0
        self.start(listen)

    def start(self, listen: str) -> None:
        cmd = [sys.executable, "-m", "rtpool", "master", "--listen", listen]
        cmd += ["--data-dir", str(self.data_dir), "--log-level", "info", *self.args]
        self.started_ns = time.perf_counter_ns()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL
            )
        fd = self.proc.stdout.fileno()
        out, end = b"", time.monotonic() + 60
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                break
            out += chunk
            m = re.search(rb"listening on (\S+)", out)
            if m:
                self.listening_ns = time.perf_counter_ns()
                self.address = m.group(1).decode()
                return
        self.kill()
        raise RuntimeError(f"master did not start: {out!r} {self.log.read_text()[-2000:]}")

    @property
    def token(self) -> str:
        return (self.data_dir / "client.token").read_text().strip()

    @property
    def worker_token(self) -> str:
        return (self.data_dir / "worker.token").read_text().strip()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def _start_worker(m: _Master, log: Path, extra: Sequence[str] = ()) -> subprocess.Popen:
    return _start_worker_at(m.address, m.worker_token, log, extra)


def _start_worker_at(
    address: str, token: str, log: Path, extra: Sequence[str] = ()
) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", "1"]
    cmd += ["--token", token, *extra]
    with open(log, "ab") as f:
        return subprocess.Popen(
            cmd, stdout=f, stderr=f, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            continue


def _wait(predicate: Callable[[], object], timeout: float, what: str) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def _parent_of(pid: int) -> int:
    """The parent pid of a process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _markers(d: Path, round_no: int) -> Dict[int, float]:
    out = {}
    for p in d.glob(f"{round_no}-*"):
        if p.suffix == ".tmp":
            continue
        out[int(p.name.split("-")[1])] = float(p.read_text())
    return out


# --- worker loss -----------------------------------------------------------------------------


def bench_worker_loss(rounds: int, lease_ms: int, say: Callable) -> Dict[str, object]:
    """Time from killing or freezing the worker running a task to the task starting elsewhere."""
    import rtpool
    from rtpool import _native

    out: Dict[str, object] = {"lease_ms": lease_ms, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="rtpool-bench-") as tmp:
        base = Path(tmp)
        # An embedded master: its stats tell when both workers are connected again.
        m = _native.Master(listen="127.0.0.1:0", options={"lease_ms": lease_ms})
        workers = [
            _start_worker_at(m.address, m.worker_token, base / f"w{i}.log") for i in range(2)
        ]

        def both_connected() -> bool:
            return m.stats().get("workers") == 2

        try:
            with rtpool.Client(m.address, m.client_token) as client:
                _wait(both_connected, 30, "both workers to connect")
                for mode, sig in (("kill -9", signal.SIGKILL), ("SIGSTOP (lease)", signal.SIGSTOP)):
                    samples: List[float] = []
                    for r in range(rounds):
                        say(f"worker loss, {mode}: round {r + 1}/{rounds}")
                        tag = f"{'k' if sig == signal.SIGKILL else 's'}{r}"
                        markers = base / f"markers-{tag}"
                        markers.mkdir()
                        release = str(base / f"release-{tag}")
                        fut = client.submit(wait_marker_task, str(markers), r, release)
                        first = _wait(
                            lambda d=markers, n=r: _markers(d, n), 30, "the task to start"
                        )
                        victim = next(iter(first))
                        parent = _parent_of(victim)
                        t_sig = time.time()
                        os.kill(victim, sig)
                        again = _wait(
                            lambda d=markers, n=r, v=victim: {
                                p: t for p, t in _markers(d, n).items() if p != v
                            },
                            lease_ms / 1000 * 3 + 30,
                            "the task to start on the other worker",
                        )
                        samples.append((min(again.values()) - t_sig) * 1e3)
                        Path(release).touch()
                        fut.result(timeout=RESULT_TIMEOUT_S)
                        # Replace the victim's whole worker process by a fresh one (its
                        # supervisor would restart the child, but only 5 times a minute).
                        for i, w in enumerate(workers):
                            if w.pid == parent or w.poll() is not None:
                                _stop_group(w)
                                workers[i] = _start_worker_at(
                                    m.address, m.worker_token, base / f"w{i}-{tag}.log"
                                )
                        _wait(both_connected, 30, "both workers to connect again")
                    out[mode] = {
                        "samples_ms": [round(x, 2) for x in samples],
                        "p50_ms": round(percentile(samples, 50), 2),
                        "max_ms": round(max(samples), 2),
                    }
        finally:
            for w in workers:
                _stop_group(w)
            m.stop()
    return out


# --- master restart --------------------------------------------------------------------------


def sleep_then(x: float) -> float:
    """Sleeps ``x`` seconds and returns it."""
    import time as _time

    _time.sleep(x)
    return x


def bench_restart(packages: int, tasks: int, say: Callable) -> Dict[str, object]:
    """kill -9 of a master with a journal, restart, replay rate and time to serving again."""
    import rtpool

    with tempfile.TemporaryDirectory(prefix="rtpool-bench-") as tmp:
        base = Path(tmp)
        log = base / "master.log"
        m = _Master(base / "data", log, ["--fsync", "always"])
        workers = [_start_worker(m, base / f"worker{i}.log") for i in range(2)]
        try:
            client = rtpool.Client(m.address, m.token)
            say(f"restart: journaling {packages} packages of {tasks} no-op tasks")
            for _ in range(packages):
                client.submit_many(noop, range(tasks)).results(timeout=RESULT_TIMEOUT_S)
            live = client.submit_many(sleep_then, [0.2] * 8)
            _wait(lambda: live.id is not None, 30, "the live package to be accepted")
            journal_bytes = (m.data_dir / "journal.log").stat().st_size
            say("restart: kill -9 of the master, then a restart on the same data dir and port")
            port = m.address.rsplit(":", 1)[1]
            m.kill()
            t_kill = time.perf_counter_ns()
            m.start(f"127.0.0.1:{port}")
            to_listening_ms = (m.listening_ns - t_kill) / 1e6
            startup_ms = (m.listening_ns - m.started_ns) / 1e6
            values = live.results(timeout=RESULT_TIMEOUT_S)
            to_done_ms = (time.perf_counter_ns() - t_kill) / 1e6
            assert values == [0.2] * 8, values
            client.close()
            text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
            found = re.findall(r"replayed in ([0-9.]+) ms \(([0-9]+) records/s\)", text)
            recs = re.findall(r"records=([0-9]+)", text)
            replay_ms, rate = (float(found[-1][0]), int(found[-1][1])) if found else (None, None)
            return {
                "packages": packages,
                "tasks": tasks,
                "journal_bytes": journal_bytes,
                "replay_records": int(recs[-1]) if recs else None,
                "replay_ms": replay_ms,
                "replay_records_per_s": rate,
                "restart_to_listening_ms": round(to_listening_ms, 1),
                "process_start_to_listening_ms": round(startup_ms, 1),
                "kill_to_live_package_done_ms": round(to_done_ms, 1),
                "client_reconnects": getattr(client, "reconnects", None),
            }
        finally:
            for w in workers:
                _stop_group(w)
            m.kill()


# --- journal overhead ------------------------------------------------------------------------

JOURNAL_MODES = (("no journal", None), ("off", "off"), ("batch", "batch"), ("always", "always"))


def bench_journal(count: int, block: int, seconds: float, say: Callable) -> Dict[str, object]:
    """No-op round trips on four clusters (no journal, fsync off, batch, always), interleaved."""
    import rtpool

    clusters, clients = {}, {}
    hists = {name: new_histogram() for name, _ in JOURNAL_MODES}
    with tempfile.TemporaryDirectory(prefix="rtpool-bench-") as tmp:
        try:
            for name, fsync in JOURNAL_MODES:
                opts = {"journal": False} if fsync is None else {"fsync": fsync}
                c = rtpool.LocalCluster(
                    workers=2, data_dir=os.path.join(tmp, name), master_options=opts
                )
                clusters[name] = c
                c.wait_for_workers(2, timeout=30)
                clients[name] = c.client()
            say("journal: warm-up")
            for name in clients:
                for _ in range(200):
                    clients[name].submit(noop).result(timeout=RESULT_TIMEOUT_S)
            done, deadline = 0, time.perf_counter() + seconds
            say(f"journal: up to {count} round trips per mode, blocks of {block}")
            order = list(clients)
            rng = random.Random(7)
            while done < count and time.perf_counter() < deadline:
                rng.shuffle(order)  # no mode always runs first after a switch
                for name in order:
                    client = clients[name]
                    for _ in range(block):
                        t0 = time.perf_counter_ns()
                        client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
                        record_ns(hists[name], time.perf_counter_ns() - t0)
                done += block
            stats = {name: summarize_histogram(h) for name, h in hists.items()}
            fsyncs = {
                name: clusters[name]._master.stats().get("journal_fsyncs") for name in clusters
            }
        finally:
            for c in clients.values():
                c.close()
            for c in clusters.values():
                c.close()
    base = stats["no journal"]
    return {
        "count": done,
        "block": block,
        "modes": stats,
        "fsyncs": fsyncs,
        "ratios_to_no_journal": {
            name: {
                "p50": safe_ratio(s["p50_us"], base["p50_us"]),
                "p99_9": safe_ratio(s["p99_9_us"], base["p99_9_us"]),
            }
            for name, s in stats.items()
        },
    }


# --- CLI -------------------------------------------------------------------------------------


def _render(result: Dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    wl = result.get("worker_loss")
    if wl:
        t = Table(title=f"Worker loss to task running elsewhere (lease {wl['lease_ms']} ms)")
        for col in ("how", "rounds", "p50 ms", "max ms"):
            t.add_column(col)
        for mode in ("kill -9", "SIGSTOP (lease)"):
            s = wl[mode]
            t.add_row(mode, str(len(s["samples_ms"])), f"{s['p50_ms']:.1f}", f"{s['max_ms']:.1f}")
        console.print(t)
    rs = result.get("restart")
    if rs:
        t = Table(title="Master kill -9 and restart (fsync always)")
        t.add_column("figure")
        t.add_column("value")
        for k, v in rs.items():
            t.add_row(k, str(v))
        console.print(t)
    jn = result.get("journal")
    if jn:
        t = Table(title=f"No-op round trip by journal mode ({jn['count']} each, interleaved)")
        for col in ("mode", "p50", "p99", "p99.9", "max", "p50 ratio", "p99.9 ratio", "fsyncs"):
            t.add_column(col)
        for name, s in jn["modes"].items():
            r = jn["ratios_to_no_journal"][name]
            t.add_row(
                name,
                f"{s['p50_us']:.0f} us",
                f"{s['p99_us']:.0f} us",
                f"{s['p99_9_us']:.0f} us",
                f"{s['max_us']:.0f} us",
                f"{r['p50']:.2f}",
                f"{r['p99_9']:.2f}",
                str(jn["fsyncs"][name]),
            )
        console.print(t)


def main(argv: Sequence[str] | None = None) -> int:
    """``rtpool bench recovery|journal ...``; returns 0 when every section ran."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench",
        # The docstring without its reStructuredText markup, its bullets kept.
        description=(__doc__ or "").replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("which", metavar="BENCH", choices=("recovery", "journal"))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rounds", type=int, default=10, help="worker-loss rounds per way (10)")
    ap.add_argument("--lease-ms", type=int, default=1000, help="worker lease (1000 ms)")
    ap.add_argument("--packages", type=int, default=200, help="restart: packages (200)")
    ap.add_argument("--tasks", type=int, default=50, help="restart: tasks per package (50)")
    ap.add_argument("--count", type=int, default=2000, help="journal: round trips per mode")
    ap.add_argument("--block", type=int, default=100, help="journal: round trips per block")
    ap.add_argument("--seconds", type=float, default=120, help="journal: time budget (120 s)")
    args = ap.parse_args(argv)
    say = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    result: Dict[str, object] = {"machine": machine_info()}
    if args.which == "recovery":
        result["worker_loss"] = bench_worker_loss(args.rounds, args.lease_ms, say)
        result["restart"] = bench_restart(args.packages, args.tasks, say)
    else:
        result["journal"] = bench_journal(args.count, args.block, args.seconds, say)
    if args.json:
        print(json.dumps(result))
    else:
        _render(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
