"""The client's delivery guarantees against a scripted fake master: ACK, idempotency keys,
heartbeats, reconnection with ATTACH and deduplication, and the new task errors."""

from __future__ import annotations

import pickle
import queue
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
from fakemaster import FakeConn, FakeMaster
from helpers import stop_process, wait_until, worker_env
from rtpool import _protocol as P
from rtpool.errors import (
    ConnectionLost,
    PoisonTaskError,
    QuotaExceededError,
    ResultsLost,
    TaskFailed,
    TaskTimeoutError,
)


def result_entry(index, value, status=P.STATUS_OK):
    data = pickle.dumps(value, 5) if status == P.STATUS_OK else value
    return [index, status, data, 0, 0, 0, 0, 0, 0]


def recv(conn: FakeConn, kind: int) -> list:
    """The next message of ``kind``, skipping heartbeats and ACKs."""
    return conn.recv_kind(kind, skip=(P.HEARTBEAT, P.ACK))


def acks_until(conn: FakeConn, package: int, count: int) -> List[int]:
    """ACK counts of ``package`` received until one says ``count``; other ACKs are skipped."""
    counts: List[int] = []
    while not counts or counts[-1] != count:
        msg = conn.recv_kind(P.ACK)
        if msg[1] == package:
            assert not counts or msg[2] > counts[-1], f"ACK counts not cumulative: {counts}"
            assert msg[2] <= count, f"ACK {msg[2]} above the {count} results sent"
            counts.append(msg[2])
    return counts


class FakeMasterV1b(FakeMaster):
    """A fake master whose WELCOME has the amended fields (lease_ms, instance)."""

    def __init__(self, instance: int = 42, **kwargs) -> None:
        self.instance = instance
        super().__init__(**kwargs)

    def welcome_fields(self) -> list:
        return [1, 7, self.max_frame_bytes, self.heartbeat_ms, 15000, self.instance]


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


@pytest.fixture
def client(fake):
    c = rtpool.Client(fake.address, "tok", name="reconnect")
    yield c
    c.close()


def test_timeout_option_encodes_timeout_ms(fake, client):
    client.options(timeout=1.5, priority=3).submit(tasks.square, 2)
    client.options(timeout=2).options(timeout=None).submit(tasks.square, 3)
    conn = fake.accept()
    first = recv(conn, P.SUBMIT)[4]
    second = recv(conn, P.SUBMIT)[4]
    assert list(first) == ["priority", "timeout_ms", "key"]  # spec order
    assert (first["priority"], first["timeout_ms"]) == (3, 1500)
    assert list(second) == ["key"]  # timeout=None: no limit, the default, not written
    assert client.options(timeout=0.0001)._opts == {"timeout_ms": 1}  # rounded up, not to 0


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, "positive number of seconds, got 0"),
        (-1.0, ValueError, "positive"),
        (float("nan"), ValueError, "positive"),
        (True, TypeError, "number of seconds, got bool"),
        ("5", TypeError, "number of seconds, got str"),
        (5e6, ValueError, "at most 4294967 s"),
    ],
)
def test_timeout_option_is_validated(client, value, error, match):
    with pytest.raises(error, match=match):
        client.options(timeout=value)


def test_every_submit_has_its_own_key(fake, client):
    client.submit(tasks.square, 1)
    client.submit(tasks.square, 2)
    client.submit_many(tasks.square, range(3))
    conn = fake.accept()
    keys = [recv(conn, P.SUBMIT)[4]["key"] for _ in range(3)]
    assert len(set(keys)) == 3
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)


def test_ack_is_cumulative_per_package_one_frame_per_batch(fake, client):
    a = client.submit_many(tasks.square, range(4))
    b = client.submit_many(tasks.square, range(2))
    conn = fake.accept()
    sa, sb = recv(conn, P.SUBMIT), recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, sa[1], 1)
    conn.send(P.ACCEPTED, sb[1], 2)
    conn.send(P.RESULTS, 1, [result_entry(0, 0), result_entry(1, 1)])
    assert conn.recv_kind(P.ACK) == [P.ACK, 1, 2]
    # Two frames in one write: one read, one ACK per package with the running total.
    conn.sock.sendall(
        P.encode(P.RESULTS, 1, [result_entry(2, 4)])
        + P.encode(P.RESULTS, 2, [result_entry(0, 0), result_entry(1, 1)])
        + P.encode(P.RESULTS, 1, [result_entry(3, 9)])
    )
    assert acks_until(conn, 1, 4)[-1] == 4
    assert a.results(5) == [0, 1, 4, 9] and b.results(5) == [0, 1]
    assert acks_until(conn, 2, 2) == [2]


def test_ack_waits_while_another_thread_is_sending(fake, client):
    # The reader never blocks on the send lock (a large SUBMIT may hold it): the ACK is sent
    # once the lock is free, by the next sender or the heartbeat thread.
    pkg = client.submit_many(tasks.square, range(2))
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 4)
    with client._conn._send_lock:
        conn.send(P.RESULTS, 4, [result_entry(0, 0), result_entry(1, 1)])
        assert pkg.results(5) == [0, 1]  # results are read meanwhile
        wait_until(lambda: client._conn._ack_later)
    assert conn.recv_kind(P.ACK) == [P.ACK, 4, 2]


def test_idle_client_sends_heartbeats():
    with FakeMaster(heartbeat_ms=50) as fake:
        client = rtpool.Client(fake.address, "tok")
        try:
            conn = fake.accept()
            start = time.monotonic()
            assert conn.recv(timeout=2) == [P.HEARTBEAT]
            assert conn.recv(timeout=2) == [P.HEARTBEAT]
            assert time.monotonic() - start >= 0.05  # not before heartbeat_ms of silence
        finally:
            client.close()


def test_reconnect_resends_unaccepted_attaches_accepted_and_dedups(fake, client):
    a = client.submit_many(tasks.square, range(3))
    b = client.submit_many(tasks.square, range(2))
    conn = fake.accept()
    sa, sb = recv(conn, P.SUBMIT), recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, sa[1], 10)  # b is never accepted on this connection
    conn.send(P.RESULTS, 10, [result_entry(0, 0)])
    assert conn.recv_kind(P.ACK) == [P.ACK, 10, 1]
    conn.send(P.RESULTS, 10, [result_entry(1, 1)])
    assert conn.recv_kind(P.ACK) == [P.ACK, 10, 2]
    assert a[1].result(5) == 1
    conn.close()

    conn = fake.accept()
    attach = recv(conn, P.ATTACH)
    assert attach[2] == 10
    resent = recv(conn, P.SUBMIT)
    assert resent == sb  # same req_id, same key, same payloads
    conn.send(P.ACCEPTED, attach[1], 10)
    # The master re-sends what it has no ACK for: index 1 again (its ACK was "lost").
    conn.send(P.RESULTS, 10, [result_entry(1, 999), result_entry(2, 4)])
    conn.send(P.ACCEPTED, resent[1], 11)
    conn.send(P.RESULTS, 11, [result_entry(0, 0), result_entry(1, 1)])
    assert a.results(5) == [0, 1, 4]  # the first copy of index 1 won
    assert b.results(5) == [0, 1]
    assert acks_until(conn, 10, 2)[-1] == 2  # counted from this connection's ACCEPTED
    assert client.reconnects == 1
    assert client._conn.duplicate_results == 1


def test_submit_while_disconnected_goes_out_after_reconnecting(fake, client):
    conn = fake.accept()
    conn.close()
    wait_until(lambda: client._conn.sock is None)
    assert fake.conns.empty()  # nothing pending: no reconnection yet
    fut = client.submit(tasks.square, 7)
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 1)
    conn.send(P.RESULTS, 1, [result_entry(0, 49)])
    assert fut.result(5) == 49
    assert client.reconnects == 1


def test_map_keeps_input_order_across_a_reconnect(fake, client):
    it = client.map(tasks.square, range(4))
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 3)
    conn.send(P.RESULTS, 3, [result_entry(1, 1)])
    conn.recv_kind(P.ACK)
    conn.close()
    conn = fake.accept()
    attach = recv(conn, P.ATTACH)
    conn.send(P.ACCEPTED, attach[1], 3)
    conn.send(P.RESULTS, 3, [result_entry(i, i * i) for i in (3, 1, 0, 2)])
    assert list(it) == [0, 1, 4, 9]
    assert client._conn.duplicate_results == 1


def test_cancel_while_disconnected_reaches_the_master_after_attach(fake, client):
    pkg = client.submit_many(tasks.square, range(3))
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 7)
    wait_until(lambda: pkg.ids == [7])
    conn.close()
    wait_until(lambda: client._conn.sock is None)
    assert pkg[2].cancel()
    conn = fake.accept()
    attach = recv(conn, P.ATTACH)
    assert attach[2] == 7
    assert recv(conn, P.CANCEL) == [P.CANCEL, 7, [2]]
    conn.send(P.ACCEPTED, attach[1], 7)
    conn.send(P.RESULTS, 7, [result_entry(0, 0), result_entry(1, 1)])
    assert pkg[0].result(5) == 0 and pkg[1].result(5) == 1 and pkg[2].cancelled()


def test_unknown_package_after_reconnect_fails_its_futures_clearly(fake, client):
    pkg = client.submit_many(tasks.square, range(3))
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 5)
    conn.send(P.RESULTS, 5, [result_entry(0, 0)])
    assert pkg[0].result(5) == 0
    conn.close()
    conn = fake.accept()
    attach = recv(conn, P.ATTACH)
    conn.send(P.ERROR, "unknown_package", "no package 5 for this user", 5)
    with pytest.raises(ResultsLost, match="no longer knows package 5") as info:
        pkg[1].result(5)
    assert isinstance(info.value, ConnectionLost)
    assert "2 unfinished tasks failed" in str(info.value)
    assert pkg[2].exception(0) is info.value
    assert pkg[0].result(0) == 0
    # The connection itself is fine.
    fut = client.submit(tasks.square, 3)
    msg = recv(conn, P.SUBMIT)
    assert msg[1] > attach[1]
    conn.send(P.ACCEPTED, msg[1], 6)
    conn.send(P.RESULTS, 6, [result_entry(0, 9)])
    assert fut.result(5) == 9


def test_shutdown_wait_waits_across_a_reconnect(fake, client):
    fut = client.submit(tasks.square, 4)
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 1)
    closer = threading.Thread(target=client.shutdown, kwargs={"wait": True})
    closer.start()
    conn.close()
    conn = fake.accept()
    attach = recv(conn, P.ATTACH)
    assert closer.is_alive()
    conn.send(P.ACCEPTED, attach[1], 1)
    conn.send(P.RESULTS, 1, [result_entry(0, 16)])
    closer.join(5)
    assert not closer.is_alive()
    assert fut.result(0) == 16
    assert conn.recv_kind(P.ACK) == [P.ACK, 1, 1]
    assert conn.recv(5) is None  # then closed


def test_master_shutdown_error_reconnects_but_malformed_does_not(fake, client):
    first = client.submit(tasks.square, 2)
    conn = fake.accept()
    recv(conn, P.SUBMIT)
    conn.send(P.ERROR, "shutdown", "the master is shutting down", 0)
    conn.close()
    conn = fake.accept()  # a retriable error: the client came back
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ERROR, "malformed", "bad frame", 0)
    conn.close()
    with pytest.raises(ConnectionLost, match="the master reported malformed: bad frame"):
        first.result(5)
    assert client.reconnects == 1 and msg[1] == 1
    with pytest.raises(queue.Empty):
        fake.accept(timeout=0.3)  # no second reconnection


def test_close_stops_both_threads(fake):
    client = rtpool.Client(fake.address, "tok")
    conn = fake.accept()
    threads = (client._conn._thread, client._conn._heartbeat_thread)
    client.close()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()
    assert conn.recv(5) is None


def test_wrong_token_on_reconnect_stops_and_fails_pending(fake, client):
    fut = client.submit(tasks.square, 4)
    conn = fake.accept()
    recv(conn, P.SUBMIT)
    fake.token = "rotated"
    conn.close()
    with pytest.raises(ConnectionLost, match="refused the client token") as info:
        fut.result(5)
    assert "1 unfinished tasks failed" in str(info.value)
    assert client.reconnects == 0
    with pytest.raises(ConnectionLost):
        client.submit(tasks.square, 1)


def test_reconnection_gives_up_after_reconnect_timeout():
    fake = FakeMaster()
    client = rtpool.Client(fake.address, "tok", reconnect_timeout=0.3)
    try:
        fut = client.submit(tasks.square, 4)
        recv(fake.accept(), P.SUBMIT)
        start = time.monotonic()
        fake.close()  # the listener too: every attempt is refused
        with pytest.raises(ConnectionLost, match=r"could not reconnect within 0\.3 s") as info:
            fut.result(10)
        assert time.monotonic() - start < 5
        assert "connection refused" in str(info.value)
    finally:
        client.close()


def test_reconnect_timeout_is_validated(fake):
    with pytest.raises(ValueError, match="reconnect_timeout must be >= 0"):
        rtpool.Client(fake.address, "tok", reconnect_timeout=-1)


def test_new_statuses_map_to_their_errors(fake, client):
    pkg = client.submit_many(tasks.square, range(4))
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 5)
    conn.send(
        P.RESULTS,
        5,
        [
            result_entry(0, b"ran past its timeout of 1500 ms", P.STATUS_TIMEOUT),
            result_entry(1, b"its worker was lost on each of its 3 attempts", P.STATUS_LOST),
            result_entry(2, b"quota of user alice used up", P.STATUS_QUOTA),
            result_entry(3, b"from a future protocol", 9),
        ],
    )
    with pytest.raises(TaskTimeoutError, match="1500 ms") as timeout:
        pkg[0].result(5)
    assert isinstance(timeout.value, TimeoutError) and isinstance(timeout.value, TaskFailed)
    with pytest.raises(PoisonTaskError, match="3 attempts") as poison:
        pkg[1].result(5)
    assert poison.value.attempts == 3
    with pytest.raises(QuotaExceededError, match="quota of user alice"):
        pkg[2].result(5)
    with pytest.raises(TaskFailed, match="from a future protocol"):
        pkg[3].result(5)
    assert rtpool.TaskTimeoutError is TaskTimeoutError  # exported


def test_quota_error_on_submit_fails_that_package_only(fake, client):
    refused = client.submit_many(tasks.square, range(2))
    conn = fake.accept()
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ERROR, "quota", "user alice used 3600 s of 3600 s", msg[1])
    with pytest.raises(QuotaExceededError, match="used 3600 s of 3600 s"):
        refused[0].result(5)
    assert isinstance(refused[1].exception(0), QuotaExceededError)
    fut = client.submit(tasks.square, 3)
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 1)
    conn.send(P.RESULTS, 1, [result_entry(0, 9)])
    assert fut.result(5) == 9
    assert client.reconnects == 0


def test_amended_welcome_is_understood():
    with FakeMasterV1b(instance=42) as fake:
        client = rtpool.Client(fake.address, "tok")
        try:
            fake.accept()
            assert (client._conn.instance, client.session) == (42, 7)
        finally:
            client.close()


# -- end to end: a real master killed and restarted ---------------------------------------


@pytest.fixture
def workers_started(tmp_path):
    """``start(address, token)`` runs a 2-process worker; all are stopped by PID at the end."""
    procs: List[subprocess.Popen] = []

    def start(address: str, token: str) -> None:
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", "2"]
        with open(tmp_path / f"worker-{len(procs)}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=worker_env(token),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    try:
        yield start
    finally:
        for proc in procs:
            stop_process(proc, group=True)


def test_e2e_package_completes_across_a_master_kill_and_restart(tmp_path, workers_started):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{s.getsockname()[1]}"  # the restarted master needs the same port
    args = ["--fsync", "always"]
    master = start_master(tmp_path, listen=listen, args=args)
    try:
        workers_started(master.address, master.worker_token)
        client = rtpool.Client(master.address, master.client_token)
        try:
            pkg = client.submit_many(tasks.sleep_return, [(i, 0.05) for i in range(40)], star=True)
            wait_until(lambda: sum(f.done() for f in pkg) >= 5, timeout=30)
            master.proc.kill()  # SIGKILL: no goodbye to anyone
            master.proc.wait(10)
            close_master(master)
            master = start_master(tmp_path, listen=listen, args=args, log_name="master2.log")
            workers_started(master.address, master.worker_token)  # if the first ones exited
            assert pkg.results(60) == list(range(40))
            assert client.reconnects >= 1
            assert client._conn.instance != 0
        finally:
            client.close()
    finally:
        close_master(master)


def _until_eof(conn: FakeConn, timeout: float = 15.0) -> List[int]:
    """Kinds received until the client closes the connection (fails after ``timeout``)."""
    kinds: List[int] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the client kept the connection open; it sent {kinds}"
        msg = conn.recv(timeout=left)
        if msg is None:
            return kinds
        kinds.append(msg[0])


def test_close_with_a_submission_never_acknowledged_closes_the_connection(fake, caplog):
    # A master that never answers a SUBMIT must not keep a closed client connected (its
    # reader, heartbeat thread and shared memory) for good: close() waits CLOSE_GRACE_S for
    # the ACCEPTED it needs to send CANCEL, then closes anyway and says so.
    c = rtpool.Client(fake.address, "tok", name="silent")
    fut = c.submit(tasks.square, 2)
    conn = fake.accept()
    recv(conn, P.SUBMIT)
    with caplog.at_level("WARNING", logger="rtpool.client"):
        c.close()
    assert fut.cancelled()
    assert P.SUBMIT not in _until_eof(conn)
    assert "1 submission(s) the master has not acknowledged" in caplog.text
    assert c._conn._closed


def test_close_cancels_a_submission_acknowledged_within_the_grace(fake):
    c = rtpool.Client(fake.address, "tok", name="late")
    fut = c.submit(tasks.square, 2)
    conn = fake.accept()
    submit = recv(conn, P.SUBMIT)
    closer = threading.Thread(target=c.close)
    closer.start()
    wait_until(fut.cancelled, timeout=5)  # close() cancelled it and now waits for ACCEPTED
    conn.send(P.ACCEPTED, submit[1], 9)
    cancel = recv(conn, P.CANCEL)
    assert cancel[1] == 9  # the whole package, named by the id the master gave it
    assert P.SUBMIT not in _until_eof(conn)
    closer.join(timeout=15)
    assert not closer.is_alive()


def test_shutdown_without_waiting_closes_once_the_grace_has_passed(fake):
    c = rtpool.Client(fake.address, "tok", name="nowait")
    fut = c.submit(tasks.square, 2)
    conn = fake.accept()
    recv(conn, P.SUBMIT)
    c.shutdown(wait=False, cancel_futures=True)
    assert fut.cancelled()
    _until_eof(conn)  # the heartbeat thread closes it after the grace
    wait_until(lambda: c._conn._closed, timeout=5)
