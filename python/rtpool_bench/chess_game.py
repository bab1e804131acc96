"""``rtpool demo chess``: a distributed engine plays the same engine in one process, each move
against a hard deadline.

Both sides run :func:`rtpool_bench.chess_engine.search` as rtpool tasks on one
``LocalCluster``, with the same time per move:

* the **distributed** engine (White) splits the root moves into one share per worker
  (root-parallel search) and sends one task per share;
* the **single** engine (Black) sends one task with every root move: the same search in one
  worker process.

Each move has a hard deadline, ``move_time`` after the client starts it. A task searches for
its budget (``move_time`` less a reserve for sending the task and its result, see
:func:`budget_s`) and returns what it found; ``client.gather(futures, deadline=)`` takes the
results that arrived by ``move_time - CLIENT_RESERVE_S`` and cancels the rest, and the move is
the best of those (compared at their common depth, :func:`~rtpool_bench.chess_engine.pick`).
If none arrived, the move comes from a depth-1 search the client ran while it waited. Each
package also carries ``deadline=move_time``, so the master serves it earliest deadline first
and counts it met or missed.

The game ends at checkmate, stalemate or a claimable draw, or after ``moves`` moves each.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Callable, Dict, List

import chess

from .chess_engine import evaluate, pick, search, split
from .stats import percentile

# What the client keeps for itself between the gather deadline and the move deadline: waking
# up, cancelling the late tasks, picking the move: well under a millisecond on a quiet machine,
# but the client wakes at normal priority, and on the shared 2-vCPU VM (load average 6) a
# wake-up came 19 ms after the gather deadline.
CLIENT_RESERVE_S = 0.05


def budget_s(move_time_s: float) -> float:
    """Seconds a task searches: the move time less the client's reserve, less 20 ms + 5 % of
    the move time for the trip there and back (submit, queue, assign, the last clock check up
    to ``CLOCK_EVERY`` nodes late, the result's way back; idle, a result is back 5-15 ms
    after its budget ends)."""
    return max(0.01, move_time_s - CLIENT_RESERVE_S - 0.02 - 0.05 * move_time_s)


def rt_budget_ms(move_time_s: float) -> int:
    """The workers' real-time budget (``rt_budget_ms``) in real-time mode: one move time.

    A search holds its CPU for its whole budget (:func:`budget_s`, 0.88 s of a 1 s move).
    Under the workers' default budget (100 ms) it was demoted after its first tenth and shared
    the CPU with every other process for the rest of the move, so the nodes each engine
    searched followed the machine's other load, not the pool (shared fairly next to our two
    hogs alone, the one single-engine process gets 2/3 of a CPU and the two distributed ones
    1/2 each: 1.5x; docs/chess.md). No search runs longer than a move, so a task past it is a
    runaway and is demoted as before.
    """
    return max(1, math.ceil(move_time_s * 1000))


def engine_move(client, board: chess.Board, shares: int, move_time_s: float) -> Dict:
    """Search ``board`` in ``shares`` tasks and choose a move by the deadline.

    Returns:
        ``move`` (a ``chess.Move``), ``nodes`` and ``cpu_s`` (of the tasks that finished in
        time), ``depth``, ``score``, ``tasks``, ``tasks_in_time``, ``errors`` (of failed
        tasks), ``fallback`` (True: no task finished, the client's depth-1 move was played),
        ``elapsed_s`` (from the start of this call to the move).
    """
    t0 = time.monotonic()
    fen = board.fen()
    groups = split(board, shares)
    view = client.options(deadline=move_time_s)
    futures = [view.submit(search, fen, g, budget_s(move_time_s)) for g in groups]
    # The fallback while the tasks run: depth 1 completes whatever the budget.
    local = search(fen, [m.uci() for m in board.legal_moves], 0.0, max_depth=1)
    left = t0 + move_time_s - CLIENT_RESERVE_S - time.monotonic()
    results = client.gather(futures, deadline=max(0.0, left), return_exceptions=True)
    done = [r for r in results if isinstance(r, dict)]
    chosen = pick(done) if done else dict(pick([local]), nodes=0, cpu_s=0.0)
    elapsed = time.monotonic() - t0
    return {
        "move": chess.Move.from_uci(chosen["best"]),
        "nodes": chosen["nodes"],
        "cpu_s": chosen["cpu_s"],
        "depth": chosen["depth"],
        "score": chosen["score"],
        "tasks": len(futures),
        "tasks_in_time": len(done),
        "errors": [repr(r) for r in results if isinstance(r, BaseException)],
        "fifo": sum(r.get("fifo") is True for r in done),
        "fallback": not done,
        "elapsed_s": elapsed,
    }


def play_game(
    workers: int = 2,
    moves: int = 40,
    move_time_s: float = 1.0,
    realtime: bool = False,
    background_load: bool = False,
    say: Callable[[str], None] = lambda s: None,
    on_ply: Callable[[Dict], None] = lambda p: None,
    rt_budget: int | None = None,
) -> Dict:
    """Play one game on a fresh ``LocalCluster(workers=workers, realtime=realtime)``.

    Args:
        workers: Worker processes; the distributed engine sends one share per worker.
        moves: Moves per side at most.
        move_time_s: Each move's deadline, seconds after the client starts it.
        realtime: Real-time mode of the cluster (SCHED_FIFO, memory locked; each step as far
            as the OS permits: ``realtime_report`` says what took effect).
        background_load: One busy-loop process per CPU at normal priority for the whole game
            (started after the warm-up, stopped by PID at the end, each bounded in time).
        say: Progress lines.
        on_ply: Called with each ply's record as soon as it is played.
        rt_budget: The workers' ``rt_budget_ms`` in real-time mode (None: one move time,
            :func:`rt_budget_ms`). In real-time mode the game's own thread (it submits,
            gathers and moves) runs inside ``client.realtime_thread()``: it must act at the
            gather deadline, not whenever the normal processes let it.

    Returns:
        ``plies`` (one record per move: ``ply``, ``number``, ``side``, ``engine``, ``san``,
        ``uci``, ``nodes``, ``cpu_ms`` (CPU time the searches got), ``depth``, ``score``,
        ``tasks``, ``tasks_in_time``, ``searches_fifo`` (of those, the searches that ended
        under SCHED_FIFO), ``fallback``,
        ``elapsed_ms``, ``margin_ms`` (deadline minus time used; negative: late), ``late``),
        ``result``, ``termination``, ``final_fen``, ``pgn_moves``, ``summary``, ``settings``.
    """
    import rtpool

    from .cpu import CpuHogs

    board = chess.Board()
    plies: List[Dict] = []
    cpus = os.cpu_count() or 1
    rt_kw = {}
    if realtime:
        rt_kw["rt_budget_ms"] = rt_budget_ms(move_time_s) if rt_budget is None else rt_budget
    with rtpool.LocalCluster(workers=workers, realtime=realtime, **rt_kw) as cluster:
        cluster.wait_for_workers(workers, timeout=60)
        rt_report = cluster.stats().get("realtime") if realtime else None
        with cluster.client() as client:
            say("warm-up: every worker imports the engine")
            warm = [client.submit(search, board.fen(), [m], 0.05) for m in ("e2e4", "d2d4")]
            warm += [client.submit(search, board.fen(), ["g1f3"], 0.05) for _ in range(workers)]
            client.gather(warm, deadline=60)
            hogs = CpuHogs(cpus, lifetime_s=2 * moves * (move_time_s + 1) + 60)
            own = client.realtime_thread() if realtime else contextlib.nullcontext()
            with hogs if background_load else contextlib.nullcontext(), own:
                if background_load:
                    say(f"background load: {cpus} busy-loop processes, pids {hogs.pids}")
                for ply in range(2 * moves):
                    if board.is_game_over(claim_draw=True):
                        break
                    distributed = board.turn == chess.WHITE
                    shares = workers if distributed else 1
                    m = engine_move(client, board, shares, move_time_s)
                    rec = _record(board, ply, m, distributed, move_time_s)
                    board.push(m["move"])
                    plies.append(rec)
                    on_ply(rec)
    outcome = board.outcome(claim_draw=True)
    return {
        "settings": {
            "workers": workers,
            "moves": moves,
            "move_time_s": move_time_s,
            "realtime": realtime,
            "background_load": background_load,
            "hogs": cpus if background_load else 0,
            "rt_budget_ms": rt_kw.get("rt_budget_ms"),
            "task_budget_s": round(budget_s(move_time_s), 3),
            "client_reserve_s": CLIENT_RESERVE_S,
        },
        "realtime_report": rt_report,
        "plies": plies,
        "result": outcome.result() if outcome else "*",
        "termination": outcome.termination.name.lower() if outcome else "move limit",
        "material_white_cp": evaluate(board) * (1 if board.turn == chess.WHITE else -1),
        "final_fen": board.fen(),
        "pgn_moves": chess.Board().variation_san(board.move_stack),
        "summary": summarize(plies, move_time_s),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _record(board: chess.Board, ply: int, m: Dict, distributed: bool, move_time_s: float):
    elapsed_ms = m["elapsed_s"] * 1000
    margin_ms = move_time_s * 1000 - elapsed_ms
    return {
        "ply": ply,
        "number": board.fullmove_number,
        "side": "white" if board.turn == chess.WHITE else "black",
        "engine": "distributed" if distributed else "single",
        "san": board.san(m["move"]),
        "uci": m["move"].uci(),
        "nodes": m["nodes"],
        "cpu_ms": round(m["cpu_s"] * 1000, 1),
        "depth": m["depth"],
        "score": m["score"],
        "tasks": m["tasks"],
        "tasks_in_time": m["tasks_in_time"],
        "searches_fifo": m["fifo"],
        "errors": m["errors"],
        "fallback": m["fallback"],
        "elapsed_ms": round(elapsed_ms, 2),
        "margin_ms": round(margin_ms, 2),
        "late": margin_ms < 0,
    }


def summarize(plies: List[Dict], move_time_s: float) -> Dict:
    """Moves late, time used and nodes, per engine; the nodes ratio per move number."""
    out: Dict[str, object] = {}
    for engine in ("distributed", "single"):
        mine = [p for p in plies if p["engine"] == engine]
        used = [p["elapsed_ms"] for p in mine]
        out[engine] = {
            "moves": len(mine),
            "late": sum(p["late"] for p in mine),
            "fallbacks": sum(p["fallback"] for p in mine),
            "searches": sum(p["tasks_in_time"] for p in mine),
            "searches_fifo": sum(p["searches_fifo"] for p in mine),
            "used_ms": {k: _r(percentile(used, q)) for k, q in (("p50", 50), ("p99", 99))}
            | {"max": _r(max(used, default=None))},
            "margin_ms_min": _r(min((p["margin_ms"] for p in mine), default=None)),
            "nodes_p50": percentile([p["nodes"] for p in mine], 50),
            "depth_p50": percentile([p["depth"] for p in mine], 50),
        }
    for key in ("nodes", "cpu_ms"):
        ratios = _per_move_ratios(plies, key)
        out[f"{key}_ratio"] = {
            "per_move_p50": _r(percentile(ratios, 50)),
            "min": _r(min(ratios, default=None)),
            "max": _r(max(ratios, default=None)),
            "moves": len(ratios),
        }
    out["late_total"] = sum(p["late"] for p in plies)
    return out


def _per_move_ratios(plies: List[Dict], key: str) -> List[float]:
    """distributed/single of ``key`` for each move number both engines played (White's ply
    and Black's reply: different positions, so one ratio is noisy; their median is not)."""
    by_number: Dict[int, Dict[str, float]] = {}
    for p in plies:
        by_number.setdefault(p["number"], {})[p["engine"]] = p[key]
    return [
        n["distributed"] / n["single"]
        for n in by_number.values()
        if n.get("single") and "distributed" in n
    ]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)
