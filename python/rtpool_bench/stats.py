"""Small helpers shared by the demo and the benchmarks: percentiles, histograms, machine facts.

Latency is reported as a distribution, never as a mean alone: p50, p90, p99, p99.9 and max,
from an HdrHistogram of microseconds with 3 significant digits (so a reported value is within
0.1% of the recorded one). Small samples (a few dozen payload round trips, a few hundred
per-task timings) use exact nearest-rank percentiles instead.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from typing import Dict, Iterable, List, Sequence

# Values are microseconds; one hour is far beyond anything a bounded benchmark records.
HDR_LOWEST_US = 1
HDR_HIGHEST_US = 3_600_000_000
HDR_DIGITS = 3

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9))


def new_histogram():
    """Return an empty HdrHistogram for microseconds (1 us to 1 h, 3 significant digits)."""
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(HDR_LOWEST_US, HDR_HIGHEST_US, HDR_DIGITS)


def record_ns(histogram, elapsed_ns: int) -> None:
    """Record one duration given in nanoseconds as whole microseconds (at least 1)."""
    histogram.record_value(max(HDR_LOWEST_US, min(HDR_HIGHEST_US, round(elapsed_ns / 1000))))


def summarize_histogram(histogram) -> Dict[str, float]:
    """Summarize a histogram of microseconds.

    Returns:
        ``count``, ``min_us``, ``mean_us``, ``p50_us``, ``p90_us``, ``p99_us``, ``p99_9_us``,
        ``max_us``. Percentiles are HdrHistogram's (the highest value equivalent to the bucket).
    """
    out: Dict[str, float] = {"count": int(histogram.get_total_count())}
    out["min_us"] = int(histogram.get_min_value())
    out["mean_us"] = round(float(histogram.get_mean_value()), 1)
    for name, pct in PERCENTILES:
        out[f"{name}_us"] = int(histogram.get_value_at_percentile(pct))
    out["max_us"] = int(histogram.get_max_value())
    return out


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Exact nearest-rank percentile of ``values`` (``None`` when empty).

    Args:
        values: The sample, in any order.
        pct: 0 < pct <= 100.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median_p90(values: Iterable[float]) -> Dict[str, float | None]:
    """Return ``{"p50": .., "p90": .., "max": ..}`` of ``values`` (``None`` entries if empty)."""
    sample: List[float] = list(values)
    return {
        "p50": percentile(sample, 50),
        "p90": percentile(sample, 90),
        "max": max(sample) if sample else None,
    }


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cpus() -> int:
    """CPUs this process may run on (affinity-aware where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_info() -> Dict[str, object]:
    """Facts about the machine a benchmark ran on, for the JSON output and the docs."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "cpu_model": cpu_model(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg_before": load,
    }


def fmt_us(value: float | None) -> str:
    """Format microseconds for a table: ``850 us``, ``1.23 ms``, ``2.50 s``; ``-`` if unknown."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.1f} us"
    if value < 1000:
        return f"{value:.0f} us"
    if value < 1_000_000:
        return f"{value / 1000:.2f} ms"
    return f"{value / 1_000_000:.2f} s"


def fmt_ratio(value: float | None, digits: int = 2) -> str:
    """Format a ratio as ``1.23x`` (``-`` if unknown)."""
    return "-" if value is None else f"{value:.{digits}f}x"


def verdict(ok: bool | None) -> str:
    """Rich markup for a bar that is met, missed, or could not be judged."""
    if ok is None:
        return "[yellow]n/a[/]"
    return "[green]meets[/]" if ok else "[red]misses[/]"


def safe_ratio(num: float | None, den: float | None) -> float | None:
    """``num / den`` rounded to 3 decimals, or ``None`` when either is unknown or den is 0."""
    if num is None or not den:
        return None
    return round(num / den, 3)
