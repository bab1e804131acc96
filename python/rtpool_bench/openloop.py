"""Open-loop load and distributions: the machinery of the open-loop benchmarks (CPU use and
hogs are in :mod:`rtpool_bench.cpu`).

An **open-loop** sender submits task ``i`` at its intended time ``t0 + i / rate`` whatever
happened to the earlier tasks, and a task's latency runs from that *intended* time to its result
arriving at the client. A sender that falls behind (a GC pause, the GIL, a slow ``submit``)
therefore counts its own lag in every late task: no coordinated omission, unlike a closed loop,
which waits for each answer and so sends less exactly when the system is slow.

The arrival instant of a result is the client's own: ``Future.timings["total_us"]`` runs from
the start of ``submit`` to the moment the client's reader thread set the result, so no thread
waiting in ``result()`` (and its wake-up) is on the measured path.

Every loop here is bounded by a count and a time budget.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import random
import statistics
import sys
import threading
import time
from collections import deque
from typing import Callable, Dict, List, NamedTuple, Sequence

from .stats import new_histogram, record_ns

RESULT_TIMEOUT_S = 60.0

# Percentiles of the open-loop benchmarks: HdrHistogram's, up to p99.99.
RT_PERCENTILES = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p99_9", 99.9),
    ("p99_99", 99.99),
)
# Percentile columns of the tables, with max: (JSON key, column title).
COLUMNS = (
    ("p50_us", "p50"),
    ("p90_us", "p90"),
    ("p99_us", "p99"),
    ("p99_9_us", "p99.9"),
    ("p99_99_us", "p99.99"),
    ("max_us", "max"),
)


class Outcome(NamedTuple):
    """One task's end. Only these figures are kept, never the future: a benchmark that kept a
    block's futures alive until its end would make the client's own garbage collections, and
    so its tail, longer than a real client's.

    Fields: latency from the intended send time (ns; None if the result never came), the
    sender's lag behind the schedule (ns), the exception's type name (or None), what
    :func:`run_open_loop`'s ``keep`` took from the future (None without it), and when the
    result reached the client (perf_counter ns; None if it never came).
    """

    latency_ns: int | None
    lag_ns: int
    error: str | None
    extra: object
    done_ns: int | None


class OpenLoopRun(NamedTuple):
    """What :func:`run_open_loop` sent and got back."""

    outcomes: List[Outcome]
    sent: int
    first_send_ns: int
    last_send_ns: int


def set_timer_slack_ns(ns: int = 1000) -> bool:
    """Shrink this thread's timer slack (Linux ``PR_SET_TIMERSLACK``; default 50 us), so the
    sender's sleeps end closer to the intended send times. Best effort; True if it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(29, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def schedule_ns(n: int, rate: float, arrivals: str, rng: random.Random) -> List[int]:
    """Intended send offsets (ns from the start) of ``n`` tasks at ``rate`` tasks/s.

    Args:
        arrivals: ``"fixed"``: ``i / rate``; ``"poisson"``: exponential gaps of mean
            ``1 / rate`` (seeded by ``rng``), which bunches arrivals as independent clients do.
    """
    if arrivals == "fixed":
        return [round(i * 1e9 / rate) for i in range(n)]
    out, t = [], 0.0
    for _ in range(n):
        out.append(round(t))
        t += rng.expovariate(rate) * 1e9
    return out


def run_open_loop(
    submit: Callable[[], object],
    offsets_ns: Sequence[int],
    max_seconds: float,
    keep: Callable[[object], object] | None = None,
    timeout_s: float = RESULT_TIMEOUT_S,
) -> OpenLoopRun:
    """Submit one task per offset at ``start + offset``, never waiting for results, then wait
    for the last results.

    The sender sleeps until a task's intended time; when it is behind it submits at once (and
    the lag counts in that task's latency). It gives up on the tasks it has not sent after
    ``max_seconds``. Each result is measured as it arrives, by a done-callback in the client's
    reader thread (after the client stamped its arrival, so the callback is not in the
    measurement), and the future is dropped.

    Args:
        submit: Submits one task and returns its future.
        offsets_ns: Intended send times, ns after the start, non-decreasing.
        max_seconds: Time budget of the sending.
        keep: Called with each finished future; what it returns is the outcome's ``extra``.
        timeout_s: How long to wait for the results after the last send; a task still
            without one then has ``latency_ns`` None and ``"TimeoutError"``.
    """
    lock = threading.Lock()
    all_done = threading.Event()
    pending: Dict[int, tuple] = {}
    outcomes: List[Outcome] = []
    sending = [True]

    def on_done(i: int, fut) -> None:
        intended, t = pending[i]
        try:
            timings = None if fut.cancelled() else fut.timings
            error = None
            if fut.cancelled():
                error = "CancelledError"
            elif fut.exception() is not None:
                error = type(fut.exception()).__name__
            done = None if timings is None else t + round(timings["total_us"] * 1000)
            latency = None if done is None else done - intended
            extra = None if keep is None else keep(fut)
            outcomes.append(Outcome(latency, max(0, t - intended), error, extra, done))
        finally:
            with lock:
                del pending[i]
                if not pending and not sending[0]:
                    all_done.set()

    perf_ns, sleep = time.perf_counter_ns, time.sleep
    start = perf_ns() + 1_000_000  # 1 ms ahead: the first task is not born late
    stop = start + int(max_seconds * 1e9)
    first = last = n = 0
    fut = None
    for i, offset in enumerate(offsets_ns):
        intended = start + offset
        now = perf_ns()
        if now > stop:
            break
        if intended > now:
            sleep((intended - now) / 1e9)
        t = perf_ns()
        fut = submit()
        with lock:
            pending[i] = (intended, t)  # before the callback, which may run at once
        fut.add_done_callback(functools.partial(on_done, i))
        first, last, n = first or t, t, n + 1
    del fut
    with lock:
        sending[0] = False
        if not pending:
            all_done.set()
    all_done.wait(timeout_s)
    with lock:
        late = list(pending.items())
        pending.clear()
    for _, (intended, t) in late:
        outcomes.append(Outcome(None, max(0, t - intended), "TimeoutError", None, None))
    return OpenLoopRun(outcomes, n, first, last)


def measure_saturation(
    submit: Callable[[], object], n: int, max_seconds: float, runs: int = 1
) -> Dict[str, object]:
    """The rate the pool sustains for single submits: ``n`` tasks sent back to back (an open
    loop at an infinite rate), completed tasks / (last result - first send); the median of
    ``runs`` runs, so that one noisy second does not set it.

    Returns:
        ``tasks_per_s`` and ``send_tasks_per_s`` (how fast the sender alone went: when the two
        are close, the client is the bottleneck), medians, and ``runs``: each run's ``tasks``
        (completed), ``seconds``, ``tasks_per_s``, ``send_tasks_per_s`` and ``errors``.
    """
    results = [_saturation_run(submit, n, max_seconds) for _ in range(runs)]
    rates = [r["tasks_per_s"] for r in results if r["tasks_per_s"]]
    sends = [r["send_tasks_per_s"] for r in results if r["send_tasks_per_s"]]
    return {
        "tasks_per_s": statistics.median(rates) if rates else None,
        "send_tasks_per_s": statistics.median(sends) if sends else None,
        "runs": results,
    }


def _saturation_run(submit: Callable[[], object], n: int, max_seconds: float) -> Dict:
    run = run_open_loop(submit, [0] * n, max_seconds)
    done = [o.done_ns for o in run.outcomes if o.done_ns is not None]
    seconds = (max(done) - run.first_send_ns) / 1e9 if done else float("nan")
    send_s = (run.last_send_ns - run.first_send_ns) / 1e9
    return {
        "tasks": len(done),
        "seconds": round(seconds, 4),
        "tasks_per_s": round(len(done) / seconds, 1) if done else None,
        "send_tasks_per_s": round(run.sent / send_s, 1) if send_s > 0 else None,
        "errors": sum(o.error is not None for o in run.outcomes),
    }


def measure_capacity(
    submit: Callable[[], object], n: int, window: int, max_seconds: float
) -> Dict[str, object]:
    """Closed-loop saturation: keep ``window`` tasks in flight (submitted one by one) for ``n``
    tasks; the rate of results in the steady part (the first and last ``window`` results, the
    ramp-up and the drain, are left out).

    Returns:
        ``tasks``, ``window``, ``tasks_per_s`` (None when too few results) and
        ``steady_seconds`` (the span it was measured over).
    """
    inflight: deque = deque()
    done: List[int] = []
    sent, end = 0, time.monotonic() + max_seconds
    perf_ns = time.perf_counter_ns
    while (sent < n and time.monotonic() < end) or inflight:
        while len(inflight) < window and sent < n and time.monotonic() < end:
            t = perf_ns()
            inflight.append((t, submit()))
            sent += 1
        t, fut = inflight.popleft()
        fut.exception(RESULT_TIMEOUT_S)
        timings = fut.timings
        if timings is not None:
            done.append(t + round(timings["total_us"] * 1000))
    done.sort()
    steady = done[window : len(done) - window]
    rate, seconds = None, None
    if len(steady) >= 2 and steady[-1] > steady[0]:
        seconds = (steady[-1] - steady[0]) / 1e9
        rate = round((len(steady) - 1) / seconds, 1)
    return {
        "tasks": sent,
        "window": window,
        "tasks_per_s": rate,
        "steady_seconds": None if seconds is None else round(seconds, 3),
    }


class GcWatch:
    """Garbage-collector pauses of this process while active (``gc.callbacks``): a pause of the
    client's collector delays every task sent or answered meanwhile."""

    def __init__(self) -> None:
        self.pauses_ns: List[int] = []
        self.full = 0
        self._t0 = 0

    def _on_gc(self, phase: str, info: Dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        elif self._t0:
            self.pauses_ns.append(time.perf_counter_ns() - self._t0)
            self.full += info.get("generation") == 2
            self._t0 = 0

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._on_gc)


def gc_summary(pauses_ns: Sequence[int], full: int) -> Dict[str, float]:
    """``count``, ``full`` (generation 2), ``total_ms`` and ``max_ms`` of GC pauses."""
    return {
        "count": len(pauses_ns),
        "full": full,
        "total_ms": round(sum(pauses_ns) / 1e6, 2),
        "max_ms": round(max(pauses_ns, default=0) / 1e6, 2),
    }


# --- distributions ---------------------------------------------------------------------------


def summarize(histogram) -> Dict[str, float]:
    """``count``, ``min_us``, ``mean_us``, ``p50_us`` ... ``p99_99_us``, ``max_us`` of a histogram
    of microseconds (HdrHistogram's percentiles: the highest value equivalent to the bucket)."""
    n = int(histogram.get_total_count())
    out: Dict[str, float] = {"count": n}
    out["min_us"] = int(histogram.get_min_value()) if n else None
    out["mean_us"] = round(float(histogram.get_mean_value()), 1) if n else None
    for name, pct in RT_PERCENTILES:
        out[f"{name}_us"] = int(histogram.get_value_at_percentile(pct)) if n else None
    out["max_us"] = int(histogram.get_max_value()) if n else None
    return out


def histogram_of(latencies_ns: Sequence[int | None]):
    """An HdrHistogram (us) of the latencies that are not None."""
    h = new_histogram()
    for x in latencies_ns:
        if x is not None:
            record_ns(h, x)
    return h


def log_edges_us(max_us: float) -> List[int]:
    """Bucket edges 10, 20, 50, 100, 200, 500, ... us, up to the first edge above ``max_us``."""
    edges, decade = [], 10
    while True:
        for m in (1, 2, 5):
            edges.append(m * decade)
            if m * decade > max_us:
                return edges
        decade *= 10


def bucket_counts(histogram, edges: Sequence[int]) -> List[int]:
    """Counts per bucket ``[edges[i-1], edges[i])`` (the first bucket starts at 0)."""
    counts = [0] * len(edges)
    for item in histogram.get_recorded_iterator():
        value = histogram.get_lowest_equivalent_value(item.value_iterated_to)
        i = next((k for k, e in enumerate(edges) if value < e), len(edges) - 1)
        counts[i] += item.count_at_value_iterated_to
    return counts


def text_histogram(series: Dict[str, object]) -> Dict[str, object]:
    """A cyclictest-style histogram of several histograms on common log-scaled buckets.

    Returns:
        ``{"from_us": .., "edges_us": [...], "counts": {label: [...]}}``: bucket ``i`` holds the
        latencies in ``[edges_us[i-1], edges_us[i])``, the first from ``from_us``; buckets empty
        in every series at either end are left out.
    """
    filled = [h for h in series.values() if h.get_total_count()]
    edges = log_edges_us(max((h.get_max_value() for h in filled), default=1))
    counts = {label: bucket_counts(h, edges) for label, h in series.items()}
    used = [i for i in range(len(edges)) if any(cs[i] for cs in counts.values())] or [0]
    lo, hi = used[0], used[-1]
    return {
        "from_us": 0 if lo == 0 else edges[lo - 1],
        "edges_us": edges[lo : hi + 1],
        "counts": {label: cs[lo : hi + 1] for label, cs in counts.items()},
    }


def format_text_histogram(hist: Dict[str, object]) -> str:
    """Render :func:`text_histogram`'s dict as cyclictest prints its ``-h`` histogram: one line per
    bucket, one count column per configuration, then totals."""
    from .stats import fmt_us

    labels = list(hist["counts"])
    width = max([10, *(len(x) for x in labels)])
    lines = ["# Histogram: latency bucket (from the intended send time) -> tasks"]
    lines.append("# " + "bucket".ljust(22) + "".join(x.rjust(width + 1) for x in labels))
    low = hist["from_us"]
    for i, edge in enumerate(hist["edges_us"]):
        name = f"{fmt_us(low)} - {fmt_us(edge)}"
        row = "".join(str(hist["counts"][x][i]).rjust(width + 1) for x in labels)
        lines.append("  " + name.ljust(22) + row)
        low = edge
    totals = "".join(str(sum(hist["counts"][x])).rjust(width + 1) for x in labels)
    lines.append("# " + "Total:".ljust(22) + totals)
    return "\n".join(lines)


def plot_distribution(
    series: Dict[str, object], path: str, title: str, bar: tuple | None = None
) -> str:
    """Save a PNG of the distributions: HdrHistogram's percentile plot (latency on a log axis
    against 1 / (1 - percentile): 90%, 99%, 99.9%, ...) and the log-binned histogram.

    Args:
        series: Label -> HdrHistogram of microseconds.
        path: The PNG's path (its directory is created).
        title: The figure's title.
        bar: ``(latency_us, label)`` to draw as a dashed line, or None.

    Returns:
        ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'rtpool[bench]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    fig, (ax, axh) = plt.subplots(1, 2, figsize=(13, 5.2))
    most = max([int(h.get_total_count()) for h in series.values()] + [10])
    try:
        for label, h in series.items():
            n = int(h.get_total_count())
            if not n:
                continue
            top = math.log10(max(10.0, n))
            xs = [10 ** (top * k / 300) for k in range(301)]
            ys = [h.get_value_at_percentile(100.0 * (1 - 1 / x)) / 1000 for x in xs]
            xs.append(n * 1.0)  # the max at the last rank
            ys.append(h.get_max_value() / 1000)
            style = _style(label, list(series))
            ax.plot(xs, ys, label=label, drawstyle="steps-post", **style)
            _plot_histogram(axh, h, label, style)
        names = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"]
        ticks = [10**k for k in range(len(names)) if 10**k <= most]
        ax.set_xscale("log")
        ax.set_xlim(1, most * 1.2)
        ax.set_xticks(ticks)
        ax.set_xticklabels(names[: len(ticks)])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.set_xlabel("percentile")
        ax.set_ylabel("latency from the intended send time (ms)")
        ax.set_title("percentile distribution")
        axh.set_xscale("log")
        axh.set_yscale("log")
        axh.xaxis.set_major_formatter(plain)
        axh.set_xlabel("latency (ms), 10 bins per decade")
        axh.set_ylabel("tasks")
        axh.set_title("histogram")
        if bar is not None:
            ax.axhline(bar[0] / 1000, color="k", linestyle="--", linewidth=1, label=bar[1])
        for a in (ax, axh):
            a.grid(True, which="both", alpha=0.3)
            a.legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _style(label: str, labels: List[str]) -> Dict[str, object]:
    """One colour per configuration, shared by its idle and loaded runs (dashed when loaded)."""
    bases = list(dict.fromkeys(x.removesuffix(" loaded") for x in labels))
    base = label.removesuffix(" loaded")
    return {
        "color": f"C{bases.index(base) % 10}",
        "linestyle": "--" if label.endswith(" loaded") else "-",
    }


def _plot_histogram(ax, histogram, label: str, style: Dict[str, object]) -> None:
    bins: Dict[int, int] = {}
    for item in histogram.get_recorded_iterator():
        value = max(1, histogram.get_lowest_equivalent_value(item.value_iterated_to))
        k = math.floor(math.log10(value) * 10)
        bins[k] = bins.get(k, 0) + item.count_at_value_iterated_to
    if not bins:
        return
    ks = list(range(min(bins), max(bins) + 2))
    xs = [10 ** (k / 10) / 1000 for k in ks]
    ys = [bins.get(k, 0) for k in ks]
    ax.step(xs, ys, where="post", label=label, **style)
