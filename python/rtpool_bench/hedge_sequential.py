"""``rtpool bench hedge --one-at-a-time N``: the request-at-a-time case of issue 17. Two or
more workers, one ``--slowdown`` times slower (it always is: the master learns its times as
they are), tasks of ``--task-ms`` (default 20) milliseconds of sleep submitted one after
another, each waited for before the next: all fast, one slow, and one slow with
``options(hedge=True)``, in interleaved blocks (A B C, then C B A, ...). Prints p50, p99,
p99.9 and max of each and the p99 ratio of the hedged one to the all-fast one (bar: 2x).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List

from .openloop import histogram_of, summarize
from .stats import safe_ratio
from .tasks import sleep_maybe_slow, sleep_maybe_slow_hedged

HEDGE_P99_RATIO_BAR = 2.0
#: Tasks per block: one configuration runs this many one after another, then the next.
BLOCK = 10


def _one(submit: Callable, timeout: float) -> tuple:
    """Submit one task and wait for it: ``(latency ns or None, error name or None)``."""
    start = time.perf_counter_ns()
    try:
        submit().result(timeout)
    except Exception as exc:  # noqa: BLE001 - counted by name, the run goes on
        return None, type(exc).__name__
    return time.perf_counter_ns() - start, None


def run_one_at_a_time(
    client, stats: Callable, n: int, task_ms: float, say: Callable, warm: int = 2 * BLOCK
) -> Dict:
    """The three configurations, ``n`` tasks each, one task at a time (see the module), after
    ``warm`` tasks of each (at least 5 per worker, so the master knows every worker's pace)."""
    hedged = client.options(hedge=True)
    configs = {
        "all fast": lambda: client.submit(sleep_maybe_slow, task_ms, False),
        "one slow": lambda: client.submit(sleep_maybe_slow, task_ms, True),
        "one slow + hedge": lambda: hedged.submit(sleep_maybe_slow_hedged, task_ms, True),
    }
    # Warm-up: the master learns each function's time on every worker, the slow one included
    # (a warm-up on the fast workers only would hide the case).
    say(f"hedge one at a time: warm-up, {warm} tasks per configuration")
    for submit in configs.values():
        for _ in range(warm):
            _one(submit, 60)
    lat: Dict[str, List[int | None]] = {k: [] for k in configs}
    errors: Dict[str, Dict[str, int]] = {k: {} for k in configs}
    before = stats()
    order = list(configs)
    done = 0
    while done < n:
        size = min(BLOCK, n - done)
        for label in order:
            for _ in range(size):
                ns, err = _one(configs[label], 60)
                lat[label].append(ns)
                if err is not None:
                    errors[label][err] = errors[label].get(err, 0) + 1
        order.reverse()
        done += size
        say(f"hedge one at a time: {done}/{n} per configuration")
    after = stats()
    rows = {
        label: {
            "sent": len(values),
            "completed": sum(v is not None for v in values),
            "errors": errors[label],
            "latency": summarize(histogram_of(values)),
        }
        for label, values in lat.items()
    }
    p99 = {k: r["latency"]["p99_us"] for k, r in rows.items()}
    ratio = safe_ratio(p99["one slow + hedge"], p99["all fast"])
    return {
        "tasks_per_config": n,
        "task_ms": task_ms,
        "configs": rows,
        "hedges": after.get("hedges", 0) - before.get("hedges", 0),
        "hedge_wins": after.get("hedge_wins", 0) - before.get("hedge_wins", 0),
        "slow_p99_ratio": safe_ratio(p99["one slow"], p99["all fast"]),
        "hedge_p99_ratio": ratio,
        "bar": {
            "hedge_p99_ratio_max": HEDGE_P99_RATIO_BAR,
            "ok": None if ratio is None else ratio <= HEDGE_P99_RATIO_BAR,
        },
    }


def render_one_at_a_time(s: Dict, console) -> None:
    """Print the one-at-a-time section."""
    from rich.table import Table

    from .openloop import COLUMNS
    from .stats import fmt_ratio, fmt_us, verdict

    t = Table(
        title=f"Hedge, one task at a time: {s['task_ms']:g} ms tasks, "
        f"{s['tasks_per_config']} per configuration",
        title_justify="left",
    )
    t.add_column("config")
    t.add_column("sent", justify="right")
    for _, name in COLUMNS:
        t.add_column(name, justify="right")
    for label, r in s["configs"].items():
        cells = [fmt_us(r["latency"][key]) for key, _ in COLUMNS]
        t.add_row(label, str(r["sent"]), *cells)
    console.print(t)
    console.print(
        f"hedges {s['hedges']} (backup won {s['hedge_wins']}); "
        f"p99(one slow) / p99(all fast) = {fmt_ratio(s['slow_p99_ratio'])}; "
        f"p99(one slow + hedge) / p99(all fast) = {fmt_ratio(s['hedge_p99_ratio'])} "
        f"(bar <= {HEDGE_P99_RATIO_BAR:g}x: {verdict(s['bar']['ok'])})"
    )
