"""The issue's 2-hop relay floor: a client, an asyncio relay process and a worker process
echoing length-prefixed frames.

:class:`rtpool_bench.floor.EchoPeer` with ``relay=True`` relays through a *blocking-socket*
process: one ``recv`` and one ``send`` per hop, no event loop at all. rtpool's master is an
event loop (tokio) between the client and the worker, and the floor of issue 25 is the same
shape in Python: the middle process runs an ``asyncio`` loop, holds one connection to the
client and one to the worker, and forwards each frame as it arrives (``StreamReader.readexactly``
of the 4-byte big-endian length, then of the body; one ``write`` each way). The worker is a
blocking echo (:func:`rtpool_bench.floor.serve`), as rtpool's worker reads its socket in a
thread. So a round trip crosses three processes and four one-way hops, with an event loop in
the middle and no work anywhere.

The relay is a child process running this file as a script (``python floor_aio.py PORT``); it
starts the echo worker itself, as :class:`EchoPeer` does. :class:`AioRelayChain` has the same
interface as :class:`EchoPeer` (``roundtrip_ns(frame)``, ``close()``, a context manager) and
stops the relay (which stops the worker) whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

if __package__:
    from .floor import _HEADER, EchoPeer, _nodelay
else:  # run as a script (the relay child): floor.py sits next to this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from floor import _HEADER, EchoPeer, _nodelay  # type: ignore[no-redef]


class AioRelayChain(EchoPeer):
    """Client side of client -> asyncio relay -> echo worker and back.

    The client's end is :class:`EchoPeer`'s (a blocking socket, ``roundtrip_ns``); only the
    child it starts differs: this file's asyncio relay instead of the blocking echo.
    """

    def _command(self, port: int) -> list:
        return [sys.executable, os.path.abspath(__file__), str(port)]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Forward one frame from ``reader`` to ``writer``; False on a zero length or EOF."""
    try:
        head = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError:
        return False
    (size,) = _HEADER.unpack(head)
    if size == 0:
        return False
    body = await reader.readexactly(size)
    writer.write(head + body)  # one write: as many segments as the sender's
    return True


async def _relay(port: int, worker: EchoPeer) -> int:
    # The worker connected to the blocking echo peer's listener; hand its socket to asyncio.
    worker_sock = worker.detach()
    client_sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    client_sock.settimeout(None)
    for s in (client_sock, worker_sock):
        _nodelay(s)
        s.setblocking(False)
    c_reader, c_writer = await asyncio.open_connection(sock=client_sock)
    w_reader, w_writer = await asyncio.open_connection(sock=worker_sock)
    try:
        while await _pipe(c_reader, w_writer) and await _pipe(w_reader, c_writer):
            pass
    finally:
        w_writer.write(_HEADER.pack(0))  # the echo worker exits on a zero length
        for w in (w_writer, c_writer):
            try:
                await w.drain()
            except OSError:
                pass
            w.close()
    return 0


def serve(port: int) -> int:
    """The relay's side: start an echo worker, connect to ``127.0.0.1:port``, relay frames
    both ways until the client sends a zero length, then stop the worker."""
    worker = EchoPeer()
    try:
        return asyncio.run(_relay(port, worker))
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
