"""Section ``linpack`` of ``rtpool bench ninf``: Linpack Mflops against n, local optimized,
local unblocked and remote (see :mod:`rtpool_bench.ninf.cli`)."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Dict, List, Sequence

from ..stats import safe_ratio
from .common import (
    LINPACK_WITHIN,
    linpack_methods,
    linpack_system,
    normalized_residual,
    remote_parts,
    start_cluster,
    time_stats,
    wait_served,
    worker_blas,
)


def _reps_for(n: int, repeats: int) -> int:
    """Repetitions of size n: fewer from n = 1000 on (their solves take longest)."""
    return repeats if n < 1000 else max(2, repeats - 2)


def _unblocked_allowed(n: int, done: Dict[int, List[float]], max_s: float) -> bool:
    """Whether the unblocked baseline fits ``max_s`` at size n, from the median of its largest
    measured size (``done``: n -> its times) scaled by n^3 (it is skipped from the first size
    it would not)."""
    measured = [(m, statistics.median(ts)) for m, ts in done.items() if ts]
    if not measured:
        return True
    m, t = max(measured)
    return t * (n / m) ** 3 <= max_s


def bench_linpack(args, say: Callable) -> Dict[str, object]:
    """Section ``linpack``: local optimized, local unblocked and remote, interleaved per n."""
    from rtpool.lib.linalg import linpack_flops

    rows: Dict[int, Dict] = {}
    with start_cluster(1, args.blas_threads) as cluster:
        cluster.wait_for_workers(1, timeout=60)
        client = cluster.client()
        wait_served(client, ["linpack", "blas_info"])
        wblas = worker_blas(client)
        skip_from = None
        for n in args.sizes:
            unblocked = {m: r["unblocked"]["seconds"] for m, r in rows.items()}
            use_unblocked = skip_from is None and _unblocked_allowed(
                n, unblocked, args.unblocked_max_seconds
            )
            if not use_unblocked and skip_from is None:
                skip_from = n
            rows[n] = _linpack_size(client, n, args, use_unblocked, say)
    out_rows = []
    for n, r in rows.items():
        flops = linpack_flops(n)
        row = {"n": n, "flops": flops, "bytes": 8 * n * n + 16 * n}
        for m in ("local", "unblocked", "remote"):
            row[m] = time_stats(r[m]["seconds"], flops)
            row[m]["max_resid"] = r[m]["max_resid"]
        row["remote_parts"] = remote_parts(r["timings"])
        row["remote_over_local"] = safe_ratio(row["remote"]["mflops"], row["local"]["mflops"])
        row["pairs"] = pair_stats(r["pairs"])
        row["remote_over_unblocked"] = safe_ratio(
            row["remote"]["mflops"], row["unblocked"]["mflops"]
        )
        out_rows.append(row)
    cblas = _client_blas()
    return {
        "workers": 1,
        "blas_threads": args.blas_threads,
        "client_blas": cblas,
        "worker_blas": wblas,
        "blas_match": blas_match(cblas, wblas),
        "unblocked_max_seconds": args.unblocked_max_seconds,
        "unblocked_skipped_from": skip_from,
        "rows": out_rows,
        "within_10pct_from_n": within_from(out_rows),
        "unblocked_crossover": unblocked_crossover(out_rows),
        "projection": project_within(out_rows),
    }


def _client_blas() -> Dict[str, object]:
    from .funcs import blas_threads

    return blas_threads()


def _linpack_size(client, n: int, args, use_unblocked: bool, say: Callable) -> Dict:
    """Time the methods at one size: a warm-up each, then repetitions in a rotating order."""
    A, b = linpack_system(n, seed=n)
    timings: List[Dict[str, float] | None] = []
    methods = linpack_methods(client, n, timings)
    if not use_unblocked:
        del methods["unblocked"]
    names = list(methods)
    out = {m: {"seconds": [], "max_resid": None} for m in ("local", "unblocked", "remote")}
    for m in ("local", "remote"):  # warm-up: first use of the size (and the interface)
        methods[m](A.copy(), b.copy())
    out["timings"] = timings
    del timings[:]
    reps = _reps_for(n, args.repeats)
    say(f"linpack: n={n}, {reps} repetitions of {', '.join(names)}")
    deadline = time.perf_counter() + args.size_seconds
    out["pairs"] = []
    for rep in range(reps):
        # local and remote back to back (a pair, its order alternating), so that a change of
        # the machine's load between repetitions hits both sides of a pair's ratio alike.
        order = ["local", "remote"] if rep % 2 == 0 else ["remote", "local"]
        order += [m for m in names if m not in order]
        for m in order:
            if m == "unblocked" and out[m]["seconds"] and _too_slow(out[m], args):
                continue
            Ac, bc = A.copy(), b.copy()
            gc.collect()
            t0 = time.perf_counter()
            x = methods[m](Ac, bc)
            out[m]["seconds"].append(time.perf_counter() - t0)
            resid = normalized_residual(A, b, x)
            out[m]["max_resid"] = max(resid, out[m]["max_resid"] or 0.0)
        # remote Mflops / local Mflops of this pair = local time / remote time
        out["pairs"].append(out["local"]["seconds"][-1] / out["remote"]["seconds"][-1])
        if rep >= 1 and time.perf_counter() > deadline:
            break
    return out


def _too_slow(rec: Dict, args) -> bool:
    """Whether the unblocked baseline's repetitions at this size have had their share: after
    one run longer than a fifth of its budget, no more."""
    return max(rec["seconds"]) > args.unblocked_max_seconds / 5


def pair_stats(ratios: Sequence[float]) -> Dict[str, object]:
    """The remote / local Mflops ratios of the pairs (one local and one remote solve back to
    back): each, and their median, min and max."""
    if not ratios:
        return {"ratios": [], "p50": None, "min": None, "max": None}
    return {
        "ratios": [round(x, 4) for x in ratios],
        "p50": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def row_ratio(row: Dict) -> float | None:
    """A size's remote / local Mflops: the median of its pairs' ratios (the ratio of the
    medians when it has no pairs)."""
    pairs = row.get("pairs") or {}
    return pairs.get("p50") if pairs.get("p50") is not None else row["remote_over_local"]


def blas_match(client: Dict, worker: Dict) -> bool:
    """Whether every BLAS library loaded on both sides runs with the same thread count
    (and at least one is known on both): the comparison is fair only then."""
    libs_c, libs_w = client.get("libs", {}), worker.get("libs", {})
    common = [k for k in libs_c if k in libs_w and libs_c[k] is not None]
    return bool(common) and all(libs_c[k] == libs_w[k] for k in common)


def within_from(rows: Sequence[Dict]) -> int | None:
    """The smallest n from which remote is within 10 % of local at every larger n measured
    (None if the largest n is not), by the median of the pairs' ratios."""
    best = None
    for row in sorted(rows, key=lambda r: r["n"], reverse=True):
        ratio = row_ratio(row)
        if ratio is None or ratio < 1 - LINPACK_WITHIN:
            break
        best = row["n"]
    return best


def unblocked_crossover(rows: Sequence[Dict]) -> Dict[str, object]:
    """The smallest n from which remote beats the unblocked baseline at every larger n where
    both were measured; ``below_smallest`` when it does so already at the smallest n."""
    both = [r for r in rows if r["remote_over_unblocked"] is not None]
    both.sort(key=lambda r: r["n"])
    n_from = None
    for row in reversed(both):
        if row["remote_over_unblocked"] <= 1.0:
            break
        n_from = row["n"]
    return {
        "n": n_from,
        "below_smallest": bool(both) and n_from == both[0]["n"],
        "measured_up_to": both[-1]["n"] if both else None,
    }


def project_within(rows: Sequence[Dict]) -> Dict[str, object] | None:
    """Where remote would come within 10 %, projected from this run: the remote overhead
    (remote - local median time) fitted as ``a + bytes / rate`` by least squares, the local
    speed as measured at the largest n. A projection, not a measurement."""
    pts = [
        (r["bytes"], r["remote"]["median_s"] - r["local"]["median_s"])
        for r in rows
        if r["remote"]["median_s"] is not None and r["local"]["median_s"] is not None
    ]
    if len(pts) < 2:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - slope * mx
    top = max(rows, key=lambda r: r["n"])
    local_rate = top["local"]["mflops"] * 1e6  # flops/s
    out = {"overhead_s": round(a, 6), "overhead_mb_per_s": None, "n": None}
    if slope > 0:
        out["overhead_mb_per_s"] = round(1 / slope / 1e6, 1)
    from rtpool.lib.linalg import linpack_flops

    for n in range(top["n"], 200_001, 100):
        t_local = linpack_flops(n) / local_rate
        over = max(0.0, a + slope * (8 * n * n + 16 * n))
        if t_local / (t_local + over) >= 1 - LINPACK_WITHIN:
            out["n"] = n
            break
    return out
