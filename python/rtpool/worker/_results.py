"""Sending a worker child's results: :class:`Reporting`, the part of ``WorkerConnection``
(``_loop.py``) that batches them.

Results go out in one ``RESULT`` frame, with the ``PULL`` that tops the credits up, in one
write: when the local queue runs empty, :data:`FLUSH_AFTER_RESULTS` results are pending, or
the oldest pending result would wait more than :data:`FLUSH_AFTER_NS` (also counting the
next task's expected time, so a long task never holds back the result before it). A frame
never exceeds the session's budget; results whose write failed when the connection dropped
are sent again in the next session (``unsent``).

A result is queued as its wire entry, ``[task, attempt, status, data, exec_us, wait_us,
end_ns]``, whose last field becomes ``flush_us`` when the frame is built.
"""

from __future__ import annotations

from collections import deque
from typing import List

from .. import _protocol as P
from .._frame import SEGMENT_MIN_BYTES, as_payload
from ._common import RESULT_OVERHEAD, Stop, perf_ns
from ._latency import RoundTrip

__all__ = [
    "DATA",
    "END",
    "FLUSH_AFTER_NS",
    "FLUSH_AFTER_RESULTS",
    "SEGMENT_RESULT_BYTES",
    "Reporting",
]

#: Results wait at most this long for company before they are sent.
FLUSH_AFTER_NS = 1_000_000
FLUSH_AFTER_RESULTS = 64
# A result entry's fields that the loop reads: its data, and its end time (then flush_us).
DATA = 3
END = 6
# A result whose data is at least SEGMENT_MIN_BYTES (this, counting RESULT_OVERHEAD) travels as
# a segment (a Payload), not copied into the msgpack body.
SEGMENT_RESULT_BYTES = SEGMENT_MIN_BYTES + RESULT_OVERHEAD


class Reporting:
    """The pending results of a worker connection, and their frames. ``WorkerConnection``
    sets the attributes below and provides ``_send`` and ``frame_budget``."""

    pending: List[list]
    pending_bytes: int
    # Results whose write failed when the connection dropped, for the next session.
    unsent: List[list]
    queue: deque
    prefetch: int
    # Credits granted with PULL and not yet used by ASSIGN.
    outstanding: int
    ema_ns: float | None
    round_trip: RoundTrip
    frame_budget: int

    def _add_result(self, result: list) -> None:
        """Queue a result that is not the end of a task run here (it asks for no credit)."""
        size = len(result[DATA]) + RESULT_OVERHEAD
        if size >= SEGMENT_RESULT_BYTES:
            result[DATA] = as_payload(result[DATA])
        if self.pending_bytes + size > self.frame_budget:
            self._flush(pull=False)
        self.pending_bytes += size
        self.pending.append(result)

    def _results_frame(self) -> bytes:
        """The pending results as one RESULT frame (or nothing), their flush_us filled in."""
        pending = self.pending
        if not pending:
            return b""
        now = perf_ns()
        for r in pending:  # (a large result is a Payload already: _run, _add_result)
            r[END] = (now - r[END]) // 1000  # end of execution -> flush_us
        frame = P.encode(P.RESULT, pending)
        self.pending = []  # a new list: _flush keeps the old one if the write fails
        self.pending_bytes = 0
        return frame

    def _flush(self, pull: bool = True) -> None:
        """Send the pending results and (``pull``) top the credits up, in one write."""
        pending = self.pending
        out = self._results_frame()
        if pull:
            credits = 1 + self.prefetch - len(self.queue) - self.outstanding
            if credits > 0:
                out += P.encode(P.PULL, credits)
                self.outstanding += credits
            else:
                credits = 0
        if out:
            try:
                self._send(out)
                if pull and credits:
                    self.round_trip.on_pull(credits, perf_ns())
            except Stop:
                self.unsent += pending  # (empty if there were no results)
                raise

    def _send_unsent(self) -> None:
        """Send the results a dropped connection kept back, in frames within the limit."""
        unsent, self.unsent = self.unsent, []
        frames = []
        batch: List[list] = []
        size = 0
        for r in unsent:
            n = len(r[DATA]) + RESULT_OVERHEAD
            if n > self.frame_budget:
                continue  # the new session's limit is lower; stale anyway
            if batch and size + n > self.frame_budget:
                frames.append(P.encode(P.RESULT, batch))
                batch, size = [], 0
            batch.append(r)
            size += n
        if batch:
            frames.append(P.encode(P.RESULT, batch))
        if frames:
            try:
                self._send(P.join(frames))
            except Stop:
                self.unsent = unsent
                raise

    def _should_flush(self) -> bool:
        pending = self.pending
        if not pending:
            return False
        if len(pending) >= FLUSH_AFTER_RESULTS:
            return True
        # Flush now if the oldest result would otherwise wait past the deadline during the
        # next task.
        return perf_ns() - pending[0][END] + (self.ema_ns or 0) >= FLUSH_AFTER_NS
