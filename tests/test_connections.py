"""Connections and file descriptors (issue 13): a master at a low open-file limit does not spin
when it runs out of descriptors; idle unauthenticated sockets do not keep clients out; workers
leave the clients' reserve; a worker refused with ``busy`` retries and joins.

Every fault is real: an ``rtpool master`` subprocess started with a low ``RLIMIT_NOFILE``,
hundreds of real idle sockets, real worker processes.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, List

import pytest

import rtpool
import tasks
from conftest import MasterProcess, attach_master, close_master, start_master
from helpers import stop_process, wait_until, worker_env
from rtpool import _dial
from rtpool.errors import MasterBusy

TICKS = os.sysconf("SC_CLK_TCK")


def _start_low_nofile_master(tmp_path: Path, nofile: int, args: List[str]) -> MasterProcess:
    """A master whose soft AND hard open-file limits are ``nofile``: it cannot raise past it."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    data_dir = tmp_path / "data"
    log = tmp_path / "master.log"
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(data_dir), "--log-level", "info", *args]
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            preexec_fn=limit,
        )
    return attach_master(proc, data_dir, log)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _open_idle(host_port, count: int, source: str = "127.0.0.1") -> List[socket.socket]:
    """``count`` connected sockets that never send a byte (bounded: one short timeout each)."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(2.0)
        s.bind((source, 0))
        try:
            s.connect(host_port)
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


def _hello(m: MasterProcess, role: str = "client", busy_timeout: float = 0.0, slots: int = 0):
    token = m.client_token if role == "client" else m.worker_token
    sock, welcome, _, _ = _dial.connect(
        m.address,
        role=role,
        token=token,
        name=f"test-{role}",
        slots=slots,
        timeout=10.0,
        busy_timeout=busy_timeout,
    )
    return sock, welcome


@pytest.fixture
def many_fds() -> None:
    """This test process opens ~1,100 sockets: its soft limit raised to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"needs an open-file hard limit of 2048 or more, have {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="defaults"),
        # Limits above the open-file limit, handshakes that do not time out: accept runs out of
        # descriptors for sure, and stays out while the measurement runs.
        pytest.param(
            [
                "--max-connections=4000",
                "--max-unauthenticated=4000",
                "--max-unauthenticated-per-host=4000",
                "--handshake-timeout-ms=60000",
            ],
            id="emfile",
        ),
    ],
)
def test_out_of_descriptors_the_master_does_not_spin_and_recovers(tmp_path, many_fds, args):
    m = _start_low_nofile_master(tmp_path, 1024, args)
    try:
        with ExitStack() as stack:
            idle = _open_idle(m.host_port, 1100)
            for s in idle:
                stack.callback(s.close)
            assert len(idle) > 1024, f"only {len(idle)} sockets connected"
            # CPU over a 3 s window while the idle sockets hold the master's descriptors.
            cpu0, t0 = _cpu_seconds(m.proc.pid), time.monotonic()
            time.sleep(3.0)
            cpu = (_cpu_seconds(m.proc.pid) - cpu0) / (time.monotonic() - t0)
            lines = m.log_text().splitlines()
            assert cpu < 0.2, f"master used {cpu:.0%} of a core with {len(idle)} idle sockets"
            assert len(lines) < 60, f"{len(lines)} log lines; last: {lines[-3:]}"
            if "emfile" in str(args):
                assert any("accept failed" in line for line in lines), lines[-5:]
        # The idle sockets are closed: a new client gets in (it retries `busy` on its own).
        sock, welcome = _hello(m, busy_timeout=20.0)
        sock.close()
        assert welcome.session > 0
        assert "open-file limit 1024" in m.log_text()
    finally:
        close_master(m)


def test_idle_unauthenticated_sockets_do_not_keep_clients_out(tmp_path, many_fds):
    m = start_master(tmp_path, args=["--max-connections", "256"])
    try:
        with ExitStack() as stack:
            # From another loopback address than the clients': the per-address handshake
            # budget is what keeps them from taking every place.
            idle = _open_idle(m.host_port, 300, source="127.0.0.2")
            for s in idle:
                stack.callback(s.close)
            assert len(idle) == 300
            refused = []
            for i in range(40):
                try:
                    sock, _ = _hello(m)  # no busy retry: any refusal counts
                    sock.close()
                except MasterBusy as exc:
                    refused.append(f"{i}: {exc}")
            assert refused == [], f"{len(refused)} of 40 clients refused: {refused[:3]}"
            # The idle sockets beyond the per-address budget were told why.
            answered = 0
            for s in idle:
                s.settimeout(0.05)
                try:
                    answered += b"busy" in s.recv(4096)
                except OSError:
                    pass
            assert answered > 0
        assert "max_unauthenticated_per_host" in m.log_text()
    finally:
        close_master(m)


def test_workers_cannot_take_the_clients_reserve(tmp_path):
    # At the defaults, 16 of 64 places are kept for clients.
    m = start_master(tmp_path, args=["--max-connections", "64"])
    held = []
    try:
        for _ in range(48):
            held.append(_hello(m, role="worker", slots=1)[0])
        with pytest.raises(MasterBusy, match="--client-reserve"):
            _hello(m, role="worker", slots=1)
        for _ in range(16):
            held.append(_hello(m)[0])
        with pytest.raises(MasterBusy, match="--max-connections"):
            _hello(m)
    finally:
        for s in held:
            s.close()
        close_master(m)


def test_a_worker_started_against_a_busy_master_retries_and_joins(tmp_path):
    m = start_master(tmp_path, args=["--max-connections", "3"])
    held = [_hello(m, role="worker", slots=1)[0] for _ in range(3)]
    log = tmp_path / "worker.log"
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address]
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(m.worker_token),
            start_new_session=True,
        )
    client = None
    try:
        refused: Callable[[], bool] = lambda: "refus" in m.log_text()  # noqa: E731
        wait_until(refused, timeout=20)
        # Refused with `busy`: the worker keeps trying instead of exiting.
        assert worker.poll() is None, log.read_text()
        held.pop().close()  # a place frees: the waiting worker takes it
        wait_until(lambda: "Worker" in m.log_text().split("refus", 1)[1], timeout=30)
        held.pop().close()  # and one for the client
        client = rtpool.Client(m.address, m.client_token)
        assert client.submit(tasks.square, 7).result(timeout=60) == 49
        assert worker.poll() is None
    finally:
        if client is not None:
            client.close()
        for s in held:
            s.close()
        stop_process(worker, group=True)
        close_master(m)


def _count_answered(socks: List[socket.socket], answers: List[bytes]) -> int:
    """Read what the master sent each idle socket that has not answered yet (without waiting);
    ``answers[i]`` collects socket ``i``'s bytes. Returns how many got a ``busy`` answer."""
    import select

    readable, _, _ = select.select(socks, [], [], 0)
    for s in readable:
        i = socks.index(s)
        try:
            answers[i] += s.recv(4096) or b"<eof>"
        except OSError:
            answers[i] += b"<reset>"
    return sum(b"busy" in a for a in answers)


def test_idle_sockets_from_many_addresses_do_not_keep_a_client_out(tmp_path):
    """A handshake flood from many addresses (4 idle sockets each, under the per-address limit)
    fills every handshake place; a new client evicts the oldest idle one instead of waiting for
    the handshake timeout (30 s here, longer than the client's 10 s connect timeout)."""
    m = start_master(
        tmp_path,
        args=[
            "--max-unauthenticated=16",
            "--max-unauthenticated-per-host=4",
            "--handshake-timeout-ms=30000",
        ],
    )
    log = tmp_path / "worker.log"
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address, "--procs", "1"]
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(m.worker_token),
            start_new_session=True,
        )
    client = None
    try:
        wait_until(lambda: "role=Worker" in m.log_text(), timeout=30)
        with ExitStack() as stack:
            idle: List[socket.socket] = []
            for h in range(30):  # 127.1.0.1 .. 127.1.0.30: no root needed on loopback
                idle += _open_idle(m.host_port, 4, source=f"127.1.0.{h + 1}")
            for s in idle:
                stack.callback(s.close)
            assert len(idle) == 120
            # Every socket past the 16 handshake places is answered `busy` (refused before,
            # evicted now): the 16 newest hold every place.
            answers = [b""] * len(idle)
            wait_until(lambda: _count_answered(idle, answers) >= len(idle) - 16, timeout=20)
            t0 = time.monotonic()
            client = rtpool.Client(m.address, m.client_token, connect_timeout=10.0)
            connected_s = time.monotonic() - t0
            assert client.submit(tasks.square, 7).result(timeout=30) == 49
            # Connected long before the idle sockets' 30 s handshake timeout would have freed
            # a place (the connect timeout is 10 s).
            assert connected_s < 10.0
            evicted = [a for a in answers if b"busy" in a]
            assert all(b"evicted" in a for a in evicted), evicted[:2]
            # Counted in the status snapshot (and `/metrics`: rtpool_connection_refusals_total);
            # a snapshot may be reused for 0.5 s.
            evictions = lambda: client.status()["connection_refusals"]["handshake_evicted"]  # noqa: E731
            wait_until(lambda: evictions() >= len(evicted), timeout=10)
        text = m.log_text()
        assert "evicted 127.1.0." in text, text[-2000:]
        # Rate-limited: one line for the first eviction, not one per eviction.
        assert text.count("silent in its handshake") < 5
    finally:
        if client is not None:
            client.close()
        stop_process(worker, group=True)
        close_master(m)
