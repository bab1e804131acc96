"""The future of one rtpool task: a ``concurrent.futures.Future`` with a faster wake-up,
a ``cancel()`` that reaches the master, and the task's measurement points."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from _thread import allocate_lock as _allocate_lock
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from threading import Condition
from typing import Any, Dict, Generator, TypeVar

from ._kept import KeptRef, read_kept

__all__ = ["DEFAULT_STALL_WARNING_S", "Future", "finish_batch"]

_InvalidStateError = cf.InvalidStateError
# result(timeout) asks the master why nothing came only for timeouts this long, waiting this
# long at most for its answer.
_EXPLAIN_AFTER_S = 1.0
_STATUS_WAIT_S = 1.0
#: Seconds a result() without a timeout waits before it checks that something can run the task
#: (the default of the client's ``stall_warning``).
DEFAULT_STALL_WARNING_S = 10.0
_log = logging.getLogger("rtpool.client")
_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})
_NO_WAKES = ()
_T = TypeVar("_T")


class Future(cf.Future[_T]):
    """The future of one rtpool task (a ``concurrent.futures.Future``).

    ``cancel()`` succeeds while the result has not arrived, and then also tells the master to
    drop the task. Once resolved by the master, :attr:`timings` holds where the time went.
    """

    # The base class wakes a thread blocked in result() with Condition.notify_all() while it
    # still holds the condition's lock, so the woken thread first blocks on that lock: one
    # more context switch on the latency path. Here a waiter blocks on a lock of its own that
    # is released after the condition's lock (the list of those locks changes only under the
    # condition). This relies on Future's internals (_condition, _state, _result, _exception,
    # _waiters, _invoke_callbacks), unchanged from Python 3.9 to 3.13.

    def __init__(self, seg: Any = None, index: int = 0, condition: Condition | None = None) -> None:
        if condition is None:
            super().__init__()
        else:
            # The futures of one package share a condition: creating one per future is half
            # the cost of a future, and no waiter here relies on its notify (see _wait_done).
            self._condition = condition
            self._state = PENDING
            # _result, _exception, _waiters and _done_callbacks stay the class's until set
            # (see below).
        self._seg = seg
        self._index = index

    # Class-level defaults: a future of a big package is made in a loop of 100,000, where
    # every attribute it does not set costs nothing.
    _result: Any = None
    _exception: BaseException | None = None
    _wakes: list | None = None
    # The master's numbers of the task's result (``RESULTS``: index, status, None where the
    # data was, queue_us ... late_us), then the client's unpickling time and when the future
    # was finished (perf_counter_ns): one tuple, so one attribute set per result.
    _entry: tuple | None = None
    #: What the task printed and logged on its worker (an ``rtpool.TaskOutput``: records in
    #: order, the worker, bytes dropped), or None when it wrote nothing (``docs/logs.md``).
    logs: Any = None

    # Fewer objects per future for the cyclic GC: a future of a big package would otherwise
    # carry two empty lists (cf.wait()'s waiters and the done callbacks) that the collector
    # tracks and promotes along with it. They are made on first use; until then the class's
    # empty tuple stands for "none" (the base class only iterates them, under the condition).
    _w: list | None = None
    _done_callbacks: Any = ()

    @property
    def _waiters(self) -> list:
        # cf.wait() and cf.as_completed() append to and remove from it under the condition.
        w = self._w
        if w is None:
            w = self._w = []
        return w

    @_waiters.setter
    def _waiters(self, value: list) -> None:
        self._w = value

    def add_done_callback(self, fn: Any) -> None:
        with self._condition:
            if self._state not in _DONE:
                if type(self._done_callbacks) is tuple:
                    self._done_callbacks = []
                self._done_callbacks.append(fn)
                return
        super().add_done_callback(fn)  # done: the base class calls it now

    def _invoke_callbacks(self) -> None:
        if self._done_callbacks:
            super()._invoke_callbacks()

    def _wait_done(self, timeout: float | None) -> bool:
        if self._state in _DONE:
            return True
        lock = _allocate_lock()
        lock.acquire()
        with self._condition:
            if self._state in _DONE:
                return True
            if self._wakes is None:
                self._wakes = [lock]
            else:
                self._wakes.append(lock)
        if timeout is None:
            self._wait_unbounded(lock)
        elif not lock.acquire(True, max(0.0, timeout)):
            with self._condition:  # transitions take the list under the condition too
                if self._wakes and lock in self._wakes:
                    self._wakes.remove(lock)
        return self._state in _DONE

    def _wait_unbounded(self, lock: Any) -> None:
        """Wait for ``lock`` (released when the future is done) with no limit; every
        ``stall_warning_s`` until a warning was logged, check that something can run the
        task, and log one warning if nothing can (no worker connected, or none serves the
        function): a result() that would otherwise block forever in silence says why."""
        seg = self._seg
        delay = None if seg is None else seg.conn.stall_warning_s
        if delay is None or seg is None:
            lock.acquire()
            return
        waited = 0.0
        while not lock.acquire(True, delay):
            waited += delay
            why = self._why_stalled(seg)
            if why is not None:
                _log.warning(
                    "%s has had no result for %g s: %s; result() keeps waiting "
                    "(Client(stall_warning=None) turns this warning off)",
                    self._name(),
                    waited,
                    why,
                )
                lock.acquire()
                return

    def _why_stalled(self, seg: Any) -> str | None:
        """Why nothing can run this task, from one status query; None if something can (or
        the master cannot tell now)."""
        if seg.package is None or self._state in _DONE or seg.conn.is_reader_thread():
            return None
        try:
            reply, workers = seg.conn.status_and_workers(seg, _STATUS_WAIT_S)
        except Exception:  # the connection is down or slow: ask again next time
            return None
        if reply is None or workers != 0:
            return None
        return _no_worker_text(seg, reply)

    def _name(self) -> str:
        seg = self._seg
        package = getattr(seg, "package", None)
        return f"task {self._index} of package {package}" if package is not None else "a task"

    def result(self, timeout: float | None = None) -> _T:
        """The task's return value, waiting up to ``timeout`` seconds.

        Raises:
            CancelledError: The task was cancelled.
            TimeoutError: No result within ``timeout``. For a ``timeout`` of a second or more
                the message says why, from one status query to the master (at most 1 s more):
                no worker is connected (or none serves the function), or how many can run it
                and how many of the package's tasks are queued and running.
            Exception: Whatever the task raised (see :class:`~rtpool.errors.TaskFailed`).
        """
        if self._state is FINISHED and self._exception is None:
            value = self._result  # the common case: no lock (_finish sets it first)
        else:
            if not self._wait_done(timeout):
                raise TimeoutError(self._timeout_message(timeout))
            value = super().result(0)
        if type(value) is KeptRef:  # kept on its worker (options(keep=True)): read it now
            return read_kept(self, value)
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception the task raised, or None, waiting up to ``timeout`` seconds.

        Raises:
            TimeoutError: As :meth:`result`.
        """
        if not self._wait_done(timeout):
            raise TimeoutError(self._timeout_message(timeout))
        return super().exception(0)

    def __await__(self) -> Generator[Any, None, _T]:
        """``await fut`` in a coroutine: what :meth:`result` gives, without blocking the event
        loop or starting a thread (``docs/asyncio.md``). Cancelling the awaiting coroutine
        cancels the task, as :meth:`cancel` does."""
        from ._aio import await_future  # asyncio only for those who await

        return await_future(self)

    def _timeout_message(self, timeout: float | None) -> str:
        """Why no result came within ``timeout``, as far as one short status query tells.

        Polling with short timeouts (below 1 s) costs nothing extra: only the bare message.
        """
        base = f"no result within {timeout:g} s"
        seg = self._seg
        if seg is None or timeout is None or timeout < _EXPLAIN_AFTER_S or seg.package is None:
            return base
        try:
            reply, workers = seg.conn.status_and_workers(seg, _STATUS_WAIT_S)
        except Exception:  # the connection is down or slow: the bare message will do
            return base
        if reply is None or workers is None:
            return base
        if workers == 0:
            return f"{base}: {_no_worker_text(seg, reply)}"
        where = _where(reply)
        workers_text = "1 worker" if workers == 1 else f"{workers} workers"
        return f"{base}; {workers_text} can run it ({where})"

    def running(self) -> bool:
        """Whether a worker has the task now: assigned to it by the master, and no result here
        yet (as ``ProcessPoolExecutor``, a task counts as running from when it is handed to a
        worker, which may hold it a moment behind the task it runs).

        A pending future asks the master (one status round trip, at most 1 s; False if the
        connection is down): the master does not tell the client when it assigns a task, to
        keep that path free for results. For a task of :meth:`~rtpool.Client.submit` the
        answer is exact; for one of a larger package (``submit_many``, ``map``), it is True
        only while none of its package's tasks is queued (False when some tasks are queued
        and others run, since the master counts them per package).
        """
        if self._state is not PENDING:
            return False
        seg = self._seg
        if seg is None or seg.package is None or seg.conn.is_reader_thread():
            return False
        try:
            reply = seg.conn.status(seg, _STATUS_WAIT_S)
        except Exception:  # down, reconnecting or slow: nothing known to run it
            return False
        if reply is None or self._state is not PENDING:
            return False
        total, queued, running = reply[0], reply[1], reply[2]
        return running > 0 and (total == 1 or queued == 0)

    def _finish(self, result: Any, exception: BaseException | None) -> Any:
        """Move to FINISHED; return the waiters' locks to release (the caller releases them
        and runs the callbacks), or None if the future was already done."""
        with self._condition:
            if self._state in _DONE:
                return None
            # The value before the state: result() reads a FINISHED future without the lock.
            if exception is None:
                self._result = result
            else:
                self._exception = exception
            self._state = FINISHED
            w = self._w
            if exception is None:
                if w:
                    for waiter in w:
                        waiter.add_result(self)
            else:
                if w:
                    for waiter in w:
                        waiter.add_exception(self)
            self._condition.notify_all()
            wakes, self._wakes = self._wakes, None
        return wakes or _NO_WAKES

    def set_result(self, result: Any) -> None:
        wakes = self._finish(result, None)
        if wakes is None:
            raise _InvalidStateError(f"{self._state}: {self!r}")
        for lock in wakes:
            lock.release()
        self._invoke_callbacks()

    def set_exception(self, exception: BaseException | None) -> None:
        wakes = self._finish(None, exception)
        if wakes is None:
            raise _InvalidStateError(f"{self._state}: {self!r}")
        for lock in wakes:
            lock.release()
        self._invoke_callbacks()

    def _to_cancelled(self) -> bool:
        # Like Future.cancel(), but True only for the call that moved the future from PENDING
        # (so every task is counted once) and never for RUNNING: rtpool futures stay PENDING
        # until their result arrives. An rtpool future never runs here, so nothing would call
        # set_running_or_notify_cancel(): it is notified at once, which wakes cf.wait() and
        # cf.as_completed() (they count only CANCELLED_AND_NOTIFIED futures as done).
        with self._condition:
            if self._state != PENDING:
                return False
            self._state = CANCELLED_AND_NOTIFIED
            w = self._w
            if w:
                for waiter in w:
                    waiter.add_cancelled(self)
            self._condition.notify_all()
            wakes, self._wakes = self._wakes, None
        if wakes:
            for lock in wakes:
                lock.release()
        self._invoke_callbacks()
        return True

    def cancel(self) -> bool:
        """Cancel the task unless its result already arrived.

        Unlike ``concurrent.futures``, this also cancels a task that a worker already runs:
        the client cannot tell a queued task from a running one without asking the master
        (an rtpool future stays PENDING until its result arrives, see :meth:`__repr__`), and
        a running task can be stopped. What happens to it:

        * queued at the master: dropped, it never runs;
        * running with a time limit or under ``--task-memory-mb`` (in the worker's executor
          process): the process is killed at once;
        * running in the worker process itself (no limit): it runs to its end, which cannot
          be interrupted, and its result is discarded.

        Returns:
            True if the future is cancelled (now, or by an earlier call), False if it already
            has a result.
        """
        if self._to_cancelled():
            seg = self._seg
            if seg is not None:
                seg.conn.on_local_cancel(seg, (self._index,))
            return True
        return self.cancelled()

    def release(self) -> bool:
        """Free now the worker's copy of this task's kept result (``options(keep=True)``).

        Without it the copy goes when the last future (or pending dependent task) that refers
        to it is garbage-collected. A value already read by :meth:`result` stays readable from
        this future; a task that takes this future as an argument afterwards, or a
        :meth:`result` not called before, runs its producer again (lineage).

        Returns:
            True if a release was sent now; False if the result is not kept, not here yet, or
            was released already.
        """
        ref = self._result if self._state in _DONE else None
        if type(ref) is not KeptRef:
            return False
        seg = self._seg
        lineage = getattr(self, "_lineage", None)
        conn = (
            seg.conn if seg is not None else getattr(getattr(lineage, "view", None), "_conn", None)
        )
        return conn is not None and conn.release_now(ref)

    def __repr__(self) -> str:
        """``<rtpool.Future at 0x.. task 3 of package 17 state=...>``: ``pending (queued or
        running at the master)`` until the result comes (the client is not told when a worker
        starts a task), then ``finished returned int``/``finished raised ValueError``, or
        ``cancelled``."""
        with self._condition:
            state, result, exc = self._state, self._result, self._exception
        if state == FINISHED:
            what = (
                f"finished raised {type(exc).__name__}"
                if exc is not None
                else f"finished returned {type(result).__name__}"
            )
        elif state in (CANCELLED, CANCELLED_AND_NOTIFIED):
            what = "cancelled"
        else:
            what = "pending (queued or running at the master)"
        seg = self._seg
        package = getattr(seg, "package", None)
        where = f" task {self._index} of package {package}" if package is not None else ""
        return f"<rtpool.Future at {id(self):#x}{where} state={what}>"

    @property
    def timings(self) -> Dict[str, float] | None:
        """Where the time of this task went, in microseconds, or None before its result came.

        Keys: ``serialize_us`` (client pickling, this task's share of its package),
        ``queue_us`` (master: receipt to assignment), ``worker_us`` (master: assignment to
        result), ``exec_us`` (worker: the function), ``wait_us`` (worker: receipt to start),
        ``flush_us`` (worker: end to send), ``late_us`` (master: how long after the
        package's deadline the result came; 0 when on time or without a deadline),
        ``deserialize_us`` (client unpickling) and ``total_us``
        (from the start of ``submit`` to the result being set).
        """
        r = self._entry
        if r is None:
            return None
        seg = self._seg
        return {
            "serialize_us": seg.serialize_us if seg is not None else 0.0,
            "queue_us": r[3],
            "worker_us": r[4],
            "exec_us": r[5],
            "wait_us": r[6],
            "flush_us": r[7],
            "late_us": r[8],
            "deserialize_us": r[-2] / 1000,
            "total_us": (r[-1] - seg.t0_ns) / 1000 if seg is not None else 0.0,
        }

    @property
    def lateness(self) -> float | None:
        """How late the task's result came after its package's deadline, in seconds.

        0.0 for a result that came by the deadline; None for a task without a deadline, and
        before the result came (or for a future cancelled here). A task dropped at its
        deadline (``on_miss="drop"``) reports the master's lateness of its failure.
        """
        r = self._entry
        seg = self._seg
        if r is None or seg is None or not seg.has_deadline:
            return None
        return r[8] / 1e6


#: Every attribute an rtpool future (or a subclass) may get on its instance, hot path first.
_INSTANCE_ATTRIBUTES = (
    "_condition",
    "_state",
    "_seg",
    "_index",
    "_entry",
    "_result",
    "_exception",
    "_wakes",
    "_w",
    "_done_callbacks",
    "logs",
    "_inner",
    "_lineage",
    "_fetched",
)


def prime_layout(cls: type, extra: tuple = ()) -> None:
    """Grow ``cls``'s shared instance-attribute keys to every attribute its futures may get.

    CPython sizes an instance's inline attribute values by the class's shared keys when the
    instance is made; an attribute set later that is not among them makes the instance a
    dict of its own. A future made with 4 attributes that then got its result's 2-3 had
    one: a second object per task for the cyclic GC to track and promote (100,000 no-op
    tasks: 200,000 tracked objects, two full collections in the reader thread, ~20 % of the
    bulk run). One throwaway instance, set each attribute once, fixes the layout for all.
    """
    probe = cls.__new__(cls)
    for name in _INSTANCE_ATTRIBUTES + extra:
        object.__setattr__(probe, name, None)


def finish_batch(condition: Any, done: list) -> tuple:
    """:meth:`Future._finish` for a batch of ``(future, value, error)`` of futures sharing
    ``condition`` (one package's): the condition taken and notified once for the batch, not
    once per future (its ``with``, ``notify_all()`` and ``notify()`` are Python-level calls:
    in bulk they were about as much of the reader thread's time as unpickling a no-op's
    result). The caller runs the callbacks of the futures it gets back and releases the
    locks (``_wakes``).

    Returns:
        The futures moved to FINISHED (not those already done: cancelled while their result
        was on the way), and the locks of the threads waiting for them.
    """
    finished = []
    wakes: list = []
    with condition:
        for fut, value, error in done:
            if fut._state in _DONE:
                continue
            # The value before the state: result() reads a FINISHED future without the lock.
            if error is None:
                fut._result = value
            else:
                fut._exception = error
            fut._state = FINISHED
            w = fut._w
            if w:
                for waiter in w:
                    if error is None:
                        waiter.add_result(fut)
                    else:
                        waiter.add_exception(fut)
            if fut._wakes:
                wakes.extend(fut._wakes)
                fut._wakes = None
            finished.append(fut)
        condition.notify_all()
    return finished, wakes


def _where(reply: tuple) -> str:
    total, queued, running = reply[0], reply[1], reply[2]
    return f"{queued} of its package's {total} tasks queued, {running} running"


def _no_worker_text(seg: Any, reply: tuple) -> str:
    """What to say when no connected worker can run a task of ``seg``, and what to do."""
    address = seg.conn.address
    if seg.decode is not None:  # a call of a named function
        return (
            f"no worker connected to the master at {address} serves the function "
            f"({_where(reply)}); start one with `rtpool worker --serve MODULE`"
        )
    return (
        f"no worker is connected to the master at {address} ({_where(reply)}); start one "
        f"with `rtpool worker --master {address}`"
    )


prime_layout(Future)
