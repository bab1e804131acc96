"""The reader thread of a client connection: it reads the master's frames, resolves the
futures of ``RESULTS``, records ``ACCEPTED`` and ``STATUS_REPLY``, handles ``ERROR`` and sends
the ``ACK``s of each batch. Messages and errors it does not know go to the handlers registered
with :meth:`~rtpool._connection.connection._Connection.on_message` and ``on_error``.

A mixin of :class:`~rtpool._connection.connection._Connection` (the state is there).
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import logging
import pickle
import time
import warnings
from typing import Any, List

import msgpack

from .. import _protocol as P
from .._frame import recv_some
from .._future import Future
from .._future import finish_batch as _finish_batch
from .._kept import KeptRef
from .._output import OUTPUT_TAG as _OUTPUT_TAG
from .._output import Sink, decode_section, stderr_sink
from .._output import split as split_output
from .._ratelimit import LogLimiter
from .._serialize import ENVELOPE_TAG as _ENVELOPE_TAG
from .._serialize import error_from_report, loads_result
from ..errors import (
    AdmissionError,
    OverloadWarning,
    ProtocolError,
    QueueLimitError,
    QuotaExceededError,
    ResultsLost,
    SubmitRejected,
    TaskFailed,
    UnknownDependencyError,
    UnschedulableError,
    UnschedulableWarning,
)
from .outcomes import task_error

_perf_ns = time.perf_counter_ns
_monotonic = time.monotonic
_RECV_BYTES = 1 << 18
#: A complete package of at most this many tasks whose last batch of results holds at most
#: ACK_DEFER_BYTES may have its ACK wait for the next frame sent (see _Connection._send_acks).
ACK_DEFER_TASKS = 16
ACK_DEFER_BYTES = 64 * 1024
_log = logging.getLogger("rtpool.client")

#: Seconds between two overload warnings of one client (the rest are counted).
NOTICE_WINDOW_S = 10.0


def notice_limiter() -> LogLimiter:
    """The limiter of a connection's overload warnings."""
    return LogLimiter(NOTICE_WINDOW_S)


_loads = loads_result
_pickle_loads = pickle.loads
_InvalidStateError = cf.InvalidStateError


def _is_unschedulable_notice(opts: dict, notice: str) -> bool:
    """Whether an ``ACCEPTED`` notice says that no worker can run the package yet: the
    package asked to wait for one, and the notice is not the overload warning."""
    return opts.get("unschedulable") == "wait" and "overload" not in notice


class _Receiver:
    """The reader thread and the routing of the master's answers."""

    #: What is done with a task's output (``rtpool._output.sink_of``; None: kept only).
    task_output: Sink | None = stderr_sink

    def _run(self, extra: List[list] | None) -> None:
        """The reader thread: read sessions one after the other until the end."""
        try:
            while extra is not None:
                reason = self._read_session(extra)
                extra = self._after_drop(reason)
        except BaseException as exc:
            # Our own bug: fail the futures rather than leave them pending forever.
            self._connection_lost(f"the client's reader thread failed: {exc!r}")
            raise

    def _read_session(self, extra: List[list]) -> str:
        """Read one connection until it breaks; return why it did."""
        reason = "the master closed the connection"
        try:
            sock = self.sock
            recv_into = sock.recv_into
            buf = bytearray(_RECV_BYTES)  # reused: see _frame.recv_some
            feed = self._reader.feed
            want = self._reader.want
            dispatch = self._dispatch
            wakes = self._wakes
            msgs = extra
            while True:
                if msgs:
                    dispatch(msgs)
                    # The waiters' locks are released after the whole batch and as late as
                    # can be: a waiter woken while this thread still runs Python would find
                    # the GIL held and block once more (a second wake-up on the latency
                    # path). So an ACK that is written releases them just before its
                    # sendall() (which lets them run); otherwise they go right before the
                    # next recv (which drops the GIL), after the deferred ACKs' bookkeeping.
                    if self._acks:
                        self._send_acks()
                    if self._releases:
                        if wakes:
                            self._release_wakes()
                        self._flush_releases()
                    if self.closing:
                        self.close_if_idle()
                        if self._closed:
                            break
                if wakes:
                    self._release_wakes()
                view = want()
                if view is not None:
                    # Inside a large frame: straight into its buffer (no copy, no join).
                    n = recv_into(view)
                    view.release()
                    if not n:
                        break
                    msgs = self._reader.got(n)
                    continue
                data = recv_some(sock, buf)
                if not data:
                    break
                self._last_recv = _monotonic()
                msgs = feed(data)
        except ProtocolError as exc:
            reason = f"the master sent an invalid frame: {exc}"
        except (IndexError, TypeError, ValueError, KeyError) as exc:
            reason = f"the master sent a malformed message: {exc!r}"
        except (OSError, AttributeError) as exc:  # AttributeError: closed under our feet
            reason = f"connection error: {getattr(exc, 'strerror', None) or exc}"
            if getattr(exc, "errno", None) == errno.ETIMEDOUT:  # keepalive, TCP_USER_TIMEOUT
                self._silent = self._silent or reason
        self._release_wakes()
        return self._silent or reason

    def _release_wakes(self) -> None:
        """Wake the threads waiting for the futures finished since the last call."""
        wakes = self._wakes
        for lock in wakes:
            lock.release()
        wakes.clear()

    def _dispatch(self, msgs: List[list]) -> None:
        for msg in msgs:
            kind = msg[0]
            if kind == P.RESULTS:
                self._on_results(msg[1], msg[2])
            elif kind == P.ACCEPTED:
                self._on_accepted(msg[1], msg[2])
                if len(msg) > 3:  # the master's notice (issue 17: overload)
                    self._on_notice(msg[2], msg[3])
            elif kind == P.STATUS_REPLY:
                self._on_status_reply(msg)
            elif kind == P.ERROR:
                self._on_error(msg[1], msg[2], msg[3])
            elif kind == P.HEARTBEAT:
                self._master_answers = True  # its answer to ours: see _Connection._use
            else:
                handler = self._handlers.get(kind)
                if handler is None:
                    raise ProtocolError(f"a client does not expect message kind {kind}")
                handler(msg)

    def _on_results(self, package: int, results: List[list]) -> None:
        seg = self._segments.get(package)
        if seg is None:
            seg = self._late.get(package)
            if seg is not None:  # late results of a package whose futures were all cancelled
                seg.rx += len(results)
                self._acks[package] = seg
            return
        seg.rx += len(results)
        self._acks[package] = seg
        futures = seg.futures
        if futures is None:
            return  # just finished by cancellations in another thread
        if seg.n <= ACK_DEFER_TASKS:
            # Inline bytes only: a result in shared memory or a segmented one is acknowledged
            # at once, so the master frees it now.
            small = all(type(r[2]) is bytes for r in results) and (
                sum(len(r[2]) for r in results) <= ACK_DEFER_BYTES
            )
        else:
            small = False
        perf_ns = _perf_ns
        loads = _loads
        pickle_loads = _pickle_loads
        decode = seg.decode
        cond = futures[0]._condition
        done: List[tuple] = []  # (future, value, error), finished together after the loop
        for r in results:
            fut = futures[r[0]]
            if fut._entry is not None:
                # Sent again after a reconnect (its ACK was lost with the connection): the
                # first copy counts.
                self.duplicate_results += 1
                continue
            status = r[1]
            t0 = perf_ns()
            value = None
            if decode is not None and status != 2:
                value, error = decode(r[0], status, r[2])
            elif status == 0:
                try:
                    data = r[2]
                    # loads_result's own first test, without its call on the common path.
                    if data and data[0] < _ENVELOPE_TAG:
                        value = pickle_loads(data)
                    else:
                        if data[0] == _OUTPUT_TAG:
                            data = self._task_output(fut, r[0], data)
                        value = loads(data)
                except Exception as exc:
                    error: BaseException | None = TaskFailed(
                        f"the task's result cannot be unpickled on the client: {exc!r}"
                    )
                else:
                    error = None
                    if type(value) is KeptRef:
                        self.adopt(value)  # freed on its worker when the client drops it
            elif status == 1:
                data = r[2]
                if data and data[0] == _OUTPUT_TAG:
                    data = self._task_output(fut, r[0], data)
                error = error_from_report(data)
            elif status == 2:
                error = cf.CancelledError()
            else:
                data = r[2]
                if data and data[0] == _OUTPUT_TAG:  # a timeout, a crash: what came before
                    data = self._task_output(fut, r[0], data)
                error = task_error(status, data)
            t1 = perf_ns()
            r[2] = None
            r.append(t1 - t0)
            r.append(t1)
            # A tuple of numbers: the cyclic GC untracks it at its first pass (a list it would
            # carry through every generation with its future).
            fut._entry = tuple(r)
            if status == 2:
                if fut._to_cancelled():
                    seg.n_results += 1
            elif fut._condition is cond:
                done.append((fut, value, error))
            else:
                wakes = fut._finish(value, error)
                if wakes is None:
                    continue  # cancelled here while its result was on the way
                fut._invoke_callbacks()
                if wakes:
                    self._wakes.extend(wakes)  # released after the batch, see _read_session
                seg.n_results += 1
        if done:
            # One package's futures share a condition: taken once for the whole batch.
            finished, wakes = _finish_batch(cond, done)
            for fut in finished:
                if fut._done_callbacks:
                    fut._invoke_callbacks()
            if wakes:
                self._wakes.extend(wakes)  # released after the batch, see _read_session
            seg.n_results += len(finished)  # not those cancelled while on the way
        if seg.n_results + seg.n_cancelled >= seg.n:
            seg.ack_may_wait = small
            with self._lock:
                self._finish(seg)

    def _task_output(self, fut: Future, index: int, data: Any) -> Any:
        """Keep a result's task output in ``fut.logs`` and show it (``Client(task_output=)``);
        return the result's data itself."""
        try:
            section, data = split_output(data)
        except ValueError as exc:  # its data then fails to load, and says so
            section = msgpack.packb(["?", 0, [[1, f"(malformed task output: {exc})"]]])
        output = fut.logs = decode_section(section)  # type: ignore[arg-type]
        sink = self.task_output
        if sink is not None:
            try:
                sink(index, output)
            except Exception as exc:  # the caller's callback: never the reader thread's end
                _log.warning("the task_output callback raised %r", exc)
        return data

    def _on_accepted(self, req_id: int, package: int) -> None:
        with self._lock:
            self._drop_since = None  # this connection works
            seg = self._by_req.pop(req_id, None)
            if seg is None:
                attach = self._attaching.get(package)
                if attach is not None and attach[0] == req_id:
                    del self._attaching[package]
                    attach[1].rx = 0  # ACK counts restart at this ACCEPTED
                return
            seg.package = package
            seg.frame = None
            seg.rx = 0
            if seg.n_results + seg.n_cancelled < seg.n:
                self._segments[package] = seg
            else:
                seg.futures = None
                self._keep_late(seg)
            pending, seg.pending_cancel = seg.pending_cancel, None
            if self._waiting:
                self._cond.notify_all()
        if pending is not None:
            self._send(P.encode(P.CANCEL, package, list(pending)), quiet=True)

    def _on_notice(self, package: int, notice: str) -> None:
        """The master's warning about a package it accepted: that no connected worker can run
        it yet (``options(unschedulable="wait")``), an :class:`UnschedulableWarning` once per
        package; else that it is overloaded, an :class:`OverloadWarning` and a log line at
        most once per window, and counted (after the warning, so a reader that sees the
        count also sees the warning)."""
        seg = self._segments.get(package) or self._late.get(package)
        if seg is not None and _is_unschedulable_notice(seg.opts, notice):
            text = (
                f"the master at {self.address} accepted package {package}, which no connected "
                f"worker can run yet; it waits for one to join: {notice}"
            )
            _log.warning("%s", text)
            try:
                warnings.warn(UnschedulableWarning(text), stacklevel=2)
            except Warning:  # -W error: raised here it would end the reader thread
                pass
            self.last_notice = notice
            return
        if self._notice_log.check(None, _monotonic()) is not None:
            text = (
                f"the master at {self.address} accepted package {package} with a warning: {notice}"
            )
            _log.warning("%s", text)
            warnings.warn(OverloadWarning(text), stacklevel=2)
        self.last_notice = notice
        self.overload_notices += 1

    def _on_status_reply(self, msg: list) -> None:
        with self._cond:
            waiter = self._status.get(msg[1])
            if waiter is not None:
                waiter[1] = tuple(msg[3:10])  # total, queued, ..., met, missed
                waiter[4] = msg[10] if len(msg) > 10 else None  # workers that can run it
                waiter[2] = True
                self._cond.notify_all()

    def _on_error(self, code: str, message: str, ref: int) -> None:
        handler = self._error_handlers.get(code)
        if handler is not None:
            handler(message, ref)
            return
        if code in (
            P.ERR_REJECTED,
            P.ERR_QUOTA,
            P.ERR_ADMISSION,
            P.ERR_QUEUE_LIMIT,
            P.ERR_UNKNOWN_DEPENDENCY,
            P.ERR_UNSCHEDULABLE,
        ):
            with self._cond:
                self._drop_since = None
                seg = self._by_req.pop(ref, None)
                self._cond.notify_all()
            if seg is not None and seg.futures is not None:
                if code == P.ERR_QUOTA:
                    exc: BaseException = QuotaExceededError(
                        # The master's message names the quota ("user's compute-time quota
                        # is used up (... over); ask an admin ...").
                        f"the master at {self.address} refused the package (request {ref}): "
                        f"{message}"
                    )
                elif code == P.ERR_ADMISSION:
                    exc = AdmissionError(
                        f"the master at {self.address} refused the package (request {ref}): it "
                        f"cannot finish by its deadline: {message}"
                    )
                elif code == P.ERR_UNKNOWN_DEPENDENCY:
                    exc = UnknownDependencyError(
                        f"the master at {self.address} cannot hold the package (request {ref}) "
                        f"for its input: {message}"
                    )
                elif code == P.ERR_UNSCHEDULABLE:
                    exc = UnschedulableError(
                        f"the master at {self.address} refused the package (request {ref}): "
                        f"{message}"
                    )
                elif code == P.ERR_QUEUE_LIMIT:
                    exc = QueueLimitError(
                        f"the master at {self.address} refused the package (request {ref}): "
                        f"{message}"
                    )
                else:
                    exc = SubmitRejected(
                        f"the master at {self.address} rejected the package (request {ref}): "
                        f"{message}"
                    )
                seg.error = exc
                seg.frame = None
                self._fail(seg.futures, exc)
                seg.futures = None
        elif code == P.ERR_UNKNOWN_PACKAGE:
            with self._cond:
                self._drop_since = None
                attach = self._attaching.pop(ref, None)
                if attach is not None:
                    seg = attach[1]
                    self._segments.pop(ref, None)
                    futures, seg.futures = seg.futures, None
                # Otherwise a STATUS or CANCEL raced with the package's last results: those
                # were sent before this error, so the futures already know everything.
                for waiter in self._status.values():
                    if waiter[0] == ref:
                        waiter[2] = True
                self._cond.notify_all()
            if attach is not None and futures:
                pending = [f for f in futures if not f.done()]
                self._fail(
                    pending,
                    ResultsLost(
                        f"after reconnecting, the master at {self.address} no longer knows "
                        f"package {ref} ({message}): it dropped the package's results (it "
                        "stayed detached longer than the master's --result-ttl, or the master "
                        f"restarted without it); {len(pending)} unfinished tasks failed, "
                        "resubmit them"
                    ),
                )
        else:
            self._fatal = (code, message)

    @staticmethod
    def _fail(futures: List[Future], exc: BaseException) -> None:
        for fut in futures:
            try:
                fut.set_exception(exc)
            except _InvalidStateError:
                pass
