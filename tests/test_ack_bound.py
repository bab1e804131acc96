"""The per-client bound on results waiting for an acknowledgement, against a real master and
worker with a raw-protocol client that never sends ``ACK``: once it holds more than
``--max-unacked-mb`` of results it is closed with ``ERROR unacked_limit`` (it cannot make
the master hold ever more for it), and a client that re-attaches and acknowledges gets every
result back (nothing is lost)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import rtpool
import tasks
from conftest import Workers, close_master, start_master
from rtpool import _protocol as P
from rtpool._serialize import dumps_args, loads_result

RESULT_BYTES = 512 * 1024
TASKS = 40  # 20 MiB of results, against a 4 MiB bound


def _client(m) -> tuple[socket.socket, P.FrameReader]:
    sock = socket.create_connection(m.host_port, timeout=60)
    sock.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "client", m.client_token, "raw-no-ack", 0))
    reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
    msgs: list = []
    while not msgs:
        msgs = reader.feed(sock.recv(65536))
    assert msgs[0][0] == P.WELCOME, msgs
    return sock, reader


def _read_until_eof(sock: socket.socket, reader: P.FrameReader) -> list:
    msgs = []
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return msgs
        msgs += reader.feed(data)


def test_a_client_that_never_acks_is_closed_at_the_bound_and_a_reattach_recovers_all(
    tmp_path: Path,
) -> None:
    m = start_master(tmp_path, args=["--max-unacked-mb", "4"])
    workers = Workers(m, tmp_path)
    try:
        workers.start(procs=1)
        fn_hash, code = rtpool._serialize.serialize_function(tasks.apply)
        args = [dumps_args((bytes, RESULT_BYTES), None)] * TASKS
        sock, reader = _client(m)
        with sock:
            sock.sendall(P.encode_submit(1, fn_hash, code, {}, args))
            msgs = _read_until_eof(sock, reader)  # never ACKs; bounded by the master closing
        assert msgs[0][:2] == [P.ACCEPTED, 1], msgs[:1]
        package = msgs[0][2]
        got = [r for msg in msgs if msg[0] == P.RESULTS for r in msg[2]]
        errors = [msg for msg in msgs if msg[0] == P.ERROR]
        assert [e[1] for e in errors] == [P.ERR_UNACKED_LIMIT], errors
        assert "--max-unacked-mb" in errors[0][2] and "ATTACH" in errors[0][2], errors
        held = sum(len(r[2]) for r in got)
        assert 4 << 20 < held < TASKS * RESULT_BYTES, f"{len(got)} results, {held} bytes"

        # Nothing is lost: once the package is done (it kept running, detached), a client
        # that re-attaches gets all 40 in the resend, which the bound never judges.
        sock, reader = _client(m)
        seen: dict[int, bytes] = {}
        with sock:
            deadline = time.monotonic() + 60
            done = 0
            while done < TASKS:
                assert time.monotonic() < deadline, f"{done} of {TASKS} done after 60 s"
                sock.sendall(P.encode(P.STATUS, 100, package))
                replies: list = []
                while not replies:
                    replies = [r for r in reader.feed(sock.recv(65536)) if r[0] == P.STATUS_REPLY]
                done = replies[0][6]  # total, queued, running, done, ...
            sock.sendall(P.encode(P.ATTACH, 2, package))
            received = 0
            while len(seen) < TASKS:
                data = sock.recv(1 << 20)
                assert data, f"closed after {len(seen)} results"
                for msg in reader.feed(data):
                    if msg[0] == P.ERROR:
                        raise AssertionError(msg)
                    if msg[0] == P.RESULTS:
                        for r in msg[2]:
                            seen.setdefault(r[0], r[2])
                        received += len(msg[2])
                        sock.sendall(P.encode(P.ACK, package, received))
        assert sorted(seen) == list(range(TASKS))
        assert all(loads_result(v) == bytes(RESULT_BYTES) for v in seen.values())
    finally:
        workers.stop_all()
        close_master(m)
