"""Fast failover, client side (issue 28): with several master addresses a silent one (a
"blackhole": a socket that accepts but never answers, as a cut path or a frozen host looks
to a new connection) costs a pass about a second, not the connect timeout, so a client still
reconnects within a reconnect budget shorter than that timeout; and a new ``Client`` given
several addresses retries a first connection that met no master (a failover under way)
within ``reconnect_timeout`` instead of failing at once.

Each test can fail without timing: the old pacing (every address waited the full
``connect_timeout``, the first connect tried once) spends the whole budget on the blackhole
or raises.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 60.0


class Blackhole:
    """A listening socket whose connections are accepted (so TCP connects) and never
    answered; it counts them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        for c in self.accepted:
            c.close()


@pytest.fixture
def blackhole():
    b = Blackhole()
    try:
        yield b
    finally:
        b.close()


def test_a_silent_address_does_not_spend_the_reconnect_budget(tmp_path: Path, blackhole):
    a = start_master(tmp_path, args=["--fsync", "always"], log_name="a.log")
    started = [a]
    # The connect timeout (30 s) is far above the reconnect budget (8 s): a pass that waited
    # it on the blackhole could never reconnect in time.
    client = rtpool.Client(
        f"{a.address},{blackhole.address}",
        a.client_token,
        connect_timeout=30,
        reconnect_timeout=8,
    )
    worker = None
    try:
        assert client.address == a.address
        pending = client.submit(tasks.sleep_return, "after", 0.0)  # no worker yet: pending
        a.proc.send_signal(signal.SIGKILL)  # by PID
        a.proc.wait(TIMEOUT_S)
        # The client's pass: A refused, then the blackhole, where it waits now.
        wait_until(lambda: blackhole.accepted, TIMEOUT_S)
        b = start_master(tmp_path, data_dir=a.data_dir, listen=a.address, log_name="a2.log")
        started.append(b)
        wait_until(lambda: client.reconnects == 1, TIMEOUT_S)
        assert client.address == a.address
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", b.address, "--procs", "1"]
        with open(tmp_path / "w.log", "wb") as log:
            worker = subprocess.Popen(
                cmd,
                env=worker_env(b.worker_token),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        assert pending.result(TIMEOUT_S) == "after"  # re-attached, then run
    finally:
        client.close()
        if worker is not None:
            stop_process(worker, group=True)
        for m in started:
            close_master(m)


def test_a_new_client_with_several_addresses_waits_for_a_master_within_reconnect_timeout(
    tmp_path: Path, blackhole
):
    first = start_master(tmp_path)  # makes the data dir's tokens; then gone: refused
    token, address = first.client_token, first.address
    close_master(first)
    holder: dict = {}

    def start_later() -> None:
        wait_until(lambda: blackhole.accepted, TIMEOUT_S)  # the client's first pass is on
        holder["m"] = start_master(tmp_path, data_dir=first.data_dir, listen=address)

    t = threading.Thread(target=start_later)
    t.start()
    client = None
    try:
        client = rtpool.Client(f"{address},{blackhole.address}", token, reconnect_timeout=30)
        assert client.address == address
        assert client.status(TIMEOUT_S)["master"]["address"] == address
    finally:
        t.join(TIMEOUT_S)
        if client is not None:
            client.close()
        if "m" in holder:
            close_master(holder["m"])


def test_a_new_client_with_one_address_still_fails_at_once(tmp_path: Path):
    port = socket.create_server(("127.0.0.1", 0))
    free = f"127.0.0.1:{port.getsockname()[1]}"
    port.close()
    with pytest.raises(rtpool.errors.ConnectError, match="connection refused"):
        rtpool.Client(free, "t" * 32, reconnect_timeout=30)
