"""Section ``bars`` of ``rtpool bench ninf``: the issue's three bars, measured on one
LocalCluster: (a) round trips of ``dmmul`` with 1 KiB of arguments, a no-op shipped-code task
and a no-op remote call, interleaved in blocks; (b) linpack n=1000 remote against local;
(c) a diamond transaction A -> (B, C) -> D against its critical path plus two round trips."""

from __future__ import annotations

import gc
import time
from typing import Callable, Dict, List

from ..stats import safe_ratio
from .common import (
    CALL_TIMEOUT_S,
    DIAMOND_BAR,
    DMMUL_RATIO_BAR,
    LINPACK_WITHIN,
    linpack_methods,
    linpack_system,
    max_min_mean,
    remote_parts,
    start_cluster,
    time_stats,
    wait_served,
)

# --- bars ------------------------------------------------------------------------------------


def bench_bars(args, linpack: Dict | None, say: Callable) -> Dict[str, object]:
    """Section ``bars``: (a) round trips, (b) linpack n=1000, (c) the diamond transaction."""
    with start_cluster(args.workers, args.blas_threads) as cluster:
        cluster.wait_for_workers(args.workers, timeout=60)
        client = cluster.client()
        wait_served(client, ["dmmul", "noop", "work", "join", "linpack"])
        rtt = _round_trips(client, args, say)
        lp = _linpack_bar(client, args, linpack, say)
        noop_call_p50_s = rtt["kinds"]["noop_call"]["p50_us"] / 1e6
        diamond = _diamond(client, args, noop_call_p50_s, say)
    ratio = safe_ratio(rtt["kinds"]["dmmul"]["p50_us"], rtt["kinds"]["noop_task"]["p50_us"])
    return {
        "workers": args.workers,
        "round_trips": rtt,
        "linpack_1000": lp,
        "diamond": diamond,
        "bars": {
            "dmmul_over_task": _bar(ratio, DMMUL_RATIO_BAR, "<="),
            "linpack_remote_over_local": _bar(lp["remote_over_local"], 1 - LINPACK_WITHIN, ">="),
            "diamond_makespan_over_bound": _bar(diamond["ratio"]["p50"], DIAMOND_BAR, "<="),
        },
    }


def _bar(measured: float | None, bound: float, op: str) -> Dict[str, object]:
    ok = None
    if measured is not None:
        ok = measured <= bound if op == "<=" else measured >= bound
    return {"measured": measured, "bound": bound, "op": op, "ok": ok}


def _round_trips(client, args, say: Callable) -> Dict[str, object]:
    """(a) dmmul n=8, a no-op task and a no-op call: sequential round trips, interleaved in
    blocks (a rotating order), after a warm-up of each."""
    import numpy as np

    from ..roundtrip import breakdown
    from ..stats import new_histogram, record_ns, summarize_histogram
    from ..tasks import noop

    rng = np.random.default_rng(8)
    A, B = rng.random((8, 8)), rng.random((8, 8))
    C = client.call("dmmul", 8, A, B)
    if not np.allclose(C, A @ B):
        raise RuntimeError("bench ninf: dmmul returned a wrong product")
    kinds = {  # each sends one round trip and returns its future
        "noop_task": lambda: client.submit(noop),
        "noop_call": lambda: client.call_async("noop"),
        "dmmul": lambda: client.call_async("dmmul", 8, A, B),
    }
    names = list(kinds)
    warm_end = time.perf_counter() + max(1.0, args.bar_seconds / 10)
    for _ in range(max(20, args.bar_calls // 10)):
        for fn in kinds.values():
            fn().result(timeout=CALL_TIMEOUT_S)
        if time.perf_counter() > warm_end:
            break
    hist = {k: new_histogram() for k in names}
    points: Dict[str, List] = {k: [] for k in names}
    say(f"bars: up to {args.bar_calls} round trips each, blocks of {args.bar_block}")
    deadline = time.perf_counter() + args.bar_seconds
    done = blocks = 0
    while done < args.bar_calls and time.perf_counter() < deadline:
        size = min(args.bar_block, args.bar_calls - done)
        order = names[blocks % 3 :] + names[: blocks % 3]
        gc.collect()
        for k in order:
            fn, h, pts = kinds[k], hist[k], points[k]
            for _ in range(size):
                t0 = time.perf_counter_ns()
                fut = fn()
                fut.result(timeout=CALL_TIMEOUT_S)
                record_ns(h, time.perf_counter_ns() - t0)
                pts.append(fut.timings)  # read after the clock stopped
        done += size
        blocks += 1
    return {
        "count": done,
        "blocks": blocks,
        "block": args.bar_block,
        "dmmul_arg_bytes": int(A.nbytes + B.nbytes),
        "kinds": {k: summarize_histogram(h) for k, h in hist.items()},
        "breakdown_us": {k: breakdown(points[k]) for k in names},
    }


def _linpack_bar(client, args, linpack: Dict | None, say: Callable) -> Dict[str, object]:
    """(b) linpack n=1000 remote vs local: from the linpack section when it measured n=1000,
    else measured here (interleaved, 3 repetitions, 1 in --quick)."""
    from rtpool.lib.linalg import linpack_flops

    from .linpack import pair_stats, row_ratio

    for row in (linpack or {}).get("rows", []):
        if row["n"] == 1000:
            return {
                "source": "linpack section",
                "n": 1000,
                "local_mflops": row["local"]["mflops"],
                "remote_mflops": row["remote"]["mflops"],
                "remote_over_local": row_ratio(row),
                "pairs": row.get("pairs"),
                "local_median_s": row["local"]["median_s"],
                "remote_median_s": row["remote"]["median_s"],
                "remote_parts": row["remote_parts"],
            }
    n = 1000
    say("bars: linpack n=1000, remote and local")
    A, b = linpack_system(n, seed=n)
    timings: List = []
    methods = linpack_methods(client, n, timings)
    times: Dict[str, List[float]] = {"local": [], "remote": []}
    for m in times:
        methods[m](A.copy(), b.copy())
    del timings[:]
    for rep in range(1 if args.quick else 3):
        for m in ("local", "remote") if rep % 2 == 0 else ("remote", "local"):
            Ac, bc = A.copy(), b.copy()
            t0 = time.perf_counter()
            methods[m](Ac, bc)
            times[m].append(time.perf_counter() - t0)
    flops = linpack_flops(n)
    local, remote = time_stats(times["local"], flops), time_stats(times["remote"], flops)
    pairs = pair_stats([lo / re for lo, re in zip(times["local"], times["remote"])])
    return {
        "source": "measured in bars",
        "n": n,
        "local_mflops": local["mflops"],
        "remote_mflops": remote["mflops"],
        "remote_over_local": pairs["p50"],
        "pairs": pairs,
        "local_median_s": local["median_s"],
        "remote_median_s": remote["median_s"],
        "remote_parts": remote_parts(timings),
    }


def _diamond(client, args, rtt_s: float, say: Callable) -> Dict[str, object]:
    """(c) A -> (B, C) -> D in one transaction, each call taking ``--diamond-ms``: makespan
    (from entering the transaction to D's result here) against the critical path (the
    measured executions of A, the slower of B and C, and D) plus 2 round trips."""
    import numpy as np

    ms, spin = args.diamond_ms, args.diamond_work == "spin"
    x = np.arange(1024, dtype=np.float64)
    say(f"bars: diamond, {args.diamond_reps} transactions of 4 x {ms:g} ms ({args.diamond_work})")
    reps: List[Dict[str, float]] = []
    wrong = 0
    deadline = time.perf_counter() + max(10.0, args.diamond_reps * ms / 1000 * 20)
    for _ in range(args.diamond_reps):
        t0 = time.perf_counter()
        with client.transaction() as tx:
            a = tx.call("work", ms, spin, x, fetch=True)
            b = tx.call("work", ms, spin, a, fetch=True)
            c = tx.call("work", ms, spin, a, fetch=True)
            d = tx.call("join", ms, spin, b, c)
        out = d.result(timeout=CALL_TIMEOUT_S)
        makespan = time.perf_counter() - t0
        wrong += not np.array_equal(out, 2 * x + 4)
        ex = [_exec_s(f, ms) for f in (a, b, c, d)]
        critical = ex[0] + max(ex[1], ex[2]) + ex[3]
        timed = all(_timed(f) for f in (a, b, c, d))
        calls = [_call_ms(f) for f in (a, b, c, d)]
        reps.append({"makespan_s": makespan, "critical_s": critical, "timed": timed})
        reps[-1]["calls_ms"] = calls
        if time.perf_counter() > deadline:
            break
    ratios = [r["makespan_s"] / (r["critical_s"] + 2 * rtt_s) for r in reps]
    return {
        "reps": len(reps),
        "ms": ms,
        "work": args.diamond_work,
        "rtt_s": rtt_s,
        "makespan_s": max_min_mean([r["makespan_s"] for r in reps]),
        "critical_s": max_min_mean([r["critical_s"] for r in reps]),
        "ratio": max_min_mean(ratios),
        "exec_from_timings": bool(reps) and all(r["timed"] for r in reps),
        "wrong_results": wrong,
        # per transaction, A, B, C, D: [master queue, worker wait, execution, total] in ms
        "transactions": [
            {
                "makespan_s": r["makespan_s"],
                "critical_s": r["critical_s"],
                "calls_ms": r["calls_ms"],
            }
            for r in reps
        ],
    }


def _exec_s(fut, ms: float) -> float:
    """A call's execution time from its timings (the nominal time if the SDK gives none)."""
    t = getattr(fut, "timings", None)
    if t and t.get("exec_us") is not None:
        return t["exec_us"] / 1e6
    return ms / 1000


def _call_ms(fut) -> List[float | None]:
    """``[queue, wait, exec, total]`` of a call in ms, from its timings (None without)."""
    t = getattr(fut, "timings", None) or {}
    keys = ("queue_us", "wait_us", "exec_us", "total_us")
    return [None if t.get(k) is None else round(t[k] / 1000, 3) for k in keys]


def _timed(fut) -> bool:
    t = getattr(fut, "timings", None)
    return bool(t and t.get("exec_us") is not None)
