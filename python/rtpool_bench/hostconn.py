"""``rtpool bench procs``: one real ``rtpool worker --procs N`` against a real master, with one
connection per process and with one connection for the host (``--connection process|host``),
interleaved A B B A in one run (issue 13).

For each configuration a fresh worker starts against the same ``rtpool master`` subprocess
(started with nothing but ``--listen`` and ``--data-dir``), and the benchmark measures:

* a package of ``--tasks`` no-op tasks: tasks/s, master CPU per task (utime + stime from
  /proc), worker frames per task at the master (``PULL``/``RESULT``/``RETURN`` in,
  ``ASSIGN``/``ABORT`` out: the status counters ``worker_frames_in``/``out``);
* the same with ``--task-ms`` sleeping tasks, where a process alone does not batch (its
  queue runs dry after each task) but a host relays the results of N of them;
* closed-loop no-op round trips of single-task packages: p50, p99, p99.9, max.

Every phase is bounded in count and time. Figures of a shared machine move from run to run:
compare the configurations of one run (the ratios), not runs.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from .scale import _cpu_s
from .stats import machine_info, new_histogram, record_ns, summarize_histogram
from .tasks import noop, sleep_ms

RESULT_TIMEOUT_S = 120.0


def _totals(client) -> Dict[str, int]:
    return client.status()["totals"]


def _settled_frames(client, before: int | None = None) -> int:
    """Worker frames the master counted, once two snapshots (1 s apart) agree."""
    last = None
    end = time.monotonic() + 10
    while time.monotonic() < end:
        t = _totals(client)
        now = t.get("worker_frames_in", 0) + t.get("worker_frames_out", 0)
        if now == last:
            return now
        last = now
        time.sleep(1.1)  # the master rebuilds its status snapshot once a second
    return last or 0


def _package(client, master_pid: int, fn, args: list) -> Dict[str, object]:
    frames0 = _settled_frames(client)
    cpu0, t0 = _cpu_s(master_pid), time.perf_counter()
    pkg = client.submit_many(fn, args)
    for fut in pkg.futures:
        fut.result(timeout=RESULT_TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    cpu = _cpu_s(master_pid) - cpu0
    frames = _settled_frames(client) - frames0
    n = len(args)
    return {
        "tasks": n,
        "seconds": round(elapsed, 3),
        "tasks_per_s": round(n / elapsed, 1),
        "master_cpu_s": round(cpu, 2),
        # /proc counts whole clock ticks (10 ms): below ~10 of them the figure means nothing.
        "master_cpu_us_per_task": round(cpu * 1e6 / n, 2) if cpu >= 0.1 else None,
        "worker_frames_per_task": round(frames / n, 3),
    }


def _latency(client, count: int, seconds: float) -> Dict[str, object]:
    for _ in range(min(200, count)):
        client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
    h, done, deadline = new_histogram(), 0, time.perf_counter() + seconds
    while done < count and time.perf_counter() < deadline:
        t0 = time.perf_counter_ns()
        client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
        record_ns(h, time.perf_counter_ns() - t0)
        done += 1
    return summarize_histogram(h)


def _start_worker(address: str, token: str, procs: int, mode: str, log: Path) -> subprocess.Popen:
    import os

    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", str(procs)]
    cmd += ["--connection", mode]
    env = {**os.environ, "RTPOOL_WORKER_TOKEN": token}
    with open(log, "ab") as f:
        return subprocess.Popen(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop_worker(proc: subprocess.Popen) -> None:
    import os

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def run_config(client, master, mode: str, args, log: Path, say) -> Dict[str, object]:
    """One worker in ``mode`` against the running master: its three measurements."""
    proc = _start_worker(master.address, master.worker_token, args.procs, mode, log)
    try:
        end = time.monotonic() + 120
        while _totals(client).get("slots", 0) != args.procs:
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError(f"the worker did not connect its {args.procs} slots")
            time.sleep(0.2)
        client.submit_many(noop, range(min(2000, args.tasks))).results()  # warm-up
        out: Dict[str, object] = {"mode": mode}
        say(f"procs: {mode}: {args.tasks} no-ops")
        out["noop"] = _package(client, master.proc.pid, noop, list(range(args.tasks)))
        n = args.sleep_tasks
        say(f"procs: {mode}: {n} tasks of {args.task_ms:g} ms")
        out["sleep"] = _package(client, master.proc.pid, sleep_ms, [args.task_ms] * n)
        say(f"procs: {mode}: up to {args.latency_count} no-op round trips")
        out["latency"] = _latency(client, args.latency_count, args.seconds)
        return out
    finally:
        _stop_worker(proc)
        end = time.monotonic() + 30
        while _totals(client).get("workers", 0) and time.monotonic() < end:
            time.sleep(0.2)


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench procs`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench procs",
        description="One `rtpool worker --procs N` with a connection per process and with one "
        "for the host (--connection process|host), interleaved A B B A: master CPU per task, "
        "tasks/s, worker frames per task, no-op round trips.",
    )
    ap.add_argument("--procs", type=int, default=32, help="worker processes (default 32)")
    ap.add_argument("--tasks", type=int, default=20000, help="no-op tasks (default 20000)")
    ap.add_argument("--sleep-tasks", type=int, default=4000, help="sleeping tasks (default 4000)")
    ap.add_argument("--task-ms", type=float, default=2.0, help="their length (default 2 ms)")
    ap.add_argument(
        "--latency-count", type=int, default=2000, help="no-op round trips (default 2000)"
    )
    ap.add_argument(
        "--seconds", type=float, default=20.0, help="time budget of the round trips (20 s)"
    )
    ap.add_argument(
        "--order",
        default="process,host,host,process",
        help="configurations in order (default process,host,host,process)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def render(result: Dict[str, object], write: Callable[[str], None]) -> None:
    """The runs as a table, in run order."""
    write(f"rtpool bench procs: --procs {result['procs']}")
    head = (
        f"{'mode':8} {'noop/s':>8} {'cpu us':>7} {'frames':>7} {'sleep/s':>8} {'cpu us':>7} "
        f"{'frames':>7} {'p50 us':>7} {'p99':>7} {'p99.9':>7} {'max':>7}"
    )
    write(head)
    for r in result["runs"]:
        a, b, lat = r["noop"], r["sleep"], r["latency"]
        write(
            f"{r['mode']:8} {a['tasks_per_s']:>8} {a['master_cpu_us_per_task']!s:>7} "
            f"{a['worker_frames_per_task']:>7} {b['tasks_per_s']:>8} "
            f"{b['master_cpu_us_per_task']!s:>7} {b['worker_frames_per_task']:>7} "
            f"{lat['p50_us']:>7} {lat['p99_us']:>7} {lat['p99_9_us']:>7} {lat['max_us']:>7}"
        )
    write("(cpu us: master CPU per task; frames: worker frames the master handled per task)")


def main(argv: Sequence[str]) -> int:
    """Entry point of ``rtpool bench procs``; ``argv`` excludes ``procs``. Returns 0."""
    import rtpool

    from .recovery import _Master

    ap = build_parser()
    args = ap.parse_args(argv)
    order = [m.strip() for m in args.order.split(",") if m.strip()]
    if min(args.procs, args.tasks, args.sleep_tasks, args.latency_count) < 1 or not order:
        ap.error("--procs, --tasks, --sleep-tasks and --latency-count must be at least 1")
    if any(m not in ("process", "host") for m in order):
        ap.error("--order takes process and host, comma-separated")

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    result: Dict[str, object] = {"machine": machine_info(), "procs": args.procs}
    runs: List[Dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="rtpool-procs-") as tmp:
        master = _Master(Path(tmp) / "data", Path(tmp) / "master.log", [])
        try:
            with rtpool.Client(master.address, master.token) as client:
                for i, mode in enumerate(order):
                    log = Path(tmp) / f"worker-{i}.log"
                    runs.append(run_config(client, master, mode, args, log, say))
        finally:
            master.kill()
    result["runs"] = runs
    if args.json:
        print(json.dumps(result))
    else:
        render(result, print)
    return 0
