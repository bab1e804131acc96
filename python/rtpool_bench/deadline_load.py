"""``rtpool bench deadline --background-load``: the deadline bench in four configurations,
normal and real-time mode, each idle and next to one busy-loop process per CPU (at normal
priority), interleaved; the real-time Linux test (cyclictest under a CPU-bound load) for the
pool.

Two ``LocalCluster(workers=N)`` run side by side for the whole run, one normal and one with
``realtime=True`` (the stock API: the embedded master, the workers and the client's reader and
heartbeat threads on SCHED_FIFO as far as the OS permits). The thread that submits is the
application's: in the real-time configurations it sends each block inside
``client.realtime_thread()``, the API for that, unless ``--sender-normal``. The real-time
cluster's memory lock covers this whole process (its master is embedded), so the normal
configurations run with locked memory too; scheduling, which is what the hogs contend for,
stays as each mode sets it.

Capacity (closed loop, 10 ms tasks) is measured idle on both clusters, by the thread that sends
the blocks, as it sends them (inside ``realtime_thread()`` for the real-time cluster). Each
mode's configurations are offered ``--load`` (0.8) of that mode's own capacity (the issue's
bar: each mode at 80 % of what it can do idle), or with ``--rate-basis lower`` all four the
same rate, ``--load`` of the lower of the two, so they differ only in mode and load. The
throughput cost of real-time mode is measured as the real-time seed did, on no-op tasks: one
package of no-op tasks at a time on each cluster, idle, in the order A B B A (normal,
real-time, real-time, normal, repeated), tasks/s per mode and their ratio. Blocks of every
configuration then run in a shuffled order each round, the pool drained between blocks
(:func:`rtpool_bench.interleave.run_interleaved`); loaded blocks start their hogs before and
stop them (by PID) after. Per configuration: the deadline-miss ratio (client side, and the
SDK's ``lateness``), completion-time percentiles, and one cyclictest-style histogram of all
four.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from .deadline import DEADLINE_MISS_BAR, _deadline_figures, _deadline_keep
from .interleave import Config, defaults, probe, run_interleaved
from .openloop import (
    histogram_of,
    measure_capacity,
    run_open_loop,
    set_timer_slack_ns,
    text_histogram,
)
from .stats import safe_ratio, usable_cpus
from .tasks import noop, spin

MODES = ("normal", "realtime")
#: No-op tasks per package of the throughput-cost runs, (normal, --quick), and A B B A rounds.
COST_TASKS = (5000, 300)
COST_ROUNDS = (3, 1)


def bench_deadline_load(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench deadline --background-load`` (see the module's docstring)."""
    import rtpool

    d = defaults("deadline", args)
    task_ms, deadline_s = d["task_ms"], args.deadline_ms / 1000
    load = args.load if args.load is not None else 0.8
    hogs = args.hogs or usable_cpus()
    window = 4 * args.workers
    cap_n = 60 if args.quick else max(60, d["count"] // 10)
    block_s = args.block_seconds or (0.5 if args.quick else 2.0)
    set_timer_slack_ns(1000)
    clusters: Dict[str, object] = {}
    try:
        for mode in MODES:
            clusters[mode] = rtpool.LocalCluster(workers=args.workers, realtime=mode == "realtime")
            clusters[mode].wait_for_workers(args.workers, timeout=30)
        views, caps, notes, clients, senders = {}, {}, {}, {}, {}
        for mode, cluster in clusters.items():
            clients[mode] = client = cluster.client()
            # The sender of the real-time blocks runs inside realtime_thread(): the capacity
            # the offered rate derives from is measured by the same thread the same way, or
            # a normal thread starved by other processes would set it too low.
            senders[mode] = (
                None
                if mode == "normal" or args.sender_normal
                else (lambda c=client: c.realtime_thread())
            )
            say(f"deadline/{mode}: warm-up and idle capacity ({cap_n} tasks, {window} in flight)")
            with _entered(senders[mode]):
                for _ in range(3):
                    run_open_loop(lambda c=client: c.submit(spin, task_ms), [0] * window, 30)
                view, notes[mode] = probe(client, spin, (task_ms,), deadline=deadline_s)
                views[mode] = view or client
                caps[mode] = measure_capacity(
                    lambda c=client: c.submit(spin, task_ms), cap_n, window, 60
                )
            if not caps[mode]["tasks_per_s"]:
                raise RuntimeError(f"{mode}: the capacity run finished too few tasks")
        cost = noop_throughput(clients, senders, args.quick, say)
        rates = offered_rates(caps, load, args.rate_basis)
        configs: List[Config] = []
        for mode in MODES:
            for loaded in (False, True):
                label = f"{mode}/{'hogs' if loaded else 'idle'}"
                sub = views[mode]
                configs.append(
                    Config(
                        label,
                        rates[mode],
                        lambda s=sub: s.submit(spin, task_ms),
                        loaded,
                        keep=_deadline_keep,
                        around=senders[mode],
                    )
                )
        say(
            f"deadline: {len(configs)} configurations, "
            + ", ".join(f"{m} at {r:.0f}/s" for m, r in rates.items())
            + f" ({args.rate_basis} capacity), {hogs} hogs when loaded"
        )

        def stats() -> Dict[str, int]:
            # Only one cluster works during a block: the sum's delta is that block's.
            total: Dict[str, int] = {}
            for cluster in clusters.values():
                for k, v in cluster.stats().items():
                    if isinstance(v, int):
                        total[k] = total.get(k, 0) + v
            return total

        run_interleaved(
            configs,
            d["count"],
            d["seconds"],
            block_s,
            args.arrivals,
            hogs,
            stats,
            say,
            lambda: [p for c in clusters.values() for p in c.worker_pids],
            args.hog_nice,
        )
        realtime_report = clusters["realtime"].stats().get("realtime")
    finally:
        for cluster in reversed(list(clusters.values())):
            cluster.close()
    out = _figures(args, configs, caps, rates, load, hogs, task_ms, notes, realtime_report)
    out["noop_throughput"] = cost
    out["sender"] = "normal" if args.sender_normal else "client.realtime_thread()"
    return out


def offered_rates(caps: Dict[str, Dict], load: float, basis: str) -> Dict[str, float]:
    """The rate offered to each mode's configurations: ``load`` of that mode's own idle
    capacity (``basis`` "own": the issue's bar, each mode at 80 % of what it can do), or of
    the lower of the two for both (``"lower"``: the same rate everywhere)."""
    if basis == "lower":
        low = min(c["tasks_per_s"] for c in caps.values())
        return {m: load * low for m in caps}
    return {m: load * c["tasks_per_s"] for m, c in caps.items()}


def _entered(around):
    import contextlib

    return around() if around is not None else contextlib.nullcontext()


def noop_throughput(clients, senders, quick: bool, say: Callable) -> Dict[str, object]:
    """The throughput cost of real-time mode: packages of no-op tasks on each cluster in turn,
    idle, in the order A B B A per round; tasks/s of each package, the median per mode and
    the ratio real-time / normal of the medians."""
    import time

    n, rounds = COST_TASKS[quick], COST_ROUNDS[quick]
    say(f"deadline: no-op throughput, {rounds} rounds of A B B A, {n} tasks per package")
    rates: Dict[str, List[float]] = {m: [] for m in MODES}
    order = [MODES[0], MODES[1], MODES[1], MODES[0]] * rounds
    for mode in order:
        with _entered(senders[mode]):
            t0 = time.perf_counter()
            clients[mode].submit_many(noop, range(n)).results(timeout=120)
            rates[mode].append(n / (time.perf_counter() - t0))
    median = {m: sorted(r)[len(r) // 2] for m, r in rates.items()}
    return {
        "tasks_per_package": n,
        "order": "A B B A" + (f" x{rounds}" if rounds > 1 else ""),
        "tasks_per_s": {m: [round(x, 1) for x in r] for m, r in rates.items()},
        "median_tasks_per_s": {m: round(v, 1) for m, v in median.items()},
        "realtime_over_normal": safe_ratio(median["realtime"], median["normal"]),
    }


def _figures(args, configs, caps, rates, load, hogs, task_ms, notes, realtime_report) -> Dict:
    deadline_s = args.deadline_ms / 1000
    cells: Dict[str, Dict] = {}
    series = {}
    for c in configs:
        row = c.result()
        figs = _deadline_figures(
            c.outcomes, deadline_s, notes[c.label.split("/")[0]] == "supported"
        )
        series[c.label] = histogram_of(figs.pop("_lat"))
        row.update(figs)
        row["bar_ok"] = row["client_miss_ratio"] is not None and (
            row["client_miss_ratio"] <= DEADLINE_MISS_BAR
        )
        cells[c.label] = row
    p999 = {k: v["completion"]["p99_9_us"] for k, v in cells.items()}
    return {
        "workers": args.workers,
        "task": f"spin({task_ms:g}): {task_ms:g} ms of CPU time (busy loop)",
        "deadline_ms": args.deadline_ms,
        "load": load,
        "hogs": hogs,
        "hog_nice": args.hog_nice,
        "arrivals": args.arrivals,
        "capacity_idle": caps,
        "realtime_capacity_cost": safe_ratio(
            caps["realtime"]["tasks_per_s"], caps["normal"]["tasks_per_s"]
        ),
        "rate_basis": args.rate_basis,
        "offered_per_s": {m: round(r, 1) for m, r in rates.items()},
        "sdk_notes": notes,
        "realtime_report": realtime_report,
        "cells": cells,
        "hogs_over_idle_p99_9": {
            m: safe_ratio(p999[f"{m}/hogs"], p999[f"{m}/idle"]) for m in MODES
        },
        "histogram": text_histogram(series),
        "miss_ratio_bar": DEADLINE_MISS_BAR,
    }


def render(s: Dict[str, object], console) -> None:
    """The table normal/realtime x idle/hogs, then the histogram."""
    from rich.table import Table

    from .openloop import format_text_histogram
    from .stats import fmt_us

    caps = s["capacity_idle"]
    basis = "each mode's own" if s.get("rate_basis") == "own" else "the lower"
    offered = ", ".join(f"{m} {r:,.1f}/s" for m, r in s["offered_per_s"].items())
    console.print(
        f"[bold]Deadline under background load[/]: {s['task']}, deadline {s['deadline_ms']:g} "
        f"ms, LocalCluster(workers={s['workers']}); idle capacity normal "
        f"{caps['normal']['tasks_per_s']:,.1f}/s, realtime {caps['realtime']['tasks_per_s']:,.1f}"
        f"/s (realtime/normal {s['realtime_capacity_cost']}); offered {offered} ({s['load']:.0%} "
        f"of {basis} capacity); hogs: {s['hogs']} busy loops at nice {s['hog_nice']}"
    )
    t = Table(title="Completion time from the intended send time", title_justify="left")
    for col in ("config", "tasks", "late", "late %", "SDK late %", "p50", "p99", "p99.9", "max"):
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    for label, r in s["cells"].items():
        c = r["completion"]
        sdk = r["sdk_miss_ratio"]
        t.add_row(
            label,
            str(r["sent"]),
            str(r["client_misses"]),
            f"{r['client_miss_ratio']:.2%}",
            "-" if sdk is None else f"{sdk:.2%}",
            *(fmt_us(c[k]) for k in ("p50_us", "p99_us", "p99_9_us", "max_us")),
        )
    console.print(t)
    print(format_text_histogram(s["histogram"]), file=console.file, flush=True)
    ratios = ", ".join(f"{m} {v}" for m, v in s["hogs_over_idle_p99_9"].items())
    rt = s["realtime_report"] or {}
    clients = rt.get("clients") or [{}]
    console.print(
        f"p99.9 with hogs / idle: {ratios}; bar: late <= {s['miss_ratio_bar']:.1%}. Real-time "
        f"mode: master active {rt.get('active')} (SCHED_FIFO {rt.get('priority')}), client "
        f"active {clients[0].get('active')}, sender {s.get('sender')}, warnings "
        f"{rt.get('warnings') or clients[0].get('warnings') or 'none'}",
        markup=False,
    )
    cost = s.get("noop_throughput")
    if cost:
        med = cost["median_tasks_per_s"]
        console.print(
            f"Throughput cost of real-time mode (no-op tasks, {cost['tasks_per_package']} per "
            f"package, {cost['order']}): normal {med['normal']:,.0f}/s, realtime "
            f"{med['realtime']:,.0f}/s (median; realtime/normal {cost['realtime_over_normal']})",
            markup=False,
        )
