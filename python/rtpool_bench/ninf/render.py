"""Tables of ``rtpool bench ninf`` (:mod:`rtpool_bench.ninf.cli`): rich tables for people, in the
Ninf paper's layout for the multi-client one. ``--json -`` prints none of this."""

from __future__ import annotations

from typing import Dict, List

from .common import DIAMOND_BAR, DMMUL_RATIO_BAR, LINPACK_WITHIN


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def mmm(s: Dict[str, float | None], digits: int = 2) -> str:
    """A paper cell: ``max/min/mean``."""
    if not s or s.get("count", 0) == 0:
        return "-"
    return "/".join(_f(s[k], digits) for k in ("max", "min", "mean"))


def met(ok: bool | None) -> str:
    """Rich markup of a bar's verdict."""
    if ok is None:
        return "[yellow]n/a[/]"
    return "[green]MET[/]" if ok else "[red]MISSED[/]"


def _secs(x: float | None) -> str:
    from ..stats import fmt_us

    return "-" if x is None else fmt_us(x * 1e6)


def render(result: Dict[str, object], console) -> None:
    """Print every section present in ``result``."""
    m, load = result["machine"], result["loadavg"]
    console.print(
        f"[bold]rtpool bench ninf[/] on {m['usable_cpus']} CPUs ({m['cpu_model']}), Python "
        f"{m['python']}; load average before {load['before']}, after {load['after']}; "
        f"{result['seconds']} s"
    )
    if "linpack" in result:
        render_linpack(result["linpack"], console)
    if "multi" in result:
        render_multi(result["multi"], console)
    if "ep" in result:
        render_ep(result["ep"], console)
    if "bars" in result:
        render_bars(result["bars"], console)
    for p in result.get("problems", []):
        console.print(f"[red]problem:[/] {p}")


def _blas_text(b: Dict[str, object]) -> str:
    libs = ", ".join(f"{k}: {v}" for k, v in b.get("libs", {}).items()) or "no BLAS loaded"
    return libs


def render_linpack(s: Dict[str, object], console) -> None:
    """The Linpack sweep: Mflops of each method per n, the ratios, the bar and crossover."""
    from rich.table import Table

    t = Table(
        title="Linpack: Mflops (median of the repetitions) and time p50 / max, local and "
        "remote interleaved",
        title_justify="left",
    )
    t.add_column("n", justify="right")
    for name in ("local optimized", "local unblocked", "remote (1 worker)"):
        t.add_column(f"{name}\nMflops", justify="right")
        t.add_column("time p50 / max", justify="right")
    t.add_column("remote /\nlocal", justify="right")
    t.add_column("pairs: p50\n(min-max)", justify="right")
    t.add_column("remote /\nunblocked", justify="right")
    t.add_column("reps", justify="right")
    for row in s["rows"]:
        cells: List[str] = [str(row["n"])]
        for k in ("local", "unblocked", "remote"):
            r = row[k]
            cells.append(_f(r["mflops"], 0) if r["reps"] else "skipped")
            cells.append(f"{_secs(r['p50_s'])} / {_secs(r['max_s'])}" if r["reps"] else "-")
        cells.append(_f(row["remote_over_local"], 3))
        pairs = row.get("pairs") or {}
        p50 = pairs.get("p50")
        ok = p50 is not None and p50 >= 1 - LINPACK_WITHIN
        text = "-" if p50 is None else f"{_f(p50, 3)} ({_f(pairs['min'], 2)}-{_f(pairs['max'], 2)})"
        cells.append(f"[green]{text}[/]" if ok else text)
        cells.append(_f(row["remote_over_unblocked"], 2))
        cells.append("/".join(str(row[k]["reps"]) for k in ("local", "unblocked", "remote")))
        t.add_row(*cells)
    console.print(t)
    n10 = s["within_10pct_from_n"]
    console.print(
        f"remote within {LINPACK_WITHIN:.0%} of local optimized (Mflops ratio >= "
        f"{1 - LINPACK_WITHIN:.2f}, median of the pairs) from n = {n10 if n10 else '-'}: "
        f"{met(n10 is not None)}"
    )
    proj = s.get("projection")
    if proj and proj.get("n") and n10 is None:
        console.print(
            f"  projected from this run (remote overhead {_secs(proj['overhead_s'])} + bytes / "
            f"{_f(proj['overhead_mb_per_s'], 0)} MB/s, local speed at the largest n): within "
            f"{LINPACK_WITHIN:.0%} from about n = {proj['n']}"
        )
    _render_remote_parts(s["rows"], console)
    x = s["unblocked_crossover"]
    if x["n"] is None:
        text = "remote never beats the unblocked baseline at the sizes measured"
    elif x["below_smallest"]:
        text = f"remote beats the unblocked baseline already at the smallest n ({x['n']})"
    else:
        text = f"remote beats the unblocked baseline from n = {x['n']}"
    console.print(f"{text} (unblocked measured up to n = {x['measured_up_to']})")
    console.print(
        f"[dim]BLAS threads {s['blas_threads']}: client {_blas_text(s['client_blas'])}; "
        f"worker {_blas_text(s['worker_blas'])}"
        f"{'' if s.get('blas_match') else ' [red](not the same: the ratio is unfair)[/]'}. "
        "Mflops = linpack_flops(n) / time; remote / local: of the medians; pairs: one local "
        "and one remote solve back to back, remote / local Mflops of each; "
        "reps: local/unblocked/remote.[/]"
    )


def _render_remote_parts(rows: List[Dict[str, object]], console) -> None:
    from rich.table import Table

    t = Table(
        title="Where a remote linpack call's time goes (medians, Future.timings)",
        title_justify="left",
    )
    for col in ("n", "local", "remote", "worker: call", "worker leg - call", "client side"):
        t.add_column(col, justify="right")
    t.add_column("MB moved", justify="right")
    for row in rows:
        p = row.get("remote_parts") or {}
        leg = None
        if p.get("worker_leg_s") is not None and p.get("exec_s") is not None:
            leg = p["worker_leg_s"] - p["exec_s"]
        t.add_row(
            str(row["n"]),
            _secs(row["local"]["median_s"]),
            _secs(row["remote"]["median_s"]),
            _secs(p.get("exec_s")),
            _secs(leg),
            _secs(p.get("client_side_s")),
            _f(row["bytes"] / 1e6, 2),
        )
    console.print(t)
    console.print(
        "[dim]worker: call = decoding the arguments, the solve, encoding the result (exec_us); "
        "worker leg - call = master -> worker -> master hops, the worker's wait and flush; "
        "client side = call time - master queue - worker leg: encoding, client <-> master "
        "hops, decoding. MB moved = A and b out, x back.[/]"
    )


def render_multi(s: Dict[str, object], console) -> None:
    """The multi-client table in the layout of the paper's Tables 3-6."""
    from rich.table import Table

    t = Table(
        title=f"Multi-client Linpack ({s['workers']} workers, a call every {s['interval_s']:g} "
        f"s with probability {s['probability']:g}, {s['cell_seconds']:g} s per cell; "
        f"max/min/mean)",
        title_justify="left",
    )
    from rich.markup import escape

    for col in ("n", "c", "Performance[Mflops]", "Response[sec]", "Wait[sec]"):
        t.add_column(escape(col), justify="right")
    for col in ("Throughput[MB/s]", "CPU", "Load", "Times"):
        t.add_column(escape(col), justify="right")
    last_n = None
    for cell in s["cells"]:
        t.add_row(
            str(cell["n"]) if cell["n"] != last_n else "",
            str(cell["c"]),
            mmm(cell["performance_mflops"], 0),
            mmm(cell["response_s"], 3),
            mmm(cell["wait_s"], 3),
            mmm(cell["throughput_mb_s"], 1),
            _f(cell["cpu_pct"], 1),
            _f(cell["load1"], 2),
            str(cell["times"])
            + (f" [red]({sum(cell['errors'].values())} failed)[/]" if cell["errors"] else ""),
        )
        last_n = cell["n"]
    console.print(t)
    busy = ", ".join(f"{c['n']}/{c['c']}: {_f(c.get('machine_busy_pct'), 0)}%" for c in s["cells"])
    console.print(f"machine busy (every process, clients included), n/c: {busy}")
    kind = {c["response_kind"] for c in s["cells"]}
    resp = (
        "from sending the CALL to the master's ACCEPTED"
        if kind == {"accepted"}
        else "client side of the call: call time - master queue - worker leg (worker_us)"
    )
    console.print(
        f"[dim]Performance = linpack_flops(n) / client-observed call time; Response = {resp}; "
        "Wait = master queue + worker prefetch wait; Throughput = (A + b out + x back) / (call "
        "time - execution); CPU = the workers' CPU time over the cell, % of all CPUs; Load = "
        "1-min load average at the end of the cell; Times = calls made.[/]"
    )


def render_ep(s: Dict[str, object], console) -> None:
    """The EP runs: plain processes (the ceiling), then remote calls by c clients."""
    from rich.table import Table

    t = Table(
        title=f"NAS EP, 2^{s['m']} pairs in {s['chunks']} chunks: plain processes, then remote "
        f"calls on {s['workers']} workers",
        title_justify="left",
    )
    from rich.markup import escape

    for col in ("run", "time", "Mops", "call max/min/mean [s]", "exec mean [s]", "wait mean [s]"):
        t.add_column(escape(col), justify="right")
    for col in ("sx", "sy"):
        t.add_column(col, justify="right")
    t.add_column("verified")
    for r in list(s.get("local", [])) + list(s["runs"]):
        ok = "[green]yes[/]" if r["verified"] else "[red]NO[/]"
        if r["verified"] is not None:
            ok += f" ({r['source']}, rel. err {r['rel_err']:.1e})"
        if r.get("remote", True):
            label = f"{r['c']} client{'s' if r['c'] > 1 else ''}"
        else:
            label = f"{r['c']} plain process{'es' if r['c'] > 1 else ''}"
        t.add_row(
            label,
            f"{r['seconds']:.3f} s",
            _f(r["mops"], 1),
            mmm(r["call_s"], 3),
            _f(r["exec_s"]["mean"], 3),
            _f(r.get("wait_s", {}).get("mean"), 3),
            f"{r['sx']:.12e}",
            f"{r['sy']:.12e}",
            ok,
        )
    console.print(t)
    console.print(
        "[dim]Mops = 2^(m+1) random numbers / time / 10^6; time from releasing the processes "
        "to the last one's sums; a plain process computes its chunks itself (call = one "
        "chunk); wait = master queue + worker wait.[/]"
    )


def render_bars(s: Dict[str, object], console) -> None:
    """The round trips, the diamond and the three bars."""
    from rich.table import Table

    from ..stats import fmt_ratio, fmt_us

    rt = s["round_trips"]
    t = Table(
        title=f"Round trips: {rt['count']} each, blocks of {rt['block']} interleaved, "
        f"{s['workers']} workers",
        title_justify="left",
    )
    t.add_column("")
    for col in ("p50", "p90", "p99", "p99.9", "max"):
        t.add_column(col, justify="right")
    labels = {
        "noop_task": "no-op task (client.submit)",
        "noop_call": "no-op remote call",
        "dmmul": f"dmmul n=8 ({rt['dmmul_arg_bytes']} B of arguments)",
    }
    for k, label in labels.items():
        h = rt["kinds"][k]
        t.add_row(label, *(fmt_us(h[f"{p}_us"]) for p in ("p50", "p90", "p99", "p99_9", "max")))
    console.print(t)
    _render_rt_breakdown(rt, labels, console)
    d = s["diamond"]
    console.print(
        f"Diamond A -> (B, C) -> D, {d['reps']} transactions of 4 x {d['ms']:g} ms "
        f"({d['work']}): makespan p50 {_secs(d['makespan_s']['p50'])}, max "
        f"{_secs(d['makespan_s']['max'])}; critical path p50 {_secs(d['critical_s']['p50'])}; "
        f"RTT (no-op call p50) {_secs(d['rtt_s'])}; makespan / (critical + 2 RTT) p50 "
        f"{fmt_ratio(d['ratio']['p50'], 3)}, max {fmt_ratio(d['ratio']['max'], 3)}"
        + ("" if d["exec_from_timings"] else " [yellow](nominal execution times)[/]")
    )
    lp = s["linpack_1000"]
    b = s["bars"]
    bars = Table(title="The bars", title_justify="left")
    for col in ("bar", "measured", "bound", "verdict"):
        bars.add_column(col)
    bars.add_row(
        "dmmul (1 KiB) p50 / no-op task p50",
        fmt_ratio(b["dmmul_over_task"]["measured"]),
        f"<= {DMMUL_RATIO_BAR}x",
        met(b["dmmul_over_task"]["ok"]),
    )
    bars.add_row(
        "linpack n=1000: remote Mflops / local Mflops (median of the pairs)",
        f"{_f(lp['remote_over_local'], 3)} (medians {_f(lp['remote_mflops'], 0)} / "
        f"{_f(lp['local_mflops'], 0)}; {lp['source']})",
        f">= {1 - LINPACK_WITHIN:.2f}",
        met(b["linpack_remote_over_local"]["ok"]),
    )
    bars.add_row(
        "diamond: makespan / (critical path + 2 RTT), p50",
        fmt_ratio(b["diamond_makespan_over_bound"]["measured"], 3),
        f"<= {DIAMOND_BAR}x",
        met(b["diamond_makespan_over_bound"]["ok"]),
    )
    console.print(bars)


_BREAKDOWN_ROWS = (
    ("client: pickling (tasks; calls encode in the client side)", "serialize_us"),
    ("client side: encode, send, client <-> master hops, wake-up", "client_side_us"),
    ("master: queue (receipt to assignment)", "queue_us"),
    ("master <-> worker hops incl. worker I/O", "master_worker_hops_us"),
    ("worker: receipt to start", "wait_us"),
    ("worker: execution (calls: decode, run, encode)", "exec_us"),
    ("worker: end to send", "flush_us"),
    ("client: unpickling / decoding the result", "deserialize_us"),
    ("total (Future.timings)", "total_us"),
)


def _render_rt_breakdown(rt: Dict[str, object], labels: Dict[str, str], console) -> None:
    from rich.table import Table

    from ..stats import fmt_us

    b = rt.get("breakdown_us")
    if not b:
        return
    t = Table(title="Where a round trip goes (Future.timings, p50)", title_justify="left")
    t.add_column("part")
    for k in labels:
        t.add_column(k.replace("_", " "), justify="right")
    for label, key in _BREAKDOWN_ROWS:
        t.add_row(label, *(fmt_us(b[k][key]["p50"]) for k in labels))
    console.print(t)
