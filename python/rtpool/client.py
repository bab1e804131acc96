"""The rtpool client: a ``concurrent.futures.Executor`` backed by an rtpool master.

One TCP connection per :class:`Client`. Submitting writes a ``SUBMIT`` frame from the calling
thread (under a lock); one daemon reader thread decodes what the master sends and resolves the
futures, so a result reaches a waiting thread after exactly one thread hop. Everything per task
on these two paths is kept small: the pickled function is cached, a package is one frame, and a
``RESULTS`` batch is decoded without building a dict per result.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import os
import pickle
import socket
import threading
import time
import weakref
from concurrent.futures._base import CANCELLED, PENDING
from typing import Any, Callable, Dict, Iterable, Iterator, List, Tuple

from . import _protocol as P
from ._connect import Address, connect, default_name, parse_address
from ._serialize import (
    PICKLE_PROTOCOL,
    dumps_args,
    error_from_report,
    run_chunk,
    serialize_function,
)
from .errors import (
    AuthenticationError,
    ConnectionLost,
    ProtocolError,
    SubmitRejected,
    TaskFailed,
)

__all__ = ["Client", "ClientView", "Future", "Package"]

_perf_ns = time.perf_counter_ns
_dumps = pickle.dumps
_loads = pickle.loads
_InvalidStateError = cf.InvalidStateError

#: The options ``Client.options()`` accepts, in protocol order.
VALID_OPTIONS = ("priority",)
_I32 = (-(2**31), 2**31 - 1)
# Bytes of a SUBMIT frame besides the function code and the payloads (prefix, array header,
# kind, req_id, fn_hash, opts), rounded up; and per payload (bin32 header).
_SUBMIT_OVERHEAD = 128
_PAYLOAD_OVERHEAD = 5
_MAX_TASKS_PER_FRAME = 2**32 - 1
# "The whole package" for on_local_cancel() and _Segment.pending_cancel: on the wire, CANCEL
# with no indices.
_ALL = ()


def _check_options(opts: Dict[str, Any]) -> Dict[str, Any]:
    for key in opts:
        if key not in VALID_OPTIONS:
            raise TypeError(f"unknown option {key!r}; valid options: {', '.join(VALID_OPTIONS)}")
    priority = opts.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"option 'priority' must be an int, got {type(priority).__name__}")
        if not _I32[0] <= priority <= _I32[1]:
            raise ValueError(f"option 'priority' must fit in 32 bits, got {priority}")
    return dict(opts)


class _Segment:
    """The tasks of one SUBMIT frame: one master package.

    A :class:`Package` is usually one segment; it has several when it does not fit in one frame.
    The reader thread counts results, the cancelling thread (under the connection lock) counts
    local cancellations; the segment is done when the two add up to its size.
    """

    __slots__ = (
        "conn",
        "error",
        "futures",
        "n",
        "n_cancelled",
        "n_results",
        "package",
        "pending_cancel",
        "req_id",
        "serialize_us",
        "t0_ns",
    )

    def __init__(self, conn: _Connection, req_id: int, n: int, t0_ns: int, serialize_us: float):
        self.conn = conn
        self.req_id = req_id
        self.package: int | None = None
        self.error: BaseException | None = None
        self.futures: List[Future] | None = None
        self.n = n
        self.n_results = 0
        self.n_cancelled = 0
        self.t0_ns = t0_ns
        self.serialize_us = serialize_us
        # Cancellations made before ACCEPTED gave the package id: indices, or _ALL.
        self.pending_cancel: tuple | None = None


class Future(cf.Future):
    """The future of one rtpool task (a ``concurrent.futures.Future``).

    ``cancel()`` succeeds while the result has not arrived, and then also tells the master to
    drop the task. Once resolved by the master, :attr:`timings` holds where the time went.
    """

    def __init__(self, seg: _Segment | None = None, index: int = 0) -> None:
        super().__init__()
        self._seg = seg
        self._index = index
        self._entry: list | None = None
        self._deser_ns = 0
        self._done_ns = 0

    def _to_cancelled(self) -> bool:
        # Like Future.cancel(), but True only for the call that moved the future from PENDING
        # (so every task is counted once) and never for RUNNING: rtpool futures stay PENDING
        # until their result arrives. Uses Future's internals, unchanged since Python 3.2.
        with self._condition:
            if self._state != PENDING:
                return False
            self._state = CANCELLED
            self._condition.notify_all()
        self._invoke_callbacks()
        return True

    def cancel(self) -> bool:
        """Cancel the task unless its result already arrived.

        Returns:
            True if the future is cancelled (the master is told to drop the task; if a worker
            already runs it, its result is discarded), False if it already has a result.
        """
        if self._to_cancelled():
            seg = self._seg
            if seg is not None:
                seg.conn.on_local_cancel(seg, (self._index,))
            return True
        return self.cancelled()

    @property
    def timings(self) -> Dict[str, float] | None:
        """Where the time of this task went, in microseconds, or None before its result came.

        Keys: ``serialize_us`` (client pickling, this task's share of its package),
        ``queue_us`` (master: receipt to assignment), ``worker_us`` (master: assignment to
        result), ``exec_us`` (worker: the function), ``wait_us`` (worker: receipt to start),
        ``flush_us`` (worker: end to send), ``deserialize_us`` (client unpickling) and
        ``total_us`` (from the start of ``submit`` to the result being set).
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
            "deserialize_us": self._deser_ns / 1000,
            "total_us": (self._done_ns - seg.t0_ns) / 1000 if seg is not None else 0.0,
        }


class Package:
    """The tasks of one :meth:`Client.submit_many` call: one function, many argument sets.

    Iterating a package yields its futures in input order; ``len()`` is the number of tasks.
    """

    def __init__(self, conn: _Connection, futures: List[Future], segments: List[_Segment]):
        self._conn = conn
        self.futures: List[Future] = futures
        self._segments = segments

    def __len__(self) -> int:
        return len(self.futures)

    def __iter__(self) -> Iterator[Future]:
        return iter(self.futures)

    def __getitem__(self, index: int) -> Future:
        return self.futures[index]

    def __repr__(self) -> str:
        done = sum(1 for f in self.futures if f.done())
        return f"<rtpool.Package ids={self.ids} tasks={len(self.futures)} done={done}>"

    @property
    def id(self) -> int | None:
        """The master's package id (of the first frame when the package needed several).

        Waits (up to 10 s) for the master to accept the package. None for an empty package.

        Raises:
            SubmitRejected: The master refused the package.
            ConnectionLost: The connection broke before the master answered.
        """
        ids = self._ids(self._segments[:1])
        return ids[0] if ids else None

    @property
    def ids(self) -> List[int]:
        """The master's package ids, one per ``SUBMIT`` frame (usually one)."""
        return self._ids(self._segments)

    def _ids(self, segments: List[_Segment]) -> List[int]:
        return [self._conn.wait_accepted(seg, 10.0) for seg in segments]

    def done(self) -> bool:
        """True when every task has a result (or was cancelled)."""
        return all(f.done() for f in self.futures)

    def results(self, timeout: float | None = None) -> List[Any]:
        """Wait for every task and return the values in input order.

        Args:
            timeout: Seconds to wait for the whole package; None waits forever.

        Returns:
            One value per task, in input order.

        Raises:
            TimeoutError: The package did not finish in time.
            Exception: The first failed task's exception, in input order.
        """
        if timeout is None:
            return [f.result() for f in self.futures]
        end = time.monotonic() + timeout
        return [f.result(max(0.0, end - time.monotonic())) for f in self.futures]

    def as_completed(self, timeout: float | None = None) -> Iterator[Future]:
        """Yield the futures as they complete (``concurrent.futures.as_completed``).

        Raises:
            TimeoutError: Not all futures completed within ``timeout`` seconds.
        """
        return cf.as_completed(self.futures, timeout)

    def cancel(self) -> int:
        """Cancel every task that has no result yet (one ``CANCEL`` per master package).

        Returns:
            The number of futures this call cancelled.
        """
        count = 0
        for seg in self._segments:
            futures = seg.futures
            if futures is None:
                continue
            n = sum(1 for f in futures if f._to_cancelled())
            if n:
                self._conn.on_local_cancel(seg, _ALL, n)
            count += n
        return count

    def status(self, timeout: float = 10.0) -> Dict[str, int]:
        """Ask the master for the package's counters.

        Args:
            timeout: Seconds to wait for the master's answer.

        Returns:
            ``{"total", "queued", "running", "done", "cancelled"}`` summed over the package's
            frames. ``done`` counts results the master has sent; parts the master already freed
            are counted from the futures here.

        Raises:
            TimeoutError: The master did not answer in time.
            ConnectionLost: The connection broke.
        """
        total = {"total": 0, "queued": 0, "running": 0, "done": 0, "cancelled": 0}
        pos = 0
        for seg in self._segments:
            futures = self.futures[pos : pos + seg.n]
            pos += seg.n
            reply = None
            if seg.futures is not None:
                self._conn.wait_accepted(seg, timeout)
                reply = self._conn.status(seg, timeout)
            if reply is None:
                cancelled = sum(1 for f in futures if f.cancelled())
                reply = (seg.n, 0, 0, seg.n - cancelled, cancelled)
            for key, value in zip(("total", "queued", "running", "done", "cancelled"), reply):
                total[key] += value
        return total


class _Connection:
    """One authenticated client connection: socket, reader thread and routing tables."""

    def __init__(self, address: Address, token: str, name: str, connect_timeout: float):
        host, port = parse_address(address)
        self.address = f"{host}:{port}"
        sock, welcome, reader, extra = connect(
            (host, port),
            role="client",
            token=token,
            name=name,
            slots=0,
            timeout=connect_timeout,
        )
        self.sock = sock
        self.session = welcome.session
        self.max_frame_bytes = welcome.max_frame_bytes
        self._reader = reader
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._by_req: Dict[int, _Segment] = {}
        self._segments: Dict[int, _Segment] = {}
        # req_id -> [package, counters or None, answered]
        self._status: Dict[int, list] = {}
        self._fatal: Tuple[str, str] | None = None
        self._lost: ConnectionLost | None = None
        self.closing = False
        self._closed = False
        self._thread = threading.Thread(
            target=self._read_loop,
            args=(extra,),
            name=f"rtpool-client-{self.address}",
            daemon=True,
        )
        self._thread.start()

    # -- sending ----------------------------------------------------------------------------

    def _send(self, frame: bytes, quiet: bool = False) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(frame)
        except OSError as exc:
            lost = self._connection_lost(f"sending to the master failed: {exc.strerror or exc}")
            if not quiet:
                raise lost from None

    def _split(self, payloads: List[bytes], code_len: int) -> List[Tuple[int, int]]:
        n = len(payloads)
        limit = self.max_frame_bytes - _SUBMIT_OVERHEAD - code_len
        if limit <= 0:
            raise ValueError(
                f"the pickled task function is {code_len} bytes, above the master's frame "
                f"limit of {self.max_frame_bytes} bytes; pass large data as arguments or "
                "start the master with a larger --max-frame-mb"
            )
        if sum(map(len, payloads)) + _PAYLOAD_OVERHEAD * n <= limit and n <= _MAX_TASKS_PER_FRAME:
            return [(0, n)]
        bounds = []
        lo = 0
        size = 0
        for i, payload in enumerate(payloads):
            item = len(payload) + _PAYLOAD_OVERHEAD
            if item > limit:
                raise ValueError(
                    f"task {i}'s arguments pickle to {len(payload)} bytes, above the master's "
                    f"frame limit of {self.max_frame_bytes} bytes; start the master with a "
                    "larger --max-frame-mb or send the data another way"
                )
            if size + item > limit or i - lo >= _MAX_TASKS_PER_FRAME:
                bounds.append((lo, i))
                lo = i
                size = 0
            size += item
        bounds.append((lo, n))
        return bounds

    def submit(
        self,
        digest: bytes,
        code: bytes,
        opts: Dict[str, Any],
        payloads: List[bytes],
        t0_ns: int,
        serialize_ns: int,
    ) -> Tuple[List[Future], List[_Segment]]:
        """Send one package; return its futures (input order) and segments."""
        n = len(payloads)
        bounds = self._split(payloads, len(code)) if n > 1 else [(0, 1)]
        serialize_us = serialize_ns / 1000 / n
        futures: List[Future] = []
        segments: List[_Segment] = []
        with self._lock:
            if self.closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._lost is not None:
                raise self._lost
            for lo, hi in bounds:
                seg = _Segment(self, next(self._ids), hi - lo, t0_ns, serialize_us)
                seg.futures = [Future(seg, i) for i in range(hi - lo)]
                futures.extend(seg.futures)
                segments.append(seg)
                self._by_req[seg.req_id] = seg
        single = len(bounds) == 1
        for seg, (lo, hi) in zip(segments, bounds):
            tasks = payloads if single else payloads[lo:hi]
            self._send(P.encode(P.SUBMIT, seg.req_id, digest, code, opts, tasks))
        return futures, segments

    def on_local_cancel(self, seg: _Segment, indices: tuple, count: int = 1) -> None:
        """Account for futures of ``seg`` cancelled here and tell the master."""
        with self._lock:
            seg.n_cancelled += count
            package = seg.package
            if package is None:
                if indices is _ALL or seg.pending_cancel is _ALL:
                    seg.pending_cancel = _ALL
                else:
                    seg.pending_cancel = (seg.pending_cancel or ()) + indices
            elif seg.n_results + seg.n_cancelled >= seg.n:
                self._finish(seg)
        if package is not None and self._lost is None:
            self._send(P.encode(P.CANCEL, package, list(indices)), quiet=True)
        if self.closing:
            self.close_if_idle()

    def _finish(self, seg: _Segment) -> None:
        # Called with self._lock held, or from the reader thread for its own counter.
        self._segments.pop(seg.package, None)
        seg.futures = None

    def wait_accepted(self, seg: _Segment, timeout: float) -> int:
        """Wait for the ``ACCEPTED`` of a segment; return its package id."""
        with self._cond:
            if seg.package is None:
                self._cond.wait_for(
                    lambda: (
                        seg.package is not None
                        or seg.req_id not in self._by_req
                        or self._lost is not None
                    ),
                    timeout,
                )
            if seg.package is not None:
                return seg.package
            if self._lost is not None:
                raise self._lost
            if seg.req_id in self._by_req:
                raise TimeoutError(
                    f"the master at {self.address} did not accept the package within {timeout:g} s"
                )
        raise seg.error or SubmitRejected(f"the master at {self.address} rejected the package")

    def status(self, seg: _Segment, timeout: float) -> tuple | None:
        """``(total, queued, running, done, cancelled)``, or None if the master freed it."""
        waiter = [seg.package, None, False]
        with self._lock:
            if self._lost is not None:
                raise self._lost
            req_id = next(self._ids)
            self._status[req_id] = waiter
        self._send(P.encode(P.STATUS, req_id, seg.package))
        with self._cond:
            self._cond.wait_for(lambda: waiter[2] or self._lost is not None, timeout)
            self._status.pop(req_id, None)
        if waiter[2]:
            return waiter[1]
        if self._lost is not None:
            raise self._lost
        raise TimeoutError(
            f"the master at {self.address} did not answer STATUS within {timeout:g} s"
        )

    # -- receiving --------------------------------------------------------------------------

    def _read_loop(self, extra: List[list]) -> None:
        reason = "the master closed the connection"
        try:
            if extra:
                self._dispatch(extra)
            recv = self.sock.recv
            feed = self._reader.feed
            dispatch = self._dispatch
            while True:
                data = recv(1 << 18)
                if not data:
                    break
                msgs = feed(data)
                if msgs:
                    dispatch(msgs)
                if self.closing:
                    self.close_if_idle()
        except ProtocolError as exc:
            reason = f"the master sent an invalid frame: {exc}"
        except (IndexError, TypeError, ValueError, KeyError) as exc:
            reason = f"the master sent a malformed message: {exc!r}"
        except OSError as exc:
            reason = f"connection error: {exc.strerror or exc}"
        self._connection_lost(reason)

    def _dispatch(self, msgs: List[list]) -> None:
        for msg in msgs:
            kind = msg[0]
            if kind == P.RESULTS:
                self._on_results(msg[1], msg[2])
            elif kind == P.ACCEPTED:
                self._on_accepted(msg[1], msg[2])
            elif kind == P.STATUS_REPLY:
                self._on_status_reply(msg)
            elif kind == P.ERROR:
                self._on_error(msg[1], msg[2], msg[3])
            else:
                raise ProtocolError(f"a client does not expect message kind {kind}")

    def _on_results(self, package: int, results: List[list]) -> None:
        seg = self._segments.get(package)
        if seg is None:
            return  # late results of a package whose futures were all cancelled
        futures = seg.futures
        if futures is None:
            return  # just finished by cancellations in another thread
        perf_ns = _perf_ns
        loads = _loads
        for r in results:
            fut = futures[r[0]]
            status = r[1]
            t0 = perf_ns()
            if status == 0:
                try:
                    value = loads(r[2])
                except Exception as exc:
                    error: BaseException | None = TaskFailed(
                        f"the task's result cannot be unpickled on the client: {exc!r}"
                    )
                else:
                    error = None
            elif status == 1:
                error = error_from_report(r[2])
            elif status == 2:
                error = cf.CancelledError()
            else:
                error = TaskFailed(
                    f"the master could not run the task: {bytes(r[2]).decode('utf-8', 'replace')}"
                )
            t1 = perf_ns()
            r[2] = None
            fut._entry = r
            fut._deser_ns = t1 - t0
            fut._done_ns = t1
            try:
                if error is None:
                    fut.set_result(value)
                elif status == 2:
                    if not fut._to_cancelled():
                        continue
                else:
                    fut.set_exception(error)
            except _InvalidStateError:
                continue  # cancelled here while its result was on the way
            seg.n_results += 1
        if seg.n_results + seg.n_cancelled >= seg.n:
            with self._lock:
                self._finish(seg)

    def _on_accepted(self, req_id: int, package: int) -> None:
        with self._cond:
            seg = self._by_req.pop(req_id, None)
            if seg is None:
                return
            seg.package = package
            if seg.n_results + seg.n_cancelled < seg.n:
                self._segments[package] = seg
            else:
                seg.futures = None
            pending, seg.pending_cancel = seg.pending_cancel, None
            self._cond.notify_all()
        if pending is not None:
            self._send(P.encode(P.CANCEL, package, list(pending)), quiet=True)

    def _on_status_reply(self, msg: list) -> None:
        with self._cond:
            waiter = self._status.get(msg[1])
            if waiter is not None:
                waiter[1] = tuple(msg[3:8])
                waiter[2] = True
                self._cond.notify_all()

    def _on_error(self, code: str, message: str, ref: int) -> None:
        if code == P.ERR_REJECTED:
            with self._cond:
                seg = self._by_req.pop(ref, None)
                self._cond.notify_all()
            if seg is not None and seg.futures is not None:
                seg.error = exc = SubmitRejected(
                    f"the master at {self.address} rejected the package (request {ref}): {message}"
                )
                for fut in seg.futures:
                    try:
                        fut.set_exception(exc)
                    except _InvalidStateError:
                        pass
                seg.futures = None
        elif code == P.ERR_UNKNOWN_PACKAGE:
            # A STATUS or CANCEL raced with the package's last results: those were sent
            # before this error, so the futures already know everything.
            with self._cond:
                for waiter in self._status.values():
                    if waiter[0] == ref:
                        waiter[2] = True
                self._cond.notify_all()
        else:
            self._fatal = (code, message)

    # -- closing ----------------------------------------------------------------------------

    def _connection_lost(self, reason: str) -> ConnectionLost:
        with self._cond:
            if self._lost is not None:
                return self._lost
            segments = list(self._by_req.values()) + list(self._segments.values())
            self._by_req.clear()
            self._segments.clear()
            pending = [f for seg in segments for f in (seg.futures or ()) if not f.done()]
            if self._closed:
                message = f"the client's connection to the master at {self.address} was closed"
            else:
                if self._fatal is not None:
                    reason = f"the master reported {self._fatal[0]}: {self._fatal[1]}"
                message = (
                    f"lost the connection to the master at {self.address} ({reason}); "
                    f"{len(pending)} unfinished tasks failed. Check that the master is running "
                    "(see its log) and resubmit them"
                )
            self._lost = lost = ConnectionLost(message)
            self._closed = True
            self._cond.notify_all()
        try:
            self.sock.close()
        except OSError:
            pass
        for fut in pending:
            try:
                fut.set_exception(lost)
            except _InvalidStateError:
                pass
        return lost

    def pending_futures(self) -> List[Future]:
        with self._lock:
            segments = list(self._by_req.values()) + list(self._segments.values())
        return [f for seg in segments for f in (seg.futures or ()) if not f.done()]

    def cancel_all(self) -> None:
        with self._lock:
            segments = list(self._by_req.values()) + list(self._segments.values())
        for seg in segments:
            futures = seg.futures
            if futures is not None:
                n = sum(1 for f in futures if f._to_cancelled())
                if n:
                    self.on_local_cancel(seg, _ALL, n)

    def close_if_idle(self) -> None:
        """Close the socket once no package waits for results (after shutdown)."""
        with self._lock:
            if self._closed or self._by_req or self._segments:
                return
            self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.closing = True
        if cancel_futures:
            self.cancel_all()
        if wait:
            cf.wait(self.pending_futures())
        self.close_if_idle()
        if wait and threading.current_thread() is not self._thread:
            with self._lock:
                idle = self._closed
            if idle:
                self._thread.join()


class _Submitter(cf.Executor):
    """What :class:`Client` and its :meth:`~Client.options` views share."""

    _conn: _Connection
    _opts: Dict[str, Any]

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker.

        Every keyword argument goes to ``fn``; package options are set with :meth:`options`.

        Args:
            fn: A picklable callable (cloudpickle: lambdas and closures work).
            *args: Positional arguments of ``fn``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The task's :class:`Future`.

        Raises:
            TypeError: ``fn`` or the arguments cannot be pickled.
            RuntimeError: The executor was shut down.
            ConnectionLost: The connection to the master is gone.
        """
        t0 = _perf_ns()
        digest, code = serialize_function(fn)
        payload = dumps_args(args, kwargs or None)
        t1 = _perf_ns()
        futures, segments = self._conn.submit(digest, code, self._opts, [payload], t0, t1 - t0)
        self._track(segments)
        return futures[0]

    def submit_many(self, fn: Callable, iterable: Iterable[Any], *, star: bool = False) -> Package:
        """Run ``fn`` once per item of ``iterable``, as one package (one ``SUBMIT`` frame).

        Args:
            fn: A picklable callable, pickled once for the whole package.
            iterable: The items; each becomes ``fn(item)``, or ``fn(*item)`` with ``star``.
            star: Unpack each item as positional arguments.

        Returns:
            The :class:`Package`, whose futures are in input order.

        Raises:
            TypeError: ``fn`` or an item cannot be pickled.
            ValueError: One item alone is larger than the master's frame limit.
            RuntimeError: The executor was shut down.
            ConnectionLost: The connection to the master is gone.
        """
        t0 = _perf_ns()
        digest, code = serialize_function(fn)
        items = list(iterable)
        if not items:
            return Package(self._conn, [], [])
        try:
            if star:
                payloads = [
                    _dumps((a if type(a) is tuple else tuple(a), None), PICKLE_PROTOCOL)
                    for a in items
                ]
            else:
                payloads = [_dumps(((a,), None), PICKLE_PROTOCOL) for a in items]
        except Exception:
            if star:
                payloads = [dumps_args(tuple(a), None) for a in items]
            else:
                payloads = [dumps_args((a,), None) for a in items]
        t1 = _perf_ns()
        futures, segments = self._conn.submit(digest, code, self._opts, payloads, t0, t1 - t0)
        self._track(segments)
        return Package(self._conn, futures, segments)

    def map(
        self,
        fn: Callable,
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """Like ``Executor.map``: submit everything now, yield results in input order.

        Args:
            fn: A picklable callable taking one argument per iterable.
            *iterables: Argument iterables, zipped.
            timeout: Seconds from this call until every result must be there.
            chunksize: Items per task; above 1, each task runs ``fn`` over a chunk (fewer,
                larger tasks for very cheap functions).

        Returns:
            An iterator of results in input order; it raises the first failing task's
            exception when it reaches it, and cancels what is left if it is closed early.

        Raises:
            ValueError: ``chunksize`` is below 1.
            TimeoutError: (from the iterator) a result is not there by the deadline.
        """
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        end = None if timeout is None else time.monotonic() + timeout
        items = zip(*iterables)
        if chunksize == 1:
            package = self.submit_many(fn, items, star=True)
        else:
            chunks = iter(lambda: list(itertools.islice(items, chunksize)), [])
            package = self.submit_many(functools.partial(run_chunk, fn), chunks)
        return _result_iterator(package, end, chunksize > 1)

    def options(self, **opts: Any) -> ClientView:
        """An executor sharing this connection that submits with these package options.

        Args:
            **opts: Package options. ``priority`` (int, default 0): higher runs first, FIFO
                within one priority.

        Returns:
            A :class:`ClientView`; its ``submit``/``submit_many``/``map`` pass every keyword
            argument to the task function.

        Raises:
            TypeError: An unknown option name (the message lists the valid ones) or a wrong
                type.
        """
        merged = dict(self._opts)
        merged.update(_check_options(opts))
        return ClientView(self._conn, merged)

    def _track(self, segments: List[_Segment]) -> None:
        pass


def _result_iterator(package: Package, end: float | None, chunked: bool) -> Iterator[Any]:
    futures = list(reversed(package.futures))
    try:
        while futures:
            fut = futures[-1]
            if end is None:
                value = fut.result()
            else:
                value = fut.result(max(0.0, end - time.monotonic()))
            futures.pop()
            if chunked:
                yield from value
            else:
                yield value
    finally:
        if futures:
            package.cancel()


class ClientView(_Submitter):
    """An executor view of a :class:`Client` with package options (see :meth:`Client.options`).

    It shares the client's connection; shutting the view down only stops it from accepting
    work (and waits for what it submitted), the client stays open.
    """

    def __init__(self, conn: _Connection, opts: Dict[str, Any]) -> None:
        self._conn = conn
        self._opts = opts
        self._submitted: List[_Segment] = []
        self._shut = False

    def __repr__(self) -> str:
        return f"<rtpool.ClientView {self._conn.address} {self._opts}>"

    def _track(self, segments: List[_Segment]) -> None:
        if self._shut:
            return
        submitted = self._submitted
        if len(submitted) >= 256:
            submitted[:] = [s for s in submitted if s.futures is not None]
        submitted.extend(segments)

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return super().submit(fn, *args, **kwargs)

    def submit_many(self, fn: Callable, iterable: Iterable[Any], *, star: bool = False) -> Package:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return super().submit_many(fn, iterable, star=star)

    submit.__doc__ = _Submitter.submit.__doc__
    submit_many.__doc__ = _Submitter.submit_many.__doc__

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work through this view; the client's connection stays open.

        Args:
            wait: Wait for the tasks submitted through this view.
            cancel_futures: Cancel those that have no result yet.
        """
        self._shut = True
        futures = [f for s in self._submitted for f in (s.futures or ()) if not f.done()]
        self._submitted = []
        if cancel_futures:
            for fut in futures:
                fut.cancel()
        if wait:
            cf.wait(futures)


class Client(_Submitter):
    """A connection to an rtpool master, usable as a ``concurrent.futures.Executor``.

    Example::

        with rtpool.Client("127.0.0.1:7070", token) as client:
            print(list(client.map(pow, range(10), range(10))))

    Args:
        address: The master's ``"host:port"`` or ``(host, port)``.
        token: The master's client token; by default ``$RTPOOL_TOKEN``.
        name: Name shown in the master's log and status (default ``hostname:pid``).
        connect_timeout: Seconds to wait for the connection and the handshake.

    Raises:
        ConnectError: The master cannot be reached.
        AuthenticationError: The master refused the token (or none was given).
        ProtocolError: The master answered the handshake with something unexpected.
    """

    def __init__(
        self,
        address: Address,
        token: str | None = None,
        *,
        name: str | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if token is None:
            token = os.environ.get("RTPOOL_TOKEN")
        if not token:
            raise AuthenticationError(
                "no client token: pass token= or set RTPOOL_TOKEN (the master prints it on "
                "first start and keeps it in its data dir as client.token)"
            )
        self._opts: Dict[str, Any] = {}
        self._conn = _Connection(address, token, name or default_name(), connect_timeout)
        # A client dropped without shutdown() closes once its pending tasks are done.
        self._finalizer = weakref.finalize(self, self._conn.shutdown, False)

    def __repr__(self) -> str:
        state = " closed" if self._conn.closing else ""
        return f"<rtpool.Client {self._conn.address} session={self._conn.session}{state}>"

    @property
    def address(self) -> str:
        """The master's ``host:port``."""
        return self._conn.address

    @property
    def session(self) -> int:
        """The session id the master gave this connection."""
        return self._conn.session

    @property
    def max_frame_bytes(self) -> int:
        """The master's frame limit; larger packages are split into several frames."""
        return self._conn.max_frame_bytes

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks and close the connection when nothing is pending.

        Args:
            wait: Block until every pending task has a result, then close.
            cancel_futures: First cancel every task that has no result yet.
        """
        self._conn.shutdown(wait, cancel_futures)

    def close(self) -> None:
        """Cancel every pending task and close the connection now. Idempotent."""
        self._conn.shutdown(wait=True, cancel_futures=True)
