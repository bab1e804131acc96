"""The tables of ``rtpool bench payload`` (:mod:`rtpool_bench.payload`)."""

from __future__ import annotations

from typing import Dict


def _ratio(x) -> str:
    if x is None:
        return "-"
    return f"[green]{x:.2f}x[/]" if x >= 1 else f"[red]{x:.2f}x[/]"


def render(s: Dict[str, object], console) -> None:
    """Two rich tables: every variant and floor per size, then the bar (rtpool's best default
    against the minimal pool and the relay)."""
    _render_all(s, console)
    _render_bar(s, console)
    if s.get("ray_version"):
        from .roundtrip import fmt_size

        for row in s["sizes"]:
            v = row["variants"]
            ours, ray = v.get("numpy/shm") or v["numpy/tcp"], v.get("ray/numpy")
            if ray and ours["mb_per_s"] and ray["mb_per_s"]:
                console.print(
                    f"{fmt_size(row['size_bytes'])}: rtpool numpy "
                    f"{ours['mb_per_s'] / ray['mb_per_s']:.2f}x Ray {s['ray_version']}'s MB/s"
                )
    console.print(
        "[dim]variant: what the task echoes / how it travels (tcp: segmented frames; shm: "
        "/dev/shm segments). pool: a minimal asyncio pickle pool (client -> master -> worker); "
        "relay: the same 2-hop chain echoing raw frames; tcp: raw Python TCP echo, one hop; "
        "memcpy: two numpy copies. MB/s = 2 x size / p50 (MB = 10^6 bytes). Variants and "
        "floors alternate one round trip each. / pool, / relay: their p50 / rtpool's best "
        "default p50 (1.00x or more meets the bar). The VM is shared: compare rows of one run "
        "only.[/]"
    )


def _render_all(s: Dict[str, object], console) -> None:
    from rich.table import Table

    from .roundtrip import fmt_size
    from .stats import fmt_us

    t = Table(
        title=f"Payload echo through a task, LocalCluster(workers={s['workers']}); "
        "comparators and floors in the same run",
        title_justify="left",
    )
    for col in ("size", "variant", "n", "p50", "p99", "max", "MB/s"):
        t.add_column(col, justify="left" if col in ("size", "variant") else "right")
    for row in s["sizes"]:
        size = fmt_size(row["size_bytes"]) + (" [red]wrong echo[/]" if row["wrong_echoes"] else "")
        entries = list(row["variants"].items()) + [
            (f"floor: {k}", v) for k, v in row["floors"].items()
        ]
        for i, (name, st) in enumerate(entries):
            t.add_row(
                size if i == 0 else "",
                name,
                str(st["count"]),
                fmt_us(st["p50_us"]),
                fmt_us(st["p99_us"]),
                fmt_us(st["max_us"]),
                f"{st['mb_per_s']:,.0f}" if st["mb_per_s"] else "-",
            )
    console.print(t)


def _render_bar(s: Dict[str, object], console) -> None:
    from rich.table import Table

    from .roundtrip import fmt_size
    from .stats import fmt_us

    t = Table(
        title="The bar: rtpool's best default path against the minimal pool and the relay",
        title_justify="left",
    )
    cols = ("size", "rtpool best default", "p50", "p99", "MB/s")
    cols += ("pool p50", "pool p99", "pool MB/s", "relay p50", "relay p99", "relay MB/s")
    for col in cols + ("/ pool", "/ relay"):
        t.add_column(col, justify="left" if col in ("size", "rtpool best default") else "right")
    for row in s["sizes"]:
        name = row.get("best_default", "-")
        cells = [fmt_size(row["size_bytes"]), name]
        for st in (row["variants"].get(name, {}), row["floors"]["pool"], row["floors"]["relay"]):
            cells += [fmt_us(st.get("p50_us")), fmt_us(st.get("p99_us"))]
            cells.append(f"{st['mb_per_s']:,.0f}" if st.get("mb_per_s") else "-")
        t.add_row(*cells, _ratio(row.get("vs_pool")), _ratio(row.get("vs_relay")))
    console.print(t)
