"""Tables of ``rtpool demo`` (:mod:`rtpool_bench.demo`): rich tables for people; ``--json``
prints the same figures without them."""

from __future__ import annotations

from typing import Dict, Sequence

from .demo import MAKESPAN_BAR, P_MAX, P_MIN, STARTUP_BAR_S
from .stats import fmt_ratio, fmt_us, verdict

# --- output ----------------------------------------------------------------------------------

# (label, where, key); keys ending in a derived name are computed by derive_points().
_POINT_ROWS = (
    ("1 serialize", "client", "serialize_us"),
    ("2 queue wait", "master", "queue_us"),
    ("2 to worker*", "master>worker", "transfer_to_worker_us"),
    ("  prefetch wait", "worker", "wait_us"),
    ("3 execution", "worker", "exec_us"),
    ("  same, locally", "client", "local_exec_us"),
    ("4 result back*", "worker>client", "result_transfer_us"),
    ("  flush", "worker", "flush_us"),
    ("  client side*", "client<>master", "client_hops_us"),
    ("5 deserialize", "client", "deserialize_us"),
    ("6 total await", "client", "total_us"),
    ("overhead*", "", "overhead_us"),
)


def _render_rounds(per_round: Sequence[Dict[str, float]], console) -> None:
    from rich.table import Table

    t = Table(title="Per round (back to back)", title_justify="left")
    for col in ("round", "sequential", "ceiling", "rtpool", "rtpool/ceiling"):
        t.add_column(col, justify="right")
    for i, r in enumerate(per_round, 1):
        t.add_row(
            str(i),
            f"{r['sequential_s']:.3f} s",
            f"{r['ceiling_s']:.3f} s",
            f"{r['rtpool_makespan_s']:.3f} s",
            fmt_ratio(r["makespan_over_ceiling"], 3),
        )
    console.print(t)


def render(result: Dict[str, object], console) -> None:
    """Print the demo's two tables (makespans, measurement points) on a rich console."""
    from rich.table import Table

    n = result["workers"]
    bars = result["bars"]
    m = result["machine"]
    console.print(
        f"[bold]rtpool demo[/]: {result['tasks']} semiprimes (seed {result['seed']}, "
        f"p in [{P_MIN}, {P_MAX}]), N = {n} workers, "
        f"{m['usable_cpus']} CPUs ({m['cpu_model']}), Python {m['python']}"
    )
    title = "Factorization: makespan"
    if result["rounds"] > 1:
        title += f", best of {result['rounds']} rounds"
    t = Table(title=title, title_justify="left")
    for col, just in (("run", "left"), ("time", "right"), ("speed-up", "right")):
        t.add_column(col, justify=just)
    t.add_column("note")
    t.add_row(
        "sequential",
        f"{result['sequential_s']:.3f} s",
        "1.00x",
        f"mean task {result['mean_task_ms']:.2f} ms",
    )
    t.add_row(
        f"ceiling, {n} processes",
        f"{result['ceiling_s']:.3f} s",
        fmt_ratio(result["ceiling_speedup"]),
        "even split, no pool",
    )
    t.add_row(
        f"rtpool, {n} workers",
        f"{result['rtpool_makespan_s']:.3f} s",
        fmt_ratio(result["speedup"]),
        "all verified" if result["results_verified"] else f"[red]{result['mismatches']} wrong[/]",
    )
    t.add_row(
        "  submit_many call",
        fmt_us(result["submit_many_us"]),
        "",
        f"of which pickling {fmt_us(result['package_serialize_us'])}",
    )
    cpu = result["client_master_cpu_s"]
    if cpu is not None:
        share = cpu / (result["rtpool_makespan_s"] * result["machine"]["usable_cpus"])
        t.add_row("  client+master CPU", f"{cpu:.3f} s", "", f"{share:.1%} of all CPUs")
    t.add_row("efficiency", f"{result['efficiency']:.2f}", "", "speed-up / N")
    t.add_row(
        "makespan/ceiling",
        fmt_ratio(result["makespan_over_ceiling"], 3),
        "",
        f"same-round median; bar <= {MAKESPAN_BAR}: {verdict(bars['makespan_ok'])}",
    )
    t.add_row(
        "  best/best",
        fmt_ratio(result["makespan_over_ceiling_best"], 3),
        "",
        "best rtpool / best ceiling, any rounds",
    )
    t.add_row(
        "start to 1st result",
        f"{result['start_to_first_result_s']:.3f} s",
        "",
        f"LocalCluster(); bar < {STARTUP_BAR_S} s: {verdict(bars['startup_ok'])}",
    )
    console.print(t)
    if len(result["per_round"]) > 1:
        _render_rounds(result["per_round"], console)

    p = Table(title="Measurement points per task (thesis 3.1.1)", title_justify="left")
    for col, just in (("point", "left"), ("where", "left"), ("p50", "right"), ("p90", "right")):
        p.add_column(col, justify=just)
    p.add_column("max", justify="right")
    stats = dict(result["timings_us"])
    stats["local_exec_us"] = result["local_exec_us"]
    for label, where, key in _POINT_ROWS:
        s = stats.get(key) or {}
        p.add_row(label, where, fmt_us(s.get("p50")), fmt_us(s.get("p90")), fmt_us(s.get("max")))
    console.print(p)
    console.print(
        "[dim]Per task, from the best round. Serialize is each task's share of the package's "
        "pickling. * derived: the master<->worker hops (worker_us - exec - wait - flush) split "
        "in half each way; 'to worker' adds the prefetch wait, 'result back' the flush and the "
        "client side (total - package pickling - queue - worker - deserialize: futures, "
        "encoding, client->master, master->client, hand-off); overhead = total - queue - exec. "
        "Queue wait includes waiting for a free worker: all tasks are submitted at once.[/]"
    )
    if result["missing_timing_keys"]:
        console.print(f"[yellow]missing timing keys: {result['missing_timing_keys']}[/]")
