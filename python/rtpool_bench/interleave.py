"""Interleaved open-loop blocks shared by ``rtpool bench latency --rate/--sweep``, ``deadline``
and ``hedge``: configurations measured against each other run in blocks, a shuffled order
each round, the system drained between blocks, so a noisy neighbour hits all alike."""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Dict, List, Sequence

from .cpu import CpuHogs, cpu_snapshot, cpu_use
from .openloop import (
    COLUMNS,
    GcWatch,
    Outcome,
    gc_summary,
    histogram_of,
    plot_distribution,
    run_open_loop,
    schedule_ns,
    summarize,
)
from .stats import safe_ratio

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


def defaults(which: str, args: argparse.Namespace) -> Dict[str, float]:
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
    #: Entered around each block's sending (e.g. ``client.realtime_thread``), or None.
    around: Callable[[], ContextManager] | None = None

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
            "errors": error_counts(self.outcomes),
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


def error_counts(outcomes: Sequence[Outcome]) -> Dict[str, int]:
    errors: Dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            errors[o.error] = errors.get(o.error, 0) + 1
    return errors


def stat_delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
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
            around = c.around() if c.around is not None else contextlib.nullcontext()
            with hog, GcWatch() as gcw, around:
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
            for k, v in stat_delta(before, after).items():
                c.stats[k] = c.stats.get(k, 0) + v
            c.blocks += 1
            c.seconds += dur


def ratios(num: Dict[str, float], den: Dict[str, float]) -> Dict[str, float | None]:
    return {key[:-3]: safe_ratio(num[key], den[key]) for key, _ in COLUMNS}


def write_plot(series, path, title, bar=None) -> Dict[str, object]:
    try:
        return {"plot": plot_distribution(series, path, title, bar), "plot_error": None}
    except ImportError as exc:
        return {"plot": None, "plot_error": f"{exc}; pip install 'rtpool[bench]' for plots"}


def probe(client, fn, args, **opts):
    """``client.options(**opts)`` and one task through it; ``(view, note)``, view None when
    this SDK or this master does not know one of the options."""
    from rtpool.errors import SubmitRejected

    try:
        view = client.options(**opts)
    except TypeError as exc:
        return None, f"this SDK has no such option: {exc}"
    try:
        view.submit(fn, *args).result(timeout=60)
    except SubmitRejected as exc:
        return None, f"the master refused the option: {exc}"
    return view, "supported"


def deadline_missed_type():
    from rtpool import errors

    return getattr(errors, "DeadlineMissedError", None)


def round2(x: float | None) -> float | None:
    """``x`` to 2 decimals (None stays None)."""
    return None if x is None else round(x, 2)
