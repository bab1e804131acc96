"""Turn the JSON of `rtpool demo --json` and `rtpool bench all --json` into markdown tables.

    python -m rtpool demo --json > demo.json
    python -m rtpool bench all --json > bench.json
    python benches/report.py demo.json bench.json
    python benches/report.py latency.json deadline.json hedge.json   # --sweep, deadline, hedge

Prints the tables docs/benchmarks.md shows, with each figure next to its bar.
"""

import json
import sys

from rtpool._bench import _BREAKDOWN_ROWS
from rtpool._bench_stats import fmt_us


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
                    for label, k in _BREAKDOWN_ROWS
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


def main(paths):
    """Print markdown for each JSON file given (demo or bench output)."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        m = data["machine"]
        print(f"<!-- {path}: {m['cpu_model']}, {m['usable_cpus']} CPUs, Python {m['python']} -->")
        if "sequential_s" in data:
            print(demo_tables(data), end="\n\n")
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
