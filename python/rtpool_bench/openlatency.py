"""``rtpool bench latency --rate R | --sweep``: open-loop no-op latency from each task's intended
send time (see :mod:`rtpool_bench.openloop_cli`)."""

from __future__ import annotations

import os
from typing import Callable, Dict, List

from .cpu import CpuHogs
from .interleave import (
    Config,
    defaults,
    ratios,
    run_interleaved,
    write_plot,
)
from .openloop import (
    histogram_of,
    measure_saturation,
    run_open_loop,
    set_timer_slack_ns,
    text_histogram,
)
from .stats import safe_ratio, usable_cpus
from .tasks import noop

OPEN_P99_9_BAR_US = 3000  # open-loop no-op p99.9 at 50 % of max throughput, idle
BAR_LEVEL_PCT = 50.0


# --- open-loop latency -----------------------------------------------------------------------


def bench_open_latency(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench latency --rate R | --sweep`` (see the module's docstring)."""
    import rtpool

    d = defaults("latency", args)
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
            for pct in parse_levels(args.levels):
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
    out.update(write_plot(series, path, title, bar))
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
            r["label"]: ratios(r["latency"], base["latency"]) for r in base_rows
        }
    if mode == "compare":
        out["loaded_to_idle"] = {
            i["label"]: ratios(l_["latency"], i["latency"]) for i, l_ in zip(idle, loaded)
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


def parse_levels(text: str) -> List[float]:
    levels = [float(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) <= 0:
        raise ValueError(f"--levels must be positive percentages, got {text!r}")
    return levels
