"""One authenticated client connection: the socket, the reader thread, and the tables that
route the master's answers (``ACCEPTED``, ``RESULTS``, ``STATUS_REPLY``, ``ERROR``) to futures.

Submitting writes a ``SUBMIT`` frame from the calling thread (under a lock); the daemon reader
thread decodes what the master sends and resolves the futures, so a result reaches a waiting
thread after exactly one thread hop. Everything per task on these two paths is kept small: a
package is one frame, and a ``RESULTS`` batch is decoded without building a dict per result.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import pickle
import socket
import threading
import time
from typing import Any, Dict, List, Tuple

from . import _protocol as P
from ._connect import Address, TlsOption, connect, parse_address
from ._future import Future
from ._serialize import error_from_report
from .errors import ConnectionLost, ProtocolError, SubmitRejected, TaskFailed

_perf_ns = time.perf_counter_ns
_loads = pickle.loads
_InvalidStateError = cf.InvalidStateError

# Bytes of a SUBMIT frame besides the function code and the payloads (prefix, array header,
# kind, req_id, fn_hash, opts), rounded up; and per payload (bin32 header).
_SUBMIT_OVERHEAD = 128
_PAYLOAD_OVERHEAD = 5
_MAX_TASKS_PER_FRAME = 2**32 - 1
# "The whole package" for on_local_cancel() and _Segment.pending_cancel: on the wire, CANCEL
# with no indices.
ALL = ()


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
        # Cancellations made before ACCEPTED gave the package id: indices, or ALL.
        self.pending_cancel: tuple | None = None


class _Connection:
    """One authenticated client connection: socket, reader thread and routing tables."""

    def __init__(
        self,
        address: Address,
        token: str,
        name: str,
        connect_timeout: float,
        tls: TlsOption = False,
        ca_file: str | None = None,
    ):
        host, port = parse_address(address)
        self.address = f"{host}:{port}"
        sock, welcome, reader, extra = connect(
            (host, port),
            role="client",
            token=token,
            name=name,
            slots=0,
            timeout=connect_timeout,
            tls=tls,
            ca_file=ca_file,
        )
        self.sock = sock
        self.session = welcome.session
        self.max_frame_bytes = welcome.max_frame_bytes
        self._reader = reader
        # Locks of threads waiting in Future.result(), released by the reader thread.
        self._wakes: List[Any] = []
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._by_req: Dict[int, _Segment] = {}
        self._segments: Dict[int, _Segment] = {}
        # req_id -> [package, counters or None, answered]
        self._status: Dict[int, list] = {}
        self._fatal: Tuple[str, str] | None = None
        # Threads in wait_accepted()/status(): ACCEPTED notifies only when there are any.
        self._waiting = 0
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
                cond = threading.Condition()
                seg.futures = [Future(seg, i, cond) for i in range(hi - lo)]
                futures.extend(seg.futures)
                segments.append(seg)
                self._by_req[seg.req_id] = seg
        single = len(bounds) == 1
        for seg, (lo, hi) in zip(segments, bounds):
            tasks = payloads if single else payloads[lo:hi]
            self._send(P.encode(P.SUBMIT, seg.req_id, digest, code, opts, tasks))
        return futures, segments

    def submit_one(
        self,
        digest: bytes,
        code: bytes,
        opts: Dict[str, Any],
        payload: bytes,
        t0_ns: int,
        serialize_ns: int,
    ) -> Tuple[Future, _Segment]:
        """:meth:`submit` for one task: the latency path, kept short."""
        seg = _Segment(self, 0, 1, t0_ns, serialize_ns / 1000)
        fut = Future(seg, 0)
        seg.futures = [fut]
        with self._lock:
            if self.closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._lost is not None:
                raise self._lost
            seg.req_id = req_id = next(self._ids)
            self._by_req[req_id] = seg
        self._send(P.encode(P.SUBMIT, req_id, digest, code, opts, [payload]))
        return fut, seg

    def on_local_cancel(self, seg: _Segment, indices: tuple, count: int = 1) -> None:
        """Account for futures of ``seg`` cancelled here and tell the master."""
        with self._lock:
            seg.n_cancelled += count
            package = seg.package
            if package is None:
                if indices is ALL or seg.pending_cancel is ALL:
                    seg.pending_cancel = ALL
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
                self._waiting += 1
                try:
                    self._cond.wait_for(
                        lambda: (
                            seg.package is not None
                            or seg.req_id not in self._by_req
                            or self._lost is not None
                        ),
                        timeout,
                    )
                finally:
                    self._waiting -= 1
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
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: waiter[2] or self._lost is not None, timeout)
            finally:
                self._waiting -= 1
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
            wakes = self._wakes
            while True:
                if wakes:
                    for lock in wakes:
                        lock.release()
                    wakes.clear()
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
        for lock in self._wakes:
            lock.release()
        self._wakes.clear()
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
            value = None
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
            if status == 2:
                if not fut._to_cancelled():
                    continue
            else:
                wakes = fut._finish(value, error)
                if wakes is None:
                    continue  # cancelled here while its result was on the way
                fut._invoke_callbacks()
                if wakes:
                    # Released just before the next recv(): a waiter woken earlier would find
                    # this thread still holding the GIL and block once more.
                    self._wakes.extend(wakes)
            seg.n_results += 1
        if seg.n_results + seg.n_cancelled >= seg.n:
            with self._lock:
                self._finish(seg)

    def _on_accepted(self, req_id: int, package: int) -> None:
        with self._lock:
            seg = self._by_req.pop(req_id, None)
            if seg is None:
                return
            seg.package = package
            if seg.n_results + seg.n_cancelled < seg.n:
                self._segments[package] = seg
            else:
                seg.futures = None
            pending, seg.pending_cancel = seg.pending_cancel, None
            if self._waiting:
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

    def cancel_segment(self, seg: _Segment) -> int:
        """Cancel the futures of ``seg`` without a result; one ``CANCEL`` for all of them."""
        futures = seg.futures
        if futures is None:
            return 0
        n = sum(1 for f in futures if f._to_cancelled())
        if n:
            self.on_local_cancel(seg, ALL, n)
        return n

    def cancel_all(self) -> None:
        with self._lock:
            segments = list(self._by_req.values()) + list(self._segments.values())
        for seg in segments:
            self.cancel_segment(seg)

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
