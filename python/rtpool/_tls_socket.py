"""A TLS socket that several threads may use at once: one reads, others write.

The client's reader thread blocks in ``recv`` while submitting threads, the heartbeat thread
and the reader itself (``ACK``) write; a worker's loop reads while its heartbeat thread writes.
On a plain TCP socket that is safe (the kernel serializes). On an ``ssl.SSLSocket`` it is not:
``recv`` and ``send`` call ``SSL_read`` and ``SSL_write`` on the same ``SSL`` object, which
OpenSSL does not allow from two threads at once (its FAQ: "an SSL connection cannot be used
concurrently by multiple threads"; ``SSL_read`` may also write, e.g. to answer a TLS 1.3 key
update), and CPython 3.11 releases the GIL around both without a lock of its own (CPython
issues 76714, 143756). The symptoms are rare and ugly: records garbled on the wire (the master
closes the connection as malformed), ``SSLError: bad record mac``, a crash.

:class:`LockedTlsSocket` puts every OpenSSL call on the connection under one lock while never
holding it during a wait: the socket is non-blocking, a call that cannot proceed
(``SSLWantReadError``/``SSLWantWriteError``) releases the lock and waits with ``poll`` for the
file descriptor, then tries again. A reader blocked waiting for data therefore holds nothing,
and a large write lets reads in between its records.

Only the methods rtpool uses are provided; plain TCP sockets are not wrapped.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import Any

_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


class LockedTlsSocket:
    """An ``ssl.SSLSocket`` (handshake done) made safe for concurrent readers and writers."""

    is_tls = True

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._timeout: float | None = None
        sock.setblocking(False)

    # -- waiting ----------------------------------------------------------------------------

    def _wait(self, exc: BaseException, deadline: float | None) -> None:
        """Wait (without the lock) until the socket is ready for what ``exc`` wants."""
        events = select.POLLIN if isinstance(exc, ssl.SSLWantReadError) else select.POLLOUT
        timeout_ms = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            timeout_ms = max(1, int(left * 1000))
        poller = select.poll()
        try:
            poller.register(self._sock.fileno(), events)
        except ValueError:  # closed meanwhile (fileno -1)
            raise OSError("the connection is closed") from None
        poller.poll(timeout_ms)

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    # -- I/O --------------------------------------------------------------------------------

    def recv(self, size: int) -> bytes:
        """Read up to ``size`` bytes; ``b""`` at the end of the stream."""
        deadline = self._deadline()
        while True:
            with self._lock:
                try:
                    return self._sock.recv(size)
                except _WANT as exc:
                    want: BaseException = exc
            self._wait(want, deadline)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """Read up to ``nbytes`` (0: ``len(buffer)``) bytes into ``buffer``; 0 at the end of
        the stream. ``flags`` must be 0 (TLS takes none)."""
        if flags:
            raise ValueError("non-zero flags not allowed in calls to recv_into() on TLS")
        deadline = self._deadline()
        while True:
            with self._lock:
                try:
                    return self._sock.recv_into(buffer, nbytes)
                except _WANT as exc:
                    want: BaseException = exc
            self._wait(want, deadline)

    def sendall(self, data: Any) -> None:
        """Write all of ``data``; the lock is taken per TLS write, never during a wait."""
        view = memoryview(data).cast("B")
        deadline = self._deadline()
        while view:
            with self._lock:
                try:
                    sent = self._sock.send(view)
                except _WANT as exc:
                    want: BaseException = exc
                else:
                    view = view[sent:]
                    continue
            # OpenSSL wants the same buffer again (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER lets
            # its address change, not its contents).
            self._wait(want, deadline)

    def pending(self) -> int:
        """Decrypted bytes waiting in the TLS layer (``select`` cannot see them)."""
        with self._lock:
            return self._sock.pending()

    # -- the rest of the socket interface rtpool uses -----------------------------------------

    def settimeout(self, timeout: float | None) -> None:
        """Bound each ``recv``/``sendall`` call (None: no bound); the socket stays
        non-blocking."""
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def fileno(self) -> int:
        return self._sock.fileno()

    def shutdown(self, how: int) -> None:
        # The plain socket's shutdown: it wakes a reader waiting in poll, and needs no lock.
        socket.socket.shutdown(self._sock, how)

    def close(self) -> None:
        self._sock.close()

    def getpeername(self) -> Any:
        return self._sock.getpeername()

    def getsockname(self) -> Any:
        return self._sock.getsockname()

    def __repr__(self) -> str:
        return f"<LockedTlsSocket {self._sock!r}>"
