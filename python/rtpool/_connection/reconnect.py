"""Reconnecting a client connection after it broke: backoff, a new handshake, then
``ATTACH`` of the accepted packages and the ``SUBMIT``s not yet accepted sent again (the same
bytes, so the same idempotency key), and the frames of the :meth:`on_reconnect` hooks.

A mixin of :class:`~rtpool._connection.connection._Connection` (the state is there).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, List, Tuple

from .. import _protocol as P
from .._dial import MasterUnreachable, connect
from .._text import plural
from ..errors import AuthenticationError, ConnectError, ConnectionLost, ProtocolError

_log = logging.getLogger("rtpool.client")
_monotonic = time.monotonic
_encode = P.encode

# Reconnection backoff: the first pause, the longest one (each is drawn in [d/2, d]).
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 5.0
# Fatal errors after which reconnecting cannot help: the same request would fail again.
_NO_RETRY = frozenset(
    {P.ERR_VERSION, P.ERR_AUTH, P.ERR_TOO_LARGE, P.ERR_MALFORMED, P.ERR_UNKNOWN_KIND}
)


class _Reconnector:
    """Reconnecting after the connection broke, and the first connection."""

    def _connect_first(self) -> Tuple[socket.socket, Any, P.FrameReader, List[list]]:
        """The first connection. With several addresses (a leader and standbys) a pass that
        found no leader, only refusals, silence or standbys (a failover under way), is tried
        again as a reconnection would be, within ``reconnect_timeout``; one address fails at
        once (a master that is not running, a mistyped address: say so now)."""
        started = _monotonic()
        backoff = _BACKOFF_FIRST
        while True:
            try:
                return connect(self.masters, **self._hello, timeout=self.connect_timeout)
            except MasterUnreachable as exc:  # refused, silent or a standby: not TLS, a token
                left = started + self.reconnect_timeout - _monotonic()
                if len(self.masters) < 2 or self.reconnect_timeout <= 0:
                    raise
                if left <= 0:
                    raise type(exc)(
                        f"{exc}; no leader within reconnect_timeout ({self.reconnect_timeout:g} s)"
                    ) from None
                pause = min(self.masters.retry_pause(backoff), left)
                if not self.masters.standby_answered:
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                time.sleep(pause)

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
        if self._silent is not None:  # a cut path, maybe: the next pass starts elsewhere
            self.masters.on_silent()
        if fatal is not None:
            reason = f"the master reported {fatal[0]}: {fatal[1]}"
            if fatal[0] == P.ERR_NOT_LEADER:  # deposed: dial the leader it names first
                self.masters.follow(fatal[1])
        if closed or self.reconnect_timeout <= 0 or (fatal is not None and fatal[0] in _NO_RETRY):
            self._connection_lost(reason)
            return None
        return self._reconnect(reason)

    def _needs_connection(self) -> bool:
        # With self._lock held. After shutdown(), only futures still pending keep it going.
        if not self.closing:
            return bool(
                self._by_req or self._segments or any(hook() for hook in self._pending_hooks)
            )
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
                # A standby answered the last pass: the leader is being elected, ask again
                # soon; nobody answered: back off, doubling.
                pause = min(self.masters.retry_pause(self._backoff), remaining)
                if not self.masters.standby_answered:
                    self._backoff = min(self._backoff * 2, _BACKOFF_MAX)
                if self._cond.wait_for(lambda: self._closed or not self._needs_connection(), pause):
                    continue  # closed, or nothing left (cancelled): see above
            if not last_error:
                last_error = "none"
                _log.warning("lost the connection to the master at %s (%s)", self.address, reason)
            try:
                sock, welcome, reader, extra = connect(
                    self.masters,
                    **self._hello,
                    timeout=max(0.05, min(self.connect_timeout, remaining)),
                )
            except AuthenticationError as exc:
                reason += f"; reconnecting failed: {exc}"
                break
            except (ConnectError, ProtocolError) as exc:
                last_error = str(exc)
                continue
            self.address = self.masters.current
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
                for hook in self._reconnect_hooks:
                    frames.extend(hook())
                self._cond.notify_all()
            try:
                for frame in frames:
                    P.sendall(sock, frame)
                self._last_send = _monotonic()
            except OSError:
                pass  # the reader finds the connection broken and starts over
        _log.warning(
            "reconnected to the master at %s (session %d%s): attached %s, re-sent %s",
            self.address,
            self.session,
            ", a new master instance (restarted or failed over)" if restarted else "",
            plural(len(self._attaching), "package"),
            plural(len(resend), "submission"),
        )
