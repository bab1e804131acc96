"""A TCP relay that adds a fixed delay to every byte, each way: a long link on loopback (this
kernel has no netem). Used by ``rtpool bench prefetch``.

Each direction of each connection has a reader thread, which stamps every chunk it reads with
the time it is due, and a writer thread, which sends the chunks in order when due: the added
round trip is exactly ``rtt_ms`` (plus a scheduling tick), whatever the traffic, and bytes are
never reordered or merged across their due times.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from typing import Deque, List, Tuple


class DelayRelay:
    """Relay loopback connections to ``upstream`` with ``rtt_ms / 2`` added each way.

    Args:
        upstream: ``(host, port)`` of the master.
        rtt_ms: Round trip added (0: a plain relay, for a fair baseline).
    """

    def __init__(self, upstream: Tuple[str, int], rtt_ms: float) -> None:
        self.upstream = upstream
        self.one_way_s = rtt_ms / 2000
        self.listener = socket.create_server(("127.0.0.1", 0))
        #: ``host:port`` for the worker's ``--master``.
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._closing = threading.Event()
        self._socks: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._spawn(self._accept_loop)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                down.close()
                continue
            for s in (down, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(None)
            self._socks += [down, up]
            self._pipe(down, up)
            self._pipe(up, down)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        chunks: Deque[Tuple[float, bytes]] = collections.deque()
        ready = threading.Condition()

        def read() -> None:
            while True:
                try:
                    data = src.recv(1 << 16)
                except OSError:
                    data = b""
                with ready:
                    chunks.append((time.monotonic() + self.one_way_s, data))
                    ready.notify()
                if not data:
                    return

        def write() -> None:
            while True:
                with ready:
                    ready.wait_for(lambda: chunks)
                    due, data = chunks.popleft()
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the link's delay itself, not a wait for a condition
                try:
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
                except OSError:
                    return

        self._spawn(read)
        self._spawn(write)

    def close(self) -> None:
        """Close every connection and the listener; join the threads (bounded)."""
        self._closing.set()
        for s in [self.listener, *self._socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(timeout=2)
