"""Turn the JSON of `rtpool demo --json` and `rtpool bench all --json` into markdown tables.

    python -m rtpool demo --json > demo.json
    python -m rtpool bench all --json > bench.json
    python benches/report.py demo.json bench.json
    python benches/report.py latency.json deadline.json hedge.json   # --sweep, deadline, hedge
    python -m rtpool bench ninf --json ninf.json && python benches/report.py ninf.json

Prints the tables docs/benchmarks.md shows, with each figure next to its bar.
"""

import json
import sys

from rtpool_bench.roundtrip_render import BREAKDOWN_ROWS
from rtpool_bench.stats import fmt_us


def _row(*cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows):
    lines = [_row(*header), _row(*("---" for _ in header))]
    lines += [_row(*r) for r in rows]
    return "\n".join(lines)


def _ok(flag):
    return "meets" if flag else "**misses**"


def demo_tables(d):
    """Markdown for one demo result: makespans and measurement points."""
    n, bars = d["workers"], d["bars"]
    cpu_share = d["client_master_cpu_s"] / (d["rtpool_makespan_s"] * d["machine"]["usable_cpus"])
    out = [
        f"{d['tasks']} semiprimes, seed {d['seed']}, N = {n}, best of {d['rounds']} rounds; "
        f"mean task {d['mean_task_ms']:.2f} ms (best sequential run)\n",
        _table(
            ("run", "time", "speed-up vs sequential", "note"),
            [
                ("sequential", f"{d['sequential_s']:.3f} s", "1.00x", ""),
                (
                    f"parallel ceiling, {n} processes",
                    f"{d['ceiling_s']:.3f} s",
                    f"{d['ceiling_speedup']:.2f}x",
                    "even split, fork",
                ),
                (
                    f"rtpool, LocalCluster(workers={n})",
                    f"{d['rtpool_makespan_s']:.3f} s",
                    f"{d['speedup']:.2f}x",
                    "all results verified" if d["results_verified"] else "WRONG RESULTS",
                ),
                (
                    f"submit_many call ({d['tasks']} tasks)",
                    fmt_us(d["submit_many_us"]),
                    "",
                    f"of which pickling {fmt_us(d['package_serialize_us'])}",
                ),
                (
                    "CPU of the client + embedded master during the makespan",
                    f"{d['client_master_cpu_s']:.3f} s",
                    "",
                    f"{cpu_share:.1%} of all CPUs",
                ),
                ("efficiency (speed-up / N)", f"{d['efficiency']:.2f}", "", ""),
                (
                    "makespan / ceiling (same round, median of rounds)",
                    f"{d['makespan_over_ceiling']:.3f}",
                    "",
                    f"bar <= {bars['makespan_over_ceiling_max']}: {_ok(bars['makespan_ok'])}",
                ),
                (
                    "makespan / ceiling (best / best, any rounds)",
                    f"{d['makespan_over_ceiling_best']:.3f}",
                    "",
                    "not judged: may pair runs under different load",
                ),
                (
                    "LocalCluster() to first result",
                    f"{d['start_to_first_result_s']:.3f} s",
                    "",
                    f"bar < {bars['start_to_first_result_max_s']} s: {_ok(bars['startup_ok'])}",
                ),
            ],
        ),
        "",
        _table(
            ("round", "first", "sequential", "ceiling", "rtpool", "rtpool / ceiling"),
            [
                (
                    i,
                    r["first"],
                    f"{r['sequential_s']:.3f} s",
                    f"{r['ceiling_s']:.3f} s",
                    f"{r['rtpool_makespan_s']:.3f} s",
                    f"{r['makespan_over_ceiling']:.3f}",
                )
                for i, r in enumerate(d["per_round"], 1)
            ],
        ),
        "",
    ]
    t = dict(d["timings_us"])
    t["local_exec_us"] = d["local_exec_us"]
    rows = [
        ("1 serialize (client, share of the package)", "serialize_us"),
        ("2 queue wait (master: receipt to assignment)", "queue_us"),
        ("2 transfer to worker* (incl. prefetch wait)", "transfer_to_worker_us"),
        ("   prefetch wait (worker)", "wait_us"),
        ("3 execution (worker)", "exec_us"),
        ("   same function in the client process", "local_exec_us"),
        ("4 result transfer* (incl. flush and client hops)", "result_transfer_us"),
        ("   flush (worker)", "flush_us"),
        ("   client side* (futures, encode, both client hops)", "client_hops_us"),
        ("5 deserialize (client)", "deserialize_us"),
        ("6 total await (client)", "total_us"),
        ("overhead* = total - queue - exec", "overhead_us"),
    ]
    out.append(
        _table(
            ("measurement point", "p50", "p90", "max"),
            [
                (label, fmt_us(t[k]["p50"]), fmt_us(t[k]["p90"]), fmt_us(t[k]["max"]))
                for label, k in rows
            ],
        )
    )
    return "\n".join(out)


def latency_table(s):
    """Markdown for the latency section."""
    keys = ("p50_us", "p90_us", "p99_us", "p99_9_us", "max_us", "mean_us")
    b = s["bars"]
    return "\n".join(
        [
            _table(
                ("", "n", "p50", "p90", "p99", "p99.9", "max", "mean"),
                [
                    (name, s[side]["count"], *(fmt_us(s[side][k]) for k in keys))
                    for name, side in (("rtpool", "rtpool"), ("TCP floor", "floor"))
                ],
            ),
            "",
            f"rtpool p50 / floor p50 = **{s['p50_ratio']:.2f}x** (bar <= "
            f"{b['p50_ratio_max']}x: {_ok(b['p50_ok'])}); rtpool p99.9 = "
            f"**{fmt_us(s['rtpool']['p99_9_us'])}** (bar <= {fmt_us(b['p99_9_max_us'])}: "
            f"{_ok(b['p99_9_ok'])}), {s['p99_9_ratio']:.1f}x the floor's p50.",
            "",
            "Where a no-op round trip goes, from `Future.timings`:",
            "",
            _table(
                ("part", "p50", "p90"),
                [
                    (
                        label,
                        fmt_us(s["breakdown_us"][k]["p50"]),
                        fmt_us(s["breakdown_us"][k]["p90"]),
                    )
                    for label, k in BREAKDOWN_ROWS
                ],
            ),
        ]
    )


def throughput_table(s):
    """Markdown for the throughput section."""
    rows = [
        (i, f"{r['submit_s']:.3f} s", f"{r['seconds']:.3f} s", f"{r['tasks_per_s']:,.0f}")
        for i, r in enumerate(s["runs"], 1)
    ]
    return "\n".join(
        [
            _table(("run", "submit_many returned", "submit to last result", "tasks/s"), rows),
            "",
            f"best **{s['best_tasks_per_s']:,.0f}** tasks/s, median "
            f"{s['median_tasks_per_s']:,.0f} tasks/s (bar >= {s['bars']['tasks_per_s_min']:,}: "
            f"{_ok(s['bars']['ok'])})",
        ]
    )


def payload_table(s):
    """Markdown for the payload section."""
    rows = []
    for r in s["sizes"]:
        size = r["size_bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        rt, fl = r["rtpool"], r["floor"]
        rows.append(
            (
                label,
                rt["count"],
                fmt_us(rt["p50_us"]),
                fmt_us(rt["max_us"]),
                f"{rt['mb_per_s']:,.0f}",
                fmt_us(fl["p50_us"]),
                fmt_us(fl["max_us"]),
                f"{fl['mb_per_s']:,.0f}",
                f"{r['p50_ratio']:.2f}x",
            )
        )
    header = (
        "size",
        "n",
        "rtpool p50",
        "rtpool max",
        "rtpool MB/s",
        "floor p50",
        "floor max",
        "floor MB/s",
        "p50 ratio",
    )
    return _table(header, rows)


_PCT = (("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("p99_9_us", "p99.9"))
_PCT += (("p99_99_us", "p99.99"), ("max_us", "max"))


def _ratio(x):
    return "-" if x is None else f"{x:.2f}x"


def _share(x):
    return "-" if x is None else f"{x:.0%}"


def open_loop_tables(s):
    """Markdown for `rtpool bench latency --rate/--sweep --json`: percentiles per
    configuration, ratios to the lowest level and loaded / idle."""
    rows = [
        (
            r["label"],
            f"{r['rate_per_s']:,.0f}",
            r["sent"],
            *(fmt_us(r["latency"][k]) for k, _ in _PCT),
            fmt_us(r["sender_lag"]["p99_us"]),
            _share(r["cpu"]["machine_busy"]),
            r["cpu"]["pool_cores"],
            f"{r['client_gc']['max_ms']:.1f} ms",
        )
        for r in s["configs"]
    ]
    header = ("config", "rate/s", "tasks", *(n for _, n in _PCT), "lag p99", "CPU busy")
    out = [_table((*header, "pool CPUs", "GC max"), rows)]
    for key, title in (
        ("ratios_to_lowest_level", "ratio to the lowest level"),
        ("loaded_to_idle", "loaded / idle"),
    ):
        if key in s:
            ratio_rows = [
                (label, *(_ratio(r[k[:-3]]) for k, _ in _PCT)) for label, r in s[key].items()
            ]
            out.append(_table((title, *(n for _, n in _PCT)), ratio_rows))
    return "\n\n".join(out)


def deadline_table(s):
    """Markdown for `rtpool bench deadline --json`."""
    c = s["completion"]
    row = (
        f"{s['capacity']['tasks_per_s']:.1f} / {s['capacity_after']['tasks_per_s']:.1f}",
        f"{s['offered_per_s']:.1f}",
        s["sent"],
        *(fmt_us(c[k]) for k, _ in _PCT),
        f"{s['client_misses']} ({s['client_miss_ratio']:.3%})",
        "-" if s["sdk_misses"] is None else f"{s['sdk_misses']} ({s['sdk_miss_ratio']:.3%})",
    )
    header = ("capacity/s (before / after)", "offered/s", "tasks", *(n for _, n in _PCT))
    return _table((*header, "misses, client", "misses, SDK"), [row])


def hedge_table(s):
    """Markdown for `rtpool bench hedge --json`."""
    fast = s["configs"]["all fast"]["latency"]["p99_us"]
    rows = [
        (
            label,
            r["sent"],
            r["slow_tasks"],
            *(fmt_us(r["latency"][k]) for k, _ in _PCT),
            _ratio(r["latency"]["p99_us"] / fast),
            r["master_stats"].get("hedges", "-"),
        )
        for label, r in s["configs"].items()
    ]
    header = ("config", "tasks", "ran slow", *(n for _, n in _PCT), "p99 / all fast", "hedges")
    return _table(header, rows)


def _f(x, digits=2):
    return "-" if x is None else f"{x:,.{digits}f}"


def _mmm(s, digits=2):
    if not s or not s.get("count"):
        return "-"
    return "/".join(_f(s[k], digits) for k in ("max", "min", "mean"))


def _secs(x):
    return "-" if x is None else fmt_us(x * 1e6)


def ninf_tables(d):
    """Markdown for ``rtpool bench ninf --json``: each section present, in the docs' layout."""
    out = []
    lp = d.get("linpack")
    if lp:
        rows = []
        for r in lp["rows"]:
            cells = [r["n"]]
            for k in ("local", "unblocked", "remote"):
                x = r[k]
                cells.append(_f(x["mflops"], 0) if x["reps"] else "skipped")
                cells.append(f"{_secs(x['p50_s'])} / {_secs(x['max_s'])}" if x["reps"] else "-")
            cells += [_f(r["remote_over_local"], 3), _f(r["remote_over_unblocked"], 2)]
            cells.append("/".join(str(r[k]["reps"]) for k in ("local", "unblocked", "remote")))
            rows.append(cells)
        head = ("n", "local Mflops", "time p50 / max", "unblocked Mflops", "time p50 / max")
        head += ("remote Mflops", "time p50 / max", "remote / local", "remote / unblocked")
        out.append(_table(head + ("reps",), rows))
        rows = []
        for r in lp["rows"]:
            p = r["remote_parts"]
            leg = None if p["worker_leg_s"] is None else p["worker_leg_s"] - p["exec_s"]
            rows.append(
                (
                    r["n"],
                    _secs(r["local"]["median_s"]),
                    _secs(r["remote"]["median_s"]),
                    _secs(p["exec_s"]),
                    _secs(leg),
                    _secs(p["client_side_s"]),
                    _f(r["bytes"] / 1e6, 2),
                )
            )
        out.append(
            _table(
                (
                    "n",
                    "local",
                    "remote",
                    "worker: call",
                    "worker leg - call",
                    "client side",
                    "MB moved",
                ),
                rows,
            )
        )
    mu = d.get("multi")
    if mu:
        rows, last = [], None
        for c in mu["cells"]:
            rows.append(
                (
                    c["n"] if c["n"] != last else "",
                    c["c"],
                    _mmm(c["performance_mflops"], 0),
                    _mmm(c["response_s"], 3),
                    _mmm(c["wait_s"], 3),
                    _mmm(c["throughput_mb_s"], 1),
                    _f(c["cpu_pct"], 1),
                    _f(c["load1"], 2),
                    c["times"],
                    _f(c.get("machine_busy_pct"), 0),
                )
            )
            last = c["n"]
        out.append(
            _table(
                (
                    "n",
                    "c",
                    "Performance[Mflops]",
                    "Response[sec]",
                    "Wait[sec]",
                    "Throughput[MB/s]",
                    "CPU",
                    "Load",
                    "Times",
                    "machine busy %",
                ),
                rows,
            )
        )
    ep = d.get("ep")
    if ep:
        rows = []
        for r in ep["local"] + ep["runs"]:
            who = "client" if r["remote"] else "plain process"
            rows.append(
                (
                    f"{r['c']} x {who}",
                    f"{r['seconds']:.3f} s",
                    _f(r["mops"], 1),
                    _mmm(r["call_s"], 3),
                    _f(r["exec_s"]["mean"], 3),
                    _f(r["wait_s"]["mean"], 3),
                    "yes" if r["verified"] else "**no**",
                )
            )
        out.append(
            _table(
                (
                    "run",
                    "time",
                    "Mops",
                    "call max/min/mean [s]",
                    "exec mean [s]",
                    "wait mean [s]",
                    "verified",
                ),
                rows,
            )
        )
    b = d.get("bars")
    if b:
        kinds = b["round_trips"]["kinds"]
        names = {"noop_task": "no-op task", "noop_call": "no-op call", "dmmul": "dmmul n=8"}
        rows = [
            (names[k], *(fmt_us(h[f"{p}_us"]) for p in ("p50", "p90", "p99", "p99_9", "max")))
            for k, h in kinds.items()
        ]
        out.append(_table(("", "p50", "p90", "p99", "p99.9", "max"), rows))
        bd = b["round_trips"]["breakdown_us"]
        rows = [
            (label, *(fmt_us(bd[k][key]["p50"]) for k in kinds)) for label, key in BREAKDOWN_ROWS
        ]
        out.append(_table(("part (p50)", *(names[k] for k in kinds)), rows))
        dm, v = b["diamond"], b["bars"]
        out.append(
            _table(
                ("bar", "measured", "bound", "verdict"),
                [
                    (
                        "dmmul p50 / no-op task p50",
                        _ratio(v["dmmul_over_task"]["measured"]),
                        "<= 1.5x",
                        _ok(v["dmmul_over_task"]["ok"]),
                    ),
                    (
                        "linpack n=1000 remote / local Mflops",
                        _f(v["linpack_remote_over_local"]["measured"], 3),
                        ">= 0.90",
                        _ok(v["linpack_remote_over_local"]["ok"]),
                    ),
                    (
                        "diamond makespan / (critical path + 2 RTT), p50",
                        f"{_ratio(v['diamond_makespan_over_bound']['measured'])} (max "
                        f"{_ratio(dm['ratio']['max'])})",
                        "<= 1.1x",
                        _ok(v["diamond_makespan_over_bound"]["ok"]),
                    ),
                ],
            )
        )
    return "\n\n".join(out)


def main(paths):
    """Print markdown for each JSON file given (demo or bench output)."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        m = data["machine"]
        print(f"<!-- {path}: {m['cpu_model']}, {m['usable_cpus']} CPUs, Python {m['python']} -->")
        if "sequential_s" in data:
            print(demo_tables(data), end="\n\n")
        if "settings" in data and "sections" in data:  # rtpool bench ninf
            print(ninf_tables(data), end="\n\n")
            continue
        for name, fn in (
            ("latency", latency_table),
            ("throughput", throughput_table),
            ("payload", payload_table),
            ("open_loop", open_loop_tables),
            ("deadline", deadline_table),
            ("hedge", hedge_table),
        ):
            if name in data:
                print(f"**{name}**\n\n{fn(data[name])}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
