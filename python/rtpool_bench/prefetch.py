"""``rtpool bench prefetch``: one worker of 20 ms tasks, near its master and 50 and 100 ms
away, and its rate against the ideal (one task per task time).

The worker connects through :class:`~rtpool_bench.prefetch_relay.DelayRelay` (also at 0 ms,
so every configuration pays the same relay); the client connects directly. Configurations
run in interleaved rounds (0, 50, 100, 100, 50, 0, ...) within one run, since the machine is
noisy: compare the ratios, not the absolute figures of two runs. ``--baseline-path`` adds a
worker run from another source tree (e.g. before this change), interleaved with this one
(A B B A within each round trip) for an A/B comparison in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

from .prefetch_relay import DelayRelay
from .stats import machine_info, percentile


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench prefetch`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench prefetch",
        description="One worker of TASK_MS tasks behind a relay adding 0/50/100 ms of round "
        "trip: tasks/s against the ideal 1000/TASK_MS, interleaved rounds in one run.",
    )
    ap.add_argument("--rtt-ms", default="0,50,100", help="added round trips (default 0,50,100)")
    ap.add_argument("--task-ms", type=float, default=20.0, help="task time (default 20)")
    ap.add_argument("--tasks", type=int, default=100, help="tasks per measurement (default 100)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each way (default 2)")
    ap.add_argument(
        "--baseline-path",
        default=None,
        metavar="DIR",
        help="also measure a worker with DIR first on its PYTHONPATH (e.g. another checkout's "
        "python/), interleaved: an A/B in one run",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def _start_worker(cluster, address: str, worker_path: str | None) -> subprocess.Popen:
    paths = [p or os.getcwd() for p in sys.path]
    if worker_path:
        paths.insert(0, worker_path)
    env = dict(os.environ)
    env["RTPOOL_WORKER_TOKEN"] = cluster.worker_token
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", "1"]
    cmd += ["--parent-pid", str(os.getpid())]
    return subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _measure(cluster, client, rtt_ms: float, worker_path: str | None, args) -> Dict[str, float]:
    """One worker behind a relay of ``rtt_ms``: the rate of a package of ``args.tasks``."""
    from rtpool.cluster import _stop_workers

    relay = DelayRelay(("127.0.0.1", int(cluster.address.rsplit(":", 1)[1])), rtt_ms)
    worker = _start_worker(cluster, relay.address, worker_path)
    try:
        cluster.wait_for_workers(1, timeout=30)
        # Warm-up: the worker learns the task time and the round trip.
        for f in [client.submit(time.sleep, args.task_ms / 1000) for _ in range(10)]:
            f.result(timeout=60)
        t0 = time.perf_counter()
        futures = [client.submit(time.sleep, args.task_ms / 1000) for _ in range(args.tasks)]
        for f in futures:
            f.result(timeout=60 + args.tasks * args.task_ms / 100)
        wall = time.perf_counter() - t0
    finally:
        _stop_workers([worker], graceful=True, timeout=10)
        relay.close()
        deadline = time.monotonic() + 10
        while int(cluster.stats().get("workers", 0)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the master sees the worker leave before the next one joins
    rate = args.tasks / wall
    ideal = 1000 / args.task_ms
    return {"rtt_ms": rtt_ms, "tasks_per_s": rate, "of_ideal": rate / ideal}


def run(args, say: Callable[[str], None]) -> Dict[str, object]:
    """Every configuration, in interleaved rounds; returns the figures."""
    import rtpool

    rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    variants = {"this": None}
    if args.baseline_path:
        variants["baseline"] = args.baseline_path
    names = list(variants)
    order: List[Tuple[float, str]] = []
    for r in range(args.rounds):
        for i, rtt in enumerate(rtts if r % 2 == 0 else rtts[::-1]):
            order += [(rtt, v) for v in (names if (r + i) % 2 == 0 else names[::-1])]
    runs: Dict[Tuple[float, str], List[Dict[str, float]]] = {k: [] for k in order}
    with rtpool.LocalCluster(workers=0) as cluster:
        client = cluster.client()
        for rtt, variant in order:
            m = _measure(cluster, client, rtt, variants[variant], args)
            rate, of_ideal = m["tasks_per_s"], m["of_ideal"]
            say(f"  {rtt:5g} ms added, {variant}: {rate:6.1f} tasks/s, {of_ideal:.0%} of ideal")
            runs[(rtt, variant)].append(m)
    rows = []
    for rtt in rtts:
        for variant in names:
            ratios = [m["of_ideal"] for m in runs[(rtt, variant)]]
            rates = [m["tasks_per_s"] for m in runs[(rtt, variant)]]
            rows.append(
                {
                    "rtt_ms": rtt,
                    "worker": variant,
                    "tasks_per_s_median": percentile(rates, 50),
                    "of_ideal_median": percentile(ratios, 50),
                    "of_ideal_min": min(ratios),
                    "of_ideal_max": max(ratios),
                }
            )
    return {
        "task_ms": args.task_ms,
        "tasks": args.tasks,
        "ideal_tasks_per_s": 1000 / args.task_ms,
        "rows": rows,
        "machine": machine_info(),
    }


def main(argv: Sequence[str]) -> int:
    """Entry point; ``argv`` excludes ``bench prefetch``. Returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1 or not args.task_ms > 0:
        ap.error("--tasks, --rounds and --task-ms must be positive")
    try:
        [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    except ValueError:
        ap.error(f"cannot read --rtt-ms {args.rtt_ms!r}; use e.g. 0,50,100")
    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    say(f"prefetch: one worker of {args.task_ms:g} ms tasks, {args.tasks} tasks per run")
    result = run(args, say)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"\n{'added RTT':>10} {'worker':>9} {'tasks/s':>8} {'of ideal':>9} {'(min-max)':>12}")
    for r in result["rows"]:
        spread = f"{r['of_ideal_min']:.0%}-{r['of_ideal_max']:.0%}"
        print(
            f"{r['rtt_ms']:>7g} ms {r['worker']:>9} {r['tasks_per_s_median']:>8.1f} "
            f"{r['of_ideal_median']:>9.0%} {spread:>12}"
        )
    print(f"ideal: {result['ideal_tasks_per_s']:g} tasks/s (one task per {args.task_ms:g} ms)")
    return 0
