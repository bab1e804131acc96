"""What the sections of ``rtpool bench ninf`` share: the bars, the cluster serving the
benchmark functions, the Linpack system and its three solvers, small statistics."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Callable, Dict, List, Sequence

from ..stats import percentile

SERVE = ("rtpool.lib.linalg", "rtpool_bench.ninf.funcs")

LINPACK_WITHIN = 0.10  # remote Mflops >= (1 - 0.10) x local Mflops
DMMUL_RATIO_BAR = 1.5  # dmmul p50 / no-op task p50
DIAMOND_BAR = 1.1  # makespan <= 1.1 x (critical path + 2 RTT)
RESID_MAX = 100.0  # LINPACK's normalized residual of a correct solve is O(1)
CALL_TIMEOUT_S = 120.0

# (normal, --quick) defaults of the options left unset.


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


def start_cluster(workers: int, blas_threads: int):
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


def linpack_methods(client, n: int, timings: List | None = None) -> Dict[str, Callable]:
    """The three solvers, each ``(A, b) -> x``; the remote one appends its call's
    ``Future.timings`` to ``timings``."""
    from rtpool.lib import linalg

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
