"""``rtpool bench latency --rate/--sweep``, ``rtpool bench deadline`` and ``rtpool bench hedge``:
the real-time benchmarks, all open loop (see :mod:`rtpool._bench_open`).

* **Open-loop latency**: no-op tasks submitted one by one at a fixed rate (``--rate``) or at
  10/50/80/95 % of the pool's single-submit saturation rate measured in the same run
  (``--sweep``); latency from each task's intended send time to its result. With
  ``--background-load`` every block runs next to one busy-loop process per core; with
  ``--compare-load`` idle and loaded blocks are interleaved. Percentiles to p99.99, a
  cyclictest-style histogram and a PNG of the distribution.
* **Deadline**: 10 ms CPU-bound tasks with a 50 ms deadline (``options(deadline=0.05)``),
  offered open loop at 80 % of the capacity measured in the same run (closed loop, enough in
  flight); the deadline-miss ratio, measured by the client (completion time from the intended
  send time over the budget) and, when the SDK and master have deadlines, by the futures'
  ``lateness``.
* **Hedge**: one of the workers 10x slower (only its environment has
  ``RTPOOL_BENCH_SLOWDOWN``); all-fast, one-slow and one-slow with ``options(hedge=True)``
  blocks interleaved at the same rate; p99 ratios to all-fast.

Configurations measured against each other run in interleaved blocks (a shuffled order each
round, the system drained between blocks) so a noisy neighbour hits all alike. Every loop is
bounded by a count and a time budget; every process started here is stopped here, by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence

from ._bench_open import (
    COLUMNS,
    CpuHogs,
    GcWatch,
    Outcome,
    cpu_snapshot,
    cpu_use,
    gc_summary,
    histogram_of,
    measure_capacity,
    measure_saturation,
    plot_distribution,
    run_open_loop,
    schedule_ns,
    set_timer_slack_ns,
    summarize,
    text_histogram,
)
from ._bench_stats import percentile, safe_ratio, usable_cpus
from ._bench_tasks import noop, spin, spin_maybe_slow, spin_maybe_slow_hedged

OPEN_P99_9_BAR_US = 3000  # open-loop no-op p99.9 at 50 % of max throughput, idle
DEADLINE_MISS_BAR = 0.001
HEDGE_P99_RATIO_BAR = 2.0
BAR_LEVEL_PCT = 50.0

# Master counters worth a per-block delta (those this master has; newer ones appear later).
STAT_KEYS = (
    "hedges",
    "hedge_wins",
    "copies_cancelled",
    "extra_copies",
    "deadlines_met",
    "deadlines_missed",
    "deadline_dropped",
    "requeued",
)

# (normal, --quick) defaults of the options left unset, per benchmark.
DEFAULTS = {
    "latency": {"count": (20000, 1500), "seconds": (20.0, 1.0), "block_seconds": (2.0, 0.5)},
    "deadline": {"count": (5000, 150), "seconds": (40.0, 2.0), "task_ms": (10.0, 10.0)},
    "hedge": {
        "count": (1000, 100),
        "seconds": (15.0, 1.5),
        "block_seconds": (2.5, 0.5),
        "task_ms": (5.0, 5.0),
    },
}


def _defaults(which: str, args: argparse.Namespace) -> Dict[str, float]:
    """The options of ``DEFAULTS[which]``: as given, else the normal or ``--quick`` default."""
    out = {}
    for key, (normal, quick) in DEFAULTS[which].items():
        value = getattr(args, key, None)
        out[key] = value if value is not None else (quick if args.quick else normal)
    return out


# --- interleaved open-loop blocks ------------------------------------------------------------


@dataclass
class Config:
    """One measured configuration: a rate, a way to submit, idle or next to CPU hogs."""

    label: str
    rate: float
    submit: Callable[[], object]
    loaded: bool = False
    level_pct: float | None = None
    keep: Callable[[object], object] | None = None  # see run_open_loop()
    outcomes: List[Outcome] = field(default_factory=list)
    unsent: int = 0
    blocks: int = 0
    seconds: float = 0.0
    stats: Dict[str, int] = field(default_factory=dict)
    hog_pids: List[int] = field(default_factory=list)
    cpu: List[tuple] = field(default_factory=list)  # (machine busy, total, pool ticks, wall s)
    gc_pauses_ns: List[int] = field(default_factory=list)
    gc_full: int = 0

    def result(self) -> Dict[str, object]:
        """The JSON-ready figures of this configuration."""
        lat = [o.latency_ns for o in self.outcomes]
        lags = [o.lag_ns for o in self.outcomes]
        return {
            "label": self.label,
            "level_pct": self.level_pct,
            "rate_per_s": round(self.rate, 1),
            "loaded": self.loaded,
            "sent": len(self.outcomes),
            "unsent": self.unsent,
            "completed": sum(x is not None for x in lat),
            "errors": _error_counts(self.outcomes),
            "blocks": self.blocks,
            "seconds": round(self.seconds, 3),
            "latency": summarize(histogram_of(lat)),
            "sender_lag": summarize(histogram_of(lags)),
            "master_stats": self.stats,
            "hog_pids": self.hog_pids,
            "cpu": self._cpu(),
            "client_gc": gc_summary(self.gc_pauses_ns, self.gc_full),
        }

    def _cpu(self) -> Dict[str, float | None]:
        if not self.cpu or any(c is None for c in self.cpu):
            return cpu_use(None, None, 0)
        sums = [sum(c[i] for c in self.cpu) for i in range(4)]
        return cpu_use((0, 0, 0), tuple(sums[:3]), sums[3])


def _error_counts(outcomes: Sequence[Outcome]) -> Dict[str, int]:
    errors: Dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            errors[o.error] = errors.get(o.error, 0) + 1
    return errors


def _stat_delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {k: after[k] - before[k] for k in STAT_KEYS if k in before and k in after}


def run_interleaved(
    configs: Sequence[Config],
    count: int,
    seconds: float,
    block_s: float,
    arrivals: str,
    hogs: int,
    stats: Callable[[], Dict[str, int]],
    say: Callable,
    pids: Callable[[], List[int]] = list,
    hog_nice: int = 0,
    seed: int = 7,
) -> None:
    """Run blocks of every configuration, a shuffled order each round, until each has sent
    ``count`` tasks or spent ``seconds`` of schedule. Each block sends open loop for about
    ``block_s``, then waits for its results (loaded blocks keep their hogs until then), so
    the next block starts on an empty pool. ``pids()`` names the worker processes, whose CPU
    use (with this process's) is measured per block."""
    rng = random.Random(seed)
    rounds = 0
    while True:
        todo = [c for c in configs if len(c.outcomes) < count and c.seconds < seconds - 1e-6]
        if not todo:
            return
        rng.shuffle(todo)
        rounds += 1
        say(f"round {rounds}: " + ", ".join(c.label for c in todo))
        for c in todo:
            dur = min(block_s, seconds - c.seconds)
            n = min(count - len(c.outcomes), max(1, math.ceil(c.rate * dur)))
            offsets = schedule_ns(n, c.rate, arrivals, rng)
            gc.collect()
            before = stats()
            hog = contextlib.nullcontext()
            if c.loaded:
                hog = CpuHogs(hogs, lifetime_s=3 * dur + 60, nice=hog_nice)
            with hog, GcWatch() as gcw:
                if c.loaded:
                    c.hog_pids.extend(hog.pids)
                workers = pids()
                cpu0, t0 = cpu_snapshot(workers), time.perf_counter()
                run = run_open_loop(c.submit, offsets, 2 * dur + 1, keep=c.keep)
                cpu1, t1 = cpu_snapshot(workers), time.perf_counter()
            c.outcomes.extend(run.outcomes)
            c.unsent += n - run.sent
            c.gc_pauses_ns.extend(gcw.pauses_ns)
            c.gc_full += gcw.full
            if cpu0 is None or cpu1 is None:
                c.cpu.append(None)
            else:
                c.cpu.append((*(b - a for a, b in zip(cpu0, cpu1)), t1 - t0))
            after = stats()
            for k, v in _stat_delta(before, after).items():
                c.stats[k] = c.stats.get(k, 0) + v
            c.blocks += 1
            c.seconds += dur


def _ratios(num: Dict[str, float], den: Dict[str, float]) -> Dict[str, float | None]:
    return {key[:-3]: safe_ratio(num[key], den[key]) for key, _ in COLUMNS}


def _write_plot(series, path, title, bar=None) -> Dict[str, object]:
    try:
        return {"plot": plot_distribution(series, path, title, bar), "plot_error": None}
    except ImportError as exc:
        return {"plot": None, "plot_error": f"{exc}; pip install 'rtpool[bench]' for plots"}


def _probe(client, fn, args, **opts):
    """``client.options(**opts)`` and one task through it; ``(view, note)``, view None when
    this SDK or this master does not know one of the options."""
    from .errors import SubmitRejected

    try:
        view = client.options(**opts)
    except TypeError as exc:
        return None, f"this SDK has no such option: {exc}"
    try:
        view.submit(fn, *args).result(timeout=60)
    except SubmitRejected as exc:
        return None, f"the master refused the option: {exc}"
    return view, "supported"


def _deadline_missed_type():
    from . import errors

    return getattr(errors, "DeadlineMissedError", None)


# --- open-loop latency -----------------------------------------------------------------------


def bench_open_latency(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench latency --rate R | --sweep`` (see the module's docstring)."""
    import rtpool

    d = _defaults("latency", args)
    mode = "compare" if args.compare_load else ("loaded" if args.background_load else "idle")
    hogs = args.hogs or usable_cpus()
    out: Dict[str, object] = {
        "workers": args.workers,
        "arrivals": args.arrivals,
        "mode": mode,
        "hogs": hogs if mode != "idle" else 0,
        "hog_nice": args.hog_nice,
        "count_per_config": d["count"],
        "seconds_per_config": d["seconds"],
        "block_seconds": d["block_seconds"],
        "timer_slack_1us": set_timer_slack_ns(1000),
    }
    sat_n = args.saturation_tasks or (1000 if args.quick else 10000)
    with rtpool.LocalCluster(workers=args.workers) as cluster:
        cluster.wait_for_workers(args.workers, timeout=30)
        client = cluster.client()

        def submit():
            return client.submit(noop)

        warmup = 200 if args.quick and args.warmup is None else (args.warmup or 2000)
        say(f"latency: warm-up ({warmup} no-op tasks back to back)")
        run_open_loop(submit, [0] * warmup, 30)
        levels: List[tuple] = []
        if args.sweep:
            say(f"latency: saturation, 3 x {sat_n} single submits back to back")
            sat = measure_saturation(submit, sat_n, 60, runs=3)
            out["saturation"] = sat
            if not sat["tasks_per_s"]:
                raise RuntimeError(f"the saturation run finished no task: {sat}")
            for pct in _parse_levels(args.levels):
                levels.append((f"{pct:g}%", pct, sat["tasks_per_s"] * pct / 100))
        else:
            levels.append((f"{args.rate:g}/s", None, args.rate))
        configs = []
        for name, pct, rate in levels:
            for loaded in {"idle": (False,), "loaded": (True,), "compare": (False, True)}[mode]:
                suffix = {"idle": "", "loaded": " loaded", "compare": " loaded" if loaded else ""}
                label = name + suffix[mode]
                configs.append(Config(label, rate, submit, loaded, pct))
        run_interleaved(
            configs,
            d["count"],
            d["seconds"],
            d["block_seconds"],
            args.arrivals,
            hogs,
            cluster.stats,
            say,
            lambda: cluster.worker_pids,
            args.hog_nice,
        )
        if args.sweep:
            say("latency: saturation again (drift check)")
            out["saturation_after"] = measure_saturation(submit, sat_n, 60)
            if mode != "idle":
                with CpuHogs(hogs, lifetime_s=120, nice=args.hog_nice):
                    out["saturation_loaded"] = measure_saturation(submit, sat_n, 60)
    out["configs"] = [c.result() for c in configs]
    _open_ratios(out, mode)
    series = {c.label: histogram_of([o.latency_ns for o in c.outcomes]) for c in configs}
    out["histogram"] = text_histogram(series)
    path = args.plot or os.path.join(
        "bench-results", "latency-sweep.png" if args.sweep else f"latency-{args.rate:g}.png"
    )
    title = f"rtpool open-loop no-op latency, LocalCluster(workers={args.workers}), " + (
        f"% of {out['saturation']['tasks_per_s']:,.0f} tasks/s" if args.sweep else "tasks/s"
    )
    bar = (OPEN_P99_9_BAR_US, "bar: p99.9 at 50%, idle") if args.sweep else None
    out.update(_write_plot(series, path, title, bar))
    return out


def _open_ratios(out: Dict[str, object], mode: str) -> None:
    """Add the ratios to the lowest level, loaded / idle, and the bar to ``out``."""
    rows = out["configs"]
    idle = [r for r in rows if not r["loaded"]]
    loaded = [r for r in rows if r["loaded"]]
    base_rows = idle or loaded
    if len(base_rows) > 1:
        base = base_rows[0]
        out["ratios_to_lowest_level"] = {
            r["label"]: _ratios(r["latency"], base["latency"]) for r in base_rows
        }
    if mode == "compare":
        out["loaded_to_idle"] = {
            i["label"]: _ratios(l_["latency"], i["latency"]) for i, l_ in zip(idle, loaded)
        }
    bar_rows = [r for r in rows if r["level_pct"] == BAR_LEVEL_PCT]
    if bar_rows:
        i = next((r for r in bar_rows if not r["loaded"]), None)
        l_ = next((r for r in bar_rows if r["loaded"]), None)
        p = i["latency"]["p99_9_us"] if i else None
        out["bar"] = {
            "level_pct": BAR_LEVEL_PCT,
            "rate_per_s": (i or l_)["rate_per_s"],
            "p99_9_max_us": OPEN_P99_9_BAR_US,
            "idle_p99_9_us": p,
            "ok": None if p is None else p <= OPEN_P99_9_BAR_US,
            "loaded_p99_9_us": l_["latency"]["p99_9_us"] if l_ else None,
            "loaded_to_idle_p99_9": safe_ratio(l_["latency"]["p99_9_us"], p) if l_ else None,
        }


def _parse_levels(text: str) -> List[float]:
    levels = [float(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) <= 0:
        raise ValueError(f"--levels must be positive percentages, got {text!r}")
    return levels


# --- deadline --------------------------------------------------------------------------------


def bench_deadline(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench deadline`` (see the module's docstring)."""
    import rtpool

    d = _defaults("deadline", args)
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
        view, note = _probe(client, spin, (task_ms,), deadline=deadline_s)
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
        stats = _stat_delta(before, cluster.stats())
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
        out.update(_write_plot(series, args.plot, title, (args.deadline_ms * 1000, "deadline")))
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
        "errors": _error_counts(outcomes),
        "completion": summarize(histogram_of(lat)),
        "sender_lag": summarize(histogram_of([o.lag_ns for o in outcomes])),
        "exec_ms": {
            "p50": _r2(percentile(execs, 50)),
            "p99": _r2(percentile(execs, 99)),
            "max": _r2(max(execs, default=None)),
        },
        "client_misses": client_miss,
        "client_miss_ratio": round(client_miss / n, 5) if n else None,
        "sdk_misses": sdk_miss,
        "sdk_miss_ratio": None if sdk_miss is None or not n else round(sdk_miss / n, 5),
        "lateness_ms": {
            "p50": _r2(percentile(lateness, 50)),
            "max": _r2(max(lateness, default=None)),
        },
        "_lat": lat,
    }


def _r2(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# --- hedge -----------------------------------------------------------------------------------


def _start_worker(cluster, env_extra: Dict[str, str]) -> subprocess.Popen:
    """One more ``rtpool worker`` for ``cluster``, as LocalCluster starts them, with extra
    environment (LocalCluster gives all its workers the same one)."""
    paths = [p or os.getcwd() for p in sys.path]
    env = dict(os.environ)
    env.update(env_extra)
    env["RTPOOL_WORKER_TOKEN"] = cluster.worker_token
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", cluster.address]
    cmd += ["--procs", "1", "--parent-pid", str(os.getpid())]
    return subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )


def _hedge_keep(fut) -> tuple | None:
    """``(exec ms, ms spun)`` of a task that succeeded, else None."""
    if fut.exception() is not None or fut.timings is None:
        return None
    return fut.timings["exec_us"] / 1000, fut.result()


def bench_hedge(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench hedge`` (see the module's docstring)."""
    import rtpool

    from .cluster import _stop_workers

    if args.workers < 2:
        raise ValueError("rtpool bench hedge needs --workers 2 or more (one of them is slow)")
    d = _defaults("hedge", args)
    task_ms = d["task_ms"]
    load = args.load if args.load is not None else 0.3
    window = 4 * args.workers
    set_timer_slack_ns(1000)
    with rtpool.LocalCluster(workers=args.workers - 1) as cluster:
        slow = _start_worker(cluster, {"RTPOOL_BENCH_SLOWDOWN": f"{args.slowdown:g}"})
        try:
            cluster.wait_for_workers(args.workers, timeout=30)
            client = cluster.client()
            say("hedge: warm-up (the master learns each function's execution time)")
            view, note = _probe(client, spin_maybe_slow_hedged, (task_ms, False), hedge=True)
            warm = [0] * (10 if args.quick else 40)
            for sub, fn, fn_args in (
                (client, spin, (task_ms,)),
                (client, spin_maybe_slow, (task_ms, False)),
                (view, spin_maybe_slow_hedged, (task_ms, False)),
            ):
                for _ in range(2 if sub is not None else 0):
                    run_open_loop(lambda s=sub, f=fn, a=fn_args: s.submit(f, *a), warm, 30)
            cap_n = 60 if args.quick else 400
            say(f"hedge: all-fast capacity, {cap_n} tasks, {window} in flight")
            cap = measure_capacity(lambda: client.submit(spin, task_ms), cap_n, window, 60)
            if not cap["tasks_per_s"]:
                raise RuntimeError(f"the capacity run finished too few tasks: {cap}")
            rate = load * cap["tasks_per_s"]
            configs = [
                Config("all fast", rate, lambda: client.submit(spin, task_ms), keep=_hedge_keep),
                Config(
                    "one slow",
                    rate,
                    lambda: client.submit(spin_maybe_slow, task_ms, True),
                    keep=_hedge_keep,
                ),
            ]
            if view is not None:
                configs.append(
                    Config(
                        "one slow + hedge",
                        rate,
                        lambda: view.submit(spin_maybe_slow_hedged, task_ms, True),
                        keep=_hedge_keep,
                    )
                )
            run_interleaved(
                configs,
                d["count"],
                d["seconds"],
                d["block_seconds"],
                args.arrivals,
                0,
                cluster.stats,
                say,
                lambda: [*cluster.worker_pids, slow.pid],
            )
        finally:
            _stop_workers([slow], graceful=True, timeout=5)
    rows = {c.label: c.result() for c in configs}
    for c in configs:
        done = [o.extra for o in c.outcomes if o.extra is not None]
        execs = [exec_ms for exec_ms, _ in done]
        rows[c.label]["exec_ms"] = {
            "p50": _r2(percentile(execs, 50)),
            "max": _r2(max(execs, default=None)),
        }
        # The tasks return the ms they spun: more than task_ms means the slow worker ran it.
        rows[c.label]["slow_tasks"] = sum(spun > task_ms for _, spun in done)
    fast = rows["all fast"]["latency"]
    p99 = {k: r["latency"]["p99_us"] for k, r in rows.items()}
    hedged = safe_ratio(p99.get("one slow + hedge"), fast["p99_us"])
    out = {
        "workers": args.workers,
        "slow_workers": 1,
        "slowdown": args.slowdown,
        "task_ms": task_ms,
        "load": load,
        "arrivals": args.arrivals,
        "capacity": cap,
        "rate_per_s": round(rate, 1),
        "configs": rows,
        "sdk": {"hedge_option": view is not None, "note": note},
        "slow_p99_ratio": safe_ratio(p99["one slow"], fast["p99_us"]),
        "hedge_p99_ratio": hedged,
        "bar": {
            "hedge_p99_ratio_max": HEDGE_P99_RATIO_BAR,
            "ok": None if hedged is None else hedged <= HEDGE_P99_RATIO_BAR,
        },
    }
    if args.plot:
        series = {c.label: histogram_of([o.latency_ns for o in c.outcomes]) for c in configs}
        out.update(_write_plot(series, args.plot, "rtpool hedge: completion time"))
    return out


# --- CLI -------------------------------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Add the options of the real-time benchmarks to ``rtpool bench``'s parser."""
    g = ap.add_argument_group("open-loop latency (latency --rate R, --sweep)")
    g.add_argument(
        "--rate", type=float, default=None, help="no-op tasks/s, open loop, instead of round trips"
    )
    g.add_argument(
        "--sweep",
        action="store_true",
        help="measure the single-submit saturation rate, then run at --levels percent of it",
    )
    g.add_argument("--levels", default="10,50,80,95", help="sweep levels, %% (default 10,50,80,95)")
    g.add_argument(
        "--background-load", action="store_true", help="a CPU hog per core during every block"
    )
    g.add_argument(
        "--compare-load",
        action="store_true",
        help="idle and loaded blocks interleaved; loaded / idle ratios per percentile",
    )
    g.add_argument("--hogs", type=int, default=0, help="CPU hogs (default: one per usable CPU)")
    g.add_argument(
        "--hog-nice",
        type=int,
        default=0,
        help="nice value of the hogs (default 0, the pool's own; 19: below the pool)",
    )
    g.add_argument(
        "--block-seconds", type=float, default=None, help="seconds per block (2; hedge 2.5)"
    )
    g.add_argument(
        "--saturation-tasks",
        type=int,
        default=None,
        help="tasks per saturation run (10000; the median of 3 runs sets the rates)",
    )
    g.add_argument(
        "--arrivals",
        choices=("fixed", "poisson"),
        default="fixed",
        help="intended send times: i / rate (default) or exponential gaps (seeded)",
    )
    g.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help="PNG of the distribution (latency default: bench-results/latency-<rate>.png)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help="a seconds-long smoke run (latency --rate/--sweep, deadline, hedge)",
    )
    g = ap.add_argument_group("deadline and hedge")
    g.add_argument(
        "--task-ms", type=float, default=None, help="ms of CPU per task (deadline 10, hedge 5)"
    )
    g.add_argument("--deadline-ms", type=float, default=50.0, help="deadline (default 50 ms)")
    g.add_argument(
        "--load",
        type=float,
        default=None,
        help="offered rate / capacity measured in the run (deadline 0.8, hedge 0.3)",
    )
    g.add_argument(
        "--slowdown", type=float, default=10.0, help="hedge: the slow worker's factor (10)"
    )


def is_open_loop(args: argparse.Namespace) -> bool:
    """True when ``rtpool bench latency`` was asked for the open-loop mode."""
    return args.rate is not None or args.sweep or args.background_load or args.compare_load


def run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Run ``latency`` (open loop), ``deadline`` or ``hedge`` as ``args`` say; print the result.

    Returns:
        0 when every task sent got its result (a late one counts), 1 otherwise.
    """
    import json

    from ._bench_stats import machine_info

    if args.which == "latency" and args.rate is None and not args.sweep:
        ap.error("open-loop latency needs --rate R or --sweep")
    if args.rate is not None and args.rate <= 0:
        ap.error("--rate must be positive")
    if args.sweep and args.rate:
        ap.error("give --rate or --sweep, not both")
    try:
        _parse_levels(args.levels)
    except ValueError as exc:
        ap.error(str(exc))

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    result: Dict[str, object] = {"machine": machine_info()}
    if args.which == "latency":
        section, key = bench_open_latency(args, say), "open_loop"
    elif args.which == "deadline":
        section, key = bench_deadline(args, say), "deadline"
    else:
        section, key = bench_hedge(args, say), "hedge"
    result[key] = section
    if args.json:
        print(json.dumps(result))
    else:
        from rich.console import Console

        from . import _bench_rt_render as rr

        render = {"open_loop": rr.render_open_latency, "deadline": rr.render_deadline}
        render.get(key, rr.render_hedge)(section, Console())
    return 0 if _all_answered(key, section) else 1


def _all_answered(key: str, s: Dict[str, object]) -> bool:
    """Every task sent got its result, and none failed (but for missing a deadline)."""
    if key == "deadline":
        rows = [s]
    else:
        rows = list(s["configs"].values()) if key == "hedge" else s["configs"]
    return all(
        r["completed"] == r["sent"] and not set(r["errors"]) - {"DeadlineMissedError"} for r in rows
    )
