"""Several master addresses (issue 28 item 3, client and worker side): a dead address gives
way to the next, a standby's ``not_leader`` points the client and the workers at the leader
it names, a deposed leader's ``not_leader`` on an open session too, one DNS name with several
records counts as several masters, and a bad address list is refused with the entry named.

The leader is a real ``rtpool master``; standbys and a deposed leader are played by
``fakemaster.FakeMaster`` (the HA master's own tests are elsewhere). The journaled failover
under load is ``test_failover_journal.py``.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from fakemaster import FakeMaster
from helpers import stop_process, wait_until, worker_env
from rtpool import _protocol as P
from rtpool._masters import Masters

TIMEOUT_S = 30.0


def _dead_address() -> str:
    """An address nothing listens on (connection refused)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return f"127.0.0.1:{s.getsockname()[1]}"


def _standby(leader: str | None) -> FakeMaster:
    fake = FakeMaster()
    fake.refusal = (P.ERR_NOT_LEADER, f"this master is a standby (leader: {leader or 'unknown'})")
    return fake


def _depose(conn, leader: str) -> None:
    """Send ``not_leader`` naming ``leader`` on ``conn`` and close it gracefully: half-close,
    then read until the peer closes (closing with unread bytes would reset the connection,
    and a reset may discard the ERROR before the peer reads it)."""
    conn.send(P.ERROR, P.ERR_NOT_LEADER, f"lost the lease (leader: {leader})", 0)
    conn.sock.shutdown(socket.SHUT_WR)
    conn.sock.settimeout(TIMEOUT_S)
    try:
        while conn.sock.recv(1 << 16):
            pass
    except OSError:
        pass
    conn.sock.close()


def _worker(addresses: str, token: str, log, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", addresses, *extra]
    with open(log, "wb") as f:
        return subprocess.Popen(
            cmd,
            env=worker_env(token),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def test_a_dead_first_address_gives_way_to_the_second(master, tmp_path):
    addresses = f"{_dead_address()},{master.address}"
    worker = _worker(addresses, master.worker_token, tmp_path / "w.log", "--procs", "1")
    try:
        with rtpool.Client(addresses, master.client_token) as client:
            assert client.address == master.address
            assert client.submit(tasks.square, 7).result(TIMEOUT_S) == 49
        status = subprocess.run(
            [sys.executable, "-m", "rtpool", "status", "--master", addresses, "--json"],
            env={**worker_env(""), "RTPOOL_TOKEN": master.client_token},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert status.returncode == 0, status.stderr
        assert '"workers"' in status.stdout
    finally:
        stop_process(worker, group=True)
    log = (tmp_path / "w.log").read_text()
    assert f"connected to the master at {master.address}" in log, log


def test_a_standby_names_the_leader_and_the_client_follows_it(master, caplog):
    """The standby first in the list names the leader (third): the client dials it next,
    before the other standby (second), which is never asked."""
    with _standby(master.address) as first, _standby(None) as second:
        addresses = [first.address, second.address, master.address]  # a list works too
        with caplog.at_level(logging.WARNING, logger="rtpool.client"):
            client = rtpool.Client(addresses, master.client_token)
        try:
            assert client.address == master.address
            assert (first.hellos, second.hellos) == (1, 0)
            lines = [r.getMessage() for r in caplog.records]
            assert f"master {first.address} is a standby; leader {master.address}" in lines
            assert client.status(TIMEOUT_S)["master"]
        finally:
            client.close()


@pytest.mark.parametrize("connection", ["process", "host"])
def test_a_worker_follows_the_leader_a_standby_names(master, tmp_path, connection):
    with _standby(master.address) as first, _standby(None) as second:
        addresses = f"{first.address},{second.address},{master.address}"
        log = tmp_path / "w.log"
        worker = _worker(
            addresses, master.worker_token, log, "--procs", "2", "--connection", connection
        )
        try:
            with rtpool.Client(master.address, master.client_token) as client:
                assert list(client.map(tasks.square, range(20), timeout=TIMEOUT_S)) == [
                    i * i for i in range(20)
                ]
        finally:
            stop_process(worker, group=True)
        assert first.hellos >= 1 and second.hellos == 0
    text = log.read_text()
    assert f"master {first.address} is a standby; leader {master.address}" in text, text
    assert f"connected to the master at {master.address}" in text, text


def test_a_deposed_leader_sends_the_client_to_the_new_one(master, workers):
    """A client on a leader that loses its lease (the fake, first in the list) gets
    ``not_leader`` naming the new leader on its open session: its pending task is sent again
    there, and the deposed one is not dialled again."""
    workers.start(1)
    with FakeMaster(token=master.client_token) as old:
        client = rtpool.Client(f"{old.address},{master.address}", master.client_token)
        try:
            conn = old.accept()
            fut = client.submit(tasks.square, 9)
            conn.recv_kind(P.SUBMIT)  # never ACCEPTED by the old leader
            old.refusal = (P.ERR_NOT_LEADER, "lost the lease (leader: unknown)")
            _depose(conn, master.address)
            assert fut.result(TIMEOUT_S) == 81
            assert client.address == master.address
            assert old.hellos == 1
            assert client.reconnects == 1
        finally:
            client.close()


def test_a_deposed_leader_sends_a_worker_to_the_new_one(master, tmp_path):
    with FakeMaster(token=master.worker_token) as old:
        log = tmp_path / "w.log"
        worker = _worker(f"{old.address},{master.address}", master.worker_token, log)
        try:
            conn = old.accept(timeout=TIMEOUT_S)
            old.refusal = (P.ERR_NOT_LEADER, "lost the lease (leader: unknown)")
            _depose(conn, master.address)
            with rtpool.Client(master.address, master.client_token) as client:
                assert client.submit(tasks.square, 4).result(TIMEOUT_S) == 16
            assert old.hellos == 1
        finally:
            stop_process(worker, group=True)
    text = log.read_text()
    assert f"reconnected to the master at {master.address}" in text, text


def test_one_name_with_several_records_is_several_masters(tmp_path, monkeypatch):
    """``masters.test`` resolves to a standby (127.0.0.1) and the leader (127.0.0.2) on one
    port: the client tries both, and checks TLS against the name, not the address."""
    m = start_master(tmp_path, listen="127.0.0.2:0")
    try:
        port = int(m.address.rsplit(":", 1)[1])
        with FakeMaster(listen=("127.0.0.1", port)) as standby:
            standby.refusal = (P.ERR_NOT_LEADER, "standby (leader: unknown)")
            real = socket.getaddrinfo

            def resolve(host, *args, **kwargs):
                if host == "masters.test":
                    return [
                        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                        for ip in ("127.0.0.1", "127.0.0.2")
                    ]
                return real(host, *args, **kwargs)

            monkeypatch.setattr(socket, "getaddrinfo", resolve)
            names = [(c.host, c.server_name) for c in Masters(f"masters.test:{port}").candidates()]
            assert names == [("127.0.0.1", "masters.test"), ("127.0.0.2", "masters.test")]
            with rtpool.Client(f"masters.test:{port}", m.client_token) as client:
                assert client.address == f"masters.test:{port} (127.0.0.2)"
                assert client.status(TIMEOUT_S)["master"]
            assert standby.hellos == 1
    finally:
        close_master(m)


@pytest.mark.parametrize(
    "address, named",
    [
        ("127.0.0.1:7070,nohost", "entry 2 of '127.0.0.1:7070,nohost' is 'nohost'"),
        ("127.0.0.1:7070,h:99999", "'h:99999'"),
        (["127.0.0.1:7070", 7071], "entry 2"),
        (" , ", "no master address"),
    ],
)
def test_bad_address_lists_are_refused_naming_the_entry(address, named):
    with pytest.raises(ValueError, match="not 'host:port'|no master address") as info:
        rtpool.Client(address, "tok")
    assert named in str(info.value)


def test_bad_address_lists_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RTPOOL_MASTER", raising=False)
    env = {**worker_env("tok")}
    env.pop("RTPOOL_MASTER", None)
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "rtpool", *a],
        env={**env, "RTPOOL_TOKEN": "tok"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    bad = run("worker", "--master", "127.0.0.1:7070,oops")
    assert bad.returncode == 2
    assert "--master: master address entry 2 of '127.0.0.1:7070,oops' is 'oops'" in bad.stderr
    missing = run("worker")
    assert missing.returncode == 2 and "set $RTPOOL_MASTER" in missing.stderr, missing.stderr
    status = run("status", "--master", "oops,127.0.0.1:7070")
    assert status.returncode == 1 and "entry 1 of 'oops,127.0.0.1:7070'" in status.stderr


def test_rtpool_master_env_gives_the_addresses(master, monkeypatch):
    monkeypatch.setenv("RTPOOL_MASTER", f"{_dead_address()},{master.address}")
    with rtpool.Client(None, master.client_token) as client:
        wait_until(lambda: client.address == master.address)


@pytest.mark.asyncio
async def test_the_async_client_takes_the_list_too(master, workers):
    workers.start(1)
    with _standby(master.address) as standby:
        addresses = [_dead_address(), standby.address, master.address]
        async with rtpool.AsyncClient(addresses, master.client_token) as client:
            fut = await client.submit(tasks.square, 6)
            assert await fut == 36
            assert client.address == master.address
        assert standby.hellos == 1
