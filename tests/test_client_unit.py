"""The client against a scripted fake master: routing, splitting, cancel, errors."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import pickle
import socket
import threading

import pytest

import rtpool
import tasks
from fakemaster import FakeMaster
from rtpool import _protocol as P
from rtpool.client import ClientView
from rtpool.errors import (
    AuthenticationError,
    ConnectError,
    ConnectionLost,
    SubmitRejected,
    TaskFailed,
)


def recv(conn, kind):
    """The next message of ``kind``, skipping heartbeats and ACKs."""
    return conn.recv_kind(kind, skip=(P.HEARTBEAT, P.ACK))


def recv_until_eof(conn):
    """The kinds of the messages before the client closes the connection."""
    kinds = []
    while (msg := conn.recv(5)) is not None and len(kinds) < 1000:
        kinds.append(msg[0])
    return kinds


def without_key(opts):
    assert len(opts.get("key", "")) == 32, opts
    return {k: v for k, v in opts.items() if k != "key"}


def result_entry(index, value, status=P.STATUS_OK):
    data = pickle.dumps(value, 5) if status == P.STATUS_OK else value
    return [index, status, data, 11, 22, 33, 44, 55, 0]


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


@pytest.fixture
def client(fake):
    c = rtpool.Client(fake.address, "tok", name="unit")
    yield c
    c.close()


def test_connect_refused_says_what_to_try():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ConnectError) as info:
        rtpool.Client(f"127.0.0.1:{port}", "tok")
    assert str(info.value) == (
        f"cannot reach master at 127.0.0.1:{port} (connection refused); is `rtpool master` running?"
    )


def test_no_token_is_an_authentication_error(monkeypatch):
    monkeypatch.delenv("RTPOOL_TOKEN", raising=False)
    with pytest.raises(AuthenticationError, match="RTPOOL_TOKEN"):
        rtpool.Client("127.0.0.1:1")


def test_token_from_environment(fake, monkeypatch):
    monkeypatch.setenv("RTPOOL_TOKEN", "tok")
    c = rtpool.Client(fake.address)
    try:
        assert fake.accept().hello[:4] == [P.HELLO, P.PROTOCOL_VERSION, "client", "tok"]
    finally:
        c.close()


def test_wrong_token_reports_the_masters_message(fake):
    with pytest.raises(AuthenticationError, match="bad token for this master"):
        rtpool.Client(fake.address, "nope")


def test_hello_fields(fake, client):
    conn = fake.accept()
    assert conn.hello == [P.HELLO, P.PROTOCOL_VERSION, "client", "tok", "unit", 0]
    assert client.max_frame_bytes == P.DEFAULT_MAX_FRAME


def test_submit_roundtrip_with_timings(fake, client):
    fut = client.submit(tasks.add, 2, b=3)
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    _, req_id, fn_hash, fn_code, opts, payloads = msg
    assert without_key(opts) == {}
    assert pickle.loads(fn_code) is tasks.add
    assert pickle.loads(payloads[0]) == ((2,), {"b": 3})
    conn.send(P.ACCEPTED, req_id, 77)
    conn.send(P.RESULTS, 77, [result_entry(0, 5)])
    assert fut.result(5) == 5
    t = fut.timings
    assert (t["queue_us"], t["worker_us"], t["exec_us"], t["wait_us"], t["flush_us"]) == (
        11,
        22,
        33,
        44,
        55,
    )
    assert t["total_us"] >= t["serialize_us"] >= 0
    assert t["deserialize_us"] >= 0


def test_options_go_to_the_package_and_kwargs_to_the_function(fake, client):
    view = client.options(priority=5)
    view.submit(tasks.echo, 1, priority=1)
    msg = fake.accept().recv_kind(P.SUBMIT)
    assert without_key(msg[4]) == {"priority": 5}
    assert pickle.loads(msg[5][0]) == ((1,), {"priority": 1})


def test_unknown_option_lists_the_valid_ones(client):
    with pytest.raises(
        TypeError, match=r"unknown option 'deadlin'; valid options: priority, timeout"
    ):
        client.options(deadlin=3)
    with pytest.raises(TypeError, match="must be an int"):
        client.options(priority="high")
    with pytest.raises(ValueError, match="32 bits"):
        client.options(priority=2**31)


def test_results_out_of_order_land_in_input_order(fake, client):
    pkg = client.submit_many(tasks.square, range(5))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    assert [pickle.loads(p) for p in msg[5]] == [((i,), None) for i in range(5)]
    conn.send(P.ACCEPTED, msg[1], 9)
    conn.send(P.RESULTS, 9, [result_entry(i, i * i) for i in (4, 2)])
    conn.send(P.RESULTS, 9, [result_entry(i, i * i) for i in (0, 3, 1)])
    assert pkg.results(5) == [0, 1, 4, 9, 16]
    assert pkg.id == 9
    assert len(pkg) == 5 and list(pkg) == pkg.futures


def test_a_finished_future_is_one_object_for_the_cyclic_gc(fake, client):
    # A future whose result's attributes did not fit its inline values got a dict of its
    # own: two tracked objects per task, and the GC's full collections of a bulk run doubled.
    pkg = client.submit_many(tasks.square, range(50))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 9)
    conn.send(P.RESULTS, 9, [result_entry(i, i * i) for i in range(50)])
    assert pkg.results(5) == [i * i for i in range(50)]
    owners = [f for f in pkg if any(type(r) is dict for r in gc.get_referents(f))]
    assert owners == []
    t = pkg[7].timings  # what the result's tuple carries
    assert (t["queue_us"], t["late_us"]) == (11, 0)
    assert 0 <= t["deserialize_us"] <= t["total_us"]


def test_package_larger_than_a_frame_is_split():
    with FakeMaster(max_frame_bytes=4096) as fake:
        client = rtpool.Client(fake.address, "tok")
        try:
            items = [bytes([i]) * 1000 for i in range(20)]
            pkg = client.submit_many(len, items)
            conn = fake.accept()
            frames = []
            seen = 0
            while seen < 20:
                msg = conn.recv_kind(P.SUBMIT)
                assert len(P.encode(*msg)) - 4 <= 4096
                frames.append(msg)
                seen += len(msg[5])
            assert len(frames) > 1
            for n, msg in enumerate(frames):
                conn.send(P.ACCEPTED, msg[1], 100 + n)
                conn.send(P.RESULTS, 100 + n, [result_entry(i, 1000) for i in range(len(msg[5]))])
            assert pkg.results(5) == [1000] * 20
            assert pkg.ids == [100 + n for n in range(len(frames))]
        finally:
            client.close()


def test_single_task_above_the_frame_limit_is_refused_locally():
    with FakeMaster(max_frame_bytes=4096) as fake:
        client = rtpool.Client(fake.address, "tok")
        try:
            with pytest.raises(ValueError, match="frame limit of 4096"):
                client.submit_many(len, [b"x" * 10, b"x" * 10000])
        finally:
            client.close()


def test_task_error_statuses(fake, client):
    from rtpool._serialize import dumps_error

    try:
        tasks.fail("boom")
    except tasks.TaskError as exc:
        report = dumps_error(exc)
    pkg = client.submit_many(tasks.square, range(3))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 5)
    conn.send(
        P.RESULTS,
        5,
        [
            result_entry(0, report, P.STATUS_ERROR),
            result_entry(1, b"cancelled: master shutting down", P.STATUS_CANCELLED),
            result_entry(2, b"no worker can run this", P.STATUS_FAILED),
        ],
    )
    with pytest.raises(tasks.TaskError, match="boom") as info:
        pkg[0].result(5)
    assert "in fail" in info.value.__cause__.tb
    with pytest.raises(cf.CancelledError):
        pkg[1].result(5)
    assert pkg[1].cancelled()
    with pytest.raises(TaskFailed, match="no worker can run this"):
        pkg[2].result(5)


def test_rejected_submit_fails_only_that_package(fake, client):
    bad = ClientView(client._conn, client._rpc, {"bogus": 1}).submit(tasks.square, 2)
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    assert without_key(msg[4]) == {"bogus": 1}
    conn.send(P.ERROR, "rejected", "unknown option `bogus`", msg[1])
    with pytest.raises(SubmitRejected, match="unknown option `bogus`"):
        bad.result(5)
    good = client.submit(tasks.square, 3)
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 1)
    conn.send(P.RESULTS, 1, [result_entry(0, 9)])
    assert good.result(5) == 9


def test_cancel_before_and_after_accepted(fake, client):
    pkg = client.submit_many(tasks.square, range(4))
    assert pkg[3].cancel()
    assert pkg[3].cancel()  # idempotent
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 8)
    assert recv(conn, P.CANCEL) == [P.CANCEL, 8, [3]]
    assert pkg[1].cancel()
    assert recv(conn, P.CANCEL) == [P.CANCEL, 8, [1]]
    conn.send(P.RESULTS, 8, [result_entry(0, 0), result_entry(1, 1)])  # 1 arrives too late
    assert pkg[0].result(5) == 0
    assert not pkg[0].cancel()
    assert pkg.cancel() == 1  # only index 2 was left
    assert recv(conn, P.CANCEL) == [P.CANCEL, 8, []]
    assert [f.cancelled() for f in pkg] == [False, True, True, True]


def test_status(fake, client):
    pkg = client.submit_many(tasks.square, range(10))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 3)
    status = {}

    def ask():
        status.update(pkg.status(timeout=5))

    import threading

    t = threading.Thread(target=ask)
    t.start()
    req = conn.recv_kind(P.STATUS)
    assert req[2] == 3
    conn.send(P.STATUS_REPLY, req[1], 3, 10, 6, 2, 1, 1, 0, 0)
    t.join(5)
    assert status == {"total": 10, "queued": 6, "running": 2, "done": 1, "cancelled": 1}


def test_status_of_a_finished_package_is_local(fake, client):
    pkg = client.submit_many(tasks.square, range(2))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 3)
    conn.send(P.RESULTS, 3, [result_entry(0, 0), result_entry(1, 1)])
    pkg.results(5)
    assert pkg.status() == {"total": 2, "queued": 0, "running": 0, "done": 2, "cancelled": 0}


def test_connection_loss_fails_pending_futures(fake):
    client = rtpool.Client(fake.address, "tok", reconnect_timeout=0)
    pkg = client.submit_many(tasks.square, range(3))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 4)
    conn.send(P.RESULTS, 4, [result_entry(0, 0)])
    assert pkg[0].result(5) == 0
    conn.close()
    with pytest.raises(ConnectionLost, match="Check that the master is running") as info:
        pkg[1].result(5)
    assert fake.address in str(info.value)
    assert "2 unfinished tasks" in str(info.value)
    with pytest.raises(ConnectionLost):
        client.submit(tasks.square, 1)
    assert client.reconnects == 0
    assert fake.conns.empty()  # no reconnection attempt


def test_fatal_error_message_reaches_the_futures(fake):
    client = rtpool.Client(fake.address, "tok", reconnect_timeout=0)
    fut = client.submit(tasks.square, 1)
    conn = fake.accept()
    conn.recv_kind(P.SUBMIT)
    conn.send(P.ERROR, "shutdown", "the master is shutting down", 0)
    conn.close()
    with pytest.raises(ConnectionLost, match="shutdown: the master is shutting down"):
        fut.result(5)


def test_map_chunks_and_order(fake, client):
    it = client.map(tasks.add, range(5), range(5), chunksize=2)
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    chunks = [pickle.loads(p)[0][0] for p in msg[5]]
    assert chunks == [[(0, 0), (1, 1)], [(2, 2), (3, 3)], [(4, 4)]]
    conn.send(P.ACCEPTED, msg[1], 2)
    conn.send(P.RESULTS, 2, [result_entry(i, [a + b for a, b in c]) for i, c in enumerate(chunks)])
    assert list(it) == [0, 2, 4, 6, 8]


def test_map_timeout_cancels_the_rest(fake, client):
    it = client.map(tasks.square, range(3), timeout=0.05)
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 2)
    with pytest.raises(TimeoutError):
        next(it)
    it.close()
    assert recv(conn, P.CANCEL) == [P.CANCEL, 2, []]


def test_shutdown_waits_then_refuses_new_work(fake):
    client = rtpool.Client(fake.address, "tok")
    fut = client.submit(tasks.square, 4)
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 1)
    conn.send(P.RESULTS, 1, [result_entry(0, 16)])
    client.shutdown(wait=True)
    assert fut.result(0) == 16
    assert recv_until_eof(conn) == [P.ACK]  # then the client closed the connection
    with pytest.raises(RuntimeError, match="after shutdown"):
        client.submit(tasks.square, 1)


def test_close_cancels_pending(fake):
    client = rtpool.Client(fake.address, "tok")
    fut = client.submit(tasks.square, 4)
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 1)
    client.close()
    assert fut.cancelled()
    assert recv(conn, P.CANCEL) == [P.CANCEL, 1, []]
    assert conn.recv(5) is None


def test_package_futures_work_with_wait_as_completed_and_callbacks(fake, client):
    pkg = client.submit_many(tasks.square, range(4))
    seen = []
    pkg[2].add_done_callback(lambda f: seen.append(f.result()))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 6)
    conn.send(P.RESULTS, 6, [result_entry(2, 4)])
    done, not_done = cf.wait(pkg.futures, timeout=5, return_when=cf.FIRST_COMPLETED)
    assert done == {pkg[2]} and len(not_done) == 3
    assert seen == [4]
    with pytest.raises(TimeoutError):
        pkg[0].result(timeout=0.01)
    conn.send(P.RESULTS, 6, [result_entry(i, i * i) for i in (3, 0, 1)])
    order = [f.result() for f in cf.as_completed(pkg.futures, timeout=5)]
    assert sorted(order) == [0, 1, 4, 9]
    assert pkg[0].exception(0) is None


def test_view_shutdown_cancels_its_own_package_and_keeps_the_client(fake, client):
    view = client.options(priority=1)
    pkg = view.submit_many(tasks.square, range(3))
    other = client.submit(tasks.square, 5)
    conn = fake.accept()
    first = conn.recv_kind(P.SUBMIT)
    second = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, first[1], 1)
    conn.send(P.ACCEPTED, second[1], 2)
    view.shutdown(wait=True, cancel_futures=True)
    assert all(f.cancelled() for f in pkg)
    assert recv(conn, P.CANCEL) == [P.CANCEL, 1, []]  # one frame for the package
    with pytest.raises(RuntimeError, match="after shutdown"):
        view.submit(tasks.square, 1)
    conn.send(P.RESULTS, 2, [result_entry(0, 25)])
    assert other.result(5) == 25


def test_cancelled_futures_wake_wait_and_as_completed(fake, client):
    # cf.wait() and cf.as_completed() count a cancelled future as done only once notified.
    pkg = client.submit_many(tasks.square, range(2))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], 6)
    threading.Timer(0.05, pkg[0].cancel).start()
    done, _ = cf.wait(pkg.futures, timeout=5, return_when=cf.FIRST_COMPLETED)
    assert done == {pkg[0]}
    threading.Timer(0.05, pkg[1].cancel).start()
    assert set(cf.as_completed(pkg.futures, timeout=5)) == set(pkg.futures)
