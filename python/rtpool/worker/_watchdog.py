"""The watchdog of a task that runs in the worker child's own process (the fast path, which
cannot be interrupted): it keeps such a task from turning its worker into a black hole.

While the loop's thread is inside the task, the heartbeat thread, every round:

* reads what the master sent (the loop does not read while the task runs), and handles it as
  the loop would: assignments queue up, ``ABORT`` of queued tasks answers them;
* gives back (``RETURN``) the tasks queued behind a task that has run much longer than this
  worker's tasks do (``_GIVE_BACK_AFTER_NS``, or 20 times the average), or as soon as a queued
  task with a time limit has waited half of it: idle workers run them, instead of the master
  failing them at its time limit without their ever starting.
  ``RETURN`` also withdraws the credits, so the master assigns nothing more to this slot until
  the task ends and the loop asks again;
* retires the child when the master aborts the running task (it ran past ``timeout`` + grace or
  ``--max-task-seconds``, or it was cancelled): the task cannot be interrupted, so the child
  sends its pending results, ``RETURN`` of its queued tasks and ``DRAIN``, and exits with
  ``EXIT_RETIRED``; the parent starts a fresh child at once. The task dies with the child.
  Only a child of ``rtpool worker`` (with a slot board) retires: a ``WorkerConnection`` run
  elsewhere (tests) keeps the old way, the task's result is sent when it ends.

Ownership: the loop's thread sets ``_inproc`` before the task and clears it after; the watchdog
touches the queue, credits, pending results and the socket only under ``_watch_lock`` while
``_inproc`` is the same task, when the loop's thread cannot. The loop takes no lock per task:
the watchdog raises ``_watching`` (under the lock) *before* it reads ``_inproc``, and the loop
reads ``_watching`` *after* it clears ``_inproc``. Under the GIL these steps interleave in some
order: either the watchdog reads ``None`` (or another task) and backs off, or the loop sees
``_watching`` and waits on the lock until the watchdog is done.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Deque, List

from .. import _protocol as P
from ._common import EXIT_RETIRED, Stop, log, perf_ns

#: A task that runs in the worker process this long (or 20 times the average task) gives back
#: the tasks queued behind it.
_GIVE_BACK_AFTER_NS = 500_000_000


def _limit_at_risk(queue: Deque[Any], now: int) -> bool:
    """Whether a queued task with a time limit has waited half of it: the master counts the
    limit from the assignment, and fails the task at the limit plus its grace period."""
    return any(t.timeout_ms and now - t.received_ns >= t.timeout_ms * 500_000 for t in queue)


class Watchdog:
    """The part of ``WorkerConnection`` that watches its in-process task (see above)."""

    # Provided by the rest of WorkerConnection: _recv_nowait and _send (Session),
    # _give_back and _results_frame (the loop).
    queue: Deque[Any]
    pending: List[list]
    ema_ns: float | None
    board: Any

    def _init_watchdog(self) -> None:
        #: The task running in this process now (set and cleared by the loop's thread).
        self._inproc: Any = None
        self._inproc_ns = 0
        self._watch_lock = threading.Lock()
        #: Raised by the watchdog while it holds the lock (see the module docstring).
        self._watching = False
        self._gave_back = False

    def _watch(self) -> None:
        """One round of the watchdog (called by the heartbeat thread)."""
        t = self._inproc
        if t is None or not self._watch_lock.acquire(blocking=False):
            return
        self._watching = True  # before _inproc is read again (see the module docstring)
        try:
            if self._inproc is not t:
                return
            self._recv_nowait()  # ABORT of the running task: see _on_abort_running
            now = perf_ns()
            ran_ns = now - self._inproc_ns
            if self.queue and (
                ran_ns >= max(_GIVE_BACK_AFTER_NS, 20 * (self.ema_ns or 0))
                or _limit_at_risk(self.queue, now)
            ):
                count = len(self.queue)
                self._give_back(count)
                log(
                    f"task {t.task_id} has run for {ran_ns / 1e9:.1f} s in this process; "
                    f"gave back the {count} tasks queued behind it",
                    logging.WARNING,
                )
        except Stop:
            pass  # the loop finds the broken connection when the task ends
        finally:
            self._watching = False
            self._watch_lock.release()

    def _on_abort_running(self) -> None:
        """The master aborted the task running in this process (heartbeat thread, under the
        lock): retire this child (see the module docstring). Does not return."""
        t = self._inproc
        ran = (perf_ns() - self._inproc_ns) / 1e9
        queued = [[q.task_id, q.attempt] for q in self.queue]
        log(
            f"the master aborted task {t.task_id} (attempt {t.attempt}) after it ran {ran:.1f} s "
            "in this process, which cannot interrupt it (it has no timeout=): retiring this "
            f"process (returning {len(queued)} queued tasks) for a fresh one",
            logging.WARNING,
        )
        out = self._results_frame()
        if queued:
            out += P.encode(P.RETURN, queued)
        out += P.encode(P.DRAIN)
        try:
            self._send(out)
        except Stop:
            pass  # the master requeues what this session held when it sees it close
        if self.board is not None:
            self.board.task_ended()  # not a crash: the parent replaces it without blame
        os._exit(EXIT_RETIRED)
