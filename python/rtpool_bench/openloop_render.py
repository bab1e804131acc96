"""Tables of the open-loop benchmarks (:mod:`rtpool_bench.openloop_cli`): rich tables for people,
the cyclictest-style histogram as plain text. ``--json`` prints none of this."""

from __future__ import annotations

from typing import Dict, List

from .deadline import DEADLINE_MISS_BAR
from .hedge import HEDGE_P99_RATIO_BAR
from .openloop import COLUMNS, format_text_histogram

# --- output ----------------------------------------------------------------------------------


def _pct_cells(h: Dict[str, float]) -> List[str]:
    from .stats import fmt_us

    return [fmt_us(h[key]) for key, _ in COLUMNS]


def _ratio_table(title: str, ratios: Dict[str, Dict[str, float | None]]):
    from rich.table import Table

    from .stats import fmt_ratio

    t = Table(title=title, title_justify="left")
    t.add_column("")
    for _, name in COLUMNS:
        t.add_column(name, justify="right")
    for label, r in ratios.items():
        t.add_row(label, *(fmt_ratio(r[key[:-3]]) for key, _ in COLUMNS))
    return t


def render_open_latency(s: Dict[str, object], console) -> None:
    """Print the open-loop latency section: percentiles, ratios, the bar, the histogram."""
    from rich.table import Table

    from .stats import fmt_ratio, fmt_us, verdict

    t = Table(
        title=f"Open-loop no-op latency from the intended send time, "
        f"LocalCluster(workers={s['workers']}), {s['arrivals']} arrivals",
        title_justify="left",
    )
    for col in ("config", "rate/s", "sent"):
        t.add_column(col, justify="right")
    for _, name in COLUMNS:
        t.add_column(name, justify="right")
    t.add_column("lag p99", justify="right")
    t.add_column("CPU busy", justify="right")
    t.add_column("pool CPUs", justify="right")
    t.add_column("GC max", justify="right")
    for r in s["configs"]:
        note = f" [red]({r['unsent']} unsent)[/]" if r["unsent"] else ""
        cpu = r["cpu"]
        t.add_row(
            r["label"],
            f"{r['rate_per_s']:,.0f}",
            f"{r['sent']}{note}",
            *_pct_cells(r["latency"]),
            fmt_us(r["sender_lag"]["p99_us"]),
            "-" if cpu["machine_busy"] is None else f"{cpu['machine_busy']:.0%}",
            "-" if cpu["pool_cores"] is None else f"{cpu['pool_cores']:.2f}",
            f"{r['client_gc']['max_ms']:.1f} ms",
        )
    console.print(t)
    sat = s.get("saturation")
    if sat:
        line = (
            f"max throughput for single submits (sent back to back, median of "
            f"{len(sat['runs'])} runs in this run): {sat['tasks_per_s']:,.0f} tasks/s "
            f"(the sender alone: {sat['send_tasks_per_s']:,.0f}/s; runs: "
            + ", ".join(f"{r['tasks_per_s'] or 0:,.0f}" for r in sat["runs"])
            + ")"
        )
        after, loaded = s.get("saturation_after"), s.get("saturation_loaded")
        if after:
            line += f"; after the sweep {after['tasks_per_s'] or 0:,.0f}/s"
        if loaded:
            line += f"; under load {loaded['tasks_per_s'] or 0:,.0f}/s"
        console.print(line)
    if "ratios_to_lowest_level" in s:
        console.print(_ratio_table("Ratio to the lowest level", s["ratios_to_lowest_level"]))
    if "loaded_to_idle" in s:
        hogs = f"{s['hogs']} CPU hogs at nice {s['hog_nice']}"
        console.print(_ratio_table(f"Loaded / idle ({hogs})", s["loaded_to_idle"]))
    b = s.get("bar")
    if b:
        text = (
            f"open-loop no-op latency at {b['level_pct']:g}% of max throughput "
            f"({b['rate_per_s']:,.0f}/s): p99.9 {fmt_us(b['idle_p99_9_us'])} idle "
            f"(bar <= {fmt_us(b['p99_9_max_us'])}: {verdict(b['ok'])})"
        )
        if b["loaded_p99_9_us"] is not None:
            text += (
                f"; under background load p99.9 {fmt_us(b['loaded_p99_9_us'])}, "
                f"{fmt_ratio(b['loaded_to_idle_p99_9'])} idle"
            )
        console.print(text)
    print(format_text_histogram(s["histogram"]), file=console.file, flush=True)
    plot = s["plot"] or f"none ({s['plot_error']})"
    console.print(f"plot: {plot}", markup=False)
    console.print(
        f"[dim]blocks of {s['block_seconds']:g} s per configuration in a shuffled order each "
        f"round, the pool drained between blocks; at most {s['count_per_config']} tasks and "
        f"{s['seconds_per_config']:g} s per configuration. HdrHistogram, us. CPU busy: the "
        f"machine's CPUs (everything on it); pool CPUs: the client with its embedded master "
        f"and the workers, in CPUs; GC max: the client's longest garbage-collector pause.[/]"
    )


def render_deadline(s: Dict[str, object], console) -> None:
    """Print the deadline section."""
    from rich.table import Table

    from .stats import verdict

    cap, after = s["capacity"], s["capacity_after"]
    console.print(
        f"[bold]Deadline[/]: {s['task']}, deadline {s['deadline_ms']:g} ms, "
        f"LocalCluster(workers={s['workers']}); capacity {cap['tasks_per_s']:,.1f}/s "
        f"({cap['window']} in flight; {after['tasks_per_s'] or 0:,.1f}/s after), offered "
        f"{s['offered_per_s']:,.1f}/s open loop ({s['load']:.0%}, {s['arrivals']} arrivals)"
    )
    t = Table(title="Completion time from the intended send time", title_justify="left")
    t.add_column("tasks", justify="right")
    for _, name in COLUMNS:
        t.add_column(name, justify="right")
    t.add_row(str(s["sent"]), *_pct_cells(s["completion"]))
    console.print(t)
    e = s["exec_ms"]
    console.print(f"execution (wall) p50 {e['p50']} ms, p99 {e['p99']} ms, max {e['max']} ms")
    b = s["bar"]
    console.print(
        f"deadline misses, client-side (completion > {s['deadline_ms']:g} ms): "
        f"{s['client_misses']} of {s['sent']} = {s['client_miss_ratio']:.4%} "
        f"(bar <= {DEADLINE_MISS_BAR:.1%}: {verdict(b['client_ok'])})"
    )
    if s["sdk_miss_ratio"] is None:
        console.print(f"SDK lateness: n/a ({s['sdk']['note']})", markup=False)
    else:
        console.print(
            f"deadline misses, SDK (lateness > 0 or DeadlineMissedError): {s['sdk_misses']} "
            f"= {s['sdk_miss_ratio']:.4%} (bar: {verdict(b['sdk_ok'])})"
        )


def render_hedge(s: Dict[str, object], console) -> None:
    """Print the hedge section."""
    from rich.table import Table

    from .stats import fmt_ratio, verdict

    t = Table(
        title=f"Hedge: {s['task_ms']:g} ms CPU tasks at {s['rate_per_s']:,.0f}/s "
        f"({s['load']:.0%} of {s['capacity']['tasks_per_s']:,.0f}/s), {s['workers']} workers, "
        f"one {s['slowdown']:g}x slower in the slow configurations",
        title_justify="left",
    )
    for col in ("config", "sent"):
        t.add_column(col, justify="right")
    for _, name in COLUMNS:
        t.add_column(name, justify="right")
    t.add_column("hedges", justify="right")
    for label, r in s["configs"].items():
        t.add_row(
            label,
            str(r["sent"]),
            *_pct_cells(r["latency"]),
            str(r["master_stats"].get("hedges", "-")),
        )
    console.print(t)
    console.print(
        f"p99(one slow) / p99(all fast) = {fmt_ratio(s['slow_p99_ratio'])}; "
        f"p99(one slow + hedge) / p99(all fast) = {fmt_ratio(s['hedge_p99_ratio'])} "
        f"(bar <= {HEDGE_P99_RATIO_BAR:g}x: {verdict(s['bar']['ok'])})"
    )
    if not s["sdk"]["hedge_option"]:
        console.print(f"hedge=True: not measured ({s['sdk']['note']})", markup=False)
