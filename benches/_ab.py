"""The pure parts of ``benches/ab_noop.py``: sides, round order, the figures read from each
bench's JSON, medians over rounds and head/base ratios. No process, file or clock here, so
``tests/test_bench_check.py`` checks all of it in milliseconds.
"""

from __future__ import annotations

import os
import statistics
from typing import Dict, List, Mapping, Optional, Sequence

#: Figures of one side in one round, by name; None when the run did not produce it.
Figures = Dict[str, Optional[float]]

#: Payload sizes the check echoes by default: the size between the inline path and shared
#: memory (64 KiB) and the 1 MiB bar of issue 16.
DEFAULT_PAYLOAD_SIZES = "64K,1M"

LATENCY_KEYS = (("p50_us", "p50"), ("p99_us", "p99"), ("p99_9_us", "p99.9"), ("max_us", "max"))


def parse_sides(texts: Sequence[str]) -> Dict[str, str]:
    """``NAME=DIR`` arguments as an ordered dict; DIR must hold the ``rtpool`` package.

    Raises:
        ValueError: a malformed argument, a repeated name or a DIR without ``rtpool/``.
    """
    sides: Dict[str, str] = {}
    for text in texts:
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{text!r}: give NAME=DIR, DIR holding the rtpool package")
        if name in sides:
            raise ValueError(f"{text!r}: the name {name!r} is given twice")
        if not os.path.isdir(os.path.join(path, "rtpool")):
            raise ValueError(f"{text!r}: {path} has no rtpool/ package (a checkout's python/)")
        sides[name] = path
    return sides


def round_order(names: Sequence[str], round_index: int) -> List[str]:
    """The order of the sides in round ``round_index`` (from 0): as given in even rounds,
    reversed in odd ones (A B, B A, A B, ...), so that drift of the machine falls on both."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def parse_size(text: str) -> int:
    """``64K``, ``1M``, ``1MiB``, ``4096`` as bytes.

    Raises:
        ValueError: not a positive size.
    """
    t = text.strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[: -len(suffix)]
            break
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if mult > 1 else t
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"cannot read the size {text!r}; use e.g. 64K or 1M")
    return int(digits) * mult


def size_label(size: int) -> str:
    """``64K``, ``1M``, ``1536``: the short name of a payload size in figure names."""
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def latency_figures(data: Mapping) -> Figures:
    """No-op round-trip percentiles (us) from ``rtpool bench latency --json``."""
    rt = data["latency"]["rtpool"]
    figures: Figures = {f"latency {label}": rt.get(key) for key, label in LATENCY_KEYS}
    aio = data["latency"].get("aio_relay")  # issue 25's 2-hop floor, in the same run
    if aio and aio.get("p50_us") and rt.get("p50_us"):
        figures["latency p50 / asyncio relay"] = rt["p50_us"] / aio["p50_us"]
    return figures


def throughput_figures(data: Mapping) -> Figures:
    """The median tasks/s of ``rtpool bench throughput --json``."""
    return {"throughput": data["throughput"].get("median_tasks_per_s")}


def default_transport(row: Mapping, shared_memory: bool) -> Mapping | None:
    """The stats of what a plain ``client.submit(echo, some_bytes)`` takes in one row of
    ``rtpool bench payload --json``: ``bytes`` over shared memory when the client has it
    (its default), else over TCP; a build before issue 16 has one figure per size."""
    if "variants" not in row:
        return row.get("rtpool")
    variants = row["variants"]
    preferred = ("bytes/shm", "bytes/tcp") if shared_memory else ("bytes/tcp",)
    for name in preferred:
        if name in variants:
            return variants[name]
    return None


def payload_figures(data: Mapping, sizes: Sequence[int]) -> Figures:
    """p50 round trip (us) of a ``bytes`` echo at each of ``sizes``, default transport."""
    section = data["payload"]
    shm = bool(section.get("shared_memory", False))
    rows = {row["size_bytes"]: row for row in section["sizes"]}
    out: Figures = {}
    for size in sizes:
        stats = default_transport(rows[size], shm) if size in rows else None
        out[f"payload {size_label(size)} p50"] = None if stats is None else stats.get("p50_us")
    return out


def medians(rounds: Sequence[Figures]) -> Figures:
    """The median of each figure over rounds, ignoring rounds where it is missing."""
    names: List[str] = []
    for figures in rounds:
        names += [k for k in figures if k not in names]
    out: Figures = {}
    for name in names:
        values = [f[name] for f in rounds if f.get(name) is not None]
        out[name] = statistics.median(values) if values else None
    return out


def ratio(head: float | None, base: float | None) -> float | None:
    """head / base, None when either is missing or base is 0."""
    if head is None or base is None or base == 0:
        return None
    return head / base


def ratios(head: Figures, base: Figures) -> Figures:
    """head / base for every figure of ``head``."""
    return {name: ratio(value, base.get(name)) for name, value in head.items()}


def is_better_higher(name: str) -> bool:
    """Throughput is better higher; every other figure here is a time, better lower."""
    return name.startswith("throughput")


def format_value(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if is_better_higher(name):
        return f"{value:,.0f}/s"
    if " / " in name:  # a ratio of two figures of the same run
        return f"{value:.2f}x"
    return f"{value:,.1f} us"


def format_round(round_index: int, name: str, figures: Figures, cpu_s: float) -> str:
    """One line per side and round."""
    cells = ", ".join(f"{k} {format_value(k, v)}" for k, v in figures.items())
    return f"round {round_index + 1} {name}: {cells}; throughput run CPU {cpu_s:.2f} s"


def format_summary(
    med: Mapping[str, Figures], cpu: Mapping[str, float], rounds: int, base: str
) -> List[str]:
    """The table of medians per side and the ratio of every other side to ``base``."""
    names = list(med)
    others = [n for n in names if n != base]
    header = ["figure", *names, *(f"{n} / {base}" for n in others)]
    lines = [
        f"medians over {rounds} round(s), sides interleaved (ratio < 1: faster, except "
        "throughput: > 1 is faster)",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    figures = list(med[base])
    for fig in figures:
        cells = [fig, *(format_value(fig, med[n].get(fig)) for n in names)]
        for n in others:
            r = ratio(med[n].get(fig), med[base].get(fig))
            cells.append("-" if r is None else f"{r:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["throughput run CPU", *(f"{cpu[n]:.2f} s" for n in names)]
    cells += [f"{ratio(cpu[n], cpu[base]) or 0:.3f}" for n in others]
    lines.append("| " + " | ".join(cells) + " |")
    return lines
