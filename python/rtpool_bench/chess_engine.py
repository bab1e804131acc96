"""The chess engine of ``rtpool demo chess``: a small alpha-beta searcher, bounded by time.

Move generation is the ``chess`` package's (PyPI ``chess``, in the ``bench`` extra); the
evaluation is our own: material plus piece-square tables (the simplified evaluation function
of the chess programming wiki), from the side to move's point of view, in centipawns.

:func:`search` is the task both engines run: iterative deepening over a given subset of the
root moves (all of them for the single-process engine, one share each for the distributed
one), negamax with alpha-beta, captures first, and a bounded capture-only quiescence search. It
stops itself when its time budget runs out and returns what it found at every depth it
completed, so the client can compare the shares at a common depth (:func:`pick`).

The module imports ``chess`` at the top: workers import it by reference to run :func:`search`,
and only ``rtpool demo chess`` and its test load it.
"""

from __future__ import annotations

import time
from typing import Dict, List, Sequence

import chess

MATE = 100_000
# How often (in nodes) the search looks at the clock: under 3 ms of CPython at the 90-100 k
# nodes per CPU second measured, so a search overruns its budget by at most that much.
CLOCK_EVERY = 256
# Quiescence plies at most: captures only, so a long exchange cannot run away with the budget.
QUIESCENCE_PLIES = 6

VALUES = {
    chess.PAWN: 100,
    chess.KNIGHT: 320,
    chess.BISHOP: 330,
    chess.ROOK: 500,
    chess.QUEEN: 900,
    chess.KING: 0,
}

# Piece-square tables from White's side, rank 8 first as printed (index 0 = a8), so that a
# white piece on square s reads entry s ^ 56 and a black one entry s.
# fmt: off
_PST = {
    chess.PAWN: [
        0, 0, 0, 0, 0, 0, 0, 0,  50, 50, 50, 50, 50, 50, 50, 50,
        10, 10, 20, 30, 30, 20, 10, 10,  5, 5, 10, 25, 25, 10, 5, 5,
        0, 0, 0, 20, 20, 0, 0, 0,  5, -5, -10, 0, 0, -10, -5, 5,
        5, 10, 10, -20, -20, 10, 10, 5,  0, 0, 0, 0, 0, 0, 0, 0,
    ],
    chess.KNIGHT: [
        -50, -40, -30, -30, -30, -30, -40, -50,  -40, -20, 0, 0, 0, 0, -20, -40,
        -30, 0, 10, 15, 15, 10, 0, -30,  -30, 5, 15, 20, 20, 15, 5, -30,
        -30, 0, 15, 20, 20, 15, 0, -30,  -30, 5, 10, 15, 15, 10, 5, -30,
        -40, -20, 0, 5, 5, 0, -20, -40,  -50, -40, -30, -30, -30, -30, -40, -50,
    ],
    chess.BISHOP: [
        -20, -10, -10, -10, -10, -10, -10, -20,  -10, 0, 0, 0, 0, 0, 0, -10,
        -10, 0, 5, 10, 10, 5, 0, -10,  -10, 5, 5, 10, 10, 5, 5, -10,
        -10, 0, 10, 10, 10, 10, 0, -10,  -10, 10, 10, 10, 10, 10, 10, -10,
        -10, 5, 0, 0, 0, 0, 5, -10,  -20, -10, -10, -10, -10, -10, -10, -20,
    ],
    chess.ROOK: [
        0, 0, 0, 0, 0, 0, 0, 0,  5, 10, 10, 10, 10, 10, 10, 5,
        -5, 0, 0, 0, 0, 0, 0, -5,  -5, 0, 0, 0, 0, 0, 0, -5,
        -5, 0, 0, 0, 0, 0, 0, -5,  -5, 0, 0, 0, 0, 0, 0, -5,
        -5, 0, 0, 0, 0, 0, 0, -5,  0, 0, 0, 5, 5, 0, 0, 0,
    ],
    chess.QUEEN: [
        -20, -10, -10, -5, -5, -10, -10, -20,  -10, 0, 0, 0, 0, 0, 0, -10,
        -10, 0, 5, 5, 5, 5, 0, -10,  -5, 0, 5, 5, 5, 5, 0, -5,
        0, 0, 5, 5, 5, 5, 0, -5,  -10, 5, 5, 5, 5, 5, 0, -10,
        -10, 0, 5, 0, 0, 0, 0, -10,  -20, -10, -10, -5, -5, -10, -10, -20,
    ],
    chess.KING: [
        -30, -40, -40, -50, -50, -40, -40, -30,  -30, -40, -40, -50, -50, -40, -40, -30,
        -30, -40, -40, -50, -50, -40, -40, -30,  -30, -40, -40, -50, -50, -40, -40, -30,
        -20, -30, -30, -40, -40, -30, -30, -20,  -10, -20, -20, -20, -20, -20, -20, -10,
        20, 20, 0, 0, 0, 0, 20, 20,  20, 30, 10, 0, 0, 10, 30, 20,
    ],
}
# fmt: on

# _SCORE[color][piece_type][square]: material + position, for that color's piece there.
_SCORE: Dict[bool, Dict[int, List[int]]] = {chess.WHITE: {}, chess.BLACK: {}}
for _pt, _table in _PST.items():
    assert len(_table) == 64, _pt
    _SCORE[chess.WHITE][_pt] = [VALUES[_pt] + _table[sq ^ 56] for sq in chess.SQUARES]
    _SCORE[chess.BLACK][_pt] = [VALUES[_pt] + _table[sq] for sq in chess.SQUARES]


def evaluate(board: chess.Board) -> int:
    """Material + piece-square score of ``board``, for the side to move, in centipawns."""
    score = 0
    for color, sign in ((chess.WHITE, 1), (chess.BLACK, -1)):
        occupied = board.occupied_co[color]
        for pt, table in _SCORE[color].items():
            for sq in chess.scan_forward(board.pieces_mask(pt, color) & occupied):
                score += sign * table[sq]
    return score if board.turn == chess.WHITE else -score


class _TimeUp(Exception):
    """The budget ran out inside the tree: unwind to the iterative-deepening loop."""


class _Search:
    def __init__(self, board: chess.Board, stop_at: float) -> None:
        self.board = board
        self.stop_at = stop_at
        self.nodes = 0
        self.clock_on = False  # off during depth 1, so every search has a move

    def _tick(self) -> None:
        self.nodes += 1
        if self.clock_on and self.nodes % CLOCK_EVERY == 0 and time.monotonic() > self.stop_at:
            raise _TimeUp

    def _ordered(self, moves) -> List[chess.Move]:
        """Captures first, most valuable victim then least valuable attacker; promotions."""
        board = self.board

        def key(m: chess.Move) -> int:
            k = 0
            if board.is_capture(m):
                victim = board.piece_type_at(m.to_square) or chess.PAWN  # en passant
                k = 10 * VALUES[victim] - VALUES[board.piece_type_at(m.from_square)] + 10_000
            if m.promotion:
                k += VALUES[m.promotion]
            return -k

        return sorted(moves, key=key)

    def quiesce(self, alpha: int, beta: int, plies: int) -> int:
        self._tick()
        stand = evaluate(self.board)
        if stand >= beta or plies == 0:
            return stand
        alpha = max(alpha, stand)
        for move in self._ordered(self.board.generate_legal_captures()):
            self.board.push(move)
            score = -self.quiesce(-beta, -alpha, plies - 1)
            self.board.pop()
            if score >= beta:
                return score
            alpha = max(alpha, score)
        return alpha

    def negamax(self, depth: int, alpha: int, beta: int, ply: int) -> int:
        self._tick()
        if depth == 0:
            return self.quiesce(alpha, beta, QUIESCENCE_PLIES)
        moves = self._ordered(self.board.legal_moves)
        if not moves:
            return -(MATE - ply) if self.board.is_check() else 0
        if self.board.halfmove_clock >= 100:
            return 0
        best = -MATE - 1
        for move in moves:
            self.board.push(move)
            score = -self.negamax(depth - 1, -beta, -alpha, ply + 1)
            self.board.pop()
            best = max(best, score)
            alpha = max(alpha, score)
            if alpha >= beta:
                break
        return best

    def root(self, moves: List[chess.Move], depth: int) -> List[tuple]:
        """The root moves with their scores at ``depth``, best first. The best score is
        exact; the others are upper bounds (alpha-beta), which is enough to order them."""
        scored = []
        alpha = -MATE - 1
        for move in moves:
            self.board.push(move)
            # A repetition at the root is scored as a draw, so the engines do not shuffle.
            if self.board.is_repetition(2):
                score = 0
            else:
                score = -self.negamax(depth - 1, -MATE - 1, -alpha, 1)
            self.board.pop()
            scored.append((score, move))
            alpha = max(alpha, score)
        scored.sort(key=lambda sm: -sm[0])
        return scored


def search(fen: str, moves_uci: Sequence[str], budget_s: float, max_depth: int = 32) -> Dict:
    """Iterative deepening over the root moves ``moves_uci`` of the position ``fen``.

    The task of both engines. Depth 1 always completes (no clock); each deeper iteration is
    abandoned when the budget, counted from the start of this call, runs out.

    Args:
        fen: The position.
        moves_uci: The root moves to search (legal in ``fen``), in UCI notation.
        budget_s: Seconds of search from the start of this call.
        max_depth: Deepest iteration.

    Returns:
        ``best`` (UCI), ``score`` (centipawns for the side to move), ``depth`` (deepest
        completed), ``by_depth`` (``[(depth, best UCI, score), ...]``), ``nodes``,
        ``seconds`` (wall), ``cpu_s`` (CPU time this search got: below ``seconds`` when
        the worker shared its CPU) and ``fifo`` (the search ended under ``SCHED_FIFO``: in
        real-time mode, False when the workers' budget demoted it; None where unknown).
    """
    t0, cpu0 = time.monotonic(), time.process_time()
    board = chess.Board(fen)
    s = _Search(board, t0 + budget_s)
    moves = [chess.Move.from_uci(u) for u in moves_uci]
    moves = s._ordered(moves)
    by_depth: List[tuple] = []
    try:
        for depth in range(1, max_depth + 1):
            scored = s.root(moves, depth)
            s.clock_on = True
            by_depth.append((depth, scored[0][1].uci(), scored[0][0]))
            moves = [m for _, m in scored]  # best first next time
            if abs(scored[0][0]) >= MATE - max_depth or time.monotonic() > s.stop_at:
                break
    except _TimeUp:
        pass
    depth, best, score = by_depth[-1]
    return {
        "best": best,
        "score": score,
        "depth": depth,
        "by_depth": by_depth,
        "nodes": s.nodes,
        "seconds": time.monotonic() - t0,
        "cpu_s": time.process_time() - cpu0,
        "fifo": _is_fifo(),
    }


def _is_fifo() -> bool | None:
    """Whether the calling thread runs under ``SCHED_FIFO`` (None off Linux)."""
    import os

    if not hasattr(os, "sched_getscheduler"):
        return None
    return os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0) == os.SCHED_FIFO


def pick(results: Sequence[Dict]) -> Dict:
    """The best move among the results of several :func:`search` shares of one position.

    Scores are compared at the deepest depth every share completed (scores of different
    depths are not comparable: odd depths flatter the side to move).

    Returns:
        ``best``, ``score``, ``depth`` (the common depth), ``nodes`` and ``cpu_s`` (sums).
    """
    if not results:
        raise ValueError("no search results to pick from")
    depth = min(r["depth"] for r in results)
    best = max(
        ((dict((d, (m, sc)) for d, m, sc in r["by_depth"])[depth]) for r in results),
        key=lambda ms: ms[1],
    )
    return {
        "best": best[0],
        "score": best[1],
        "depth": depth,
        "nodes": sum(r["nodes"] for r in results),
        "cpu_s": sum(r.get("cpu_s", 0.0) for r in results),
    }


def split(board: chess.Board, shares: int) -> List[List[str]]:
    """The legal moves of ``board`` in ``shares`` groups, dealt round-robin in move order
    (captures first), so each share gets some of the promising moves; no empty group."""
    s = _Search(board, 0.0)
    moves = [m.uci() for m in s._ordered(board.legal_moves)]
    groups = [moves[i::shares] for i in range(shares)]
    return [g for g in groups if g]
