"""Freeing results kept on workers (``docs/data.md``): the client's side of ``RELEASE``.

A kept result is a :class:`~rtpool._kept.KeptRef` the reader thread unpickled from a result.
:meth:`_Releases.adopt` ties the worker's copy to the life of that object: the futures that
resolved to it (a task's, a dependent's proxy) and the lineage of every task that took one of
them as an argument all hold it, so when the last of them is gone (garbage-collected) no pending
task of this client can read the value any more, and its worker may drop it. The finalizer only
queues the key (it may run in any thread, inside any lock, during garbage collection); the
reader thread after each batch and the heartbeat thread send the queue as one ``RELEASE``, which
the master turns into a ``DROP`` for the worker. :meth:`_Releases.release_now` is the explicit
path (``Future.release()``).

A release sent while disconnected is kept for the next connection; a worker that is gone (or
reconnected under a new session) holds nothing to drop, or keeps the value until its bound
evicts it.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Deque, Tuple

from .. import _protocol as P
from .._kept import KeptRef

# Keys per RELEASE frame (the master accepts up to 65,536).
_BATCH = 4096


class _Releases:
    """Mixin of :class:`~rtpool._connection.connection._Connection`."""

    _send_lock: threading.Lock
    sock: Any

    def _init_releases(self) -> None:
        #: (session, key) pairs waiting to be sent; appended by finalizers, without a lock.
        self._releases: Deque[Tuple[int, bytes]] = collections.deque()
        #: Keys released (sent) since start; tests read it.
        self.released = 0

    def adopt(self, ref: KeptRef) -> None:
        """Release ``ref``'s value on its worker when the object is garbage-collected."""
        if ref.session and ref._finalizer is None:
            fin = weakref.finalize(ref, self._releases.append, (ref.session, bytes(ref.key)))
            fin.atexit = False  # at exit nothing sends the queue any more
            ref._finalizer = fin

    def release_now(self, ref: KeptRef) -> bool:
        """Release ``ref``'s value now (once); False if it was released already or is not
        one this connection adopted."""
        fin = ref._finalizer
        if fin is None or not fin.alive:
            return False
        fin()
        self._flush_releases(block=True)
        return True

    def _flush_releases(self, block: bool = False) -> None:
        """Send the queued releases (``block``: wait for the send lock; else skip when another
        thread is writing, the heartbeat thread sends them later)."""
        if not self._releases:
            return
        if not self._send_lock.acquire(block):
            return
        try:
            sock = self.sock
            if sock is None:
                return  # sent after the reconnection
            while self._releases:
                batch = []
                while self._releases and len(batch) < _BATCH:
                    session, key = self._releases.popleft()
                    batch.append([session, key])
                try:
                    P.sendall(sock, P.encode(P.RELEASE, batch))
                except OSError:
                    self._releases.extendleft(tuple(reversed([tuple(b) for b in batch])))
                    return  # the reader sees the broken connection
                self.released += len(batch)
        finally:
            self._send_lock.release()
