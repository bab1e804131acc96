"""``rtpool demo chess``: its options, the per-move lines and the summary table (the game is
:mod:`rtpool_bench.chess_game`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, Sequence


def parser() -> argparse.ArgumentParser:
    """The ``rtpool demo chess`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool demo chess",
        description=(
            "A distributed chess engine (root-parallel: one task per worker, each searching a "
            "share of the root moves) plays the same engine in one worker process, with the "
            "same time per move, on a LocalCluster. Every move has a hard deadline; prints per "
            "move the nodes searched, the time used and the margin to the deadline, then the "
            "result and a summary (moves late, nodes ratio distributed/single)."
        ),
    )
    ap.add_argument(
        "--move-time",
        type=float,
        default=1.0,
        metavar="S",
        help="each move's deadline in seconds (default 1)",
    )
    ap.add_argument("--moves", type=int, default=40, help="moves per side at most (default 40)")
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes, and shares of the distributed search (default 2)",
    )
    ap.add_argument(
        "--background-load",
        action="store_true",
        help="one busy-loop process per CPU at normal priority for the whole game",
    )
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="LocalCluster(realtime=True): SCHED_FIFO and locked memory for the master and "
        "the workers, as far as the OS permits (what did not take effect is printed)",
    )
    ap.add_argument(
        "--rt-budget-ms",
        type=int,
        default=None,
        metavar="MS",
        help="with --realtime, the workers' real-time budget (default: one move time, so a "
        "search keeps SCHED_FIFO for its whole budget; 100 is the workers' own default)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rtpool demo chess``.

    Returns:
        0 when every move was made by its deadline, 1 when a move was late, 2 on bad
        arguments.
    """
    ap = parser()
    args = ap.parse_args(argv)
    if args.move_time <= 0 or args.moves < 1 or args.workers < 1:
        ap.error("--move-time must be above 0, --moves and --workers at least 1")
    if args.rt_budget_ms is not None and (not args.realtime or args.rt_budget_ms < 0):
        ap.error("--rt-budget-ms needs --realtime and 0 (no budget) or more milliseconds")
    if args.move_time < 0.2:
        ap.error(f"--move-time {args.move_time:g} leaves no time to search; use 0.2 s or more")
    from . import chess_game

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    def on_ply(p: Dict) -> None:
        if not args.json:
            print(_ply_line(p), flush=True)

    if not args.json:
        print(
            f"{'move':>5} {'side':5} {'engine':11} {'SAN':7} {'nodes':>8} {'depth':>5} "
            f"{'tasks':>5} {'CPU ms':>7} {'used ms':>8} {'margin ms':>9}  deadline"
        )
    result = chess_game.play_game(
        args.workers,
        args.moves,
        args.move_time,
        args.realtime,
        args.background_load,
        say,
        on_ply,
        args.rt_budget_ms,
    )
    if args.json:
        print(json.dumps(result))
    else:
        _print_summary(result)
    return 0 if result["summary"]["late_total"] == 0 else 1


def _ply_line(p: Dict) -> str:
    verdict = f"MISSED by {-p['margin_ms']:.1f} ms" if p["late"] else "met"
    if p["fallback"]:
        verdict += " (no task in time: depth-1 fallback)"
    return (
        f"{p['number']:>5} {p['side']:5} {p['engine']:11} {p['san']:7} {p['nodes']:>8} "
        f"{p['depth']:>5} {p['tasks_in_time']:>2}/{p['tasks']:<2} {p['cpu_ms']:>7.0f} "
        f"{p['elapsed_ms']:>8.1f} "
        f"{p['margin_ms']:>9.1f}  {verdict}"
    )


def _print_summary(result: Dict) -> None:
    st, s = result["settings"], result["summary"]
    rt = result["realtime_report"]
    print()
    print(f"result {result['result']} ({result['termination']}); {result['pgn_moves']}")
    print(
        f"settings: {st['workers']} workers, {st['move_time_s']:g} s per move (tasks search "
        f"{st['task_budget_s']:g} s), realtime {st['realtime']}, background load "
        f"{st['hogs']} hogs; load average {result['load_average']}"
    )
    if rt is not None:
        warn = "; ".join(rt.get("warnings") or []) or "none"
        print(
            f"realtime (master): active {rt.get('active')}, warnings: {warn}; workers' "
            f"budget {st['rt_budget_ms']} ms, the game's thread in client.realtime_thread()"
        )
    for engine in ("distributed", "single"):
        e = s[engine]
        u = e["used_ms"]
        print(
            f"{engine:11}: {e['moves']} moves, {e['late']} late, {e['fallbacks']} fallbacks; "
            f"time used p50 {u['p50']} ms, p99 {u['p99']} ms, max {u['max']} ms (smallest "
            f"margin {e['margin_ms_min']} ms); nodes p50 {e['nodes_p50']}, depth p50 "
            f"{e['depth_p50']}"
            + (
                f"; {e['searches_fifo']} of {e['searches']} searches SCHED_FIFO to the end"
                if st["realtime"]
                else ""
            )
        )
    for key, what in (("nodes", "nodes"), ("cpu_ms", "CPU time the searches got")):
        r = s[f"{key}_ratio"]
        print(
            f"{what} distributed/single per move number: p50 {r['per_move_p50']} (min "
            f"{r['min']}, max {r['max']}, {r['moves']} moves)"
        )
    print(f"moves late: {s['late_total']} of {s['distributed']['moves'] + s['single']['moves']}")
