"""The pure half of ``benches/figures.py``: one run's figures (the JSON of ``rtpool bench
latency/throughput/payload/scale`` and ``rtpool demo``, merged) as the README's Performance
table and the summary at the top of docs/benchmarks.md, and the swap of the text between a
file's marker comments. No process or file here: ``tests/test_figures.py`` checks it all.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

BEGIN = "<!-- figures:begin -->"
END = "<!-- figures:end -->"
#: What the tables say about where they come from, after the markers.
GENERATED = "<!-- written by benches/figures.py from one run's JSON: edit that, not this -->"

#: The sections of a run, and what a saved ``--json`` output of each looks like.
SECTIONS = ("latency", "throughput", "payload", "scale", "demo")


def section_of(data: Mapping) -> Dict[str, object]:
    """The sections in one saved JSON: a merged run (``figures.py --save-json``), ``rtpool
    bench latency|throughput|payload|all --json``, ``rtpool bench scale --json`` (its
    ``levels``) or ``rtpool demo --json`` (the whole object)."""
    if "sequential_s" in data:
        return {"demo": dict(data)}
    if "levels" in data and "latency" not in data:
        return {"scale": {"levels": data["levels"]}}
    return {k: data[k] for k in SECTIONS if k in data}


def merge(files: Sequence[Mapping]) -> Dict[str, object]:
    """One run out of several saved outputs: sections, then ``machine``, ``commit``, ``date``
    and ``commands`` from the first file that has them.

    Raises:
        ValueError: a section given twice, or none at all.
    """
    run: Dict[str, object] = {}
    for data in files:
        for name, value in section_of(data).items():
            if name in run:
                raise ValueError(f"the section {name!r} is in two of the files given")
            run[name] = value
        for key in ("machine", "commit", "date", "commands"):
            if key in data and key not in run:
                run[key] = data[key]
    if not any(k in run for k in SECTIONS):
        raise ValueError(f"no figures in the files given (none of {', '.join(SECTIONS)})")
    return run


def replace_between(text: str, body: str, where: str = "the file") -> str:
    """``text`` with what lies between its one ``BEGIN`` and ``END`` lines replaced by
    ``body``; every other byte unchanged.

    Raises:
        ValueError: the markers missing, repeated or out of order, naming ``where``.
    """
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{where} needs exactly one {BEGIN} and one {END} line")
    head, rest = text.split(BEGIN, 1)
    if END not in rest:
        raise ValueError(f"{where}: {END} comes before {BEGIN}")
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body.strip(chr(10))}\n{END}{tail}"


# -- formatting ------------------------------------------------------------------------------


def us(value) -> str:
    """``850 us``, ``1.23 ms``, ``-``."""
    if value is None:
        return "-"
    if value < 1000:
        return f"{value:.0f} us"
    if value < 1_000_000:
        return f"{value / 1000:.2f} ms"
    return f"{value / 1e6:.2f} s"


def num(value, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.0f}{unit}"


def ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def size_name(size: int) -> str:
    if size >= 1 << 20:
        return f"{size / (1 << 20):g} MiB"
    if size >= 1 << 10:
        return f"{size / (1 << 10):g} KiB"
    return f"{size} B"


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Sequence[Sequence]) -> List[str]:
    return [row(*header), row(*("---" for _ in header)), *(row(*r) for r in rows)]


def default_variant(section: Mapping, size_row: Mapping) -> tuple:
    """(name, stats) of what ``client.submit(echo, some_bytes)`` takes: ``bytes`` over shared
    memory when the run had it (the client's default), else over TCP."""
    variants = size_row.get("variants", {})
    for name in ("bytes/shm", "bytes/tcp") if section.get("shared_memory") else ("bytes/tcp",):
        if name in variants:
            return name, variants[name]
    return "-", {}


def provenance(run: Mapping) -> str:
    """Machine, date and commit of the run, one sentence."""
    m = run.get("machine", {})
    cpus = m.get("usable_cpus") or m.get("cpu_count")
    load = m.get("loadavg_before")
    load_text = f", load average {load[0]} before" if load else ""
    return (
        f"{m.get('cpu_model', 'unknown CPU')}, {cpus} CPUs{load_text}; Python "
        f"{m.get('python', '?')}, {m.get('platform', '?')}; {run.get('date', 'date unknown')}, "
        f"commit `{run.get('commit', 'unknown')}`"
        + (" (a `--quick` smoke run, not figures to publish)" if run.get("quick") else "")
    )


def largest_level(run: Mapping):
    levels = run.get("scale", {}).get("levels") or []
    return max(levels, key=lambda lv: lv["workers"]) if levels else None


def idle_cpu(level: Mapping):
    """The master's CPU with the level's workers idle, % of a core, if the bench measured it."""
    idle = level.get("idle") or {}
    return idle.get("master_cpu_pct")


# -- the README's Performance table -----------------------------------------------------------


def readme_rows(run: Mapping) -> List[tuple]:
    """The rows of the README's table, one per section present."""
    rows: List[tuple] = []
    lat = run.get("latency")
    if lat:
        rt, tcp, chain = lat["rtpool"], lat["floor"], lat.get("relay_chain") or {}
        aio = lat.get("aio_relay") or {}
        rows.append(
            (
                "no-op round trip p50 / p99 / p99.9",
                " / ".join(us(rt.get(k)) for k in ("p50_us", "p99_us", "p99_9_us")),
                f"raw TCP ping-pong {us(tcp['p50_us'])} ({ratio(rt['p50_us'], tcp['p50_us'])}); "
                f"3-process relay chain {us(chain.get('p50_us'))} "
                f"({ratio(rt['p50_us'], chain.get('p50_us'))})"
                + (
                    f"; asyncio relay {us(aio['p50_us'])} ({ratio(rt['p50_us'], aio['p50_us'])})"
                    if aio.get("p50_us")
                    else ""
                ),
            )
        )
    thr = run.get("throughput")
    if thr:
        rows.append(
            (
                f"{thr['tasks']:,} no-op tasks in one package",
                f"{num(thr['median_tasks_per_s'])} tasks/s (median of {len(thr['runs'])}; "
                f"best {num(thr['best_tasks_per_s'])})",
                "",
            )
        )
    pay = run.get("payload")
    for size_row in pay["sizes"] if pay else ():
        _, stats = default_variant(pay, size_row)
        tcp = size_row.get("floors", {}).get("tcp", {})
        rows.append(
            (
                f"{size_name(size_row['size_bytes'])} `bytes` echoed by a task",
                f"{us(stats.get('p50_us'))}, {num(stats.get('mb_per_s'))} MB/s",
                f"raw TCP echo {us(tcp.get('p50_us'))}, {num(tcp.get('mb_per_s'))} MB/s",
            )
        )
    level = largest_level(run)
    if level:
        t, lt = level.get("throughput", {}), level.get("latency", {})
        idle = idle_cpu(level)
        rows.append(
            (
                f"{level['workers']:,} simulated workers (`rtpool bench scale`)",
                f"{num(t.get('tasks_per_s'))} tasks/s; round trip p50 {us(lt.get('p50_us'))}"
                + ("" if idle is None else f"; idle master {idle:.1f} % of a core"),
                f"{level['connections']['connected']:,} connected; master "
                f"{level.get('master_rss_per_connection_kb', '-')} KiB per connection",
            )
        )
    demo = run.get("demo")
    if demo:
        rows.append(
            (
                f"factorization demo ({demo['tasks']} tasks of {demo['mean_task_ms']:.1f} ms)",
                f"makespan {demo['makespan_over_ceiling']:.3f}x the parallel ceiling; "
                f"`LocalCluster()` to first result {demo['start_to_first_result_s']:.2f} s",
                f"{demo['workers']} plain processes, even split",
            )
        )
    return rows


def readme_table(run: Mapping) -> str:
    """The README's Performance table with its provenance line."""
    lines = [
        GENERATED,
        f"Measured in one run: {provenance(run)}; `LocalCluster(workers=2)`.",
        "",
        *table(("", "rtpool", "reference measured in the same run"), readme_rows(run)),
    ]
    return "\n".join(lines)


# -- the summary at the top of docs/benchmarks.md ---------------------------------------------

_PCTS = (("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"), ("p99_9_us", "p99.9"))
_PCTS += (("max_us", "max"),)


def _latency_lines(lat: Mapping) -> List[str]:
    sides = [("rtpool", lat["rtpool"]), ("raw TCP ping-pong", lat["floor"])]
    if lat.get("relay_chain"):
        sides.append(("relay chain: driver -> relay -> echo and back", lat["relay_chain"]))
    if lat.get("aio_relay"):
        sides.append(("asyncio relay: driver -> asyncio relay -> echo and back", lat["aio_relay"]))
    p50 = lat["rtpool"]["p50_us"]
    rows = [
        (name, s.get("count", "-"), *(us(s.get(k)) for k, _ in _PCTS), ratio(p50, s["p50_us"]))
        for name, s in sides
    ]
    header = ("sequential no-op round trip", "n", *(label for _, label in _PCTS))
    return table((*header, "rtpool p50 / this p50"), rows)


def _throughput_lines(thr: Mapping) -> List[str]:
    rates = ", ".join(num(r.get("tasks_per_s")) for r in thr["runs"])
    return [
        f"{thr['tasks']:,} no-op tasks in one package, {len(thr['runs'])} runs: median "
        f"**{num(thr['median_tasks_per_s'])}** tasks/s, best {num(thr['best_tasks_per_s'])} "
        f"(each run: {rates})."
    ]


def _payload_lines(pay: Mapping) -> List[str]:
    names: List[str] = []
    for size_row in pay["sizes"]:
        names += [n for n in size_row.get("variants", {}) if n not in names]
    rows = []
    for size_row in pay["sizes"]:
        default, stats = default_variant(pay, size_row)
        variants, floors = size_row.get("variants", {}), size_row.get("floors", {})
        cells = [size_name(size_row["size_bytes"]), us(stats.get("p50_us")), default]
        cells += [num(variants.get(n, {}).get("mb_per_s")) for n in names]
        cells += [num(floors.get(k, {}).get("mb_per_s")) for k in ("tcp", "memcpy")]
        rows.append(cells)
    header = ("size", "p50, default", "default transport", *(f"{n} MB/s" for n in names))
    return [
        "Echo of each size through a task, every variant in turn (MB/s = 2 x size / p50):",
        "",
        *table((*header, "raw TCP MB/s", "memcpy MB/s"), rows),
    ]


def _scale_lines(scale: Mapping) -> List[str]:
    rows = []
    for lv in scale["levels"]:
        t, lt = lv.get("throughput", {}), lv.get("latency", {})
        idle = idle_cpu(lv)
        rows.append(
            (
                f"{lv['workers']:,}",
                f"{lv['connections']['connected']:,}",
                "-" if idle is None else f"{idle:.1f} %",
                num(t.get("tasks_per_s")),
                "-" if t.get("master_cpu_us_per_task") is None else t["master_cpu_us_per_task"],
                " / ".join(us(lt.get(k)) for k in ("p50_us", "p99_us", "p99_9_us", "max_us")),
                lv.get("master_rss_per_connection_kb", "-"),
                lv.get("master_lease_lost", "-"),
            )
        )
    header = ("simulated workers", "connected", "idle master CPU", "tasks/s")
    header += ("master CPU us/task", "round trip p50 / p99 / p99.9 / max", "KiB/connection")
    return table((*header, "leases lost (master)"), rows)


def _demo_lines(d: Mapping) -> List[str]:
    return [
        f"{d['tasks']} semiprimes ({d['mean_task_ms']:.2f} ms each), N = {d['workers']}, best "
        f"of {d['rounds']} rounds: sequential {d['sequential_s']:.3f} s, parallel ceiling "
        f"{d['ceiling_s']:.3f} s, rtpool {d['rtpool_makespan_s']:.3f} s; makespan / ceiling "
        f"**{d['makespan_over_ceiling']:.3f}** (same-round median); LocalCluster() to first "
        f"result {d['start_to_first_result_s']:.3f} s."
    ]


_DOCS_PARTS = (
    ("latency", "Latency", _latency_lines),
    ("throughput", "Throughput", _throughput_lines),
    ("payload", "Payload", _payload_lines),
    ("scale", "Cluster scale", _scale_lines),
    ("demo", "Factorization demo", _demo_lines),
)


def docs_summary(run: Mapping) -> str:
    """The summary of docs/benchmarks.md: provenance, commands, a table per section."""
    lines = [GENERATED, f"**Machine and run**: {provenance(run)}.", ""]
    commands = run.get("commands") or {}
    if commands:
        lines += ["Commands, one after another in that run:", "", "```"]
        lines += [commands[k] for k in SECTIONS if k in commands]
        lines += ["```", ""]
    for key, title, render in _DOCS_PARTS:
        if run.get(key):
            lines += [f"**{title}**", "", *render(run[key]), ""]
    return "\n".join(lines).rstrip("\n")
