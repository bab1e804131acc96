"""The worker's connection to the master: handshake, reading and writing, heartbeats, signals,
reconnection.

:class:`Session` is the connection half of ``WorkerConnection`` (``_loop.py``): it owns the
socket, the frame reader, the send lock, the heartbeat thread, the self-pipe that wakes the
loop on a signal, and reconnection with backoff. What the messages mean is the loop's:
:meth:`Session._recv_nowait` hands them to ``_on_messages``, which the loop defines.

A background thread sends ``HEARTBEAT`` when nothing was sent (or received) for
``heartbeat_ms``, also while a task runs, so the master's lease never expires for a busy
worker. The master answers them, so a worker that hears nothing for three leases plus a heartbeat
knows the path is cut (a TCP connection over a dead path stays open for many minutes when
nothing is sent) and reconnects.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, Dict, List, NoReturn, Tuple

from .. import _dial, _shm
from .. import _protocol as P
from .._text import plural
from ..errors import AuthenticationError, MasterBusy, ProtocolError, RtpoolError
from . import _kept
from ._common import EXIT_CONFIG, EXIT_LOST, EXIT_OK, RESULT_FRAME_OVERHEAD, Stop, log, perf_ns

_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
RECV_BYTES = 1 << 18
_HEARTBEAT = P.encode(P.HEARTBEAT)
_SO_TIMESTAMPNS = 35  # Linux (asm-generic); not in the socket module
_TIMESPEC = struct.Struct("qq")
_CMSG_BYTES = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64
# Reconnecting to the master: exponential backoff with jitter, each attempt bounded.
_RECONNECT_FIRST_S = 0.1
_RECONNECT_MAX_S = 5.0
_RECONNECT_ATTEMPT_TIMEOUT_S = 5.0


def _enable_kernel_timestamps(sock: socket.socket) -> bool:
    # An assignment that arrives while a task runs waits in the socket until the task ends;
    # the kernel's receive timestamp (SO_TIMESTAMPNS) lets wait_us count that time too.
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def _received_ns(ancillary: Any) -> int:
    """perf_counter_ns() of when the kernel received the data just read (else: now)."""
    now = perf_ns()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            age = time.time_ns() - (sec * 1_000_000_000 + nsec)
            if 0 < age < 60_000_000_000:  # the wall clock may have been stepped
                return now - age
    return now


class Session:
    """The connection half of a worker child (see the module docstring).

    It does not connect by itself: the owner calls ``self._start_session(*self._connect(t))``
    once its own state is in place. Subclasses define ``_on_messages(msgs, received_ns)``.
    """

    def __init__(
        self,
        address: str,
        token: str,
        name: str,
        connect_timeout: float,
        tls: Any,
        ca_file: str | None,
        reconnect_timeout: float | None,
    ) -> None:
        #: The master addresses (a leader and standbys), and where to dial next.
        self.masters = _dial.Masters(address, say=lambda line: log(line, logging.WARNING))
        #: The address of the master this worker is (or was last) connected to.
        self.address = self.masters.current
        self.name = name
        #: The stable identity sent in ``HELLO`` (the owner sets it; see
        #: ``_dial.worker_identity``), under which the master keeps this worker's pace.
        self.identity: str | None = None
        #: The resources and labels sent in ``HELLO`` (the owner sets them; empty: none).
        self.resources: Dict[str, int] = {}
        self.labels: Dict[str, str] = {}
        self._token = token
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self._tls_context = _dial.tls_context(tls, ca_file)  # also for reconnections
        self.stopping = False
        self._signals = 0
        self._send_lock = threading.Lock()
        self._hb_stop = threading.Event()
        #: The master's ``WELCOME.instance`` (None: not connected yet).
        self.instance: int | None = None
        #: Sessions opened so far (1 + successful reconnections).
        self.sessions = 0
        #: Real-time mode of this process (``run_child`` sets it), or None.
        self.realtime: Any = None
        #: This child's record on the parent's slot board (``_board.py``), or None.
        self.board: Any = None
        self._wake_r, self._wake_w = os.pipe()
        self._recv_buf = bytearray(RECV_BYTES)
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def _connect(
        self, timeout: float
    ) -> Tuple[socket.socket, _dial.Welcome, P.FrameReader, List[list]]:
        """Open a connection and complete the handshake (one slot).

        Raises:
            ConnectError, AuthenticationError, ProtocolError: As ``_dial.connect()``.
        """
        parts = _dial.connect(
            self.masters,
            role="worker",
            token=self._token,
            name=self.name,
            slots=1,
            timeout=timeout,
            tls=self._tls_context or False,
            identity=self.identity,
            resources=self.resources,
            labels=self.labels,
            features=_dial.FEATURE_IDLE_HEARTBEAT,
        )
        self.address = self.masters.current
        return parts

    def _start_session(
        self,
        sock: socket.socket,
        welcome: _dial.Welcome,
        reader: P.FrameReader,
        early: List[list],
    ) -> bool:
        """Use a new connection; return whether its master is another instance (restarted)."""
        with self._send_lock:
            self.sock = sock
            self._last_send = time.monotonic()
        with contextlib.suppress(OSError):  # kept results name the address peers reach
            local = sock.getsockname()
            _kept.advertise(local[0] if isinstance(local, tuple) else "", welcome.session)
        self._last_recv = time.monotonic()
        #: The master answered a heartbeat on this session (an older master never does: then
        #: its silence means nothing).
        self.master_answers = False
        self.reader = reader
        self._early = early
        self.session = welcome.session
        heartbeat_ms = max(welcome.heartbeat_ms, 1)
        if welcome.lease_ms:
            # At least three heartbeats per lease, whatever heartbeat_ms says.
            heartbeat_ms = min(heartbeat_ms, max(welcome.lease_ms // 3, 1))
        self.heartbeat_s = heartbeat_ms / 1000
        # While it holds no task, a worker heartbeats at the master's idle rate, if it offered
        # one (issue 25: the lease protects tasks; an idle worker is judged by the idle heartbeat
        # plus a lease); from the moment it holds one, every heartbeat_s again.
        idle_ms = getattr(welcome, "idle_heartbeat_ms", 0)
        self.idle_heartbeat_s = max(idle_ms / 1000, self.heartbeat_s)
        # A TLS socket (LockedTlsSocket) has no recvmsg and takes no recv flags; it may hold
        # decrypted bytes that select() does not see.
        self._tls = getattr(sock, "is_tls", False)
        self._kernel_ts = not self._tls and _enable_kernel_timestamps(sock)
        # A RESULT frame must fit the master's frame limit: results are batched up to this
        # many bytes, and a single larger result is replaced by an error.
        self.frame_budget = welcome.max_frame_bytes - RESULT_FRAME_OVERHEAD
        # Silence from the master past this means the path is cut (it answers heartbeats). A
        # dead path is usually noticed sooner, by the kernel (TCP_USER_TIMEOUT: our heartbeats
        # go unacknowledged for the lease); this catches a path that still acknowledges but
        # delivers nothing (a stalled relay or proxy), and is long enough not to leave a master
        # that is only frozen for a few seconds (3 leases + a heartbeat: 10 s by default).
        self.silence_s = 3 * (welcome.lease_ms or 3 * heartbeat_ms) / 1000 + self.heartbeat_s
        restarted = self.instance is not None and welcome.instance != self.instance
        self.instance = welcome.instance
        if self.board is not None:
            self.board.session(welcome.lease_ms, welcome.instance)
        self.sessions += 1
        return restarted

    def _end_session(self) -> None:
        """Close the connection."""
        with self._send_lock:
            self._close_socket()
        self._early = []

    def _close_socket(self) -> None:
        """Shut the connection down (a child behind its host's connection keeps it)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    # -- signals ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM: graceful shutdown, a second one exits at once. SIGINT is the parent's."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            self._on_second_signal()
            os._exit(1)
        self.stopping = True

    def _on_second_signal(self) -> None:
        """Last words before a second signal exits at once (the owner may kill what it runs)."""

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    # -- I/O --------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            with self._send_lock:
                P.sendall(self.sock, data)
                self._last_send = time.monotonic()
        except OSError as exc:
            raise Stop(EXIT_LOST, f"sending to the master failed: {exc.strerror or exc}") from None

    def _heartbeat_loop(self) -> None:
        # Runs for the life of serve(), across reconnections; it also keeps the lease while a
        # task runs (in the executor process, or here between the task's bytecodes).
        board = self.board
        watch = getattr(self, "_watch", None)  # the owner's watchdog of an in-process task
        while not self._hb_stop.wait(self.heartbeat_s / 2):
            if board is not None:
                board.beat()  # the parent watches for a task that holds the GIL
            if watch is not None:
                watch()
            _shm.tidy()  # idle result segments, mappings of removed argument segments
            period = self.heartbeat_s if self._holds_tasks() else self.idle_heartbeat_s
            if time.monotonic() - self._last_send >= period * 0.9:
                try:
                    with self._send_lock:
                        self.sock.sendall(_HEARTBEAT)
                        self._last_send = time.monotonic()
                except OSError:
                    pass  # the main loop finds the broken connection and reconnects
            elif time.monotonic() - self._last_recv >= period * 0.9:
                # Sending, but hearing nothing: ask for the master's answer (see _wait).
                self._send_quietly(_HEARTBEAT)

    def _holds_tasks(self) -> bool:
        """Whether this worker holds a task (queued, running or its result unsent): then its
        lease runs and it heartbeats every ``heartbeat_s``; else every ``idle_heartbeat_s``."""
        return True

    def _send_quietly(self, data: bytes) -> None:
        """Send ``data``; a broken connection is left for the main loop to find."""
        try:
            with self._send_lock:
                self.sock.sendall(data)
                self._last_send = time.monotonic()
        except OSError:
            pass

    def _recv_nowait(self) -> None:
        """Take whatever the socket holds without blocking."""
        if self.reader.big is not None and not self._tls:
            # Inside a large frame: straight into its buffer, no copy.
            self._recv_into(self.reader.want())
            return
        try:
            # Through one buffer kept for the session's life (see _frame.recv_some).
            if self._tls:
                if not self.sock.pending() and not select.select([self.sock], [], [], 0)[0]:
                    return
                data, ancillary = P.recv_some(self.sock, self._recv_buf), ()
            elif self._kernel_ts:
                n, ancillary, _, _ = self.sock.recvmsg_into(
                    [self._recv_buf], _CMSG_BYTES, _MSG_DONTWAIT
                )
                data = memoryview(self._recv_buf)[:n]
            else:
                data, ancillary = P.recv_some(self.sock, self._recv_buf, _MSG_DONTWAIT), ()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._on_recv_error(exc)
        if not data:
            raise Stop(EXIT_LOST, "the master closed the connection")
        self._last_recv = time.monotonic()
        try:
            msgs = self.reader.feed(data)
        except ProtocolError as exc:
            raise Stop(EXIT_LOST, f"bad frame from the master: {exc}") from None
        self._on_messages(msgs, _received_ns(ancillary))

    def _recv_into(self, view: memoryview) -> None:
        try:
            with view:
                n = self.sock.recv_into(view, 0, _MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._on_recv_error(exc)
        if not n:
            raise Stop(EXIT_LOST, "the master closed the connection")
        self._last_recv = time.monotonic()
        try:
            msgs = self.reader.got(n)
        except ProtocolError as exc:
            raise Stop(EXIT_LOST, f"bad frame from the master: {exc}") from None
        self._on_messages(msgs, _received_ns(()))

    def _on_recv_error(self, exc: OSError) -> NoReturn:
        if exc.errno == errno.ETIMEDOUT:  # keepalive or TCP_USER_TIMEOUT: a silent path
            self.masters.on_silent()
        raise Stop(EXIT_LOST, f"connection error: {exc.strerror or exc}") from None

    def _on_messages(self, msgs: List[list], received_ns: int) -> None:
        raise NotImplementedError

    def _wait(self) -> None:
        """Block until the master sends something or a signal arrives."""
        if self.realtime is not None:
            self.realtime.before_wait()  # back to SCHED_FIFO if the budget demoted us
        if self._tls and self.sock.pending():
            self._recv_nowait()
            return
        # Bounded by the silence allowed: data that arrived meanwhile is seen at once.
        left = max(0.0, self._last_recv + self.silence_s - time.monotonic())
        readable, _, _ = select.select(
            [self.sock, self._wake_r], [], [], left if self.master_answers else None
        )
        if self._wake_r in readable:
            self._drain_wakeups()
        if self.sock in readable:
            self._recv_nowait()
        elif not readable and self.master_answers:
            self.masters.on_silent()  # the path may be cut: the next pass starts elsewhere
            raise Stop(
                EXIT_LOST,
                f"no word from the master for {self.silence_s:g} s (it answers heartbeats); "
                "the path to it may be cut",
            )

    # -- reconnection -----------------------------------------------------------------------

    def connect_first(self) -> int | None:
        """The first connection: None once the session is up, else the exit code.

        A master that is not there yet (or still busy after the dial's own retries) is waited
        for like a lost one (``_reconnect``, within ``reconnect_timeout``; 0 = forever), so
        workers may start before their master. A bad token or address, or reconnection turned
        off (``reconnect_timeout`` None), ends it at once with ``EXIT_CONFIG``. Call it after
        :meth:`install_signal_handlers`: SIGTERM stops the wait.
        """
        try:
            parts = self._connect(self.connect_timeout)
        except (_dial.MasterUnreachable, MasterBusy) as exc:  # not TLS or a token: it may start
            if self.reconnect_timeout is None:
                log(str(exc), logging.ERROR)
                return EXIT_CONFIG
            limit = self.reconnect_timeout
            within = f"for up to {limit:g} s" if limit else "until it is up"
            log(f"{exc}; waiting for the master {within} (--reconnect-timeout)", logging.WARNING)
            return self._reconnect(first=True)
        except (RtpoolError, ValueError) as exc:
            log(str(exc), logging.ERROR)
            return EXIT_CONFIG
        self._start_session(*parts)
        log(f"connected to the master at {self.address} as {self.name} (session {self.session})")
        return None

    def _reconnect(self, first: bool = False) -> int | None:
        """Connect again, with exponential backoff and jitter: None once a new session is up,
        else the exit code (``reconnect_timeout`` passed, bad token, or a signal). ``first``:
        the master was never reached yet (the lines say "connect", not "reconnect")."""
        lost = time.monotonic()
        limit = self.reconnect_timeout
        attempt = 0
        backoff = _RECONNECT_FIRST_S
        while True:  # bounded by reconnect_timeout when set (0 = forever, by request)
            attempt += 1
            # Jittered, so workers of a restarted master spread out; short while a standby
            # answered the last pass (an election), doubling while no master answers.
            delay = self.masters.retry_pause(backoff)
            if not self.masters.standby_answered:
                backoff = min(backoff * 2, _RECONNECT_MAX_S)
            if limit:
                left = lost + limit - time.monotonic()
                if left <= 0:
                    again = "" if first else "re"
                    log(
                        f"could not {again}connect to the master at {self.masters.spec} within "
                        f"{limit:g} s (--reconnect-timeout); exiting",
                        logging.ERROR,
                    )
                    return EXIT_LOST
                delay = min(delay, left)
            if self._sleep(delay):
                return EXIT_OK
            timeout = min(self.connect_timeout, _RECONNECT_ATTEMPT_TIMEOUT_S)
            try:
                parts = self._connect(timeout)
            except AuthenticationError as exc:
                log(f"{exc}; exiting", logging.ERROR)
                return EXIT_CONFIG
            except (RtpoolError, OSError, ValueError) as exc:
                if attempt & (attempt - 1) == 0:  # attempts 1, 2, 4, 8...: a falling rate
                    log(
                        f"{'' if first else 're'}connection attempt {attempt} failed: {exc}",
                        logging.WARNING,
                    )
                continue
            self._start_session(*parts)
            again = "" if first else "re"
            log(
                f"{again}connected to the master at {self.address} as {self.name} (session "
                f"{self.session}) after {plural(attempt, 'attempt')}"
            )
            return None

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until a signal; return whether the worker is stopping."""
        if not self.stopping and seconds > 0:
            readable, _, _ = select.select([self._wake_r], [], [], seconds)
            if readable:
                self._drain_wakeups()
        return self.stopping
