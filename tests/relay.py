"""A TCP relay that a test can cut and restore: a real network fault on loopback.

When cut, the relay stops forwarding in both directions without closing anything (a
blackhole: the peer's sends are accepted by the relay's kernel, nothing comes back), and holds
new connections without forwarding them until the path is back. Keepalive probes and
``TCP_USER_TIMEOUT`` see a live path (the relay's kernel acknowledges everything): only a
peer's own silence check notices the cut, as through a stalled proxy.

Used by ``test_liveness.py`` (worker and client sides); import it as ``from relay import Relay``.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import List, Tuple


class Relay:
    """A TCP relay to ``upstream`` on an ephemeral loopback port, which can be cut and restored.

    Args:
        upstream: ``(host, port)`` of the server behind the relay.
    """

    def __init__(self, upstream: Tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        #: ``host:port`` to connect to instead of ``upstream``.
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        #: Set to cut the path, clear to restore it.
        self.cut = threading.Event()
        self.closing = threading.Event()
        self.threads: List[threading.Thread] = []
        self._spawn(self._accept_loop)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept_loop(self) -> None:
        self.listener.settimeout(0.1)
        while not self.closing.is_set():
            try:
                down, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._spawn(self._pump, down)

    def _pump(self, down: socket.socket) -> None:
        # Hold a connection made during a cut until the path is back (or the relay closes).
        while self.cut.is_set() and not self.closing.is_set():
            time.sleep(0.02)
        try:
            up = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            down.close()
            return
        peers = {down: up, up: down}
        try:
            while not self.closing.is_set():
                if self.cut.is_set():
                    time.sleep(0.02)  # blackhole: read nothing, write nothing, close nothing
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            down.close()
            up.close()

    def close(self) -> None:
        """Stop relaying, close every connection and join the threads (bounded)."""
        self.closing.set()
        self.listener.close()
        for t in self.threads:
            t.join(timeout=5)
