"""Liveness both ways (issue 13): a worker or a client whose path to the master is cut notices
within a bound and reconnects as soon as the path is back; nothing is lost or duplicated.

The cut is real from the peer's side: its connection goes through a TCP relay (``relay.py``)
that, when cut, stops forwarding in both directions without closing anything (a blackhole:
the peer's sends are accepted, nothing comes back), and takes new connections without
forwarding them either.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from fakemaster import FakeMaster
from helpers import stop_process, wait_until, worker_env
from relay import Relay
from rtpool import _protocol as P


@pytest.fixture
def leased_master(tmp_path):
    m = start_master(tmp_path, args=["--lease-ms", "1000"])
    yield m
    close_master(m)


def test_a_cut_off_worker_notices_and_rejoins_when_the_path_is_back(tmp_path, leased_master):
    m = leased_master
    relay = Relay(m.host_port)
    log = tmp_path / "worker.log"
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", relay.address]
    cmd += ["--reconnect-timeout", "60"]
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(m.worker_token),
            start_new_session=True,
        )
    client = rtpool.Client(m.address, m.client_token)  # the client's path is not cut
    try:
        assert client.submit(tasks.square, 3).result(timeout=60) == 9
        relay.cut.set()
        cut_at = time.monotonic()
        # Silence allowed: 3 leases + a heartbeat = 3.3 s; the bound leaves room for a busy VM.
        wait_until(lambda: "no word from the master" in log.read_text(), timeout=10)
        noticed_s = time.monotonic() - cut_at
        futures = [client.submit(tasks.square, x) for x in range(10)]
        # A while cut: the reconnection attempts go nowhere.
        wait_until(lambda: "reconnection attempt 2 failed" in log.read_text(), timeout=30)
        assert "reconnected" not in log.read_text()
        relay.cut.clear()
        restored_at = time.monotonic()
        wait_until(lambda: "reconnected to the master" in log.read_text(), timeout=15)
        rejoin_s = time.monotonic() - restored_at
        assert [f.result(timeout=60) for f in futures] == [x * x for x in range(10)]
        assert worker.poll() is None, log.read_text()
        print(f"cut noticed after {noticed_s:.2f} s, rejoined {rejoin_s:.2f} s after restore")
    finally:
        client.close()
        stop_process(worker, group=True)
        relay.close()


def test_a_cut_off_client_notices_reconnects_and_gets_every_result_once(tmp_path, leased_master):
    m = leased_master
    relay = Relay(m.host_port)
    runs = tmp_path / "runs.txt"
    with open(tmp_path / "worker.log", "ab") as out:
        worker = subprocess.Popen(  # the worker's path is not cut
            [sys.executable, "-m", "rtpool", "worker", "--master", m.address, "--procs", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(m.worker_token),
            start_new_session=True,
        )
    client = rtpool.Client(relay.address, m.client_token, connect_timeout=2)
    conn = client._conn
    try:
        assert client.submit(tasks.square, 3).result(timeout=60) == 9
        # Liveness needs a master that answers heartbeats: wait for the first answer.
        wait_until(lambda: getattr(conn, "_master_answers", True), timeout=10)
        before = [client.submit(tasks.logged, x, str(runs), 0.2) for x in range(10)]
        # All 10 accepted by the master before the cut (else they wait in the relay).
        wait_until(lambda: not conn._by_req, timeout=10)
        relay.cut.set()
        cut_at = time.monotonic()
        # Silence allowed: 3 leases + a heartbeat = 4 s; the bound leaves room for a busy VM.
        wait_until(lambda: getattr(conn, "_silent", None) is not None, timeout=15)
        noticed_s = time.monotonic() - cut_at
        during = [client.submit(tasks.logged, x, str(runs)) for x in range(10, 15)]
        # The master keeps running the tasks meanwhile: its results wait for the client.
        wait_until(lambda: len(runs.read_text().split()) >= 10 if runs.exists() else False, 30)
        assert conn.reconnects == 0
        relay.cut.clear()
        restored_at = time.monotonic()
        wait_until(lambda: conn.reconnects >= 1, timeout=15)
        rejoin_s = time.monotonic() - restored_at
        results = [f.result(timeout=60)[0] for f in before + during]
        assert results == list(range(15))
        ran = sorted(int(x) for x in runs.read_text().split())
        assert ran == list(range(15)), "each task runs exactly once"
        print(f"client: cut noticed after {noticed_s:.2f} s, rejoined {rejoin_s:.2f} s after")
    finally:
        client.close()
        stop_process(worker, group=True)
        relay.close()


def test_a_large_submit_that_holds_the_socket_is_not_taken_for_a_silent_master():
    # The master (a scripted one: lease 0.3 s, heartbeats every 0.1 s, so 0.9 s of patience)
    # answers heartbeats, then takes the client's 8 MB SUBMIT through a slow link (a 64 KiB
    # receive window read every 50 ms: ~2.5 MB/s): for ~3 s the heartbeats behind it are not
    # even acknowledged, so no answer can be expected.
    with FakeMaster(heartbeat_ms=100) as fake:
        fake.lease_ms = 300
        fake.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        client = rtpool.Client(fake.address, "tok")
        conn = client._conn
        master = fake.accept()
        try:
            assert master.recv_kind(P.HEARTBEAT, skip=())[0] == P.HEARTBEAT
            master.send(P.HEARTBEAT)
            wait_until(lambda: conn._master_answers, timeout=5)
            sender = threading.Thread(target=client.submit, args=(tasks.echo, b"x" * 8_000_000))
            sender.start()
            msgs: list = []
            end = time.monotonic() + 30
            while not any(m[0] == P.SUBMIT for m in msgs) and time.monotonic() < end:
                data = master.sock.recv(256 * 1024)
                assert data, "the client dropped the connection"
                msgs += master.reader.feed(data)
                time.sleep(0.05)  # the slow link: the fault injected
            assert any(m[0] == P.SUBMIT for m in msgs), "the SUBMIT did not arrive in 30 s"
            sender.join(5)
            # Answer every heartbeat for two patience periods more: the connection stays.
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                msg = master.recv(timeout=5)
                assert msg is not None, "the client dropped the connection"
                if msg[0] == P.HEARTBEAT:
                    master.send(P.HEARTBEAT)
            assert conn._silent is None and conn.reconnects == 0
        finally:
            master.close()
            client.close()
