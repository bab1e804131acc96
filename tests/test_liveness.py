"""Liveness both ways (issue 13): a worker whose path to the master is cut notices within a
bound and reconnects as soon as the path is back; nothing is lost or duplicated.

The cut is real from the worker's side: its connection goes through a TCP relay of this test
that, when cut, stops forwarding in both directions without closing anything (a blackhole:
the worker's sends are accepted, nothing comes back), and takes new connections without
forwarding them either.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import threading
import time
from typing import List

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env


class Relay:
    """A TCP relay to ``upstream`` on an ephemeral loopback port, which can be cut and restored."""

    def __init__(self, upstream) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = threading.Event()
        self.closing = threading.Event()
        self.threads: List[threading.Thread] = []
        self._spawn(self._accept_loop)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept_loop(self) -> None:
        self.listener.settimeout(0.1)
        while not self.closing.is_set():
            try:
                down, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._spawn(self._pump, down)

    def _pump(self, down: socket.socket) -> None:
        # Hold a connection made during a cut until the path is back (or the relay closes).
        while self.cut.is_set() and not self.closing.is_set():
            time.sleep(0.02)
        try:
            up = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            down.close()
            return
        peers = {down: up, up: down}
        try:
            while not self.closing.is_set():
                if self.cut.is_set():
                    time.sleep(0.02)  # blackhole: read nothing, write nothing, close nothing
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            down.close()
            up.close()

    def close(self) -> None:
        self.closing.set()
        self.listener.close()
        for t in self.threads:
            t.join(timeout=5)


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
