"""``rtpool bench ninf``: the Ninf paper's benchmarks on rtpool's grid RPC (``docs/rpc.md``).

Every section starts its own ``LocalCluster`` whose workers serve ``rtpool.lib.linalg`` and
:mod:`rtpool._bench_ninf_funcs`, and stops it (and every client process it started, by PID).

* ``linpack``: Linpack Mflops against n for the local optimized solver (scipy's LAPACK in this
  process), the unblocked LINPACK baseline (also here; skipped from the size where it would
  take more than ``--unblocked-max-seconds``) and ``client.call("linpack", n, A, b)`` through
  one worker. The three are interleaved (a rotating order in every repetition), with the same
  BLAS thread count here and in the worker. Reports remote / local per n, the smallest n from
  which remote stays within 10 % of local, and the crossover with the unblocked baseline.
* ``multi``: the paper's multi-client tables (Tables 3-6): ``c`` client processes, each
  calling ``linpack`` at ticks ``--interval`` seconds apart with probability
  ``--probability``, for ``--cell-seconds``, on ``--workers`` workers; per call Performance,
  Response, Wait and Throughput (max/min/mean), the workers' CPU, the load average and the
  number of calls.
* ``ep``: NAS EP (2^m pairs, class S: m = 24) split into ``--ep-chunks`` remote ``ep`` calls
  shared by c client processes; Mops, time, verification of the sums against ``EP_VERIFY``.
* ``bars``: the issue's three bars. (a) round trips of ``dmmul`` with 1 KiB of arguments,
  a no-op shipped-code task and a no-op remote call, interleaved in blocks; (b) linpack n=1000
  remote vs local; (c) a diamond transaction A -> (B, C) -> D against its critical path plus
  two round trips.

Every loop is bounded by a count and by a time budget. ``--quick`` runs tiny sizes for tests.
The tables are in :mod:`rtpool._bench_ninf_render`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence

from ._bench_stats import machine_info, percentile, safe_ratio

SERVE = ("rtpool.lib.linalg", "rtpool._bench_ninf_funcs")
SECTIONS = ("linpack", "multi", "ep", "bars")

LINPACK_WITHIN = 0.10  # remote Mflops >= (1 - 0.10) x local Mflops
DMMUL_RATIO_BAR = 1.5  # dmmul p50 / no-op task p50
DIAMOND_BAR = 1.1  # makespan <= 1.1 x (critical path + 2 RTT)
RESID_MAX = 100.0  # LINPACK's normalized residual of a correct solve is O(1)
CALL_TIMEOUT_S = 120.0

# (normal, --quick) defaults of the options left unset.
DEFAULTS = {
    "sizes": ((100, 200, 400, 800, 1000, 1200, 1600), (100, 200)),
    "repeats": (5, 2),
    "size_seconds": (60.0, 5.0),
    "multi_sizes": ((600, 1000), (200,)),
    "clients": ((1, 2, 4, 8, 16), (1, 2)),
    "cell_seconds": (6.0, 1.5),
    "ep_m": (24, 24),
    "ep_chunks": (16, 8),
    "ep_clients": ((1, 2, 4), (1, 2)),
    "bar_calls": (2000, 100),
    "bar_block": (100, 50),
    "bar_seconds": (60.0, 10.0),
    "diamond_reps": (20, 3),
    "diamond_ms": (50.0, 20.0),
}


# --- small helpers ---------------------------------------------------------------------------


def max_min_mean(values: Sequence[float]) -> Dict[str, float | None]:
    """``max``, ``min``, ``mean`` (the paper's ``max/min/mean`` cells), ``p50`` and ``count``."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"max": None, "min": None, "mean": None, "p50": None, "count": 0}
    return {
        "max": max(vals),
        "min": min(vals),
        "mean": statistics.fmean(vals),
        "p50": percentile(vals, 50),
        "count": len(vals),
    }


def time_stats(seconds: Sequence[float], flops: float) -> Dict[str, float | None]:
    """Repetitions of one solve: time p50 and max, Mflops of the median and of the best time."""
    if not seconds:
        return {"reps": 0, "p50_s": None, "max_s": None, "median_s": None, "mflops": None}
    med = statistics.median(seconds)
    return {
        "reps": len(seconds),
        "p50_s": percentile(seconds, 50),
        "max_s": max(seconds),
        "median_s": med,
        "mflops": flops / med / 1e6,
        "best_mflops": flops / min(seconds) / 1e6,
    }


def loadavg() -> List[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset with the normal or the ``--quick`` default."""
    for key, (normal, quick) in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, quick if args.quick else normal)
    return args


def _cluster(workers: int, blas_threads: int):
    import rtpool

    env = {k: str(blas_threads) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["MKL_NUM_THREADS"] = str(blas_threads)
    return rtpool.LocalCluster(workers=workers, serve=list(SERVE), worker_env=[env] * workers)


def wait_served(client, names: Sequence[str], timeout: float = 30.0) -> None:
    """Wait until the master lists every function of ``names`` (the workers' SERVE may come
    after they count as joined)."""
    end = time.monotonic() + timeout
    while True:
        served = {f.name for f in client.functions()}
        missing = [n for n in names if n not in served]
        if not missing:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"the workers do not serve {', '.join(missing)} after {timeout} s")
        time.sleep(0.05)


def worker_blas(client) -> Dict[str, object]:
    """The BLAS threads a worker really runs with (``blas_info`` on one of them)."""
    return json.loads(client.call("blas_info"))


# --- linpack ---------------------------------------------------------------------------------


def linpack_system(n: int, seed: int):
    """A random ``n x n`` system with entries in [-0.5, 0.5) whose solution is all ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    A = rng.random((n, n)) - 0.5
    return A, A.sum(axis=1)


def normalized_residual(A, b, x) -> float:
    """LINPACK's check: ||A x - b|| / (n ||A|| ||x|| eps), infinity norms; O(1) when right."""
    import numpy as np

    n = A.shape[0]
    r = np.abs(A @ x - b).max()
    den = n * np.abs(A).sum(axis=1).max() * np.abs(x).max() * np.finfo(np.float64).eps
    return float(r / den) if den else float("inf")


def _linpack_methods(client, n: int, timings: List | None = None) -> Dict[str, Callable]:
    """The three solvers, each ``(A, b) -> x``; the remote one appends its call's
    ``Future.timings`` to ``timings``."""
    from .lib import linalg

    def unblocked(A, b):
        lu, ipvt, _ = linalg.dgefa_unblocked(A)
        return linalg.dgesl_unblocked(lu, ipvt, b)

    def remote(A, b):
        fut = client.call_async("linpack", n, A, b)
        x = fut.result(timeout=CALL_TIMEOUT_S)
        if timings is not None:
            timings.append(fut.timings)
        return x

    return {"local": linalg.linpack_local, "unblocked": unblocked, "remote": remote}


def remote_parts(timings: Sequence[Dict[str, float] | None]) -> Dict[str, float | None]:
    """Medians of where remote calls' time went (``Future.timings``), in seconds: ``exec_s``
    (the worker's call: decoding the arguments, the function, encoding the result),
    ``worker_leg_s`` (the master's assignment to result: the hops to and from the worker and
    its wait, execution and flush) and ``client_side_s`` (the rest: encoding, the client <->
    master hops, decoding)."""
    ts = [t for t in timings if t]
    if not ts:
        return {"exec_s": None, "worker_leg_s": None, "client_side_s": None}

    def med(values):
        return statistics.median(values) / 1e6

    return {
        "exec_s": med([t["exec_us"] for t in ts]),
        "worker_leg_s": med([t["worker_us"] for t in ts]),
        "client_side_s": med([t["total_us"] - t["queue_us"] - t["worker_us"] for t in ts]),
    }


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
    from .lib.linalg import linpack_flops

    rows: Dict[int, Dict] = {}
    with _cluster(1, args.blas_threads) as cluster:
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
        row["remote_over_unblocked"] = safe_ratio(
            row["remote"]["mflops"], row["unblocked"]["mflops"]
        )
        out_rows.append(row)
    return {
        "workers": 1,
        "blas_threads": args.blas_threads,
        "client_blas": _client_blas(),
        "worker_blas": wblas,
        "unblocked_max_seconds": args.unblocked_max_seconds,
        "unblocked_skipped_from": skip_from,
        "rows": out_rows,
        "within_10pct_from_n": within_from(out_rows),
        "unblocked_crossover": unblocked_crossover(out_rows),
        "projection": project_within(out_rows),
    }


def _client_blas() -> Dict[str, object]:
    from ._bench_ninf_funcs import blas_threads

    return blas_threads()


def _linpack_size(client, n: int, args, use_unblocked: bool, say: Callable) -> Dict:
    """Time the methods at one size: a warm-up each, then repetitions in a rotating order."""
    A, b = linpack_system(n, seed=n)
    timings: List[Dict[str, float] | None] = []
    methods = _linpack_methods(client, n, timings)
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
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
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
        if rep >= 1 and time.perf_counter() > deadline:
            break
    return out


def _too_slow(rec: Dict, args) -> bool:
    """Whether the unblocked baseline's repetitions at this size have had their share: after
    one run longer than a fifth of its budget, no more."""
    return max(rec["seconds"]) > args.unblocked_max_seconds / 5


def within_from(rows: Sequence[Dict]) -> int | None:
    """The smallest n from which remote is within 10 % of local at every larger n measured
    (None if the largest n is not)."""
    best = None
    for row in sorted(rows, key=lambda r: r["n"], reverse=True):
        ratio = row["remote_over_local"]
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
    from .lib.linalg import linpack_flops

    for n in range(top["n"], 200_001, 100):
        t_local = linpack_flops(n) / local_rate
        over = max(0.0, a + slope * (8 * n * n + 16 * n))
        if t_local / (t_local + over) >= 1 - LINPACK_WITHIN:
            out["n"] = n
            break
    return out


# --- CLI -------------------------------------------------------------------------------------


def _ints(text: str) -> List[int]:
    vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench ninf`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench ninf",
        description="The Ninf paper's Linpack and EP benchmarks on rtpool's grid RPC, and the "
        "issue's three bars. Each section starts its own LocalCluster serving "
        "rtpool.lib.linalg.",
    )
    ap.add_argument(
        "sections",
        nargs="*",
        metavar="SECTION",
        help="linpack, multi, ep, bars (default: all four, in this order)",
    )
    ap.add_argument(
        "--json",
        metavar="PATH",
        help="also write the figures as JSON ('-': stdout only, no tables)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions (tests)")
    ap.add_argument("--workers", type=int, default=2, help="workers of multi, ep, bars (2)")
    ap.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of this process and of every worker and client (default 1)",
    )
    g = ap.add_argument_group("linpack")
    g.add_argument("--sizes", type=_ints, help="orders n (100,200,400,800,1000,1200,1600)")
    g.add_argument("--repeats", type=int, help="repetitions per n (5; 3 from n=1000 on)")
    g.add_argument("--size-seconds", type=float, help="time budget per n (60)")
    g.add_argument(
        "--unblocked-max-seconds",
        type=float,
        default=10.0,
        help="skip the unblocked baseline from the n where one solve would take longer (10)",
    )
    g = ap.add_argument_group("multi")
    g.add_argument("--multi-sizes", type=_ints, help="orders n (600,1000)")
    g.add_argument("--clients", type=_ints, help="client processes per cell (1,2,4,8,16)")
    g.add_argument("--cell-seconds", type=float, help="seconds each cell's clients call (6)")
    g.add_argument("--interval", type=float, default=0.1, help="s: seconds between ticks (0.1)")
    g.add_argument("--probability", type=float, default=0.5, help="p: call at a tick (0.5)")
    g.add_argument("--max-calls", type=int, default=1000, help="calls per client at most (1000)")
    g = ap.add_argument_group("ep")
    g.add_argument("--ep-m", type=int, help="2^m pairs (24: class S)")
    g.add_argument("--ep-chunks", type=int, help="remote calls per run (16)")
    g.add_argument("--ep-clients", type=_ints, help="client processes (1,2,4)")
    g.add_argument("--ep-seconds", type=float, default=120.0, help="time budget per run (120)")
    g = ap.add_argument_group("bars")
    g.add_argument("--bar-calls", type=int, help="round trips of each kind (2000)")
    g.add_argument("--bar-block", type=int, help="round trips per block (100)")
    g.add_argument("--bar-seconds", type=float, help="time budget of the round trips (60)")
    g.add_argument("--diamond-reps", type=int, help="diamond transactions (20)")
    g.add_argument("--diamond-ms", type=float, help="milliseconds of each diamond call (50)")
    g.add_argument(
        "--diamond-work",
        choices=("sleep", "spin"),
        default="sleep",
        help="how a diamond call takes its time (sleep: B and C never compete for the 2 "
        "CPUs with the master and the client; spin: CPU time)",
    )
    return ap


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section {bad[0]!r}; choose from {', '.join(SECTIONS)}")
    positive = ("workers", "blas_threads", "repeats", "ep_m", "ep_chunks", "bar_calls")
    positive += ("bar_block", "diamond_reps", "max_calls")
    for key in positive:
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1")
    for key in ("interval", "cell_seconds", "size_seconds", "bar_seconds", "diamond_ms"):
        if getattr(args, key) <= 0:
            ap.error(f"--{key.replace('_', '-')} must be positive")
    if not 0 < args.probability <= 1:
        ap.error("--probability must be in (0, 1]")
    if args.ep_chunks > 1 << args.ep_m:
        ap.error("--ep-chunks must not exceed 2^m")


def run(args: argparse.Namespace, say: Callable) -> Dict[str, object]:
    """Run the selected sections; the JSON-ready result."""
    from ._bench_ninf_funcs import set_blas_threads

    set_blas_threads(args.blas_threads)  # here, and inherited by the workers and clients
    result: Dict[str, object] = {"machine": machine_info()}
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "sections")}
    sections = args.sections or list(SECTIONS)
    result["sections"] = sections
    result["loadavg"] = {"before": loadavg()}
    t0 = time.perf_counter()
    if "linpack" in sections:
        result["linpack"] = bench_linpack(args, say)
        result["loadavg"]["after_linpack"] = loadavg()
    if "multi" in sections:
        from ._bench_ninf_multi import bench_multi

        result["multi"] = bench_multi(args, say)
        result["loadavg"]["after_multi"] = loadavg()
    if "ep" in sections:
        from ._bench_ninf_multi import bench_ep

        result["ep"] = bench_ep(args, say)
        result["loadavg"]["after_ep"] = loadavg()
    if "bars" in sections:
        from ._bench_ninf_bars import bench_bars

        result["bars"] = bench_bars(args, result.get("linpack"), say)
    result["loadavg"]["after"] = loadavg()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def problems(result: Dict[str, object]) -> List[str]:
    """What went wrong (wrong answers, failed calls); missing a speed bar is not a problem."""
    out = []
    for row in result.get("linpack", {}).get("rows", []):
        for m in ("local", "unblocked", "remote"):
            r = row[m]["max_resid"]
            if r is not None and not r <= RESID_MAX:
                out.append(f"linpack n={row['n']} {m}: residual {r:.3g}")
    for cell in result.get("multi", {}).get("cells", []):
        if cell["errors"] or cell["max_abs_error"] > 1e-6:
            out.append(f"multi n={cell['n']} c={cell['c']}: {cell['errors'] or 'wrong answer'}")
    ep = result.get("ep", {})
    for r in ep.get("local", []) + ep.get("runs", []):
        if not r["verified"] or r["errors"]:
            where = "clients" if r["remote"] else "plain processes"
            out.append(f"ep, {r['c']} {where}: not verified {r['errors'] or ''}")
    if result.get("bars", {}).get("diamond", {}).get("wrong_results"):
        out.append("bars: a diamond transaction returned a wrong result")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rtpool bench ninf``.

    Returns:
        0 when every section ran and every answer was right, 1 when an answer was wrong or a
        call failed, 2 on bad arguments. Missing a speed bar is reported, not an error.
    """
    ap = build_parser()
    args = _settings(ap.parse_args(argv))
    _check_args(ap, args)
    to_stdout = args.json == "-"
    console = None
    if not to_stdout:
        from rich.console import Console

        console = Console(stderr=True)

    def say(text: str) -> None:
        if console is not None:
            console.print(f"[dim]{text}[/]")

    result = run(args, say)
    result["problems"] = problems(result)
    if args.json:
        text = json.dumps(result)
        if to_stdout:
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    if not to_stdout:
        from rich.console import Console

        from ._bench_ninf_render import render

        out = Console()
        if not out.is_terminal:  # a file or a pipe: wide enough for the tables
            out = Console(width=max(out.width, 180))
        render(result, out)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
