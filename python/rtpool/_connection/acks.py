"""Acknowledging results (``docs/reliability.md``): the client's side of ``ACK``.

After each batch of frames read, the reader thread acknowledges every package that got results
in it (the master frees what is acknowledged and re-sends the rest after a reconnect). The ACK
of a small complete package may wait for the next frame this client sends, which carries it in
the same write; the heartbeat thread's tick and closing flush what waits.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from .. import _protocol as P

_encode = P.encode
_monotonic = time.monotonic

#: At most this many complete packages' ACKs wait for the next frame (``_send_acks``): each
#: of at most ACK_DEFER_TASKS tasks and ACK_DEFER_BYTES of results (defined in receive.py).
ACK_DEFER_MAX = 64


def _ack_frames(acks: Any) -> bytes:
    """One ``ACK`` frame per package of ``acks`` (package -> segment), with its running count."""
    return b"".join([_encode(P.ACK, pkg, seg.rx) for pkg, seg in acks.items()])


class _Acks:
    """The ACK half of :class:`~rtpool._connection.connection._Connection` (a mixin: the
    state lives on the connection)."""

    _ack_later: Any
    _acks: Any
    _lock: Any
    _send_lock: Any
    sock: Any
    _last_send: float
    _ack_since: float = 0.0
    _wakes: Any
    _release_wakes: Any

    def _defer_acks(self, acks: Any) -> None:
        with self._lock:
            if not self._ack_later:
                self._ack_since = _monotonic()
            self._ack_later.update(acks)

    def acks_overdue(self, age: float) -> bool:
        """Whether ACKs have waited ``age`` seconds or more (the heartbeat thread sends them
        then: an ACK waits one to two of its ticks at most, never less than one)."""
        return bool(self._ack_later) and _monotonic() - self._ack_since >= age

    def _take_acks(self) -> bytes:
        # With the send lock held: the deferred ACKs as frames, and none deferred any more.
        with self._lock:
            later, self._ack_later = self._ack_later, {}
        return _ack_frames(later)

    def _flush_acks(self, sock: socket.socket) -> None:
        # With the send lock held.
        acks = self._take_acks()
        if acks:
            sock.sendall(acks)

    def _send_acks(self) -> None:
        """Reader thread, after a batch: one ACK per package that got results in it.

        The ACK of a small package that is complete (every result in, few bytes) may wait,
        for at most a heartbeat tick, to ride in front of the next frame sent (``_send``): in
        a sequential workload that saves a write here and a wake-up of the master between a
        result and the next ``SUBMIT``. A package still receiving results is acknowledged at
        once (the master's unacknowledged bound paces it), and so is everything when more
        than ``ACK_DEFER_MAX`` packages wait.
        """
        acks, self._acks = self._acks, {}
        if len(self._ack_later) + len(acks) <= ACK_DEFER_MAX and all(
            seg.ack_may_wait for seg in acks.values()
        ):
            self._defer_acks(acks)
            return
        if not self._send_lock.acquire(False):
            # Another thread is writing (maybe a large SUBMIT): do not stop reading results
            # for it. It sends these when done (or the heartbeat thread does).
            self._defer_acks(acks)
            return
        try:
            sock = self.sock
            if sock is not None:
                frames = _ack_frames(acks)
                if self._wakes:
                    self._release_wakes()  # sendall() drops the GIL: they run meanwhile
                sock.sendall(frames)
                self._last_send = _monotonic()
        except OSError:
            pass  # the next recv() sees the broken connection
        finally:
            self._send_lock.release()
