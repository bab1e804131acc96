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

The class is split by concern: this module has the state, sending, the generic hooks and
closing; ``acks.py`` acknowledging results; ``packages.py`` submitting, cancelling and waiting
on packages; ``receive.py`` the reader thread; ``reconnect.py`` reconnecting. The connection
knows nothing of calls of named functions (``rtpool.rpc``): they are packages whose segments
have a ``decode`` hook, and the grid-RPC state plugs in through
:meth:`_Connection.on_message`, :meth:`~_Connection.on_error`,
:meth:`~_Connection.on_reconnect` and :meth:`~_Connection.on_pending`.
"""

from __future__ import annotations

import concurrent.futures as cf
import fcntl
import itertools
import logging
import os
import socket
import sys
import termios
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

from .. import _protocol as P
from .. import _shm
from .._dial import Address, TlsOption
from .._future import Future
from .._masters import Masters
from ..errors import ConnectionLost
from .acks import _Acks
from .packages import _Packages
from .receive import _Receiver, notice_limiter
from .reconnect import _BACKOFF_FIRST, _Reconnector
from .release import _Releases
from .segment import ALL, _Segment

_sendall = P.sendall


def _shm_owner(hosts: List[str]) -> str | None:
    """The owner tag for shared-memory payloads: with ``RTPOOL_SHM=1``, or by default (auto)
    when every master is on a loopback address; None (TCP only) otherwise or with
    ``RTPOOL_SHM=0``."""
    if not _shm.available():
        return None
    forced = os.environ.get("RTPOOL_SHM", "auto").strip().lower() in ("1", "on", "yes", "true")
    local = all(host in ("localhost", "::1") or host.startswith("127.") for host in hosts)
    if forced or local:
        _shm.sweep()  # segments of clients that died on this host
        return _shm.owner()
    return None


__all__ = ["ALL", "_Connection", "_Segment"]

_log = logging.getLogger("rtpool.client")
# Bytes in the send queue (not yet acknowledged) that still let the silence check judge: a
# few heartbeats' worth.
_QUEUED_SLACK = 4096
#: After shutdown() with every future done, how long the connection waits for the master's
#: ACCEPTED of submissions it has not acknowledged yet (so that their CANCEL can be sent)
#: before it closes anyway. A master that answers does so in milliseconds; a silent one
#: must not keep a closed client connected (and its shared memory attached) for good.
CLOSE_GRACE_S = 2.0


def _queued_bytes(sock: socket.socket | None) -> int:
    """Bytes written to ``sock`` that its peer has not acknowledged yet (Linux ``SIOCOUTQ``;
    0 where unknown)."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return int.from_bytes(buf, sys.byteorder, signed=True)


_monotonic = time.monotonic
_encode = P.encode
_HEARTBEAT = P.encode(P.HEARTBEAT)


class _Connection(_Acks, _Packages, _Receiver, _Reconnector, _Releases):
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
        thread_start: Callable[[str], Callable[[], None]] | None = None,
    ):
        #: The master addresses (several: a leader and standbys), and where to dial next.
        self.masters = Masters(address)
        #: The address of the master this connection is (or was last) on.
        self.address = self.masters.current
        #: This client's shared-memory owner tag when its master (and so, by default, its
        #: workers) is on this host, else None: large payloads then go through /dev/shm.
        self.shm_owner = _shm_owner(self.masters.hosts())
        self._shm_attached = bool(self.shm_owner)
        if self._shm_attached:
            _shm.attach()  # the process's segments go when its last client closes
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
        sock, welcome, reader, extra = self._connect_first()
        self.address = self.masters.current
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
        # Hooks of the layers above (rtpool.rpc), see on_message() and the like.
        self._handlers: Dict[int, Callable[[list], None]] = {}
        self._error_handlers: Dict[str, Callable[[str, int], None]] = {}
        self._reconnect_hooks: List[Callable[[], List[bytes]]] = []
        self._pending_hooks: List[Callable[[], bool]] = []
        self._acks: Dict[int, _Segment] = {}  # reader only: packages of the current batch
        self._ack_later: Dict[int, _Segment] = {}  # ACKs the reader could not send at once
        self._init_releases()
        self._fatal: Tuple[str, str] | None = None
        # Threads in wait_accepted()/status(): ACCEPTED notifies only when there are any.
        self._waiting = 0
        self._lost: ConnectionLost | None = None
        self.closing = False
        self._close_by: float | None = None  # shutdown(): when close_if_idle() stops waiting
        self._closed = False
        self._stop = threading.Event()
        self._gen = 0  # bumped at each (re)connection, see _send()
        self._last_send = _monotonic()
        self._last_probe = 0.0  # last HEARTBEAT the heartbeat thread sent
        self._drop_since: float | None = None
        self._backoff = _BACKOFF_FIRST
        self.reconnects = 0
        self.duplicate_results = 0  # results of a task after its first one (tests read it)
        self.overload_notices = 0  # ACCEPTED with the master's overload notice
        self.last_notice: str | None = None
        self._notice_log = notice_limiter()
        self.sock: socket.socket | None = None
        self._thread_start = thread_start
        self._use(sock, welcome, reader)
        self._thread = threading.Thread(
            target=self._in_thread,
            args=("reader", self._run, extra),
            name=f"rtpool-client-{self.address}",
            daemon=True,
        )
        self._thread.start()
        self._heartbeat_thread = threading.Thread(
            target=self._in_thread,
            args=("heartbeat", self._heartbeat_loop),
            name=f"rtpool-heartbeat-{self.address}",
            daemon=True,
        )
        self._heartbeat_thread.start()

    def _in_thread(self, role: str, body: Callable[..., None], *args: Any) -> None:
        """Run ``body(*args)`` as the connection's ``role`` thread (``reader``,
        ``heartbeat``), between the thread-priority hooks: ``thread_start(role)`` first (real-
        time mode puts the thread under SCHED_FIFO there), what it returned last."""
        leave = self._thread_start(role) if self._thread_start is not None else None
        try:
            body(*args)
        finally:
            if leave is not None:
                leave()

    def _use(self, sock: socket.socket, welcome: Any, reader: P.FrameReader) -> None:
        self.sock = sock
        self._reader = reader
        self.session = welcome.session
        self.max_frame_bytes = welcome.max_frame_bytes
        self.heartbeat_ms = welcome.heartbeat_ms
        self.instance = welcome.instance
        self._last_recv = _monotonic()
        # Liveness (issue 13): the master answers heartbeats, so once it has answered one on
        # this session, hearing nothing for 3 leases + a heartbeat means the path is cut (a
        # stalled relay or proxy acknowledges our bytes: keepalive and TCP_USER_TIMEOUT see
        # nothing wrong). An older master never answers: then its silence means nothing.
        self._master_answers = False
        self._silent: str | None = None  # why the heartbeat thread dropped this session
        lease_ms = getattr(welcome, "lease_ms", 0) or 3 * max(self.heartbeat_ms, 1)
        # Counted from the first heartbeat not answered (not from the last frame received: a
        # large SUBMIT that holds the send lock for a minute delays our heartbeats, not the
        # master's answers), so the silence seen is at most a heartbeat more than this.
        self._patience_s = 3 * lease_ms / 1000
        self.silence_s = self._patience_s + max(self.heartbeat_ms, 1) / 1000
        self._asked: float | None = None  # first HEARTBEAT sent since the last frame received

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
                if self._ack_later:
                    # Deferred ACKs ride in front of the frame, in the same write: the master
                    # reads both in one wake-up (the sequential path: the last result's ACK
                    # and the next SUBMIT). A segmented frame (a Frame: a payload in shared
                    # memory or a TCP segment) takes them as its first part: one sendmsg, not
                    # a write of the ACKs before it (a second master wake-up per round trip).
                    acks = self._take_acks()
                    if acks:
                        frame = acks + frame
                _sendall(sock, frame)
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

    def _heartbeat_loop(self) -> None:
        try:
            self._heartbeats()
        finally:
            self._detach_shm()

    def _detach_shm(self) -> None:
        """Once, when the connection ends: the process's last client removes its segments."""
        with self._lock:
            attached, self._shm_attached = self._shm_attached, False
        if attached:
            _shm.detach()

    def _heartbeats(self) -> None:
        # Sends HEARTBEAT when nothing else was sent for heartbeat_ms (the master closes
        # silent clients), and ACKs the reader had to defer. Never on a submission's path.
        while True:
            period = self.heartbeat_ms / 1000
            tick = min(max(period / 2, 0.005), 1.0) if period > 0 else 1.0
            if self._stop.wait(tick):
                return
            if self.closing and self._close_overdue():
                self.close_if_idle(force=True)  # shutdown(wait=False) and a silent master
                continue
            _shm.tidy()  # idle segments, mappings of removed ones (at most once a second)
            if self.acks_overdue(tick):
                with self._send_lock:
                    try:
                        if self.sock is not None:
                            self._flush_acks(self.sock)
                    except OSError:
                        pass
            if self._releases:
                self._flush_releases(block=True)
            now = _monotonic()
            if period > 0 and (
                now - self._last_send >= period
                or (now - self._last_recv >= period and now - self._last_probe >= period)
            ):
                # Also when sending but hearing nothing: ask for the master's answer.
                self._last_probe = now
                self._send(_HEARTBEAT, quiet=True)
                asked = self._asked
                if asked is None or asked < self._last_recv:
                    self._asked = _monotonic()  # after the send: it may have waited
            asked = self._asked
            if (
                self._master_answers
                and asked is not None
                and asked > self._last_recv
                and _monotonic() - asked > self._patience_s
            ):
                if _queued_bytes(self.sock) > _QUEUED_SLACK:
                    # Our heartbeat may still wait behind megabytes the master is receiving
                    # (a large SUBMIT on a slow link): not silence yet. On a dead path that
                    # data goes unacknowledged and TCP_USER_TIMEOUT ends the connection.
                    self._asked = _monotonic()
                else:
                    self._drop_silent()

    def _drop_silent(self) -> None:
        """Shut the socket of a master silent past ``silence_s``: the reader thread sees the
        connection end and reconnects (when tasks are pending) as soon as the path is back."""
        with self._send_lock:
            sock = self.sock
            if sock is None or self._silent is not None:
                return
            self._silent = (
                f"no word from the master for {self.silence_s:g} s (it answers heartbeats); "
                "the path to it may be cut"
            )
        _log.warning("%s (master at %s); dropping the connection", self._silent, self.address)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- hooks and requests for the layers above (rtpool.rpc) -------------------------------

    def on_message(self, kind: int, handler: Callable[[list], None]) -> None:
        """Route messages of ``kind`` (which the connection does not handle itself) to
        ``handler(msg)``, on the reader thread."""
        self._handlers[kind] = handler

    def on_error(self, code: str, handler: Callable[[str, int], None]) -> None:
        """Route ``ERROR code`` to ``handler(message, ref)`` on the reader thread, instead of
        treating it as fatal."""
        self._error_handlers[code] = handler

    def on_reconnect(self, hook: Callable[[], List[bytes]]) -> None:
        """After each reconnection, send the frames ``hook()`` returns (after the ``ATTACH``es
        and the re-sent ``SUBMIT``s); it runs with the connection's lock held."""
        self._reconnect_hooks.append(hook)

    def on_pending(self, hook: Callable[[], bool]) -> None:
        """``hook()`` (called with the lock held) says whether requests of the layer above
        wait for an answer: the connection then reconnects for them."""
        self._pending_hooks.append(hook)

    def send(self, frame: bytes, gen: int | None = None) -> None:
        """Write one frame (dropped while disconnected); ``gen`` as :meth:`open_request`
        returned it: not if a reconnection happened since (it re-sent the request)."""
        self._send(frame, gen=gen)

    def notify(self, update: Callable[[], None]) -> None:
        """Run ``update()`` with the lock held and wake the threads in :meth:`wait`."""
        with self._cond:
            update()
            self._cond.notify_all()

    def open_request(self, register: Callable[[int], None], what: str) -> Tuple[int, int]:
        """A new request id; ``register(req_id)`` runs with the lock held (so a reconnection
        sees the request through :meth:`on_pending`/:meth:`on_reconnect`).

        Returns:
            ``(req_id, gen)``: pass ``gen`` to :meth:`send`.

        Raises:
            ConnectionLost: The connection is gone for good.
            RuntimeError: The client was shut down (``what`` says what cannot be done).
        """
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self.closing:
                raise RuntimeError(f"cannot {what} after shutdown")
            req_id = next(self._ids)
            register(req_id)
            if self.sock is None:
                self._cond.notify_all()  # a reader waiting for work reconnects
            return req_id, self._gen

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` (checked with the lock held) or the connection is lost for
        good; return ``done()``."""
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: done() or self._lost is not None, timeout)
            finally:
                self._waiting -= 1
            return done()

    def raise_if_lost(self) -> None:
        """Raise the :class:`ConnectionLost` of a connection gone for good."""
        if self._lost is not None:
            raise self._lost

    def new_segment(self, n: int, t0_ns: int, opts: dict) -> _Segment:
        """A new segment of ``n`` tasks with package options ``opts`` (wire form); the caller
        sets its ``futures`` (and ``decode``, ``retry``), then sends it (:meth:`send_segment`)."""
        seg = _Segment(self, next(self._ids), n, t0_ns, 0.0)
        seg.opts = opts
        return seg

    def send_segment(self, seg: _Segment, frame: bytes) -> None:
        """Send the request of a new segment; a reconnection re-sends ``frame`` until the
        master answers it.

        Raises:
            RuntimeError: The client was shut down.
            ConnectionLost: The connection is gone for good.
        """
        seg.frame = frame
        self._send(frame, gen=self._register([seg]))

    def take_refused(self, ref: int) -> _Segment | None:
        """The segment of request ``ref``, which the master refused with an ERROR its owner
        handles; a reconnection no longer re-sends it. The owner then sends it again with
        :meth:`resend` or fails it with :meth:`fail_unsent`."""
        with self._cond:
            self._drop_since = None  # this connection works
            seg = self._by_req.get(ref)
            if seg is not None:
                seg.frame = None
            self._cond.notify_all()
        return seg

    def resend(self, seg: _Segment, build: Callable[[int], bytes]) -> None:
        """Send a refused segment again under a new request id: ``build(req_id)`` is its
        frame. Nothing if its futures failed meanwhile (the connection was lost for good)."""
        with self._lock:
            if self._by_req.pop(seg.req_id, None) is None:
                return
            seg.req_id = next(self._ids)
            seg.frame = frame = build(seg.req_id)
            self._by_req[seg.req_id] = seg
            gen = self._gen
        self._send(frame, gen=gen)

    def fail_unsent(self, seg: _Segment, exc: BaseException) -> None:
        """Fail every future of a segment the master has not accepted (its owner could not
        build its request, or the master refused it)."""
        with self._cond:
            self._by_req.pop(seg.req_id, None)
            seg.frame = None
            futures, seg.futures = seg.futures, None
            seg.error = exc
            self._cond.notify_all()
        if futures:
            self._fail(futures, exc)

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

    def close_if_idle(self, force: bool = False) -> None:
        """Close the socket once no package waits for results (after shutdown). While
        disconnected, packages whose futures are all done (cancelled) do not count.

        With ``force`` (the close grace has passed), packages whose futures are all done do
        not count either: they are submissions the master has not acknowledged, so their
        ``CANCEL`` could not be sent. They run detached until the master's result TTL."""
        with self._cond:
            if self._closed:
                return
            unanswered = 0
            if self._by_req or self._segments:
                if force and not self._pending_locked():
                    unanswered = len(self._by_req)
                elif self.sock is not None or self._needs_connection():
                    return
            self._closed = True
            sock = self.sock
            self._cond.notify_all()
        if unanswered:
            _log.warning(
                "closing the connection to %s with %d submission(s) the master has not "
                "acknowledged within %g s: they could not be cancelled and run detached until "
                "the master's result TTL",
                self.address,
                unanswered,
                CLOSE_GRACE_S,
            )
        self._stop.set()
        if sock is not None and self._ack_later:
            with self._send_lock:  # the deferred ACKs: the master frees those results now
                try:
                    self._flush_acks(sock)
                except OSError:
                    pass
        if sock is not None:
            try:
                # Only the reading side: this wakes the reader thread, which first sends the
                # ACKs of the batch it may be handling, then closes the socket.
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def _pending_locked(self) -> bool:
        """With self._lock held: whether any future of a registered package has no outcome."""
        segments = list(self._by_req.values()) + list(self._segments.values())
        return any(not f.done() for seg in segments for f in (seg.futures or ()))

    def _close_overdue(self) -> bool:
        by = self._close_by
        return by is not None and not self._closed and _monotonic() >= by

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.closing = True
        if cancel_futures:
            self.cancel_all()
        with self._cond:
            self._cond.notify_all()  # a reader waiting to reconnect checks what is left
        if wait:
            cf.wait(self.pending_futures())
        if self._close_by is None:
            # From here, submissions still unacknowledged get CLOSE_GRACE_S for their ACCEPTED
            # (and CANCEL); then the connection closes anyway (the heartbeat thread sees to it
            # when nobody waits here).
            self._close_by = _monotonic() + CLOSE_GRACE_S
        self.close_if_idle()
        if wait and threading.current_thread() is not self._thread:
            with self._cond:
                by = self._close_by
                self._cond.wait_for(
                    lambda: self._closed or self._pending_locked(),
                    timeout=max(0.0, by - _monotonic()),
                )
            self.close_if_idle(force=True)
            with self._lock:
                idle = self._closed
            if idle:
                self._thread.join()
                self._detach_shm()  # now, not when the heartbeat thread notices
