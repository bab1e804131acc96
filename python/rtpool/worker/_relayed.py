"""A worker child behind its parent's host connection (``--connection host``, ``_relay.py``).

:class:`RelayedConnection` is the child's ``WorkerConnection`` with one difference: its
"master" is the parent, at the other end of a socket pair made before the fork. The child
speaks the same protocol over it (``PULL``, ``ASSIGN``, ``RESULT``, ``RETURN``, ``ABORT``,
heartbeats, ``DRAIN``) and runs tasks exactly as a child with its own connection does; only
the handshake differs: the child sends ``HELLO`` and the parent answers with its master's
``WELCOME`` once its own connection is up (plus the host address kept results advertise).

A lost master connection reaches the child as an ``ERROR`` from the parent: the child ends
its session as usual (its unstarted tasks are the master's again) and says ``HELLO`` again,
on the same socket pair, which the parent answers when it has reconnected. The child never
dials, so its reconnection is the parent's (``--reconnect-timeout`` included).
"""

from __future__ import annotations

import logging
import select
import socket
from typing import Any, List, Tuple

from .. import _dial
from .. import _protocol as P
from ..errors import ConnectError, ProtocolError
from . import _kept
from ._common import EXIT_LOST, EXIT_OK, log
from ._loop import WorkerConnection
from ._session import RECV_BYTES

#: The ``ERROR`` code the parent sends a child when the host's master connection is lost.
ERR_HOST_LOST = "host_connection_lost"


class RelayedConnection(WorkerConnection):
    """A worker child whose connection is a socket pair to its parent (module docstring).

    Args:
        link: The child's end of the socket pair.
        *args, **kwargs: As :class:`WorkerConnection` (``connect`` is always False).
    """

    def __init__(self, link: socket.socket, *args: Any, **kwargs: Any) -> None:
        self._link = link
        self._relay_host = ""
        kwargs["connect"] = False
        super().__init__(*args, **kwargs)

    def _connect(self, timeout: float) -> Tuple[socket.socket, _dial.Welcome, Any, List[list]]:
        """Say ``HELLO`` to the parent and wait for its ``WELCOME`` (or a signal).

        The parent answers once its master connection is up, however long that takes (its
        ``--reconnect-timeout`` bounds it). Messages before the ``WELCOME`` belong to an old
        session and are dropped; the stream's framing is kept across sessions (the reader of
        the old session goes on), since a session may end with a frame half read.

        Raises:
            ConnectError: The worker is stopping, or the parent closed the socket pair.
        """
        sock = self._link
        sock.setblocking(True)
        with self._send_lock:  # (the heartbeat thread writes to it too)
            sock.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "worker", "", self.name, 1))
        reader = getattr(self, "reader", None) or P.FrameReader(P.DEFAULT_MAX_FRAME)
        while True:
            readable, _, _ = select.select([sock, self._wake_r], [], [])
            if self._wake_r in readable:
                self._drain_wakeups()
            if self.stopping:
                raise ConnectError("the worker is stopping")
            if sock not in readable:
                continue
            try:
                if reader.big is not None:
                    with reader.want() as view:
                        n = sock.recv_into(view)
                    msgs = reader.got(n) if n else None
                else:
                    data = sock.recv(RECV_BYTES)
                    msgs = reader.feed(data) if data else None
            except (OSError, ProtocolError) as exc:
                raise ConnectError(f"the worker's parent process failed: {exc}") from None
            if msgs is None:
                raise ConnectError("the worker's parent process closed its socket pair")
            for i, msg in enumerate(msgs):
                if msg[0] == P.WELCOME:
                    welcome = _dial.Welcome(*msg[1:7])
                    self._relay_host = msg[7]
                    reader.max_frame = welcome.max_frame_bytes
                    return sock, welcome, reader, msgs[i + 1 :]

    def connect_first(self) -> int | None:
        """The first session: None once it is up, else the exit code. The parent waits for
        the master (and gives up on it); a child only waits for its parent."""
        try:
            parts = self._connect(self.connect_timeout)
        except ConnectError as exc:
            if self.stopping:
                return EXIT_OK
            log(str(exc), logging.ERROR)
            return EXIT_LOST
        self._start_session(*parts)
        log(
            f"connected to the master at {self.address} as {self.name} (session "
            f"{self.session}, through the host's connection)"
        )
        return None

    def _start_session(self, *parts: Any) -> bool:
        restarted = super()._start_session(*parts)
        _kept.advertise(self._relay_host, self.session)  # the host's address, not the pair's
        return restarted

    def _close_socket(self) -> None:
        """A session ends; the socket pair stays (the next session uses it)."""
