"""Results kept where they are made: a worker process's store of kept results and the data
port that serves them to peers (``docs/data.md``).

A task submitted with ``options(keep=True)`` (or ``keep_bytes=N`` and a result at least that
large) does not send its return value to the master: :meth:`KeptStore.put` keeps the value in
this process and the task returns a small :class:`~rtpool._kept.KeptRef` instead (host, port,
a 16-byte random key, the size). Whoever holds the reference (the client that submitted the
task, or the worker of a task that takes the future as an argument) fetches the value from
this process's data port, directly: it never passes through the master or, for a dependent
task, the client. A task run in this same process reads it from the store without a copy.

The key is the capability: 128 random bits, sent only to the package's owner (through the
authenticated master connection) and from there to that owner's dependent tasks. The data port
answers nothing but a known key.

Data port, one request per connection (big-endian)::

    request : b"RTK1" | op: u8 (1 get, 2 release) | key: 16 bytes
    answer  : status: u8 (0 ok, 1 unknown key) | count: u32 | length: u64 x (1 + count)
              | the pickle (protocol 5) | its ``count`` out-of-band buffers

The values are pickled when a peer asks (never for a task of this process), with protocol 5's
out-of-band buffers so a numpy array is written from where it lies, not copied into the
pickle. The store holds at most ``rtpool worker --keep-mb`` MiB (else ``RTPOOL_KEEP_MB``,
else 1024); past it the least recently read results go, and a reader of an evicted (or lost:
the process died) result gets :class:`~rtpool.errors.KeptResultLost`, upon which the client
re-runs the task that made it (lineage, ``rtpool._deps``). When the client no longer needs a
value (its last future is gone, or ``Future.release()``), the master sends ``DROP`` with its key
and :func:`drop` forgets it.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
from collections import OrderedDict
from typing import Any, List, Tuple

from .._frame import recv_exact
from .._kept import MAGIC, OP_GET, OP_RELEASE, KeptRef, set_keeper, value_size

__all__ = ["KeptStore", "advertise", "drop", "set_limit_mb", "store"]

_HEAD = struct.Struct(">BI")
_LEN = struct.Struct(">Q")
_REQUEST_BYTES = len(MAGIC) + 1 + 16
# Default bound of a process's store; RTPOOL_KEEP_MB overrides it.
_DEFAULT_KEEP_MB = 1024

_lock = threading.Lock()
_store: KeptStore | None = None
# The address peers reach this worker at: the local address of its master connection.
_host = "127.0.0.1"
# The worker's master session (WELCOME.session): what a dependent task's `near` names.
_session = 0
# --keep-mb, if given (else RTPOOL_KEEP_MB, else the default).
_limit_mb: int | None = None


def advertise(host: str, session: int) -> None:
    """Set the address and session kept references name (the worker session calls it on
    connecting; a store already serving keeps its address, the session follows)."""
    global _host, _session
    if host and host not in ("0.0.0.0", "::"):
        _host = host
    _session = session


def store() -> KeptStore:
    """This process's store, started (with its data port) on first use."""
    global _store
    with _lock:
        # A forked executor process must not use its parent's store (its thread is not there).
        if _store is None or _store.pid != os.getpid():
            _store = KeptStore(_host, _limit_bytes())
        return _store


def drop(keys: List[bytes]) -> None:
    """``DROP`` from the master: forget these values (their owner released them). Keys this
    process does not hold (evicted, or kept by its executor process) are ignored."""
    st = _store
    if st is None or st.pid != os.getpid():
        return
    for key in keys:
        st.release(bytes(key))


def set_limit_mb(mb: int) -> None:
    """Bound each store of this process and its forks to ``mb`` MiB (``--keep-mb``)."""
    global _limit_mb
    _limit_mb = mb


def _limit_bytes() -> int:
    if _limit_mb is not None:
        return _limit_mb << 20
    text = os.environ.get("RTPOOL_KEEP_MB", "")
    try:
        mb = int(text) if text else _DEFAULT_KEEP_MB
    except ValueError:
        raise ValueError(f"RTPOOL_KEEP_MB must be a whole number of MiB, got {text!r}") from None
    if mb < 1:
        raise ValueError(f"RTPOOL_KEEP_MB must be at least 1, got {mb}")
    return mb << 20


class KeptStore:
    """Kept results of one process, served on a data port of its own (a daemon thread)."""

    def __init__(self, host: str, limit_bytes: int) -> None:
        self.pid = os.getpid()
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self._values: OrderedDict[bytes, Tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self.host = host
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, name="rtpool-kept", daemon=True).start()

    def put(self, value: Any) -> KeptRef:
        """Keep ``value``; return the reference that names it (and evict past the bound)."""
        key = os.urandom(16)
        size = value_size(value)
        with self._lock:
            self._values[key] = (value, size)
            self.used_bytes += size
            while self.used_bytes > self.limit_bytes and len(self._values) > 1:
                _, (_, old) = self._values.popitem(last=False)
                self.used_bytes -= old
        return KeptRef(self.host, self.port, key, size, self.pid, _session)

    def get(self, key: bytes) -> Tuple[bool, Any]:
        """``(found, value)`` of a key of this process (no copy)."""
        with self._lock:
            entry = self._values.get(key)
            if entry is None:
                return False, None
            self._values.move_to_end(key)
            return True, entry[0]

    def release(self, key: bytes) -> None:
        """Forget a kept value (its owner no longer needs it)."""
        with self._lock:
            entry = self._values.pop(key, None)
            if entry is not None:
                self.used_bytes -= entry[1]

    def __len__(self) -> int:
        return len(self._values)

    # -- the data port ----------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30.0)
                request = recv_exact(conn, _REQUEST_BYTES)
                if request is None or not request.startswith(MAGIC):
                    return
                op, key = request[len(MAGIC)], bytes(request[len(MAGIC) + 1 :])
                if op == OP_RELEASE:
                    self.release(key)
                    conn.sendall(_HEAD.pack(0, 0) + _LEN.pack(0))
                    return
                if op != OP_GET:
                    return
                found, value = self.get(key)
                if not found:
                    conn.sendall(_HEAD.pack(1, 0) + _LEN.pack(0))
                    return
                _send_value(conn, value)
            except OSError:
                pass  # the reader went away: it retries or re-runs the producer


def _send_value(conn: socket.socket, value: Any) -> None:
    buffers: List[pickle.PickleBuffer] = []
    data = pickle.dumps(value, 5, buffer_callback=buffers.append)
    views = [memoryview(data)] + [b.raw() for b in buffers]
    head = _HEAD.pack(0, len(buffers)) + b"".join(_LEN.pack(v.nbytes) for v in views)
    conn.sendall(head)
    for view in views:
        conn.sendall(view)


set_keeper(store)
