"""Real-time mode of a client (``rtpool.Client(realtime=True)``, the clients of a
``LocalCluster(realtime=True)``): the process's memory locked and the client's own threads, the
reader (every result arrives through it) and the heartbeat thread (it also sends the ``ACK``s
the reader had to defer), under ``SCHED_FIFO``; each step as far as the OS permits, with the
same refusal rules as the master and the workers (``_realtime.py``): a refused step logs one
warning (what failed, the errno, how to permit it) on the ``rtpool.client`` logger and that
aspect stays normal; the client works either way.

The threads of the application are left alone: a thread that submits runs at whatever policy
it has, unless asked with :meth:`rtpool.Client.realtime_thread` (``with client.realtime_thread():
...``), which puts it under ``SCHED_FIFO`` for the block and restores its policy after. In a
Python process that matters more than it seems: a thread that holds the GIL at normal priority
while the CPUs are busy with ``SCHED_FIFO`` threads (the workers, on a small machine) is not
scheduled, and every real-time thread of the process that needs the GIL waits for it.

Why the I/O threads run one priority above the workers by default
(:data:`~rtpool._realtime.DEFAULT_IO_PRIORITY`): ``SCHED_FIFO`` does not time-slice between
equal priorities, so a reader at the workers' priority waits behind a worker's whole task
(10 ms in the deadline bench) for a CPU, and results queue in its socket meanwhile. Its work is
microseconds per frame, so it preempting a task costs the task nothing measurable.

The memory lock is the one the embedded masters of the process count (``_native.lock_memory``):
``mlockall`` is process-wide and ``munlockall`` happens when the last holder (master or client)
lets go. A client lets go when its last thread ends (after :meth:`~rtpool.Client.close`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List

from ._realtime import _fifo_warning

__all__ = ["ClientRealtime", "fifo_thread"]

_log = logging.getLogger("rtpool.client")
_RESET_ON_FORK = getattr(os, "SCHED_RESET_ON_FORK", 0)


def _supported() -> str | None:
    if sys.platform.startswith("linux") and hasattr(os, "SCHED_FIFO"):
        return None
    return "real-time mode (realtime=True) is only supported on Linux; the client stays normal"


def set_thread_fifo(priority: int, who: str) -> str | None:
    """Put the calling thread under ``SCHED_FIFO`` ``priority`` (with ``SCHED_RESET_ON_FORK``:
    what it starts runs normal). Returns None, or the warning naming ``who`` when refused."""
    unsupported = _supported()
    if unsupported:
        return unsupported
    try:
        # pid 0 is the calling thread: Linux schedules threads, not processes.
        os.sched_setscheduler(0, os.SCHED_FIFO | _RESET_ON_FORK, os.sched_param(priority))
    except (OSError, OverflowError) as exc:
        err = exc if isinstance(exc, OSError) else OSError(0, str(exc))
        return "real-time mode: " + _fifo_warning(priority, err, who)
    return None


@contextlib.contextmanager
def fifo_thread(priority: int, log: Callable[[str], None] = _log.warning) -> Iterator[bool]:
    """The calling thread under ``SCHED_FIFO`` for the block, its policy restored after.
    Yields whether it took effect (a refusal is logged with ``log``)."""
    name = threading.current_thread().name
    before = None if _supported() else (os.sched_getscheduler(0), os.sched_getparam(0))
    why = set_thread_fifo(priority, f"thread {name!r}")
    if why:
        log(why)
    try:
        yield why is None
    finally:
        if why is None and before is not None:
            os.sched_setscheduler(0, before[0], before[1])


class ClientRealtime:
    """Real-time mode of one client: what :meth:`start` and :meth:`enter_thread` achieved.

    Args:
        priority: ``SCHED_FIFO`` priority of the client's threads, 1-99.
        threads: How many threads will enter (the memory is let go when as many have left).
        log: Where each refusal goes, once.
    """

    def __init__(
        self, priority: int, threads: int, log: Callable[[str], None] = _log.warning
    ) -> None:
        self.priority = priority
        self._expected = threads
        self._left = 0
        self._log = log
        self._lock = threading.Lock()
        self._memory: Any = None
        self._threads: Dict[str, bool] = {}
        self._user_threads = 0
        self._warned_fifo = False
        self.warnings: List[str] = []

    def start(self) -> None:
        """The process-wide step: lock memory (counted with the embedded masters')."""
        unsupported = _supported()
        if unsupported:
            self._warn(unsupported)
            return
        from . import _native
        from .errors import RtpoolError

        try:
            self._memory = _native.lock_memory()
        except RtpoolError as exc:
            self._warn(str(exc))

    def enter_thread(self, role: str) -> Callable[[], None]:
        """Called first thing by the client's thread ``role`` (``reader``, ``heartbeat``): it
        enters ``SCHED_FIFO``. Returns what the thread calls when it ends."""
        why = set_thread_fifo(self.priority, f"the client's {role} thread")
        with self._lock:
            self._threads[role] = why is None
            if why and not self._warned_fifo:
                self._warned_fifo = True
                self._warn(why, locked=True)
        return lambda: self._leave_thread(role)

    def _leave_thread(self, role: str) -> None:
        with self._lock:
            self._threads[role] = False
            self._left += 1
            if self._left < self._expected:
                return
            memory, self._memory = self._memory, None
        if memory is not None:
            memory.release()

    def release(self) -> None:
        """Let go of the memory lock now (the client failed to start its threads)."""
        with self._lock:
            memory, self._memory = self._memory, None
        if memory is not None:
            memory.release()

    @contextlib.contextmanager
    def user_thread(self, priority: int | None) -> Iterator[bool]:
        """:func:`fifo_thread` for an application's thread, counted in the report."""
        with fifo_thread(self.priority if priority is None else priority, self._log) as fifo:
            with self._lock:
                self._user_threads += fifo
            try:
                yield fifo
            finally:
                with self._lock:
                    self._user_threads -= fifo

    def report(self) -> Dict[str, Any]:
        """What is in effect now: ``requested``, ``active`` (every step took effect),
        ``memory_locked``, ``priority``, ``fifo_threads`` (the client's threads under
        ``SCHED_FIFO`` now), ``threads`` (role -> under ``SCHED_FIFO``), ``user_threads``
        (application threads inside :meth:`user_thread`) and ``warnings``."""
        with self._lock:
            threads = dict(self._threads)
            locked = self._memory is not None and self._memory.held
            return {
                "requested": True,
                "active": locked and bool(threads) and all(threads.values()) and not self.warnings,
                "memory_locked": locked,
                "priority": self.priority,
                "fifo_threads": sum(threads.values()),
                "threads": threads,
                "user_threads": self._user_threads,
                "warnings": list(self.warnings),
            }

    def _warn(self, text: str, locked: bool = False) -> None:
        if locked:
            self.warnings.append(text)
        else:
            with self._lock:
                self.warnings.append(text)
        self._log(text)
