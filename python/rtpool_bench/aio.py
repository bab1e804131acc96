"""``rtpool bench asyncio``: rtpool futures from one event loop (``docs/asyncio.md``).

Two parts, on one LocalCluster:

* **many**: ``--tasks`` (10,000) no-op tasks submitted one by one from one coroutine
  (``await client.submit(noop)``, one future each), then ``await client.gather(futures)``;
  then the same count as one package (``submit_many``). The process's threads are counted
  before, while the futures are pending, and after (Python threads, and the kernel's count in
  ``/proc/self/task``, native ones included): a thread per future would show thousands.
* **latency**: sequential no-op round trips, ``await fut`` against ``fut.result()`` (the same
  client, the same loop thread; ``result()`` blocks it, which is what it is compared with),
  interleaved in ``--rounds`` rounds of ``--count`` each, the order swapped every round.
  p50/p99/p99.9/max of each and their ratios, measured in the same run.

Every loop is bounded by its count and ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Sequence

from .stats import machine_info, percentile
from .tasks import noop


def _threads() -> Dict[str, int]:
    try:
        native = len(os.listdir("/proc/self/task"))
    except OSError:
        native = -1
    return {"python": threading.active_count(), "native": native}


def _summary(ns: List[int]) -> Dict[str, Any]:
    us = [v / 1000 for v in ns]
    out: Dict[str, Any] = {"n": len(us)}
    for name, pct in (("p50_us", 50), ("p99_us", 99), ("p99_9_us", 99.9)):
        value = percentile(us, pct)
        out[name] = None if value is None else round(value, 1)
    out["max_us"] = round(max(us), 1) if us else None
    return out


async def _many(client: Any, tasks: int, end: float) -> Dict[str, Any]:
    before = _threads()
    t0 = time.perf_counter()
    futures = []
    for _ in range(tasks):
        if time.monotonic() > end:
            break
        futures.append(await client.submit(noop))
    t_sub = time.perf_counter()
    pending = _threads()
    await client.gather(futures, deadline=max(1.0, end - time.monotonic()))
    t_done = time.perf_counter()
    done = sum(1 for f in futures if f.done() and not f.cancelled())
    t1 = time.perf_counter()
    package = await client.submit_many(noop, range(tasks))
    await client.gather(package.futures, deadline=max(1.0, end - time.monotonic()))
    t2 = time.perf_counter()
    return {
        "tasks": len(futures),
        "done": done,
        "submit_s": round(t_sub - t0, 3),
        "total_s": round(t_done - t0, 3),
        "tasks_per_s": round(len(futures) / (t_done - t0)),
        "package_tasks_per_s": round(tasks / (t2 - t1)),
        "threads_before": before,
        "threads_pending": pending,
        "threads_after": _threads(),
    }


async def _latency(client: Any, count: int, rounds: int, end: float) -> Dict[str, Any]:
    sync = client.sync
    samples: Dict[str, List[int]] = {"await": [], "result": []}
    for r in range(rounds):
        for mode in ("await", "result") if r % 2 == 0 else ("result", "await"):
            for _ in range(count):
                if time.monotonic() > end:
                    break
                t = time.perf_counter_ns()
                if mode == "await":
                    await (await client.submit(noop))
                else:
                    sync.submit(noop).result()
                samples[mode].append(time.perf_counter_ns() - t)
    out = {mode: _summary(ns) for mode, ns in samples.items()}
    a, b = out["await"], out["result"]
    out["ratio_await_to_result"] = {
        k: round(a[k] / b[k], 2) if a[k] and b[k] else None
        for k in ("p50_us", "p99_us", "p99_9_us", "max_us")
    }
    return out


async def _run(args: argparse.Namespace) -> Dict[str, Any]:
    import rtpool

    end = time.monotonic() + args.seconds
    async with rtpool.LocalCluster(workers=args.workers) as cluster:
        await cluster.wait_for_workers_async(timeout=60)
        client = await cluster.async_client()
        for _ in range(args.warmup):
            await (await client.submit(noop))
            client.sync.submit(noop).result()
        many = await _many(client, args.tasks, end)
        latency = await _latency(client, args.count, args.rounds, end)
    return {"machine": machine_info(), "workers": args.workers, "many": many, "latency": latency}


def render(out: Dict[str, Any]) -> str:
    m, lat = out["many"], out["latency"]
    tb, tp, ta = m["threads_before"], m["threads_pending"], m["threads_after"]
    lines = [
        f"rtpool bench asyncio ({out['workers']} workers)",
        f"many: {m['tasks']} no-op tasks from one event loop, one future each: submitted in "
        f"{m['submit_s']} s, all done in {m['total_s']} s ({m['tasks_per_s']} tasks/s; "
        f"as one package: {m['package_tasks_per_s']} tasks/s)",
        f"  threads (python/native): before {tb['python']}/{tb['native']}, with "
        f"{m['tasks']} futures pending {tp['python']}/{tp['native']}, after "
        f"{ta['python']}/{ta['native']}",
        "latency: sequential no-op round trips, interleaved (us)",
        f"  {'':8} {'n':>6} {'p50':>9} {'p99':>9} {'p99.9':>9} {'max':>9}",
    ]
    for mode in ("await", "result"):
        s = lat[mode]
        lines.append(
            f"  {mode:8} {s['n']:>6} {s['p50_us']:>9} {s['p99_us']:>9} {s['p99_9_us']:>9} "
            f"{s['max_us']:>9}"
        )
    r = lat["ratio_await_to_result"]
    lines.append(
        f"  await/result: p50 {r['p50_us']}x, p99 {r['p99_us']}x, p99.9 {r['p99_9_us']}x, "
        f"max {r['max_us']}x"
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rtpool bench asyncio",
        description="rtpool futures from one asyncio event loop: 10,000 tasks with a thread "
        "count, and the latency of `await fut` against `fut.result()` in the same run.",
    )
    ap.add_argument("--tasks", type=int, default=10_000, help="tasks of part many (10000)")
    ap.add_argument("--count", type=int, default=1000, help="round trips per round (1000)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each mode (4)")
    ap.add_argument("--warmup", type=int, default=200, help="warm-up round trips each (200)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    ap.add_argument("--seconds", type=float, default=120.0, help="time budget (120)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def main(argv: Sequence[str]) -> int:
    """Entry point of ``rtpool bench asyncio``; ``argv`` excludes ``asyncio``."""
    args = build_parser().parse_args(list(argv))
    if min(args.tasks, args.count, args.rounds, args.workers) < 1 or args.warmup < 0:
        print(
            "rtpool bench asyncio: --tasks, --count, --rounds and --workers must be at least 1",
            file=sys.stderr,
        )
        return 2
    out = asyncio.run(_run(args))
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0
