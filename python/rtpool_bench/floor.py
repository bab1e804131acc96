"""The one-hop floor: a raw Python TCP ping-pong between two processes on loopback.

rtpool's round trips are compared with the cheapest thing two Python processes can do over
TCP: send a frame, have the other process read it whole and send it back. Both ends set
``TCP_NODELAY`` and frame messages as rtpool does (a 4-byte big-endian length, then the body),
so the floor pays the same syscalls and wake-ups per message that any Python peer would, and
nothing else (no msgpack, no pickle, no scheduler).

The echo peer is a child process running this file as a script (``python floor.py
PORT``): it connects back to the parent, echoes frames until it reads a zero length, and exits.
The parent stops it by PID in ``close()`` whatever happens.

The **relay chain** (``EchoPeer(relay=True)``) is the floor of rtpool's topology: the child
relays each frame to an echo process of its own and the echo back, so a round trip crosses
three processes and four one-way hops, as client -> master -> worker -> master -> client does,
with no work at all in between. On a small VM the wake-ups of that chain, not the work, set
what any design with a separate master and worker can reach.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time

_HEADER = struct.Struct(">I")


def _nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _recv_exactly(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False if the peer closed first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def make_frame(payload_bytes: int) -> bytes:
    """A length-prefixed frame with a body of ``payload_bytes`` bytes (at least 1)."""
    size = max(1, payload_bytes)
    return _HEADER.pack(size) + (b"\xa5" * size)


class EchoPeer:
    """A child process that echoes frames over one loopback TCP connection.

    Use as a context manager; ``roundtrip_ns(frame)`` sends one frame and waits for its echo.
    """

    def __init__(self, connect_timeout_s: float = 15.0, relay: bool = False) -> None:
        self._relay = relay
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._buf = bytearray(_HEADER.size)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            listener.settimeout(0.2)
            port = listener.getsockname()[1]
            # Run this file as a script: the child needs nothing of rtpool and starts faster.
            self._proc = subprocess.Popen(self._command(port), stdin=subprocess.DEVNULL)
            sock = self._accept(listener, connect_timeout_s)
            sock.settimeout(None)
            _nodelay(sock)
            self._sock = sock
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()

    def _accept(self, listener: socket.socket, timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return listener.accept()[0]
            except socket.timeout:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"the echo peer exited with code {self._proc.returncode} before connecting"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the echo peer did not connect within {timeout_s:.0f} s"
                    ) from None

    def _command(self, port: int) -> list:
        """The child's command line: this file as a script, connecting back to ``port``."""
        return [sys.executable, os.path.abspath(__file__), str(port)] + (
            ["relay"] if self._relay else []
        )

    def detach(self) -> socket.socket:
        """Hand the connection to the caller, who then owns it and must end it with a zero
        length frame (``close()`` only waits for the child then)."""
        sock, self._sock = self._sock, None
        assert sock is not None, "echo peer is closed"
        return sock

    @property
    def pid(self) -> int | None:
        """The echo child's PID (``None`` once stopped)."""
        return None if self._proc is None else self._proc.pid

    def roundtrip_ns(self, frame: bytes) -> int:
        """Send ``frame`` (from :func:`make_frame`) and wait for the echo; nanoseconds taken."""
        assert self._sock is not None, "echo peer is closed"
        if len(self._buf) < len(frame):
            self._buf = bytearray(len(frame))
        view = memoryview(self._buf)[: len(frame)]
        t0 = time.perf_counter_ns()
        self._sock.sendall(frame)
        if not _recv_exactly(self._sock, view):
            raise ConnectionError("the echo peer closed the connection")
        elapsed = time.perf_counter_ns() - t0
        return elapsed

    def close(self) -> None:
        """Ask the child to exit, then stop it by PID if it does not within 5 s."""
        if self._sock is not None:
            try:
                self._sock.sendall(_HEADER.pack(0))
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None

    def __enter__(self) -> EchoPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(port: int, relay: bool = False) -> int:
    """The child's side: connect to ``127.0.0.1:port`` and echo frames until a zero length
    (with ``relay``, pass each frame through an echo process of its own first)."""
    inner = EchoPeer() if relay else None
    try:
        return _serve(port, inner)
    finally:
        if inner is not None:
            inner.close()


def _serve(port: int, inner: EchoPeer | None) -> int:
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    sock.settimeout(None)
    _nodelay(sock)
    buf = bytearray(1 << 16)
    try:
        while True:
            if not _recv_exactly(sock, memoryview(buf)[: _HEADER.size]):
                return 0
            (size,) = _HEADER.unpack_from(buf)
            if size == 0:
                return 0
            if len(buf) < _HEADER.size + size:
                grown = bytearray(_HEADER.size + size)
                grown[: _HEADER.size] = buf[: _HEADER.size]
                buf = grown
            frame = memoryview(buf)[: _HEADER.size + size]
            if not _recv_exactly(sock, frame[_HEADER.size :]):
                return 0
            if inner is not None:
                inner.roundtrip_ns(bytes(frame))
            # One write for header and body: the same number of segments as the request.
            sock.sendall(frame)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), relay=sys.argv[2:3] == ["relay"]))
