"""One client connection to the master, kept up across disconnects: the socket, the reader
thread, the heartbeat thread, and the tables that route the master's answers (``ACCEPTED``,
``RESULTS``, ``STATUS_REPLY``, ``ERROR``) to futures.

Submitting writes a ``SUBMIT`` frame from the calling thread (under a lock); the daemon reader
thread decodes what the master sends and resolves the futures, so a result reaches a waiting
thread after exactly one thread hop. Everything per task on these two paths is kept small: a
package is one frame, and a ``RESULTS`` batch is decoded without building a dict per result.

Delivery (see ``docs/reliability.md``): after each batch of frames read, the reader
sends one ``ACK`` per package that got results. When the connection drops, the reader thread
reconnects with backoff, re-sends every ``SUBMIT`` not yet ``ACCEPTED`` (same bytes, so the
same idempotency ``key``), ``ATTACH``es every accepted package with pending futures, and keeps
the first result of each task (the master re-sends the ones not acknowledged).

Calls of named functions (``CALL``, see ``docs/rpc.md``) are packages too: a call segment
has a ``decode`` hook that turns each result's msgpack data into the call's outputs (instead
of unpickling it), and ``FUNCTIONS`` requests wait for their ``FUNCTIONS_REPLY`` like
``STATUS`` (re-sent after a reconnection). The interfaces, validation and encoding are in
``_calls.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import os
import pickle
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

from . import _protocol as P
from ._connect import Address, TlsOption, connect, parse_address
from ._future import Future
from ._serialize import error_from_report
from .errors import (
    AdmissionError,
    AuthenticationError,
    ConnectError,
    ConnectionLost,
    DeadlineMissedError,
    PoisonTaskError,
    ProtocolError,
    QuorumError,
    QuotaExceededError,
    ResultsLost,
    SubmitRejected,
    TaskFailed,
    TaskTimeoutError,
    UnknownFunctionError,
)

_log = logging.getLogger("rtpool.client")
_perf_ns = time.perf_counter_ns
_monotonic = time.monotonic
_loads = pickle.loads
_urandom = os.urandom
_encode = P.encode
_encode_submit = P.encode_submit
_InvalidStateError = cf.InvalidStateError

# Bytes of a SUBMIT frame besides the function code and the payloads (prefix, array header,
# kind, req_id, fn_hash, opts with priority, timeout_ms and key), rounded up; and per payload
# (bin32 header).
_SUBMIT_OVERHEAD = 256
_PAYLOAD_OVERHEAD = 5
_MAX_TASKS_PER_FRAME = 2**32 - 1
# "The whole package" for on_local_cancel() and _Segment.pending_cancel: on the wire, CANCEL
# with no indices.
ALL = ()
# Reconnection backoff: the first pause, the longest one (each is drawn in [d/2, d]).
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 5.0
# Fatal errors after which reconnecting cannot help: the same request would fail again.
_NO_RETRY = frozenset(
    {P.ERR_VERSION, P.ERR_AUTH, P.ERR_TOO_LARGE, P.ERR_MALFORMED, P.ERR_UNKNOWN_KIND}
)
# Segments finished by local cancellation may still get late results (tasks that were running):
# they stay countable for ACK, up to this many (the oldest are forgotten first).
_LATE_MAX = 1024
_HEARTBEAT = P.encode(P.HEARTBEAT)
# The SUBMIT options written before "key" (spec order).
_BEFORE_KEY = frozenset({"priority", "timeout_ms"})


class _Segment:
    """The tasks of one SUBMIT frame: one master package.

    A :class:`Package` is usually one segment; it has several when it does not fit in one frame.
    The reader thread counts results, the cancelling thread (under the connection lock) counts
    local cancellations; the segment is done when the two add up to its size.
    """

    __slots__ = (
        "conn",
        "decode",
        "error",
        "frame",
        "futures",
        "has_deadline",
        "n",
        "n_cancelled",
        "n_results",
        "package",
        "pending_cancel",
        "req_id",
        "retry",
        "rx",
        "serialize_us",
        "t0_ns",
    )

    def __init__(self, conn: _Connection, req_id: int, n: int, t0_ns: int, serialize_us: float):
        self.conn = conn
        self.req_id = req_id
        self.package: int | None = None
        self.error: BaseException | None = None
        self.futures: List[Future] | None = None
        # Whether the package has a deadline (its futures then report their lateness).
        self.has_deadline = False
        # The SUBMIT frame, kept until ACCEPTED so a reconnect re-sends the very same bytes.
        self.frame: bytes | None = None
        self.n = n
        self.n_results = 0
        self.n_cancelled = 0
        # TaskResult entries received on this connection since ACCEPTED: the ACK count.
        self.rx = 0
        self.t0_ns = t0_ns
        self.serialize_us = serialize_us
        # Cancellations made before ACCEPTED gave the package id: indices, or ALL.
        self.pending_cancel: tuple | None = None
        # Call packages: (index, status, data) -> (value, error), instead of unpickling.
        self.decode: Callable[[int, int, Any], Tuple[Any, BaseException | None]] | None = None
        # Call packages whose interfaces came from the cache: on ERROR unknown_function,
        # called once (in a thread of its own) with the segment and the master's message,
        # to fetch the interfaces again and re-send (see _Connection.resend_calls).
        self.retry: Callable[[_Segment, str], None] | None = None


def _submit_frame(req_id: int, digest: bytes, code: bytes, opts: dict, tasks: list) -> bytes:
    # ``opts`` are in wire form and spec order (Client.options() made them so). A fresh random
    # idempotency key per package (128 bits from os.urandom, as uuid4 but a fifth of its
    # cost): a SUBMIT re-sent after a reconnect never makes a second package.
    key = _urandom(16).hex()
    if opts.keys() <= _BEFORE_KEY:
        opts = {**opts, "key": key}  # the common case: "key" goes last
    else:
        opts = _with_key(opts, key)
    return _encode_submit(req_id, digest, code, opts, tasks)


def _call_frame(req_id: int, opts: dict, calls: list) -> bytes:
    """A ``CALL`` frame; ``opts`` in wire form, with a fresh idempotency key as for SUBMIT."""
    key = _urandom(16).hex()
    if opts.keys() <= _BEFORE_KEY:
        opts = {**opts, "key": key}
    else:
        opts = _with_key(opts, key)
    return _encode(P.CALL, req_id, opts, calls)


def _with_key(opts: dict, key: str) -> dict:
    """``opts`` with ``"key"`` in its spec position: after priority and timeout_ms."""
    out = {}
    for name, value in opts.items():
        if "key" not in out and name not in _BEFORE_KEY:
            out["key"] = key
        out[name] = value
    return out


def _task_error(status: int, data: bytes) -> BaseException:
    """The exception of a task that ended with a status other than ok/error/cancelled."""
    if status == P.STATUS_DISAGREE:
        return _quorum_error(data)
    message = bytes(data).decode("utf-8", "replace")
    if status == P.STATUS_TIMEOUT:
        return TaskTimeoutError(f"the task ran past its timeout: {message}", "", message)
    if status == P.STATUS_LOST:
        return PoisonTaskError(
            f"the task's worker was lost on each of its attempts (a poison task?): {message}",
            "",
            message,
        )
    if status == P.STATUS_QUOTA:
        return QuotaExceededError(f"the user's quota ran out before the task ran: {message}")
    if status == P.STATUS_MISSED:
        return DeadlineMissedError(
            f"the task could not make its deadline and was dropped (on_miss='drop'): {message}",
            "",
            message,
        )
    return TaskFailed(f"the master could not run the task: {message}", "", message)


def _quorum_error(data: bytes) -> QuorumError:
    """The :class:`QuorumError` of a task with status 8, every copy's result attached."""
    try:
        message, copies = P.decode_disagreement(data)
    except ProtocolError as exc:
        return QuorumError(
            f"the task's copies did not reach a quorum, and the master's report of them "
            f"cannot be read: {exc}"
        )
    results = [(worker, status, _copy_value(status, data)) for worker, status, data in copies]
    return QuorumError(
        f"the task's {len(results)} copies did not reach a quorum: {message}", results
    )


def _copy_value(status: int, data: bytes) -> Any:
    """One copy's value in a :class:`QuorumError`: what its future would have given."""
    if status == P.STATUS_OK:
        try:
            return _loads(data)
        except Exception as exc:
            return TaskFailed(f"the copy's result cannot be unpickled on the client: {exc!r}")
    if status == P.STATUS_ERROR:
        return error_from_report(data)
    return bytes(data).decode("utf-8", "replace")


class _Connection:
    """One client connection: socket, reader and heartbeat threads, routing tables."""

    def __init__(
        self,
        address: Address,
        token: str,
        name: str,
        connect_timeout: float,
        tls: TlsOption = False,
        ca_file: str | None = None,
        reconnect_timeout: float = 60.0,
    ):
        host, port = parse_address(address)
        self.address = f"{host}:{port}"
        self._hello = {
            "role": "client",
            "token": token,
            "name": name,
            "slots": 0,
            "tls": tls,
            "ca_file": ca_file,
        }
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        sock, welcome, reader, extra = connect((host, port), **self._hello, timeout=connect_timeout)
        # Locks of threads waiting in Future.result(), released by the reader thread.
        self._wakes: List[Any] = []
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._by_req: Dict[int, _Segment] = {}  # req_id -> segment not yet ACCEPTED
        self._segments: Dict[int, _Segment] = {}  # package -> accepted, futures pending
        self._late: Dict[int, _Segment] = {}  # package -> finished by local cancels
        self._attaching: Dict[int, Tuple[int, _Segment]] = {}  # package -> (req_id, segment)
        # req_id -> [package, counters or None, answered, error]
        self._status: Dict[int, list] = {}
        # req_id -> [name, functions or None, answered]: FUNCTIONS requests in flight
        self._fn_waiters: Dict[int, list] = {}
        #: Interfaces of named functions by (name, version asked for), for _calls.py: one
        #: FUNCTIONS round trip per function and client, shared by its options() views.
        self.interfaces: Dict[Tuple[str, str | None], Any] = {}
        self._acks: Dict[int, _Segment] = {}  # reader only: packages of the current batch
        self._ack_later: Dict[int, _Segment] = {}  # ACKs the reader could not send at once
        self._fatal: Tuple[str, str] | None = None
        # Threads in wait_accepted()/status(): ACCEPTED notifies only when there are any.
        self._waiting = 0
        self._lost: ConnectionLost | None = None
        self.closing = False
        self._closed = False
        self._stop = threading.Event()
        self._gen = 0  # bumped at each (re)connection, see _send()
        self._last_send = _monotonic()
        self._drop_since: float | None = None
        self._backoff = _BACKOFF_FIRST
        self.reconnects = 0
        self.duplicate_results = 0  # results of a task after its first one (tests read it)
        self.sock: socket.socket | None = None
        self._use(sock, welcome, reader)
        self._thread = threading.Thread(
            target=self._run, args=(extra,), name=f"rtpool-client-{self.address}", daemon=True
        )
        self._thread.start()
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"rtpool-heartbeat-{self.address}", daemon=True
        )
        self._heartbeat_thread.start()

    def _use(self, sock: socket.socket, welcome: Any, reader: P.FrameReader) -> None:
        self.sock = sock
        self._reader = reader
        self.session = welcome.session
        self.max_frame_bytes = welcome.max_frame_bytes
        self.heartbeat_ms = welcome.heartbeat_ms
        self.instance = welcome.instance

    # -- sending ----------------------------------------------------------------------------

    def _send(self, frame: bytes, quiet: bool = False, gen: int | None = None) -> None:
        """Write one frame. While disconnected it is dropped: what matters (SUBMIT, CANCEL of
        a package) is sent again by the reconnection. ``gen``: send only if no reconnection
        happened since then (the reconnection already re-sent the frame)."""
        with self._send_lock:
            sock = self.sock
            if sock is None or (gen is not None and gen != self._gen):
                return
            try:
                sock.sendall(frame)
                if self._ack_later:
                    self._flush_acks(sock)
            except OSError as exc:
                error = exc
            else:
                self._last_send = _monotonic()
                return
        self._on_send_error(sock, error, quiet)

    def _on_send_error(self, sock: socket.socket, exc: OSError, quiet: bool) -> None:
        if self.reconnect_timeout > 0:
            try:  # wake the reader: it sees the broken connection and reconnects
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        lost = self._connection_lost(f"sending to the master failed: {exc.strerror or exc}")
        if not quiet:
            raise lost from None

    def _flush_acks(self, sock: socket.socket) -> None:
        # With the send lock held.
        with self._lock:
            later, self._ack_later = self._ack_later, {}
        if later:
            sock.sendall(b"".join([_encode(P.ACK, pkg, seg.rx) for pkg, seg in later.items()]))

    def _send_acks(self) -> None:
        """Reader thread, after a batch: one ACK per package that got results in it."""
        acks, self._acks = self._acks, {}
        if not self._send_lock.acquire(False):
            # Another thread is writing (maybe a large SUBMIT): do not stop reading results
            # for it. It sends these when done (or the heartbeat thread does).
            with self._lock:
                self._ack_later.update(acks)
            return
        try:
            sock = self.sock
            if sock is not None:
                sock.sendall(b"".join([_encode(P.ACK, pkg, seg.rx) for pkg, seg in acks.items()]))
                self._last_send = _monotonic()
        except OSError:
            pass  # the next recv() sees the broken connection
        finally:
            self._send_lock.release()

    def _heartbeat_loop(self) -> None:
        # Sends HEARTBEAT when nothing else was sent for heartbeat_ms (the master closes
        # silent clients), and ACKs the reader had to defer. Never on a submission's path.
        while True:
            period = self.heartbeat_ms / 1000
            tick = min(max(period / 2, 0.005), 1.0) if period > 0 else 1.0
            if self._stop.wait(tick):
                return
            if self._ack_later:
                with self._send_lock:
                    try:
                        if self.sock is not None:
                            self._flush_acks(self.sock)
                    except OSError:
                        pass
            if period > 0 and _monotonic() - self._last_send >= period:
                self._send(_HEARTBEAT, quiet=True)

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

    def _register(self, segments: List[_Segment]) -> int:
        """Make segments (frames set) known to the reader; return the connection generation."""
        with self._lock:
            if self.closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._lost is not None:
                raise self._lost
            for seg in segments:
                self._by_req[seg.req_id] = seg
            if self.sock is None:
                self._cond.notify_all()  # a reader waiting for work reconnects
            return self._gen

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
        has_deadline = "deadline_ms" in opts
        futures: List[Future] = []
        segments: List[_Segment] = []
        single = len(bounds) == 1
        for lo, hi in bounds:
            seg = _Segment(self, next(self._ids), hi - lo, t0_ns, serialize_us)
            seg.has_deadline = has_deadline
            cond = threading.Condition()
            seg.futures = [Future(seg, i, cond) for i in range(hi - lo)]
            tasks = payloads if single else payloads[lo:hi]
            seg.frame = _submit_frame(seg.req_id, digest, code, opts, tasks)
            futures.extend(seg.futures)
            segments.append(seg)
        gen = self._register(segments)
        for seg in segments:
            frame = seg.frame
            if frame is not None:  # None: already answered
                self._send(frame, gen=gen)
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
        req_id = next(self._ids)  # itertools.count: atomic under the GIL
        seg = _Segment(self, req_id, 1, t0_ns, serialize_ns / 1000)
        if "deadline_ms" in opts:
            seg.has_deadline = True
        fut = Future(seg, 0)
        seg.futures = [fut]
        seg.frame = frame = _submit_frame(req_id, digest, code, opts, [payload])
        self._send(frame, gen=self._register([seg]))
        return fut, seg

    def call_segment(self, n: int, t0_ns: int, opts: Dict[str, Any]) -> _Segment:
        """A new segment for a package of ``n`` calls; the caller sets its ``futures``,
        ``decode`` (and ``retry``), then sends it with :meth:`send_calls`."""
        seg = _Segment(self, next(self._ids), n, t0_ns, 0.0)
        if "deadline_ms" in opts:
            seg.has_deadline = True
        return seg

    def send_calls(self, seg: _Segment, opts: Dict[str, Any], calls: list) -> None:
        """Send a ``CALL`` frame: ``calls`` are ``[name, version, args, deps, fetch]``.

        Raises:
            ValueError: The frame is above the master's frame limit (a package of calls is
                never split: its dependencies are indices within the frame).
        """
        frame = _call_frame(seg.req_id, opts, calls)
        self._check_call_frame(frame, len(calls))
        seg.frame = frame
        self._send(frame, gen=self._register([seg]))

    def _check_call_frame(self, frame: bytes, n: int) -> None:
        if len(frame) - 4 > self.max_frame_bytes:
            what = "the call's arguments" if n == 1 else f"the {n} calls' arguments"
            raise ValueError(
                f"{what} take {len(frame) - 4} bytes, above the master's frame limit of "
                f"{self.max_frame_bytes} bytes; send less data per call, or start the master "
                "with a larger --max-frame-mb"
            )

    def resend_calls(self, seg: _Segment, opts: Dict[str, Any], calls: list) -> None:
        """Send a call segment again under a new request id (the ``retry`` hook's way back,
        after ``ERROR unknown_function``); nothing if its futures failed meanwhile."""
        frame = _call_frame(0, opts, calls)  # checked at its final size (req_id aside)
        try:
            self._check_call_frame(frame, len(calls))
        except ValueError as exc:
            self.fail_unsent(seg, exc)
            return
        with self._lock:
            if self._by_req.pop(seg.req_id, None) is None:
                return  # the connection was lost for good: its futures failed with it
            seg.req_id = next(self._ids)
            seg.frame = frame = _call_frame(seg.req_id, opts, calls)
            self._by_req[seg.req_id] = seg
            gen = self._gen
        self._send(frame, gen=gen)

    def fail_unsent(self, seg: _Segment, exc: BaseException) -> None:
        """Fail every future of a segment the master has not accepted (a ``retry`` that
        could not rebuild its calls)."""
        with self._cond:
            self._by_req.pop(seg.req_id, None)
            seg.frame = None
            futures, seg.futures = seg.futures, None
            seg.error = exc
            self._cond.notify_all()
        if futures:
            self._fail(futures, exc)

    def functions(self, name: str, timeout: float) -> list:
        """Ask the master which functions are served (``FUNCTIONS``): ``name``'s versions,
        or everything for ``""``. Survives a reconnection (the request is sent again).

        Returns:
            ``[[name, version, servers, interface], ...]`` as ``FUNCTIONS_REPLY`` lists them.

        Raises:
            TimeoutError: No answer within ``timeout`` seconds.
            ConnectionLost: The connection is gone for good.
            RuntimeError: The client was shut down.
        """
        waiter = [name, None, False]
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self.closing:
                raise RuntimeError("cannot ask the master for functions after shutdown")
            req_id = next(self._ids)
            self._fn_waiters[req_id] = waiter
            gen = self._gen
            if self.sock is None:
                self._cond.notify_all()  # a reader waiting for work reconnects
        try:
            self._send(_encode(P.FUNCTIONS, req_id, name), gen=gen)
            with self._cond:
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: waiter[2] or self._lost is not None, timeout)
                finally:
                    self._waiting -= 1
        finally:
            with self._lock:
                self._fn_waiters.pop(req_id, None)
        if waiter[2]:
            return waiter[1]
        if self._lost is not None:
            raise self._lost
        raise TimeoutError(
            f"the master at {self.address} did not answer FUNCTIONS within {timeout:g} s"
        )

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
        # Called with self._lock held.
        if self._segments.pop(seg.package, None) is not None and seg.n_cancelled:
            self._keep_late(seg)
        seg.futures = None

    def _keep_late(self, seg: _Segment) -> None:
        # With self._lock held: results of tasks that ran before the CANCEL reached the master
        # may still come for this package; count them for ACK so the master can free it.
        late = self._late
        late[seg.package] = seg
        if len(late) > _LATE_MAX:
            del late[next(iter(late))]

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
        """``(total, queued, running, done, cancelled)``, followed by ``(met, missed)`` from
        a master with deadlines, or None if the master freed the package."""
        waiter = [seg.package, None, False, None]
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self.sock is None:
                raise ConnectionLost(
                    f"the connection to the master at {self.address} is down and the client "
                    "is reconnecting; ask for the status again later"
                )
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
        if waiter[3] is not None:
            raise waiter[3]
        if waiter[2]:
            return waiter[1]
        if self._lost is not None:
            raise self._lost
        raise TimeoutError(
            f"the master at {self.address} did not answer STATUS within {timeout:g} s"
        )

    # -- receiving --------------------------------------------------------------------------

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
            recv = self.sock.recv
            feed = self._reader.feed
            dispatch = self._dispatch
            wakes = self._wakes
            msgs = extra
            while True:
                if msgs:
                    dispatch(msgs)
                    if wakes:
                        # Released only now, after the whole batch: a waiter woken earlier
                        # would find this thread still holding the GIL and block once more.
                        for lock in wakes:
                            lock.release()
                        wakes.clear()
                    if self._acks:
                        self._send_acks()  # its sendall() lets the woken threads run
                    if self.closing:
                        self.close_if_idle()
                        if self._closed:
                            break
                data = recv(1 << 18)
                if not data:
                    break
                msgs = feed(data)
        except ProtocolError as exc:
            reason = f"the master sent an invalid frame: {exc}"
        except (IndexError, TypeError, ValueError, KeyError) as exc:
            reason = f"the master sent a malformed message: {exc!r}"
        except (OSError, AttributeError) as exc:  # AttributeError: closed under our feet
            reason = f"connection error: {getattr(exc, 'strerror', None) or exc}"
        for lock in self._wakes:
            lock.release()
        self._wakes.clear()
        return reason

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
            elif kind == P.FUNCTIONS_REPLY:
                self._on_functions_reply(msg[1], msg[2])
            else:
                raise ProtocolError(f"a client does not expect message kind {kind}")

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
        perf_ns = _perf_ns
        loads = _loads
        decode = seg.decode
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
                error = _task_error(status, r[2])
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
                    self._wakes.extend(wakes)  # released after the batch, see _read_session
            seg.n_results += 1
        if seg.n_results + seg.n_cancelled >= seg.n:
            with self._lock:
                self._finish(seg)

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

    def _on_status_reply(self, msg: list) -> None:
        with self._cond:
            waiter = self._status.get(msg[1])
            if waiter is not None:
                # 5 counters, or 7 (met, missed) from a master with deadlines.
                waiter[1] = tuple(msg[3:10])
                waiter[2] = True
                self._cond.notify_all()

    def _on_functions_reply(self, req_id: int, functions: list) -> None:
        with self._cond:
            waiter = self._fn_waiters.get(req_id)
            if waiter is not None:
                waiter[1] = functions
                waiter[2] = True
                self._cond.notify_all()

    def _on_unknown_function(self, message: str, ref: int) -> None:
        """``ERROR unknown_function`` for the ``CALL`` with request id ``ref``: retry it once
        if its interfaces came from the cache, else fail its futures."""
        with self._cond:
            self._drop_since = None
            seg = self._by_req.get(ref)
            retry = None
            if seg is not None:
                retry, seg.retry = seg.retry, None
                seg.frame = None  # not re-sent by a reconnection while it is rebuilt
                if retry is None:
                    del self._by_req[ref]
            self._cond.notify_all()
        if seg is None:
            return
        if retry is not None:
            # It asks the master for the interfaces again: not on this thread.
            threading.Thread(
                target=retry, args=(seg, message), name="rtpool-call-retry", daemon=True
            ).start()
            return
        futures, seg.futures = seg.futures, None
        if futures:
            exc = UnknownFunctionError(message)
            seg.error = exc
            self._fail(futures, exc)

    def _on_error(self, code: str, message: str, ref: int) -> None:
        if code == P.ERR_UNKNOWN_FUNCTION:
            self._on_unknown_function(message, ref)
            return
        if code == P.ERR_REJECTED or code == P.ERR_QUOTA or code == P.ERR_ADMISSION:
            with self._cond:
                self._drop_since = None
                seg = self._by_req.pop(ref, None)
                self._cond.notify_all()
            if seg is not None and seg.futures is not None:
                if code == P.ERR_QUOTA:
                    exc: BaseException = QuotaExceededError(
                        f"the master at {self.address} refused the package (request {ref}): "
                        f"the user's compute-time quota is used up: {message}"
                    )
                elif code == P.ERR_ADMISSION:
                    exc = AdmissionError(
                        f"the master at {self.address} refused the package (request {ref}): it "
                        f"cannot finish by its deadline: {message}"
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

    # -- reconnecting -----------------------------------------------------------------------

    def _after_drop(self, reason: str) -> List[list] | None:
        """The connection broke: reconnect if that is wanted and possible. Return the messages
        that came with the new ``WELCOME``, or None when the reader thread ends."""
        sock = self.sock
        if sock is not None:
            try:  # wakes a thread blocked sending on it
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._send_lock, self._cond:
            self.sock = None
            if sock is not None:
                sock.close()
            fatal, self._fatal = self._fatal, None
            self._ack_later.clear()
            self._acks.clear()
            self._late.clear()
            self._attaching.clear()
            for waiter in self._status.values():
                waiter[2] = True
                waiter[3] = ConnectionLost(
                    f"the connection to the master at {self.address} broke before it answered "
                    "STATUS; ask again"
                )
            self._cond.notify_all()
            closed = self._closed
        if fatal is not None:
            reason = f"the master reported {fatal[0]}: {fatal[1]}"
        if closed or self.reconnect_timeout <= 0 or (fatal is not None and fatal[0] in _NO_RETRY):
            self._connection_lost(reason)
            return None
        return self._reconnect(reason)

    def _needs_connection(self) -> bool:
        # With self._lock held. After shutdown(), only futures still pending keep it going.
        if not self.closing:
            return bool(self._by_req or self._segments or self._fn_waiters)
        segments = list(self._by_req.values()) + list(self._segments.values())
        return any(not f.done() for seg in segments for f in (seg.futures or ()))

    def _reconnect(self, reason: str) -> List[list] | None:
        last_error = ""
        while True:
            with self._cond:
                if not self._needs_connection():
                    # Nothing pending: reconnect when a submission needs it (a fresh deadline).
                    self._drop_since = None
                    self._cond.wait_for(
                        lambda: self._closed or self.closing or self._needs_connection()
                    )
                if self._closed or not self._needs_connection():
                    self._closed = True  # shut down, and nothing left to wait for
                    break
                now = _monotonic()
                if self._drop_since is None:
                    self._drop_since = now
                    self._backoff = _BACKOFF_FIRST
                remaining = self._drop_since + self.reconnect_timeout - now
                if remaining <= 0:
                    reason += (
                        f"; could not reconnect within {self.reconnect_timeout:g} s "
                        f"(last attempt: {last_error})"
                    )
                    break
                pause = min(random.uniform(self._backoff / 2, self._backoff), remaining)
                self._backoff = min(self._backoff * 2, _BACKOFF_MAX)
                if self._cond.wait_for(lambda: self._closed or not self._needs_connection(), pause):
                    continue  # closed, or nothing left (cancelled): see above
            if not last_error:
                last_error = "none"
                _log.warning("lost the connection to the master at %s (%s)", self.address, reason)
            try:
                sock, welcome, reader, extra = connect(
                    self.address,
                    **self._hello,
                    timeout=max(0.05, min(self.connect_timeout, remaining)),
                )
            except AuthenticationError as exc:
                reason += f"; reconnecting failed: {exc}"
                break
            except (ConnectError, ProtocolError) as exc:
                last_error = str(exc)
                continue
            self._resume(sock, welcome, reader)
            return extra
        self._connection_lost(reason)
        return None

    def _resume(self, sock: socket.socket, welcome: Any, reader: P.FrameReader) -> None:
        """Use a new connection: ATTACH the accepted packages, re-send the other SUBMITs."""
        with self._send_lock:
            with self._cond:
                restarted = welcome.instance != self.instance
                self._use(sock, welcome, reader)
                self._gen += 1
                self.reconnects += 1
                frames = []
                # ATTACH first: were the master to reuse an id for a re-sent SUBMIT, the
                # ATTACH of the old package with that id is answered before.
                for package, seg in self._segments.items():
                    req_id = next(self._ids)
                    self._attaching[package] = (req_id, seg)
                    frames.append(_encode(P.ATTACH, req_id, package))
                    futures = seg.futures or ()
                    cancelled = [
                        i for i, f in enumerate(futures) if f.cancelled() and f._entry is None
                    ]
                    if cancelled:  # in case the CANCEL was lost with the connection
                        frames.append(_encode(P.CANCEL, package, cancelled))
                resend = sorted(self._by_req.values(), key=lambda s: s.req_id)
                frames.extend(seg.frame for seg in resend if seg.frame is not None)
                for req_id, waiter in self._fn_waiters.items():
                    if not waiter[2]:
                        frames.append(_encode(P.FUNCTIONS, req_id, waiter[0]))
                self._cond.notify_all()
            try:
                for frame in frames:
                    sock.sendall(frame)
                self._last_send = _monotonic()
            except OSError:
                pass  # the reader finds the connection broken and starts over
        _log.warning(
            "reconnected to the master at %s (session %d%s): attached %d packages, re-sent %d",
            self.address,
            self.session,
            ", the master restarted" if restarted else "",
            len(self._attaching),
            len(resend),
        )

    # -- closing ----------------------------------------------------------------------------

    def _connection_lost(self, reason: str) -> ConnectionLost:
        with self._cond:
            if self._lost is not None:
                return self._lost
            segments = list(self._by_req.values()) + list(self._segments.values())
            self._by_req.clear()
            self._segments.clear()
            self._attaching.clear()
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
            sock, self.sock = self.sock, None
        self._stop.set()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with self._send_lock:
                sock.close()
        self._fail(pending, lost)
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
        """Close the socket once no package waits for results (after shutdown). While
        disconnected, packages whose futures are all done (cancelled) do not count."""
        with self._cond:
            if self._closed:
                return
            if self._by_req or self._segments:
                if self.sock is not None or self._needs_connection():
                    return
            self._closed = True
            sock = self.sock
            self._cond.notify_all()
        self._stop.set()
        if sock is not None:
            try:
                # Only the reading side: this wakes the reader thread, which first sends the
                # ACKs of the batch it may be handling, then closes the socket.
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.closing = True
        if cancel_futures:
            self.cancel_all()
        with self._cond:
            self._cond.notify_all()  # a reader waiting to reconnect checks what is left
        if wait:
            cf.wait(self.pending_futures())
        self.close_if_idle()
        if wait and threading.current_thread() is not self._thread:
            with self._lock:
                idle = self._closed
            if idle:
                self._thread.join()
