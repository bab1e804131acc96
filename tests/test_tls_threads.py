"""One TLS connection used by several threads at once (issue 12, item 7): the client's reader
thread reads results while submitting threads, the heartbeat thread and the reader itself
(``ACK``) write. OpenSSL allows one call on a connection at a time; without a lock, a write
racing a read garbles records (the master sees "bad record mac" and drops the connection).

Hammered over real TLS against a real master (``--tls-self-signed``): concurrent submitters
while results stream back, and the raw socket layer against a TLS echo server.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
import threading
from pathlib import Path

import rtpool
from helpers import stop_process, worker_env
from rtpool._frame import recv_some
from rtpool._tls_socket import LockedTlsSocket
from test_tls import TlsMaster, tls_master  # noqa: F401  (the fixture)

THREADS = 6
ROUNDS = 60
PER_ROUND = 25
PAYLOAD = 3000  # bytes each way per task: TLS records in both directions at once


def test_concurrent_submitters_share_one_tls_connection(
    tls_master: TlsMaster,  # noqa: F811
    tmp_path: Path,
) -> None:
    import tasks

    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", tls_master.address]
    cmd += ["--procs", "2", "--ca-file", str(tls_master.cert)]
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(
            cmd,
            env=worker_env(tls_master.worker_token),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    client = rtpool.Client(tls_master.address, tls_master.client_token, ca_file=tls_master.cert)
    errors: list = []

    def hammer(k: int) -> None:
        try:
            for r in range(ROUNDS):
                base = (k * ROUNDS + r) * PER_ROUND
                xs = [bytes([k]) * PAYLOAD + b"%d" % i for i in range(base, base + PER_ROUND)]
                got = list(client.map(tasks.echo, xs, timeout=60))
                if got != [((x,), {}) for x in xs]:
                    errors.append(f"thread {k} round {r}: wrong results")
                    return
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: {exc!r}")

    try:
        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a submitter hung"
        assert not errors, errors[:3]
        # Results are recovered by reconnecting; the connection must not have broken at all.
        assert client.reconnects == 0, tls_master.log_text()[-3000:]
        assert "bad record mac" not in tls_master.log_text().lower()
    finally:
        client.close()
        stop_process(worker, group=True)


def test_the_locked_socket_survives_concurrent_writers_and_a_reader(tmp_path: Path) -> None:
    # A TLS echo server. On each of CONNECTIONS fresh connections, 3 writer threads send
    # framed messages (serialized among themselves, as rtpool's send lock does) while a reader
    # thread reads the echoes back, from the first byte on: the reader's first SSL_read also
    # handles the server's TLS 1.3 session tickets, the likeliest moment for a race. With a
    # bare ssl.SSLSocket about 5 in 100 such connections break ("bad record mac", garbled
    # frames) on CPython 3.11 / OpenSSL 3.
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(tmp_path / "key.pem"),
            "-out",
            str(tmp_path / "cert.pem"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server_errors: list = []

    def echo(conn: socket.socket) -> None:
        try:
            with sctx.wrap_socket(conn, server_side=True) as s:
                while data := s.recv(1 << 16):
                    s.sendall(data)
        except (OSError, ssl.SSLError) as exc:
            server_errors.append(repr(exc))
        finally:
            conn.close()

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    cctx = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    cctx.check_hostname = False
    broken = []
    try:
        for c in range(CONNECTIONS):
            raw = cctx.wrap_socket(socket.create_connection(server.getsockname()))
            sock = LockedTlsSocket(raw)
            try:
                # Half the readers as rtpool's (recv_into, through recv_some), half with recv.
                problem = _hammer(sock, writers=3, per_writer=100, reuse_buffer=c % 2 == 1)
            finally:
                sock.close()
            if problem:
                broken.append(f"connection {c}: {problem}")
    finally:
        server.close()
    assert not broken and not server_errors, (broken[:3], server_errors[:3])


CONNECTIONS = 60


def _hammer(sock: LockedTlsSocket, writers: int, per_writer: int, reuse_buffer: bool) -> str | None:
    """Concurrent writers and one reader on ``sock``; the first problem seen, or None."""
    send_lock = threading.Lock()
    problems: list = []
    expected = writers * per_writer
    received = [0]

    def write(k: int) -> None:
        try:
            for i in range(per_writer):
                body = bytes([k]) * (1 + (i * 37) % 3000)
                with send_lock:
                    sock.sendall(struct.pack(">I", len(body)) + body)
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"writer {k}: {exc!r}")

    def read() -> None:
        buf = bytearray()
        chunk = bytearray(1 << 16)
        try:
            while received[0] < expected:
                data = recv_some(sock, chunk) if reuse_buffer else sock.recv(1 << 16)
                if not data:
                    problems.append("end of stream")
                    return
                buf += data
                while len(buf) >= 4:
                    n = struct.unpack_from(">I", buf)[0]
                    if n > 3000:
                        problems.append(f"garbled length {n}")
                        return
                    if len(buf) < 4 + n:
                        break
                    if buf[4 : 4 + n] != bytes([buf[4]]) * n:
                        problems.append("garbled body")
                        return
                    del buf[: 4 + n]
                    received[0] += 1
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"reader: {exc!r}")

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if problems:  # a broken connection: unblock the reader
        sock.shutdown(socket.SHUT_RDWR)
    reader.join(30)
    if reader.is_alive():
        sock.shutdown(socket.SHUT_RDWR)
        reader.join(10)
        return "the reader hung"
    if problems:
        return problems[0]
    return None if received[0] == expected else f"{received[0]} of {expected} echoes"
