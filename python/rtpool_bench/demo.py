"""``rtpool demo``: the factorization benchmark of the thesis rtpool grew out of, in one run.

Each task finds the smallest factor of a semiprime ``p * q`` by trial division (the thesis'
"Code 5"), which costs about ``p`` loop iterations. The primes come from a seeded generator, so
a seed always gives the same task list; ``p`` is drawn from a fixed range chosen so that one
task takes about 10 ms in CPython on the 2-vCPU VM rtpool is developed on (``--calibrate``
prints the range that would give 10 ms on another machine; the demo itself never changes the
range, so its task list does not depend on the machine).

One run measures, on the same tasks:

1. sequential: every task in this process, one after another;
2. the parallel ceiling: the tasks split evenly over N plain processes (fork, no pool), timed
   from starting the processes to having every result back;
3. rtpool: a ``LocalCluster(workers=N)``, all tasks in one package, timed from ``submit_many``
   to the last result, every result checked against the sequential run;
4. start-up: a fresh ``LocalCluster`` from construction to the first result of a no-op task.

Steps 1-3 are repeated ``--rounds`` times (default 3; 2 and 3 in alternating order) and the
best of each is reported, as the thesis did; the per-round figures are in the JSON. It prints
the makespans, speed-ups and the per-task measurement points (median and p90) of the best
rtpool round.

``smallest_factor`` lives here, in an importable module, so workers import it by reference.
This module imports only the standard library at the top, so that import is cheap.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Dict, List, Sequence, Tuple

# p (the smaller prime) is drawn uniformly from this range. Trial division costs ~p iterations;
# on the 2-vCPU AMD EPYC VM rtpool is developed on, CPython 3.11 takes 77 ns per iteration when
# the VM is quiet and 90-110 ns under the neighbours' usual load, so a task takes 8-11 ms
# (about 10 ms). Changing the range changes every task list: keep it fixed, and use
# --calibrate to see what another machine would need.
P_MIN = 100_000
P_MAX = 125_000
# q is much larger than p, so p is always the smallest factor.
Q_MIN = 4 * P_MAX
Q_MAX = 64 * P_MAX

TARGET_TASK_MS = 10.0
WARMUP_SEED = 0x5EED
MAKESPAN_BAR = 1.05  # rtpool makespan / parallel ceiling
STARTUP_BAR_S = 0.5  # LocalCluster() to the first result

TIMING_KEYS = (
    "serialize_us",
    "queue_us",
    "worker_us",
    "exec_us",
    "wait_us",
    "flush_us",
    "deserialize_us",
    "total_us",
)

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def smallest_factor(n: int) -> int:
    """Return the smallest factor of ``n`` (``n`` itself if prime) by trial division.

    The thesis' task: deliberately naive, so its cost is predictable (about ``p`` iterations
    for a semiprime ``p * q`` with ``p <= q``).

    Args:
        n: An integer >= 2.

    Returns:
        The smallest ``k >= 2`` that divides ``n``.
    """
    k = 2
    while k * k <= n:
        if n % k == 0:
            return k
        k += 1
    return n


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for ``n < 3.3e24`` (the first 12 primes as bases)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(n: int) -> int:
    """The smallest prime ``>= n``."""
    n = max(2, n)
    while not is_prime(n):
        n += 1
    return n


def semiprimes(count: int, seed: int) -> List[Tuple[int, int]]:
    """``count`` pairs ``(p, q)`` of primes with ``p < q``, the same for the same seed.

    Args:
        count: How many pairs.
        seed: Seed of the ``random.Random`` that draws them.

    Returns:
        A list of ``(p, q)``; the task of pair ``i`` is ``smallest_factor(p * q) == p``.
    """
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        p = next_prime(rng.randrange(P_MIN, P_MAX))
        q = next_prime(rng.randrange(Q_MIN, Q_MAX))
        pairs.append((p, q))
    return pairs


def calibrate(target_ms: float = TARGET_TASK_MS, probes: int = 7) -> Dict[str, float]:
    """Measure this machine's trial-division speed and the ``p`` that would take ``target_ms``.

    Returns:
        ``ns_per_iteration`` (best of ``probes`` runs), ``p_for_target`` and the expected
        task time of the demo's fixed range on this machine.
    """
    p = next_prime(P_MIN)
    n = p * next_prime(Q_MIN)
    best = float("inf")
    for _ in range(probes):
        t0 = time.perf_counter_ns()
        smallest_factor(n)
        best = min(best, time.perf_counter_ns() - t0)
    ns_per_iter = best / p
    return {
        "ns_per_iteration": round(ns_per_iter, 1),
        "p_for_target": int(target_ms * 1e6 / ns_per_iter),
        "target_ms": target_ms,
        "demo_range_ms": [
            round(P_MIN * ns_per_iter / 1e6, 2),
            round(P_MAX * ns_per_iter / 1e6, 2),
        ],
    }


# --- the three ways to run the tasks ---------------------------------------------------------


def run_sequential(
    numbers: Sequence[int], progress=None, label: str = "sequential"
) -> Tuple[float, List[int], List[float]]:
    """Run every task here, one after another.

    Returns:
        ``(seconds, factors, per-task microseconds)``.
    """
    factors, per_task_us = [], []
    task = progress.add_task(label, total=len(numbers)) if progress else None
    t0 = time.perf_counter()
    for n in numbers:
        t = time.perf_counter_ns()
        factors.append(smallest_factor(n))
        per_task_us.append((time.perf_counter_ns() - t) / 1000)
        if progress:
            progress.advance(task)
    return time.perf_counter() - t0, factors, per_task_us


def _ceiling_child(numbers: Sequence[int], conn) -> None:
    conn.send([smallest_factor(n) for n in numbers])
    conn.close()


def run_ceiling(numbers: Sequence[int], procs: int, timeout_s: float) -> Tuple[float, List[int]]:
    """The parallel ceiling: ``numbers`` split evenly into ``procs`` contiguous chunks, one
    plain process each (fork where available), timed from the first start to the last result.

    Returns:
        ``(seconds, factors in input order)``.

    Raises:
        TimeoutError: A process did not deliver within ``timeout_s``.
    """
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    bounds = [len(numbers) * i // procs for i in range(procs + 1)]
    chunks = [list(numbers[bounds[i] : bounds[i + 1]]) for i in range(procs)]
    pipes = [ctx.Pipe(duplex=False) for _ in chunks]
    children = [
        ctx.Process(target=_ceiling_child, args=(chunk, w), daemon=True)
        for chunk, (_, w) in zip(chunks, pipes)
    ]
    try:
        t0 = time.perf_counter()
        for child in children:
            child.start()
        parts = []
        for r, _ in pipes:
            if not r.poll(max(0.0, t0 + timeout_s - time.perf_counter())):
                raise TimeoutError(f"the parallel ceiling did not finish in {timeout_s:.0f} s")
            parts.append(r.recv())
        for child in children:
            child.join(timeout=5)
        elapsed = time.perf_counter() - t0
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(timeout=5)
    return elapsed, [f for part in parts for f in part]


def run_rtpool(
    numbers: Sequence[int], workers: int, timeout_s: float, progress=None, label: str = "rtpool"
) -> Dict[str, object]:
    """Run all tasks as one package on a ``LocalCluster(workers=workers)``.

    The cluster is started and its workers warmed up (each imports this module once) before
    the clock starts; the makespan runs from ``submit_many`` to the last result.

    Returns:
        ``makespan_s``, ``submit_many_us`` (the call itself: pickling, futures, encoding,
        sending), ``factors`` (input order) and ``timings`` (one dict per task).
    """
    import rtpool

    with rtpool.LocalCluster(workers=workers) as cluster:
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            # Warm up with tasks like the real ones: each worker imports this module, and its
            # adaptive prefetch (an EMA of task time) starts from ~10 ms tasks. Sub-ms warm-up
            # tasks would leave it at its maximum, so that the first ~65 real tasks went to
            # each worker at once.
            warm = [p * q for p, q in semiprimes(2 * workers, WARMUP_SEED)]
            client.submit_many(smallest_factor, warm).results(timeout=30)
            task = progress.add_task(label, total=len(numbers)) if progress else None
            cpu0 = _process_cpu_s()
            t0 = time.perf_counter_ns()
            pkg = client.submit_many(smallest_factor, numbers)
            t_submitted = time.perf_counter_ns()
            for _ in pkg.as_completed(timeout=timeout_s):
                if progress:
                    progress.advance(task)
            makespan_ns = time.perf_counter_ns() - t0
            cpu1 = _process_cpu_s()
            factors = [f.result() for f in pkg.futures]
            timings = [dict(getattr(f, "timings", None) or {}) for f in pkg.futures]
    return {
        "makespan_s": makespan_ns / 1e9,
        "submit_many_us": (t_submitted - t0) / 1000,
        # This process is the client and the embedded master: CPU it took from the workers.
        "client_master_cpu_s": None if cpu0 is None else cpu1 - cpu0,
        "factors": factors,
        "timings": timings,
    }


def _process_cpu_s() -> float | None:
    """User + system CPU seconds of this process, all threads (None where unknown)."""
    try:
        import resource
    except ImportError:
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_startup(workers: int, timeout_s: float = 30.0) -> Dict[str, float]:
    """Time a fresh ``LocalCluster(workers=workers)`` from construction to a no-op's result.

    Returns:
        ``start_to_first_result_s`` and ``shutdown_s`` (leaving the ``with`` block).
    """
    import rtpool

    from .tasks import noop

    t0 = time.perf_counter()
    with rtpool.LocalCluster(workers=workers) as cluster:
        with cluster.client() as client:
            client.submit(noop).result(timeout=timeout_s)
            t1 = time.perf_counter()
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    return {"start_to_first_result_s": round(t1 - t0, 4), "shutdown_s": round(t3 - t2, 4)}


# --- measurement points ----------------------------------------------------------------------


def derive_points(
    timings: Sequence[Dict[str, float]], package_tasks: int = 1
) -> Dict[str, List[float]]:
    """Per-task measurement points: the SDK's keys plus the derived transfer times.

    The master only sees when it sent an assignment and when the result arrived (worker_us);
    the worker knows how long it waited, ran and held the result (wait_us, exec_us, flush_us).
    What is left of worker_us is the two master<->worker hops, split evenly. The client's
    serialize_us is each task's share of its package's pickling, and total_us starts before the
    whole package is pickled, so the package's pickling is ``serialize_us * package_tasks``.

    * transfer_to_worker = (worker - exec - wait - flush) / 2 + wait
    * client_hops = total - serialize * package_tasks - queue - worker - deserialize: what the
      client's own figures leave over: building the futures, encoding and sending the SUBMIT
      frame, client->master, master->client, and handing the result to its future
    * result_transfer = (worker - exec - wait - flush) / 2 + flush + client_hops
    * overhead = total - queue - exec: what running the task remotely added, queueing aside

    Args:
        timings: One ``Future.timings`` dict per task (missing keys are skipped).
        package_tasks: Tasks in the package these tasks were submitted in.
    """
    points: Dict[str, List[float]] = {k: [] for k in TIMING_KEYS}
    for extra in ("transfer_to_worker_us", "client_hops_us", "result_transfer_us", "overhead_us"):
        points[extra] = []
    for t in timings:
        for k in TIMING_KEYS:
            if t.get(k) is not None:
                points[k].append(float(t[k]))
        if any(t.get(k) is None for k in TIMING_KEYS):
            continue
        hops = max(0.0, t["worker_us"] - t["exec_us"] - t["wait_us"] - t["flush_us"])
        client_hops = max(
            0.0,
            t["total_us"]
            - t["serialize_us"] * package_tasks
            - t["queue_us"]
            - t["worker_us"]
            - t["deserialize_us"],
        )
        points["transfer_to_worker_us"].append(hops / 2 + t["wait_us"])
        points["client_hops_us"].append(client_hops)
        points["result_transfer_us"].append(hops / 2 + t["flush_us"] + client_hops)
        points["overhead_us"].append(max(0.0, t["total_us"] - t["queue_us"] - t["exec_us"]))
    return points


# --- the run ---------------------------------------------------------------------------------


def run_demo(
    workers: int, tasks: int, seed: int, rounds: int = 3, console=None
) -> Dict[str, object]:
    """Run the whole demo and return every figure as a JSON-ready dict.

    Each round runs sequential, then ceiling and rtpool back to back, ceiling first in odd
    rounds and rtpool first in even ones (rtpool on a fresh cluster, closed before any ceiling
    process is forked). Times are the best of
    the rounds, as in the thesis ("3 runs, the best result taken"); the makespan/ceiling ratio
    is taken within each round (the two ran back to back under the same background load) and
    its median over rounds is the figure judged against the bar. ``per_round`` keeps it all.

    Args:
        workers: N, the number of worker processes (and of ceiling processes).
        tasks: How many semiprimes.
        seed: Seed of the semiprime list.
        rounds: How many times to run the three.
        console: A rich console for progress bars (``None``: no progress output).
    """
    from .stats import machine_info, median_p90, safe_ratio

    info = {
        "machine": machine_info(),
        "workers": workers,
        "tasks": tasks,
        "seed": seed,
        "rounds": rounds,
    }
    pairs = semiprimes(tasks, seed)
    numbers = [p * q for p, q in pairs]
    expected = [p for p, _ in pairs]
    per_round, best_rt, local_us, wrong = [], None, [], 0
    for r in range(rounds):
        tag = f"round {r + 1}/{rounds}"
        with _progress(console) as progress:
            seq_s, seq_factors, us = run_sequential(numbers, progress, f"sequential, {tag}")
        local_us.extend(us)
        timeout_s = max(60.0, 20 * seq_s)
        # Alternate which of the two goes first (ceiling first in odd rounds), so a drift in
        # the machine's background load does not always favour the same one.
        for what in ("ceiling", "rtpool") if r % 2 == 0 else ("rtpool", "ceiling"):
            if what == "ceiling":
                _say(console, f"parallel ceiling, {tag}: {workers} plain processes ...")
                ceil_s, ceil_factors = run_ceiling(numbers, workers, timeout_s)
            else:
                with _progress(console) as progress:
                    rt = run_rtpool(numbers, workers, timeout_s, progress, f"rtpool, {tag}")
        wrong += sum(a != b for a, b in zip(rt["factors"], expected))
        wrong += len(expected) - len(rt["factors"])
        wrong += seq_factors != expected or ceil_factors != expected
        per_round.append(
            {
                "sequential_s": round(seq_s, 4),
                "ceiling_s": round(ceil_s, 4),
                "rtpool_makespan_s": round(rt["makespan_s"], 4),
                "makespan_over_ceiling": safe_ratio(rt["makespan_s"], ceil_s),
                "first": "ceiling" if r % 2 == 0 else "rtpool",
            }
        )
        if best_rt is None or rt["makespan_s"] < best_rt["makespan_s"]:
            best_rt = rt
    _say(console, "start-up: a fresh LocalCluster to its first result ...")
    startup = run_startup(workers)

    seq_s = min(x["sequential_s"] for x in per_round)
    ceil_s = min(x["ceiling_s"] for x in per_round)
    makespan = best_rt["makespan_s"]
    speedup = safe_ratio(seq_s, makespan)
    points = derive_points(best_rt["timings"], package_tasks=tasks)
    serialize = points["serialize_us"]
    figures = {
        "sequential_s": seq_s,
        "ceiling_s": ceil_s,
        "rtpool_makespan_s": round(makespan, 4),
        "ceiling_speedup": safe_ratio(seq_s, ceil_s),
        "speedup": speedup,
        "efficiency": None if speedup is None else round(speedup / workers, 3),
        # Judged: rtpool vs the ceiling of the same round (back to back, same background
        # load), the median over rounds. Best vs best may pair runs from different load.
        "makespan_over_ceiling": _median([x["makespan_over_ceiling"] for x in per_round]),
        "makespan_over_ceiling_best": safe_ratio(makespan, ceil_s),
        "mean_task_ms": round(seq_s / tasks * 1000, 3),
        "package_serialize_us": round(serialize[0] * tasks, 1) if serialize else None,
        "submit_many_us": round(best_rt["submit_many_us"], 1),
        "client_master_cpu_s": _round(best_rt["client_master_cpu_s"], 3),
        **startup,
    }
    info.update(figures)
    info.update(
        {
            "per_round": per_round,
            "prime_range": [P_MIN, P_MAX],
            "results_verified": wrong == 0,
            "mismatches": int(wrong),
            "semiprimes": numbers,
            "rtpool_factors": best_rt["factors"],
            "timings_us": {k: median_p90(v) for k, v in points.items()},
            "local_exec_us": median_p90(local_us),
            "missing_timing_keys": [k for k in TIMING_KEYS if len(points[k]) < tasks],
            "bars": {
                "makespan_over_ceiling_max": MAKESPAN_BAR,
                "makespan_ok": _at_most(figures["makespan_over_ceiling"], MAKESPAN_BAR),
                "start_to_first_result_max_s": STARTUP_BAR_S,
                "startup_ok": startup["start_to_first_result_s"] < STARTUP_BAR_S,
            },
        }
    )
    return info


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _median(values: Sequence[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[(len(known) - 1) // 2] if known else None


def _at_most(value: float | None, bar: float) -> bool | None:
    return None if value is None else value <= bar


def _say(console, text: str) -> None:
    if console is not None:
        console.print(f"[dim]{text}[/]")


class _NoProgress:
    def __enter__(self):
        return None  # so `if progress:` skips the updates

    def __exit__(self, *exc):
        return None


def _progress(console):
    """A transient rich progress bar on ``console`` (a no-op context without a console)."""
    if console is None:
        return _NoProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
