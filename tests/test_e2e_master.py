"""End to end against an `rtpool master` subprocess: authentication, hostile frames,
connection loss, and the `rtpool worker` command."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess

import psutil
import pytest

import rtpool
import tasks
from helpers import wait_until
from rtpool import _protocol as P
from rtpool._dial import connect
from rtpool.errors import AuthenticationError, ConnectionLost


def raw_hello(master, role: str, token: str) -> socket.socket:
    sock = socket.create_connection(master.host_port, timeout=10)
    sock.sendall(
        P.encode(P.HELLO, P.PROTOCOL_VERSION, role, token, "raw-test", 1 if role == "worker" else 0)
    )
    return sock


def read_until_eof(sock: socket.socket, max_frame: int = P.DEFAULT_MAX_FRAME) -> list:
    reader = P.FrameReader(max_frame)
    msgs = []
    while True:
        data = sock.recv(65536)
        if not data:
            return msgs
        msgs += reader.feed(data)


def authenticated(master) -> socket.socket:
    sock = raw_hello(master, "client", master.client_token)
    reader = P.FrameReader()
    msgs = []
    while not msgs:
        msgs = reader.feed(sock.recv(65536))
    assert msgs[0][0] == P.WELCOME, msgs
    return sock


@pytest.fixture
def served(master, workers, client_factory):
    """A worker and a client that must keep working while other connections misbehave."""
    workers.start(procs=1)
    client = client_factory()
    assert client.submit(tasks.square, 2).result(30) == 4
    return client


def assert_still_serving(master, client_factory, served) -> None:
    assert served.submit(tasks.square, 5).result(30) == 25
    assert client_factory().submit(tasks.square, 6).result(30) == 36
    assert master.proc.poll() is None


def test_wrong_token_is_refused(master, client_factory, served):
    with pytest.raises(AuthenticationError, match="refused the client token"):
        rtpool.Client(master.address, "not-the-token")
    assert_still_serving(master, client_factory, served)


def test_worker_token_cannot_connect_a_client(master, client_factory, served):
    with pytest.raises(AuthenticationError, match="refused the client token"):
        rtpool.Client(master.address, master.worker_token)
    with raw_hello(master, "client", master.worker_token) as sock:
        msgs = read_until_eof(sock)
    assert [m[:2] for m in msgs] == [[P.ERROR, "auth"]]
    assert_still_serving(master, client_factory, served)


def test_client_token_cannot_connect_a_worker(master, client_factory, served):
    with pytest.raises(AuthenticationError, match="refused the worker token"):
        connect(
            master.address,
            role="worker",
            token=master.client_token,
            name="x",
            slots=1,
            timeout=10,
        )
    with raw_hello(master, "worker", master.client_token) as sock:
        msgs = read_until_eof(sock)
    assert [m[:2] for m in msgs] == [[P.ERROR, "auth"]]
    assert msgs[0][2]  # a message for humans
    assert_still_serving(master, client_factory, served)


def test_malformed_frame_after_auth_closes_only_that_connection(master, client_factory, served):
    with authenticated(master) as sock:
        sock.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
        msgs = read_until_eof(sock)
    assert [m[:2] for m in msgs] == [[P.ERROR, "malformed"]]
    assert_still_serving(master, client_factory, served)


def test_wrong_field_count_is_malformed(master, client_factory, served):
    with authenticated(master) as sock:
        sock.sendall(P.encode(P.STATUS, 1, 2, 3))  # one field too many
        assert [m[:2] for m in read_until_eof(sock)] == [[P.ERROR, "malformed"]]
    assert_still_serving(master, client_factory, served)


def test_worker_message_from_a_client_is_unknown_kind(master, client_factory, served):
    with authenticated(master) as sock:
        sock.sendall(P.encode(P.PULL, 5))
        assert [m[:2] for m in read_until_eof(sock)] == [[P.ERROR, "unknown_kind"]]
    assert_still_serving(master, client_factory, served)


@pytest.mark.parametrize("after_auth", [False, True])
def test_oversized_length_prefix_is_refused(master, client_factory, served, after_auth):
    if after_auth:
        sock = authenticated(master)
        prefix = struct.pack(">I", served.max_frame_bytes + 1)
    else:
        sock = socket.create_connection(master.host_port, timeout=10)
        prefix = struct.pack(">I", P.PRE_AUTH_MAX_FRAME + 1)
    with sock:
        sock.sendall(prefix)  # no body: the master must not wait for it
        assert [m[:2] for m in read_until_eof(sock)] == [[P.ERROR, "too_large"]]
    assert_still_serving(master, client_factory, served)


def test_rejected_submit_keeps_the_connection(master, served):
    with authenticated(master) as sock:
        _rejected_submits(sock)


def _rejected_submits(sock):
    fn_hash, code = rtpool._serialize.serialize_function(tasks.square)
    sock.sendall(P.encode(P.SUBMIT, 7, fn_hash, code, {"bogus": 1}, [b"x"]))
    sock.sendall(P.encode(P.SUBMIT, 8, fn_hash, code, {}, []))  # empty package
    sock.sendall(P.encode(P.SUBMIT, 9, b"\x00" * 32, code, {}, [b"x"]))  # hash mismatch
    reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
    msgs = []
    while len(msgs) < 3:
        msgs += reader.feed(sock.recv(65536))
    assert sorted((m[0], m[1], m[3]) for m in msgs) == [
        (P.ERROR, "rejected", 7),
        (P.ERROR, "rejected", 8),
        (P.ERROR, "rejected", 9),
    ]
    sock.sendall(P.encode(P.STATUS, 10, 999_999))  # still open: an answer comes
    while len(msgs) < 4:
        msgs += reader.feed(sock.recv(65536))
    assert msgs[3][:2] == [P.ERROR, "unknown_package"]


def test_master_death_fails_pending_futures_and_stops_workers(master, workers, client_factory):
    worker = workers.start(2, "--reconnect-timeout", "1")
    client = client_factory(reconnect_timeout=0.5)  # then it gives up reconnecting
    pkg = client.submit_many(tasks.sleep_return, [(i, 0.05) for i in range(200)], star=True)
    wait_until(lambda: any(f.done() for f in pkg), timeout=30)
    master.proc.send_signal(signal.SIGKILL)
    with pytest.raises(ConnectionLost, match="Check that the master is running") as info:
        pkg.results(30)
    assert master.address in str(info.value)
    assert worker.wait(30) == 3  # the workers exit when they cannot reconnect within 1 s


def test_worker_with_a_wrong_token_exits_with_a_message(master, workers):
    proc = workers.start(procs=1, token="wrong-token")
    assert proc.wait(30) == 2
    assert "refused the worker token" in workers.log_text(0)


def test_worker_sigterm_when_idle_exits_cleanly(master, workers, client_factory):
    proc = workers.start(procs=2)
    client = client_factory()
    assert len({pid for _, pid in client.map(tasks.pid_of, range(50))}) >= 1
    children = psutil.Process(proc.pid).children()
    assert len(children) == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    for child in children:
        wait_until(lambda c=child: not c.is_running(), timeout=5)


def test_worker_processes_share_a_package(master, workers, client_factory):
    workers.start(procs=2)
    client = client_factory()
    results = client.submit_many(tasks.pid_of, [(i, 0.005) for i in range(200)], star=True)
    pids = {pid for _, pid in results.results(60)}
    assert len(pids) == 2


def test_missing_module_on_the_worker_is_named(
    master, workers, client_factory, tmp_path, monkeypatch
):
    (tmp_path / "client_only_mod.py").write_text("def f(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import client_only_mod

    workers.start(procs=1)  # its PYTHONPATH has the tests, not tmp_path
    client = client_factory()
    with pytest.raises(ModuleNotFoundError, match="install module 'client_only_mod' on the worker"):
        client.submit(client_only_mod.f, 1).result(30)
    assert client.submit(tasks.square, 3).result(30) == 9  # the worker lives on


def test_supervisor_restarts_a_crashed_child(master, workers, client_factory):
    proc = workers.start(procs=1)
    client = client_factory()
    (_, first_pid) = client.submit(tasks.pid_of, 0).result(30)
    assert psutil.Process(first_pid).ppid() == proc.pid
    psutil.Process(first_pid).kill()
    # The supervisor forks a new child, which connects and takes the next tasks.
    results = client.submit_many(tasks.pid_of, range(20)).results(30)
    pids = {pid for _, pid in results}
    assert first_pid not in pids and len(pids) == 1
    assert psutil.Process(pids.pop()).ppid() == proc.pid
    assert "died (killed by signal 9 (SIGKILL)); restarting it" in workers.log_text(0)


def test_second_sigterm_exits_at_once(master, workers, client_factory, tmp_path):
    log = tmp_path / "runs"
    proc = workers.start(procs=1)
    client = client_factory()
    fut = client.submit(tasks.logged, 1, str(log), 60.0)
    wait_until(lambda: log.exists(), timeout=30)
    proc.send_signal(signal.SIGTERM)  # graceful: would wait for the 60 s task
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert not fut.done()  # the master requeues it; no worker is left to run it
