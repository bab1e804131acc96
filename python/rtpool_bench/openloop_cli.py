"""``rtpool bench latency --rate/--sweep``, ``rtpool bench deadline`` and ``rtpool bench hedge``:
the open-loop benchmarks (machinery in :mod:`rtpool_bench.openloop`,
blocks in :mod:`rtpool_bench.interleave`).

* **Open-loop latency**: no-op tasks submitted one by one at a fixed rate (``--rate``) or at
  10/50/80/95 % of the pool's single-submit saturation rate measured in the same run
  (``--sweep``); latency from each task's intended send time to its result. With
  ``--background-load`` every block runs next to one busy-loop process per core; with
  ``--compare-load`` idle and loaded blocks are interleaved. Percentiles to p99.99, a
  cyclictest-style histogram and a PNG of the distribution.
* **Deadline**: 10 ms CPU-bound tasks with a 50 ms deadline (``options(deadline=0.05)``),
  offered open loop at 80 % of the capacity measured in the same run (closed loop, enough in
  flight); the deadline-miss ratio, measured by the client (completion time from the intended
  send time over the budget) and, when the SDK and master have deadlines, by the futures'
  ``lateness``. With ``--background-load``: normal and real-time mode, each idle and next to
  one busy-loop process per core, interleaved (:mod:`rtpool_bench.deadline_load`).
* **Hedge**: one of the workers 10x slower (only its environment has
  ``RTPOOL_BENCH_SLOWDOWN``); all-fast, one-slow and one-slow with ``options(hedge=True)``
  blocks interleaved at the same rate; p99 ratios to all-fast.

Configurations measured against each other run in interleaved blocks (a shuffled order each
round, the system drained between blocks) so a noisy neighbour hits all alike. Every loop is
bounded by a count and a time budget; every process started here is stopped here, by PID.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict

from .deadline import bench_deadline
from .hedge import bench_hedge
from .openlatency import bench_open_latency, parse_levels

# --- CLI -------------------------------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Add the options of the open-loop benchmarks to ``rtpool bench``'s parser."""
    g = ap.add_argument_group("open-loop latency (latency --rate R, --sweep)")
    g.add_argument(
        "--rate", type=float, default=None, help="no-op tasks/s, open loop, instead of round trips"
    )
    g.add_argument(
        "--sweep",
        action="store_true",
        help="measure the single-submit saturation rate, then run at --levels percent of it",
    )
    g.add_argument("--levels", default="10,50,80,95", help="sweep levels, %% (default 10,50,80,95)")
    g.add_argument(
        "--background-load",
        action="store_true",
        help="a CPU hog per core during every block; deadline: normal and realtime mode, idle "
        "and with the hogs, interleaved (the table and a histogram)",
    )
    g.add_argument(
        "--compare-load",
        action="store_true",
        help="idle and loaded blocks interleaved; loaded / idle ratios per percentile",
    )
    g.add_argument("--hogs", type=int, default=0, help="CPU hogs (default: one per usable CPU)")
    g.add_argument(
        "--hog-nice",
        type=int,
        default=0,
        help="nice value of the hogs (default 0, the pool's own; 19: below the pool)",
    )
    g.add_argument(
        "--block-seconds", type=float, default=None, help="seconds per block (2; hedge 2.5)"
    )
    g.add_argument(
        "--saturation-tasks",
        type=int,
        default=None,
        help="tasks per saturation run (10000; the median of 3 runs sets the rates)",
    )
    g.add_argument(
        "--arrivals",
        choices=("fixed", "poisson"),
        default="fixed",
        help="intended send times: i / rate (default) or exponential gaps (seeded)",
    )
    g.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help="PNG of the distribution (latency default: bench-results/latency-<rate>.png)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help="a seconds-long smoke run (latency --rate/--sweep, deadline, hedge)",
    )
    g = ap.add_argument_group("deadline and hedge")
    g.add_argument(
        "--task-ms", type=float, default=None, help="ms of CPU per task (deadline 10, hedge 5)"
    )
    g.add_argument("--deadline-ms", type=float, default=50.0, help="deadline (default 50 ms)")
    g.add_argument(
        "--load",
        type=float,
        default=None,
        help="offered rate / capacity measured in the run (deadline 0.8, hedge 0.3)",
    )
    g.add_argument(
        "--slowdown", type=float, default=10.0, help="hedge: the slow worker's factor (10)"
    )
    g.add_argument(
        "--sender-normal",
        action="store_true",
        help="deadline --background-load: the submitting thread stays normal in the real-time "
        "configurations (by default it runs inside client.realtime_thread())",
    )
    g.add_argument(
        "--rate-basis",
        choices=("own", "lower"),
        default="own",
        help="deadline --background-load: offer each mode --load of its own idle capacity "
        "(own, the default) or both modes --load of the lower of the two capacities (lower)",
    )
    g.add_argument(
        "--one-at-a-time",
        type=int,
        default=0,
        metavar="N",
        help="hedge: instead of the open loop, N tasks per configuration submitted one after "
        "another, each waited for (the request-at-a-time case; --task-ms default 20, sleeping)",
    )


def is_open_loop(args: argparse.Namespace) -> bool:
    """True when ``rtpool bench latency`` was asked for the open-loop mode."""
    return args.rate is not None or args.sweep or args.background_load or args.compare_load


def run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Run ``latency`` (open loop), ``deadline`` or ``hedge`` as ``args`` say; print the result.

    Returns:
        0 when every task sent got its result (a late one counts), 1 otherwise.
    """
    import json

    from .stats import machine_info

    if args.which == "latency" and args.rate is None and not args.sweep:
        ap.error("open-loop latency needs --rate R or --sweep")
    if args.rate is not None and args.rate <= 0:
        ap.error("--rate must be positive")
    if args.sweep and args.rate:
        ap.error("give --rate or --sweep, not both")
    try:
        parse_levels(args.levels)
    except ValueError as exc:
        ap.error(str(exc))

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    result: Dict[str, object] = {"machine": machine_info()}
    if args.which == "latency":
        section, key = bench_open_latency(args, say), "open_loop"
    elif args.which == "deadline" and args.background_load:
        from .deadline_load import bench_deadline_load

        section, key = bench_deadline_load(args, say), "deadline_load"
    elif args.which == "deadline":
        section, key = bench_deadline(args, say), "deadline"
    else:
        section, key = bench_hedge(args, say), "hedge"
    result[key] = section
    if args.json:
        print(json.dumps(result))
    else:
        from rich.console import Console

        from . import openloop_render as rr
        from .deadline_load import render as render_deadline_load

        render = {
            "open_loop": rr.render_open_latency,
            "deadline": rr.render_deadline,
            "deadline_load": render_deadline_load,
        }
        if key == "hedge" and "tasks_per_config" in section:
            from .hedge_sequential import render_one_at_a_time

            render["hedge"] = render_one_at_a_time
        render.get(key, rr.render_hedge)(section, Console())
    return 0 if _all_answered(key, section) else 1


def _all_answered(key: str, s: Dict[str, object]) -> bool:
    """Every task sent got its result, and none failed (but for missing a deadline)."""
    if key == "deadline":
        rows = [s]
    elif key == "deadline_load":
        rows = list(s["cells"].values())
    else:
        rows = list(s["configs"].values()) if key == "hedge" else s["configs"]
    return all(
        r["completed"] == r["sent"] and not set(r["errors"]) - {"DeadlineMissedError"} for r in rows
    )
