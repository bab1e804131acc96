"""The master connection of a worker host (``--connection host``): the half of the relay
(``_relay.py``) that faces the master.

:class:`Upstream` dials the master with ``slots`` = the host's processes, retries with backoff
within ``--reconnect-timeout``, heartbeats it and notices its silence, and batches what goes
up: the children's results, credits and returns are written together, at most once per
:data:`FLUSH_INTERVAL_NS` while the children still hold tasks, at once when they hold none.
What the messages mean for the children is the relay's: it defines :meth:`_from_master`,
:meth:`_on_session`, :meth:`_on_master_lost` and :meth:`_holding`.
"""

from __future__ import annotations

import errno
import logging
import random
import selectors
import socket
import time
from typing import Any, Dict, List

from .. import _dial
from .. import _protocol as P
from .._frame import Frame
from ..errors import AuthenticationError, ConnectError, MasterBusy, ProtocolError, RtpoolError
from ._common import (
    EXIT_CONFIG,
    EXIT_LOST,
    RESULT_FRAME_OVERHEAD,
    RESULT_OVERHEAD,
    log,
    perf_ns,
)
from ._session import RECV_BYTES

#: At most one write of results and credits to the master per this long while the children
#: run other tasks: under load the master gets a few frames per host per millisecond, not
#: three per task. The same bound a child puts on holding its own results for company
#: (``_results.FLUSH_AFTER_NS``).
FLUSH_INTERVAL_NS = 1_000_000
#: ... or when this many results wait.
FLUSH_RESULTS = 256
_HEARTBEAT = P.encode(P.HEARTBEAT)
_RECONNECT_FIRST_S = 0.1
_RECONNECT_MAX_S = 5.0
_ATTEMPT_TIMEOUT_S = 5.0
_CONFIG_ERRORS = frozenset({P.ERR_AUTH, P.ERR_VERSION})
_MAX_ORPHANS = 65536


def flat(data: Any) -> bytes:
    """An encoded frame as one ``bytes`` (a socket pair is written without ``sendmsg``)."""
    if type(data) is Frame:
        return b"".join(bytes(p) for p in data.parts)
    return data


class Lost(Exception):
    """The master connection is unusable (the message says why)."""


class Upstream:
    """The host's master connection (see the module docstring).

    Args:
        args: The parsed ``rtpool worker`` options (address, TLS, reconnection, procs).
        token: The worker token.
        name: The host's name in the master's ``HELLO``.
        serve: The ``SERVE`` frame of ``--serve`` (b"": none), sent in every session.
    """

    def __init__(self, args: Any, token: str, name: str, serve: bytes) -> None:
        #: The master addresses (a leader and standbys), and where to dial next.
        self.masters = _dial.Masters(args.master, say=lambda line: log(line, logging.WARNING))
        #: The address of the master this host is (or was last) connected to.
        self.address = self.masters.current
        self.token = token
        self.name = name
        self.slots = args.procs
        self.reconnect_timeout = args.reconnect_timeout
        self.tls = _dial.tls_context(args.tls, args.ca_file)
        self.serve = serve
        # The host's resources and labels, in HELLO (docs/resources.md).
        inv = getattr(args, "inventory", None)
        self.resources: Dict[str, int] = dict(inv.resources) if inv is not None else {}
        self.labels: Dict[str, str] = dict(inv.labels) if inv is not None else {}
        #: The relay's selector; the master connection is registered with data None.
        self.selector = selectors.DefaultSelector()
        self.sock: Any = None  # the master connection (None: not connected)
        self.reader: Any = None
        #: Every receive of this process's loop goes through it (see _frame.recv_some).
        self.recv_buf = bytearray(RECV_BYTES)
        self.welcome_frame = b""
        self.instance: int | None = None
        self.results: List[list] = []  # for the next RESULT frame
        self.results_bytes = 0  # their estimated size
        self.frame_budget = P.DEFAULT_MAX_FRAME - RESULT_FRAME_OVERHEAD
        self.frames: List[Any] = []  # for the master, before the results and the PULL
        self.pull = 0  # credits for the next PULL
        self.written_ns = 0  # perf_counter_ns() of the last write to the master
        #: Writes to the master so far (one per batch; the closing line counts them).
        self.writes = 0
        #: Results of a lost session, sent to the same master instance when it is back (it
        #: counts them stale, as it does a child's own ``unsent``).
        self.orphans: List[list] = []
        self.draining = False
        #: Set when the relay gives up (a refused token, no master within the timeout).
        self.exit_code: int | None = None
        self.ever_connected = False
        self.lost_at = time.monotonic()
        self.attempt = 0
        self.next_attempt = 0.0
        self.backoff = _RECONNECT_FIRST_S  # doubles while no master answers a pass

    # -- the relay's part -------------------------------------------------------------------

    def _from_master(self, msgs: List[list]) -> None:
        raise NotImplementedError

    def _on_session(self) -> None:
        """A master session started: welcome the children waiting for one."""

    def _on_master_lost(self, why: str) -> None:
        """The master session ended: tell the children, forget what they held."""

    def _holding(self) -> bool:
        """Whether the children hold tasks (more results will come to batch with)."""
        return False

    # -- the master connection --------------------------------------------------------------

    def add_results(self, entries: List[list]) -> None:
        """Queue result entries for the master: in the next ``RESULT`` frame, or a new one
        when they would take it past the master's frame limit (each child keeps its own
        frames within it; several together may not be)."""
        size = 0
        for r in entries:
            size += len(r[3]) + RESULT_OVERHEAD
        if self.results and self.results_bytes + size > self.frame_budget:
            self._seal_results()
        self.results.extend(entries)
        self.results_bytes += size

    def _seal_results(self) -> None:
        """The pending results as a frame of their own, ahead of what follows."""
        if self.results:
            self.frames.append(P.encode(P.RESULT, self.results))
            self.results = []
            self.results_bytes = 0

    def _on_error(self, code: str, message: str) -> None:
        if code == P.ERR_SERVE_CONFLICT:
            log(f"the master refused to serve a function: {message}", logging.WARNING)
        elif code in P.NON_FATAL_ERRORS:
            log(f"master reported {code}: {message}", logging.WARNING)
        elif code in _CONFIG_ERRORS:
            self._give_up(EXIT_CONFIG, f"the master reported {code}: {message}; exiting")
        else:
            if code == P.ERR_NOT_LEADER:  # deposed: dial the leader it names first
                self.masters.follow(message)
            raise Lost(f"the master reported {code}: {message}")

    def _connect(self) -> None:
        """One attempt at the master connection (when due), with backoff between attempts."""
        now = time.monotonic()
        if self.sock is not None or self.exit_code is not None or now < self.next_attempt:
            return
        limit = self.reconnect_timeout
        again = "re" if self.ever_connected else ""
        if self.attempt and limit and now - self.lost_at > limit:
            self._give_up(
                EXIT_LOST,
                f"could not {again}connect to the master at {self.masters.spec} within {limit:g} s "
                "(--reconnect-timeout); exiting",
            )
            return
        self.attempt += 1
        try:
            sock, welcome, reader, early = _dial.connect(
                self.masters,
                role="worker",
                token=self.token,
                name=self.name,
                slots=self.slots,
                timeout=_ATTEMPT_TIMEOUT_S,
                tls=self.tls or False,
                busy_timeout=0,
                # The host's stable identity: its reconnects keep the pace the master learned.
                identity=_dial.worker_identity(),
                resources=self.resources,
                labels=self.labels,
            )
        except AuthenticationError as exc:
            self._give_up(EXIT_CONFIG, f"{exc}; exiting")
            return
        except (ConnectError, MasterBusy, OSError) as exc:
            self._retry_later(exc)
            return
        except (RtpoolError, ValueError) as exc:  # a protocol version the master refuses
            self._give_up(EXIT_CONFIG, str(exc))
            return
        self.address = self.masters.current
        self._start(sock, welcome, reader, early)

    def _retry_later(self, exc: Exception) -> None:
        if self.reconnect_timeout is None:
            code = EXIT_LOST if self.ever_connected else EXIT_CONFIG
            self._give_up(code, str(exc))
            return
        attempt = self.attempt
        if attempt == 1 and not self.ever_connected:
            limit = self.reconnect_timeout
            within = f"for up to {limit:g} s" if limit else "until it is up"
            log(f"{exc}; waiting for the master {within} (--reconnect-timeout)", logging.WARNING)
        elif attempt & (attempt - 1) == 0:
            again = "re" if self.ever_connected else ""
            log(f"{again}connection attempt {attempt} failed: {exc}", logging.WARNING)
        # Short while a standby answered (an election under way), else doubling; jittered.
        self.next_attempt = time.monotonic() + self.masters.retry_pause(self.backoff)
        if not self.masters.standby_answered:
            self.backoff = min(self.backoff * 2, _RECONNECT_MAX_S)

    def _give_up(self, code: int, message: str) -> None:
        log(message, logging.ERROR)
        self.exit_code = code
        self._drop_master(None)

    def _start(self, sock: Any, welcome: _dial.Welcome, reader: Any, early: List[list]) -> None:
        restarted = self.instance is not None and welcome.instance != self.instance
        self.sock, self.reader = sock, reader
        self.instance = welcome.instance
        self.master_answers = False
        self.last_send = self.last_recv = time.monotonic()
        heartbeat_ms = max(welcome.heartbeat_ms, 1)
        if welcome.lease_ms:
            heartbeat_ms = min(heartbeat_ms, max(welcome.lease_ms // 3, 1))
        self.heartbeat_s = heartbeat_ms / 1000
        self.silence_s = 3 * (welcome.lease_ms or 3 * heartbeat_ms) / 1000 + self.heartbeat_s
        self.lease_s = (welcome.lease_ms or 3 * heartbeat_ms) / 1000
        self.beat_at = 0.0
        try:
            host = sock.getsockname()[0]
        except OSError:
            host = ""
        self.welcome_frame = flat(P.encode(P.WELCOME, *welcome, host))
        self.selector.register(sock, selectors.EVENT_READ, None)
        again = "re" if self.ever_connected else ""
        after = f" after {self.attempt} attempts" if self.attempt > 1 else ""
        note = "; it restarted" if restarted else ""
        log(
            f"{again}connected to the master at {self.address} as {self.name} (session "
            f"{welcome.session}, one connection for {self.slots} worker processes){after}{note}"
        )
        self.ever_connected = True
        self.attempt = 0
        self.backoff = _RECONNECT_FIRST_S
        self.frames = [self.serve] if self.serve else []
        self.frame_budget = welcome.max_frame_bytes - RESULT_FRAME_OVERHEAD
        orphans, self.orphans = self.orphans, []
        if orphans and not restarted:
            self.add_results(orphans)
        self.frames.append(_HEARTBEAT)  # its answer shows the master answers (a cut is seen)
        if self.draining:
            self.frames.append(P.encode(P.DRAIN))
        self._on_session()
        if early:
            self._from_master(early)
        self.flush()

    def _drop_master(self, why: str | None) -> None:
        """The master connection is gone: tell every child, forget what it held."""
        if self.sock is not None:
            self.selector.unregister(self.sock)
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
            self.lost_at = time.monotonic()
            self.next_attempt = self.lost_at + _RECONNECT_FIRST_S * random.uniform(0.5, 1.0)
            if why is not None and self.exit_code is None:
                log(f"{why}; reconnecting (master {self.address})", logging.WARNING)
        self._on_master_lost(why or "the worker is stopping")
        self.orphans += self.results
        self.results = []
        self.results_bytes = 0
        self.frames = []
        self.pull = 0

    def _read_master(self) -> None:
        try:
            data = P.recv_some(self.sock, self.recv_buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno == errno.ETIMEDOUT:  # keepalive or TCP_USER_TIMEOUT: a silent path
                self.masters.on_silent()
            raise Lost(f"connection error: {exc.strerror or exc}") from None
        if not data:
            raise Lost("the master closed the connection")
        self.last_recv = time.monotonic()
        try:
            msgs = self.reader.feed(data)
        except ProtocolError as exc:
            raise Lost(f"bad frame from the master: {exc}") from None
        self._from_master(msgs)

    def _flush_due_ns(self) -> int | None:
        """When the pending frames must go (perf_counter_ns), None if nothing is pending: at
        once, or :data:`FLUSH_INTERVAL_NS` after the last write while the children hold more
        tasks (their results join this batch). A ``RETURN`` or a heartbeat waits with them:
        neither is urgent within a millisecond."""
        if not self.results and not self.pull and not self.frames:
            return None
        if not self._holding() or len(self.results) >= FLUSH_RESULTS:
            return 0
        return self.written_ns + FLUSH_INTERVAL_NS

    def flush(self) -> None:
        """Write what the children sent since the last flush: one write to the master."""
        if self.sock is None:
            return
        out = self.frames
        self._seal_results()
        if self.pull > 0 and not self.draining:
            out.append(P.encode(P.PULL, self.pull))
        self.pull = 0
        if not out:
            return
        self.frames = []
        try:
            P.sendall(self.sock, P.join(out))
        except OSError as exc:
            self._drop_master(f"sending to the master failed: {exc.strerror or exc}")
            return
        self.last_send = time.monotonic()
        self.written_ns = perf_ns()
        self.writes += 1

    def _keep_alive(self, now: float) -> None:
        """Heartbeat the master; raise :class:`Lost` past its silence."""
        quiet = self.heartbeat_s * 0.9
        # Idle, or hearing nothing (ask for the master's answer): once per heartbeat period.
        if now - self.beat_at >= quiet and (
            now - self.last_send >= quiet or now - self.last_recv >= quiet
        ):
            self.beat_at = now
            self.frames.append(_HEARTBEAT)
        if self.master_answers and now - self.last_recv > self.silence_s:
            self.masters.on_silent()  # the path may be cut: the next pass starts elsewhere
            raise Lost(
                f"no word from the master for {self.silence_s:g} s (it answers heartbeats); "
                "the path to it may be cut"
            )

    def drain(self) -> None:
        """Graceful shutdown: ask the master for no more work; the children drain."""
        if self.draining:
            return
        self.draining = True
        if self.sock is not None:
            self.frames.append(P.encode(P.DRAIN))
            self.flush()

    def close_master(self) -> None:
        """Send what is left, close, and wait for the master's close (closing with unread
        data would reset the connection and lose the frames)."""
        sock = self.sock
        if sock is None:
            return
        self.flush()
        self.selector.unregister(sock)
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(2.0)
            while sock.recv(RECV_BYTES):
                pass
        except OSError:
            pass
        sock.close()
        self.sock = None
