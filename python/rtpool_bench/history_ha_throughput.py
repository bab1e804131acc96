"""``rtpool bench ha throughput``: packages of 100 no-op tasks through a master with its
journal in PostgreSQL (``--ha``, acknowledged once committed) against masters with the local
journal (the default ``--fsync``, and ``always``), in one run, rounds alternating, the same
workers' kind and count for each. Prints tasks/s and packages/s per mode and the ratios.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

from .ha_cluster import fresh_database, start_pair
from .recovery import _Master, _start_worker_at, _stop_group
from .stats import machine_info, percentile
from .tasks import noop


def add_throughput_args(ap: argparse.ArgumentParser) -> None:
    """The options of ``rtpool bench ha throughput``."""
    ap.add_argument("--pg", required=True, help="a PostgreSQL server URL (a database is made)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per mode, alternating (3)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per round (5)")
    ap.add_argument("--tasks", type=int, default=100, help="tasks per package (100)")
    ap.add_argument("--inflight", type=int, default=8, help="packages in flight (8)")
    ap.add_argument("--workers", type=int, default=2, help="rtpool worker processes (2)")
    ap.add_argument("--procs", type=int, default=2, help="processes per worker (2)")


def _round(address: str, token: str, args: argparse.Namespace) -> Dict[str, float]:
    """Submits packages for ``args.seconds`` with ``args.inflight`` unfinished; counts them."""
    import rtpool

    client = rtpool.Client(address, token, name="ha-throughput")
    try:
        room = threading.Semaphore(args.inflight)
        done: List[float] = []
        lock = threading.Lock()
        end = time.monotonic() + args.seconds
        started = time.monotonic()
        pkgs = []
        while time.monotonic() < end:
            if not room.acquire(timeout=max(0.0, end - time.monotonic())):
                break
            t0 = time.monotonic()
            pkg = client.submit_many(noop, [() for _ in range(args.tasks)], star=True)
            left = [args.tasks]

            def on_done(_f, t0=t0, left=left) -> None:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.append(time.monotonic() - t0)
                        room.release()

            for f in pkg.futures:
                f.add_done_callback(on_done)
            pkgs.append(pkg)
        for pkg in pkgs:
            for f in pkg.futures:
                f.result(60)
        elapsed = time.monotonic() - started
        return {
            "packages_per_s": len(pkgs) / elapsed,
            "tasks_per_s": len(pkgs) * args.tasks / elapsed,
            "package_p50_ms": percentile([d * 1e3 for d in done], 50),
        }
    finally:
        client.close()


def throughput_main(args: argparse.Namespace) -> int:
    """Runs the rounds; prints one line per round and the summary. Returns 0."""
    base = Path(tempfile.mkdtemp(prefix="rtpool-ha-tp-"))
    url = fresh_database(args.pg, f"rtpool_tp_{int(time.time() * 1e3) % 10**9}")
    a, b = start_pair(base, url, 1000)
    local = _Master(base / "local", base / "local.log", [])
    always = _Master(base / "always", base / "always.log", ["--fsync", "always"])
    modes = {
        "ha": (a.address, (a.data / "client.token").read_text().strip(), a.data),
        "local": (local.address, local.token, local.data_dir),
        "local-always": (always.address, always.token, always.data_dir),
    }
    workers = []
    results: Dict[str, List[Dict[str, float]]] = {k: [] for k in modes}
    try:
        for name, (address, _, data) in modes.items():
            wtoken = (data / "worker.token").read_text().strip()
            for w in range(args.workers):
                log = base / f"worker-{name}-{w}.log"
                workers.append(_start_worker_at(address, wtoken, log, ["--procs", str(args.procs)]))
        for r in range(args.rounds):
            for name, (address, token, _) in modes.items():
                res = _round(address, token, args)
                results[name].append(res)
                print(
                    f"round {r + 1} {name:>12}: {res['tasks_per_s']:>9.0f} tasks/s, "
                    f"{res['packages_per_s']:>7.1f} packages/s, package p50 "
                    f"{res['package_p50_ms']} ms",
                    flush=True,
                )
    finally:
        for p in workers:
            _stop_group(p)
        for m in (a, b):
            m.kill()
        local.kill()
        always.kill()
    best = {k: max(x["tasks_per_s"] for x in v) for k, v in results.items()}
    med = {k: percentile([x["tasks_per_s"] for x in v], 50) for k, v in results.items()}
    print(
        f"packages of {args.tasks} no-op tasks, {args.workers}x{args.procs} worker processes, "
        f"{args.inflight} in flight: median tasks/s ha {med['ha']:.0f}, local {med['local']:.0f}"
        f", local-always {med['local-always']:.0f}; ha/local {med['ha'] / med['local']:.2f}, "
        f"ha/local-always {med['ha'] / med['local-always']:.2f} (best rounds: "
        f"{best['ha']:.0f} / {best['local']:.0f} / {best['local-always']:.0f})"
    )
    print(machine_info())
    shutil.rmtree(base, ignore_errors=True)
    return 0
