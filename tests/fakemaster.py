"""A scripted stand-in for the master, to test the client and the worker without the Rust side.

It speaks the wire protocol through ``rtpool._protocol`` and leaves every decision to the
test: each authenticated connection is handed to the test as a :class:`FakeConn` from which
it reads messages and to which it writes replies.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import List

from rtpool import _protocol as P


class FakeConn:
    """The master's side of one authenticated connection."""

    def __init__(self, sock: socket.socket, reader: P.FrameReader, hello: list) -> None:
        self.sock = sock
        self.reader = reader
        self.hello = hello
        self._msgs: List[list] = []

    def recv(self, timeout: float = 5.0) -> list | None:
        """The next message, or None at EOF. Fails the test after ``timeout`` seconds."""
        self.sock.settimeout(timeout)
        while not self._msgs:
            data = self.sock.recv(1 << 20)
            if not data:
                return None
            self._msgs.extend(self.reader.feed(data))
        return self._msgs.pop(0)

    def recv_kind(self, kind: int, timeout: float = 5.0, skip=(P.HEARTBEAT,)) -> list:
        """The next message of ``kind``, skipping the kinds in ``skip``; fail on anything else."""
        while True:
            msg = self.recv(timeout)
            assert msg is not None, f"connection closed while waiting for kind {kind}"
            if msg[0] in skip and msg[0] != kind:
                continue
            assert msg[0] == kind, f"expected kind {kind}, got {msg!r:.200}"
            return msg

    def send(self, kind: int, *fields) -> None:
        self.sock.sendall(P.encode(kind, *fields))

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeMaster:
    """Accepts connections on 127.0.0.1, answers HELLO, queues each connection for the test.

    Args:
        token: The only token accepted (for either role).
        max_frame_bytes: Announced in WELCOME.
        heartbeat_ms: Announced in WELCOME.

    ``lease_ms`` and ``instance`` (announced in WELCOME) are class defaults; a subclass or a
    test may set them, e.g. change ``instance`` between connections to play a restarted master.
    """

    lease_ms = 15000
    instance = 1
    #: ``(code, message)``: answer every HELLO with this ERROR and close (a standby answers
    #: ``("not_leader", "... (leader: HOST:PORT)")``); None: WELCOME.
    refusal: tuple | None = None
    #: Refuse a HELLO of more than this many fields as ``malformed`` (as a master that predates
    #: its trailing fields does); None: any.
    max_hello_fields: int | None = None

    def __init__(
        self,
        token: str = "tok",
        max_frame_bytes: int = P.DEFAULT_MAX_FRAME,
        heartbeat_ms: int = 5000,
        listen: tuple = ("127.0.0.1", 0),
    ) -> None:
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.heartbeat_ms = heartbeat_ms
        self.hellos = 0  # handshakes so far
        self.listener = socket.create_server(listen)
        self.address = f"{listen[0]}:{self.listener.getsockname()[1]}"
        self.conns: queue.Queue[FakeConn] = queue.Queue()
        self._open: List[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self._open.append(sock)
            threading.Thread(target=self._handshake, args=(sock,), daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        reader = P.FrameReader()
        msgs: List[list] = []
        try:
            while not msgs:
                data = sock.recv(65536)
                if not data:
                    return
                msgs = reader.feed(data)
        except OSError:
            return
        hello = msgs[0]
        self.hellos += 1
        if self.max_hello_fields is not None and len(hello) - 1 > self.max_hello_fields:
            sock.sendall(P.encode(P.ERROR, P.ERR_MALFORMED, "HELLO has too many fields", 0))
            sock.close()
            return
        if self.refusal is not None:
            code, message = self.refusal
            sock.sendall(P.encode(P.ERROR, code, message, 0))
            sock.close()
            return
        if hello[0] != P.HELLO or hello[3] != self.token:
            sock.sendall(P.encode(P.ERROR, "auth", "bad token for this master", 0))
            sock.close()
            return
        reader.max_frame = self.max_frame_bytes
        sock.sendall(P.encode(P.WELCOME, *self.welcome_fields()))
        conn = FakeConn(sock, reader, hello)
        conn._msgs.extend(msgs[1:])
        self.conns.put(conn)

    def welcome_fields(self) -> list:
        """The fields of the WELCOME answering each HELLO: all six, as the master sends them."""
        return [
            P.PROTOCOL_VERSION,
            self.hellos,
            self.max_frame_bytes,
            self.heartbeat_ms,
            self.lease_ms,
            self.instance,
        ]

    def accept(self, timeout: float = 5.0) -> FakeConn:
        """The next authenticated connection."""
        return self.conns.get(timeout=timeout)

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread on Linux
        except OSError:
            pass
        self.listener.close()
        for sock in self._open:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> FakeMaster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
