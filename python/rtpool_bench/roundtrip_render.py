"""Tables of ``rtpool bench latency|throughput|payload|all`` (:mod:`rtpool_bench.roundtrip`):
rich tables for people; ``--json`` prints the same figures without them."""

from __future__ import annotations

from typing import Dict

from .roundtrip import AIO_RELAY_P50_BAR, LATENCY_P50_BAR, LATENCY_P99_9_BAR_US, THROUGHPUT_BAR
from .stats import fmt_ratio, fmt_us, verdict


def render(result: Dict[str, object], console) -> None:
    """Print each section present in ``result`` as a rich table."""
    m = result["machine"]
    console.print(
        f"[bold]rtpool bench[/] on {m['usable_cpus']} CPUs ({m['cpu_model']}), "
        f"Python {m['python']}, load average before {m['loadavg_before']}"
    )
    if "latency" in result:
        _render_latency(result["latency"], console)
    if "throughput" in result:
        _render_throughput(result["throughput"], console)
    if "payload" in result:
        from .payload_render import render as render_payload

        render_payload(result["payload"], console)


def _render_latency(s: Dict[str, object], console) -> None:
    from rich.table import Table

    t = Table(
        title=f"Latency: {s['count']} sequential no-op round trips each, "
        f"LocalCluster(workers={s['workers']})",
        title_justify="left",
    )
    t.add_column("")
    for col in ("p50", "p90", "p99", "p99.9", "max", "mean"):
        t.add_column(col, justify="right")
    for name, h in (
        ("rtpool", s["rtpool"]),
        ("TCP floor", s["floor"]),
        ("relay chain", s["relay_chain"]),
        ("asyncio relay", s["aio_relay"]),
    ):
        t.add_row(
            name,
            *(fmt_us(h[k]) for k in ("p50_us", "p90_us", "p99_us", "p99_9_us", "max_us")),
            fmt_us(h["mean_us"]),
        )
    console.print(t)
    b = s["bars"]
    console.print(
        f"rtpool p50 / floor p50 = {fmt_ratio(s['p50_ratio'])} (bar <= {LATENCY_P50_BAR}x: "
        f"{verdict(b['p50_ok'])}); rtpool p99.9 = {fmt_us(s['rtpool']['p99_9_us'])} "
        f"= {fmt_ratio(s['p99_9_ratio'])} floor p50 (bar <= {fmt_us(LATENCY_P99_9_BAR_US)}: "
        f"{verdict(b['p99_9_ok'])})"
    )
    console.print(
        f"relay chain p50 / floor p50 = {fmt_ratio(s['chain_p50_ratio'])}: the same three "
        f"processes and four hops as rtpool with no work at all; rtpool p50 / relay chain p50 "
        f"= {fmt_ratio(s['p50_ratio_to_chain'])}"
    )
    aio = s["p50_ratio_to_aio_relay"]
    console.print(
        f"rtpool p50 / asyncio relay p50 = {fmt_ratio(aio)} "
        f"(issue 25's 2-hop floor: client -> asyncio relay process -> echo worker and back; "
        f"bar <= {AIO_RELAY_P50_BAR}x: {verdict(aio is not None and aio <= AIO_RELAY_P50_BAR)})"
    )
    _render_breakdown(s["breakdown_us"], console)
    console.print(
        f"[dim]HdrHistogram, us, 3 significant digits; blocks of {s['block']} rtpool round "
        f"trips, then as many floor, relay-chain and asyncio-relay round trips "
        f"({s['floor_message_bytes']}-byte frames, "
        f"TCP_NODELAY), alternating, after {s['warmup']} warm-up round trips each"
        f"{'; stopped by the time budget' if s['stopped_by_time'] else ''}.[/]"
    )


BREAKDOWN_ROWS = (
    ("client: pickling", "serialize_us"),
    ("client side: encode, send, both client hops, wake-up", "client_side_us"),
    ("master: queue (receipt to assignment)", "queue_us"),
    ("master<->worker hops incl. worker I/O", "master_worker_hops_us"),
    ("worker: receipt to start", "wait_us"),
    ("worker: execution", "exec_us"),
    ("worker: end to send", "flush_us"),
    ("client: unpickling", "deserialize_us"),
    ("total (Future.timings)", "total_us"),
)


def _render_breakdown(b: Dict[str, Dict[str, float]], console) -> None:
    from rich.table import Table

    t = Table(title="Where a no-op round trip goes (Future.timings)", title_justify="left")
    t.add_column("part")
    t.add_column("p50", justify="right")
    t.add_column("p90", justify="right")
    for label, key in BREAKDOWN_ROWS:
        t.add_row(label, fmt_us(b[key]["p50"]), fmt_us(b[key]["p90"]))
    console.print(t)


def _render_throughput(s: Dict[str, object], console) -> None:
    from rich.table import Table

    t = Table(
        title=f"Throughput: {s['tasks']} no-op tasks in one package, "
        f"LocalCluster(workers={s['workers']})",
        title_justify="left",
    )
    for col in ("run", "submit_many", "submit to last result", "tasks/s"):
        t.add_column(col, justify="right")
    for i, r in enumerate(s["runs"], 1):
        note = " [red](timed out)[/]" if r["timed_out"] else ""
        t.add_row(
            str(i),
            f"{r['submit_s']:.3f} s",
            f"{r['seconds']:.3f} s{note}",
            f"{r['tasks_per_s']:,.0f}",
        )
    console.print(t)
    best, med = s["best_tasks_per_s"], s["median_tasks_per_s"]
    console.print(
        f"best {best or 0:,.0f} tasks/s, median {med or 0:,.0f} tasks/s "
        f"(bar >= {THROUGHPUT_BAR:,}/s: {verdict(s['bars']['ok'])})"
    )
