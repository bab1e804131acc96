"""A TCP front for a group of ``rtpool master --ha`` processes that forwards each new
connection to the one whose ``GET /leader`` answers 200: what a Kubernetes Service with that
readiness probe (or a load balancer with that health check) does, for the HA tests and
``rtpool bench ha``, so that today's clients and workers, given one address, follow a
failover as they follow a restart (reconnect, re-attach on the new ``instance``).

A connection that arrives while no master leads is held (not refused) until one does, for at
most ``hold_s``: the peer's reconnect then costs no backoff. Established connections are never
moved: when their master dies or fences itself, they close, and the peer reconnects.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.request
from typing import List, Sequence, Tuple

#: How often the masters' ``/leader`` is polled.
POLL_S = 0.02


class LeaderProxy:
    """Forwards connections on an ephemeral loopback port to the current leader.

    Args:
        masters: ``(peer address "host:port", HTTP address "host:port")`` of each master.
        hold_s: How long a new connection waits for a leader before it is closed.
    """

    def __init__(self, masters: Sequence[Tuple[str, str]], hold_s: float = 10.0) -> None:
        self.masters = list(masters)
        self.hold_s = hold_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        #: ``host:port`` for clients and workers.
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.closing = threading.Event()
        self._leader: str | None = None
        self._changed = threading.Condition()
        self._threads: List[threading.Thread] = []
        self._spawn(self._poll_loop)
        self._spawn(self._accept_loop)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    @property
    def leader(self) -> str | None:
        """The peer address of the master that answered ``/leader`` 200 last, if any."""
        with self._changed:
            return self._leader

    def _poll_loop(self) -> None:
        while not self.closing.is_set():
            found = None
            for peer, http in self.masters:
                try:
                    with urllib.request.urlopen(f"http://{http}/leader", timeout=0.2) as r:
                        if r.status == 200:
                            found = peer
                            break
                except OSError:
                    continue
            with self._changed:
                if found != self._leader:
                    self._leader = found
                    self._changed.notify_all()
            self.closing.wait(POLL_S)

    def _wait_leader(self) -> str | None:
        end = time.monotonic() + self.hold_s
        with self._changed:
            while self._leader is None and not self.closing.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(min(left, 0.1))
            return self._leader

    def _accept_loop(self) -> None:
        self.listener.settimeout(0.2)
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        leader = self._wait_leader()
        if leader is None:
            conn.close()
            return
        host, port = leader.rsplit(":", 1)
        try:
            up = socket.create_connection((host, int(port)), timeout=2)
        except OSError:
            conn.close()
            return
        up.settimeout(None)
        for s in (conn, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pipe(conn, up)

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.closing.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.5)
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def close(self) -> None:
        """Stops accepting and forwarding; open connections close within half a second."""
        self.closing.set()
        self.listener.close()
        for t in self._threads:
            t.join(2)
