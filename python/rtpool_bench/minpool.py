"""The payload bench's two comparators: a minimal asyncio pickle pool and a raw 2-hop relay.

Issue 25 measured a 60-line asyncio pool beating rtpool at 64 KiB; this is that pool, run in
the same bench and interleaved with rtpool's variants so each size is compared within one run:

* **minimal pool**: the client pickles ``(echo, (payload,))`` (protocol 5, in band) into a
  length-prefixed frame with an 8-byte task id; an asyncio **master** process hands each task
  to an idle **worker** process and the result back to the client that sent it; the worker
  unpickles, calls, pickles the result. No scheduler, no retries, no acks: the least a Python
  pool with a separate master does.
* **raw relay**: the same master, and a worker that echoes each frame's body unchanged (no
  pickling): client -> asyncio relay -> echo worker and back, two hops each way. rtpool's
  topology, with no work in between.

Frames: ``>IQ`` (body length, task id), then the body. The master is this file run as a script
(``python minpool.py MODE WORKERS``; it prints its port, starts ``WORKERS`` worker processes
running :func:`_work`, and exits when stdin closes), so the parent stops it by closing a pipe,
and by PID in :meth:`MinimalPool.close` whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
from typing import Any, List

_HEAD = struct.Struct(">IQ")


def echo(payload: Any) -> Any:
    """The minimal pool's task: return ``payload`` (rtpool_bench.tasks.echo's twin, here so the
    worker imports nothing of rtpool)."""
    return payload


# --- the master (an asyncio process) -------------------------------------------------------


async def _master(mode: str, workers: int) -> None:
    idle: asyncio.Queue = asyncio.Queue()
    clients: dict = {}  # task id -> the writer of the client that sent it

    async def on_worker(reader, writer) -> None:
        while True:
            await idle.put(writer)
            head = await reader.readexactly(_HEAD.size)
            n, task = _HEAD.unpack(head)
            body = await reader.readexactly(n)
            out = clients.pop(task)
            out.write(head + body)  # one write, as a minimal pool would

    async def on_client(reader, writer) -> None:
        while True:
            head = await reader.readexactly(_HEAD.size)
            n, task = _HEAD.unpack(head)
            body = await reader.readexactly(n)
            clients[task] = writer
            (await idle.get()).write(head + body)

    async def on_connect(reader, writer) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            role = await reader.readexactly(1)
            await (on_worker if role == b"w" else on_client)(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # a peer left, or the master stops

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, limit=1 << 26)
    port = server.sockets[0].getsockname()[1]
    here = os.path.abspath(__file__)
    procs = [
        subprocess.Popen([sys.executable, here, "worker", mode, str(port)]) for _ in range(workers)
    ]
    print(port, flush=True)
    try:
        # Stop when the parent closes our stdin (or dies).
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        server.close()
        for p in procs:
            p.kill()
            p.wait()


# --- the worker (blocking sockets: the cheapest Python loop) -------------------------------


def _recv_into(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def _work(mode: str, port: int) -> None:
    """Connect to the master; run (``pool``) or echo (``relay``) every task it sends."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"w")
    head = bytearray(_HEAD.size)
    while _recv_into(sock, memoryview(head)):
        n, task = _HEAD.unpack(head)
        body = bytearray(n)
        if not _recv_into(sock, memoryview(body)):
            return
        if mode == "pool":
            fn, args = pickle.loads(body)
            body = pickle.dumps(fn(*args), protocol=5)
        sock.sendall(_HEAD.pack(len(body), task) + body)


# --- the bench's side ----------------------------------------------------------------------


class MinimalPool:
    """A master process of ``mode`` (``pool`` or ``relay``) with its workers, and one client
    connection to it. ``roundtrip(payload)`` (pool) or ``roundtrip_frame(body)`` (relay)."""

    def __init__(self, mode: str, workers: int = 2, timeout_s: float = 15.0) -> None:
        self.mode = mode
        self._task = 0
        self._buf = bytearray(1 << 16)
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "master", mode, str(workers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            line = self._proc.stdout.readline()
            if not line.strip():
                raise RuntimeError(f"the minimal {mode} master exited before listening")
            self._sock = socket.create_connection(("127.0.0.1", int(line)), timeout=timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.settimeout(120.0)  # a bench's bound, not a speed figure
            self._sock.sendall(b"c")
        except BaseException:
            self.close()
            raise

    def _call(self, body: bytes) -> memoryview:
        self._task += 1
        self._sock.sendall(_HEAD.pack(len(body), self._task) + body)
        head = memoryview(self._buf)[: _HEAD.size]
        if not _recv_into(self._sock, head):
            raise ConnectionError(f"the minimal {self.mode} master closed the connection")
        n, task = _HEAD.unpack(head)
        if len(self._buf) < n:
            self._buf = bytearray(n)
        view = memoryview(self._buf)[:n]
        if task != self._task or not _recv_into(self._sock, view):
            raise ConnectionError(f"the minimal {self.mode} master sent a wrong reply")
        return view

    def roundtrip(self, payload: Any) -> tuple:
        """Pool: one echo task of ``payload``; (nanoseconds, the value it returned)."""
        t0 = time.perf_counter_ns()
        back = pickle.loads(self._call(pickle.dumps((echo, (payload,)), protocol=5)))
        return time.perf_counter_ns() - t0, back

    def roundtrip_frame(self, body: bytes) -> tuple:
        """Relay: one frame of ``body`` there and back; (nanoseconds, whether it came back
        equal)."""
        t0 = time.perf_counter_ns()
        view = self._call(body)
        elapsed = time.perf_counter_ns() - t0
        return elapsed, view == body

    def close(self) -> None:
        """Close the connection and the master's stdin; stop it by PID if it lingers."""
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()
        proc = self._proc
        try:
            proc.stdin.close()
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        proc.stdout.close()

    def __enter__(self) -> MinimalPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: List[str]) -> int:
    if argv[0] == "master":
        asyncio.run(_master(argv[1], int(argv[2])))
    else:
        _work(argv[1], int(argv[2]))
    return 0


if __name__ == "__main__":
    # The worker unpickles rtpool_bench.minpool.echo by name: make the package importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1:]))
