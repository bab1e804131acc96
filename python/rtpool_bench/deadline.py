"""``rtpool bench deadline``: 10 ms CPU-bound tasks with a 50 ms deadline, open loop at 80 % of
the capacity measured in the same run; the deadline-miss ratio (see
:mod:`rtpool_bench.openloop_cli`)."""

from __future__ import annotations

import gc
import math
import random
from typing import Callable, Dict, Sequence

from .interleave import (
    defaults,
    error_counts,
    probe,
    round2,
    stat_delta,
    write_plot,
)
from .openloop import (
    GcWatch,
    Outcome,
    gc_summary,
    histogram_of,
    measure_capacity,
    run_open_loop,
    schedule_ns,
    set_timer_slack_ns,
    summarize,
)
from .stats import percentile
from .tasks import spin

DEADLINE_MISS_BAR = 0.001


# --- deadline --------------------------------------------------------------------------------


def bench_deadline(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench deadline`` (see the module's docstring)."""
    import rtpool

    d = defaults("deadline", args)
    task_ms, deadline_s = d["task_ms"], args.deadline_ms / 1000
    load = args.load if args.load is not None else 0.8
    window = 4 * args.workers
    cap_n = max(60, d["count"] // 10) if not args.quick else 60
    set_timer_slack_ns(1000)
    with rtpool.LocalCluster(workers=args.workers) as cluster:
        cluster.wait_for_workers(args.workers, timeout=30)
        client = cluster.client()
        say("deadline: warm-up")
        for _ in range(3):
            run_open_loop(lambda: client.submit(spin, task_ms), [0] * window, 30)
        view, note = probe(client, spin, (task_ms,), deadline=deadline_s)
        say(f"deadline: capacity, {cap_n} tasks, {window} in flight")
        cap = measure_capacity(lambda: client.submit(spin, task_ms), cap_n, window, 60)
        if not cap["tasks_per_s"]:
            raise RuntimeError(f"the capacity run finished too few tasks: {cap}")
        rate = load * cap["tasks_per_s"]
        n = min(d["count"], max(1, math.ceil(rate * d["seconds"])))
        sub = view or client
        say(f"deadline: {n} tasks open loop at {rate:.0f}/s ({load:.0%} of {cap['tasks_per_s']}/s)")
        gc.collect()
        before = cluster.stats()
        offsets = schedule_ns(n, rate, args.arrivals, random.Random(7))
        with GcWatch() as gcw:
            run = run_open_loop(
                lambda: sub.submit(spin, task_ms), offsets, 2 * n / rate + 5, _deadline_keep
            )
        outcomes = run.outcomes
        stats = stat_delta(before, cluster.stats())
        say("deadline: capacity again (drift check)")
        cap_after = measure_capacity(lambda: client.submit(spin, task_ms), cap_n, window, 60)
    out = {
        "workers": args.workers,
        "task": f"spin({task_ms:g}): {task_ms:g} ms of CPU time (busy loop)",
        "task_ms": task_ms,
        "deadline_ms": args.deadline_ms,
        "load": load,
        "arrivals": args.arrivals,
        "capacity": cap,
        "capacity_after": cap_after,
        "offered_per_s": round(rate, 1),
        "requested": n,
        "unsent": n - run.sent,
        "master_stats": stats,
        "client_gc": gc_summary(gcw.pauses_ns, gcw.full),
    }
    out.update(_deadline_figures(outcomes, deadline_s, view is not None))
    out["sdk"] = {"deadline_option": view is not None, "note": note}
    miss = out["sdk_miss_ratio"]
    out["bar"] = {
        "miss_ratio_max": DEADLINE_MISS_BAR,
        "client_ok": out["client_miss_ratio"] <= DEADLINE_MISS_BAR,
        "sdk_ok": None if miss is None else miss <= DEADLINE_MISS_BAR,
    }
    lat = out.pop("_lat")
    if args.plot:
        title = f"rtpool deadline bench: completion time of {task_ms:g} ms tasks at {rate:.0f}/s"
        series = {"completion": histogram_of(lat)}
        out.update(write_plot(series, args.plot, title, (args.deadline_ms * 1000, "deadline")))
    return out


def _deadline_keep(fut) -> tuple:
    """``(lateness s or None, exec ms or None)`` of a finished task."""
    timings = fut.timings
    return getattr(fut, "lateness", None), timings and timings["exec_us"] / 1000


def _deadline_figures(outcomes: Sequence[Outcome], deadline_s: float, sdk: bool) -> Dict:
    lat = [o.latency_ns for o in outcomes]
    budget_ns = deadline_s * 1e9
    client_miss = sum(x is None or x > budget_ns for x in lat)
    sdk_miss, lateness = None, []
    if sdk:
        sdk_miss = 0
        for o in outcomes:
            late = o.extra[0] if o.extra else None
            if o.error == "DeadlineMissedError" or (late or 0) > 0:
                sdk_miss += 1
                if late:
                    lateness.append(late * 1000)
    execs = [o.extra[1] for o in outcomes if o.extra and o.extra[1] is not None]
    n = len(outcomes)
    return {
        "sent": n,
        "completed": sum(x is not None for x in lat),
        "errors": error_counts(outcomes),
        "completion": summarize(histogram_of(lat)),
        "sender_lag": summarize(histogram_of([o.lag_ns for o in outcomes])),
        "exec_ms": {
            "p50": round2(percentile(execs, 50)),
            "p99": round2(percentile(execs, 99)),
            "max": round2(max(execs, default=None)),
        },
        "client_misses": client_miss,
        "client_miss_ratio": round(client_miss / n, 5) if n else None,
        "sdk_misses": sdk_miss,
        "sdk_miss_ratio": None if sdk_miss is None or not n else round(sdk_miss / n, 5),
        "lateness_ms": {
            "p50": round2(percentile(lateness, 50)),
            "max": round2(max(lateness, default=None)),
        },
        "_lat": lat,
    }
