"""Calls of named functions from a client (docs/rpc.md).

First the client against the scripted fake master (the frames it sends, interface caching,
the retry after ``unknown_function``, transactions on the wire), then end to end against a
LocalCluster whose workers serve ``tasks.rpc``, ``tasks.rpc_v2``, ``tasks.rpc_e2e`` and
``rtpool.lib.linalg``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import pickle
import signal

import msgpack
import numpy as np
import pytest

import rtpool
from fakemaster import FakeMaster
from helpers import wait_until
from rtpool import _protocol as P
from rtpool.errors import CallError, NotFetchedError, TaskFailed, UnknownFunctionError
from rtpool.rpc import codec
from rtpool.rpc import remote as _remote

IFACES = {
    (iface.name, iface.version): iface
    for module in ("tasks.rpc", "tasks.rpc_v2", "tasks.rpc_e2e")
    for _, iface in _remote.served_functions(module)
}


def recv(conn, kind):
    return conn.recv_kind(kind, skip=(P.HEARTBEAT, P.ACK))


def answer_functions(conn, *keys, servers=1) -> list:
    """Answer the next FUNCTIONS with these (name, version) interfaces; return the request."""
    msg = recv(conn, P.FUNCTIONS)
    entries = [[n, v, servers, IFACES[(n, v)].to_bytes()] for n, v in keys]
    conn.send(P.FUNCTIONS_REPLY, msg[1], entries)
    return msg


def result_entry(index, data, status=P.STATUS_OK):
    return [index, status, data, 11, 22, 33, 44, 55, 0]


def refs(payload) -> list:
    """An argument payload with ext values shown as (code, content)."""

    def hook(code, data):
        return (code, msgpack.unpackb(data) if code == codec.EXT_REF else len(data))

    return msgpack.unpackb(payload, ext_hook=hook)


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


@pytest.fixture
def pool():
    with cf.ThreadPoolExecutor(2) as p:
        yield p


@pytest.fixture
def client(fake):
    c = rtpool.Client(fake.address, "tok", name="rpc-unit")
    c.master = fake.accept()
    yield c
    c.close()


# -- the client against the fake master -----------------------------------------------------


def test_calls_report_their_lateness_only_with_a_deadline(client, pool):
    plain = pool.submit(client.call_async, "add", 1, 2)
    answer_functions(client.master, ("add", "2"))
    _, req_id, opts, _ = recv(client.master, P.CALL)
    client.master.send(P.ACCEPTED, req_id, 5)
    late = [0, P.STATUS_OK, codec.encode_results([3]), 11, 22, 33, 44, 55, 250_000]
    client.master.send(P.RESULTS, 5, [late])
    plain = plain.result(5)  # the CallFuture
    assert plain.result(5) == 3 and plain.lateness is None  # no deadline: no lateness
    timed = client.options(deadline=1).call_async("add", 4, 5)  # the interface is cached
    _, req_id, opts, _ = recv(client.master, P.CALL)
    assert opts["deadline_ms"] == 1000
    client.master.send(P.ACCEPTED, req_id, 6)
    late[2] = codec.encode_results([9])
    client.master.send(P.RESULTS, 6, [late])
    assert timed.result(5) == 9 and timed.lateness == 0.25


def test_call_fetches_the_interface_once_and_sends_one_call_frame(client, pool):
    fut = pool.submit(client.call, "add", 2, 3)
    assert answer_functions(client.master, ("add", "2"), ("add", "1"))[2] == "add"
    call = recv(client.master, P.CALL)
    _, req_id, opts, calls = call
    assert set(opts) == {"key"}
    # The newest version, named exactly; arguments as msgpack; no dependency.
    assert calls == [["add", "2", msgpack.packb([2, 3]), [], False]]
    client.master.send(P.ACCEPTED, req_id, 5)
    client.master.send(P.RESULTS, 5, [result_entry(0, codec.encode_results([1005]))])
    assert fut.result(5) == 1005
    # Cached: the next call goes straight out, also through an options() view.
    view = client.options(priority=3)
    fut = pool.submit(view.call, "add", 4, 5)
    _, req_id, opts, calls = recv(client.master, P.CALL)
    assert opts["priority"] == 3 and calls[0][:2] == ["add", "2"]
    client.master.send(P.ACCEPTED, req_id, 6)
    client.master.send(P.RESULTS, 6, [result_entry(0, codec.encode_results([1009]))])
    assert fut.result(5) == 1009


def test_an_explicit_version_is_cached_apart(client, pool):
    fut = pool.submit(client.call_async, "add", 1, 2, version="1")
    answer_functions(client.master, ("add", "2"), ("add", "1"))
    fut = fut.result(5)
    assert recv(client.master, P.CALL)[3][0][:2] == ["add", "1"]
    assert set(client._rpc.interfaces) == {("add", "1")}
    fut.cancel()


def test_validation_errors_send_nothing(client, pool):
    fut = pool.submit(client.call_async, "scale", 3, np.zeros(3), 2.0)
    answer_functions(client.master, ("scale", "1"))
    first = recv(client.master, P.CALL)
    fut.result(5).cancel()
    sent = []
    real_send = client._conn._send
    client._conn._send = lambda frame, *a, **k: (sent.append(frame), real_send(frame, *a, **k))
    shape = r"scale: argument x has shape \(4,\), expected \(n,\) = \(3,\)"
    with pytest.raises(CallError, match=shape):
        client.call("scale", 3, np.zeros(4), 2.0)
    with pytest.raises(CallError, match="scale: argument x has dtype int64, expected float64"):
        client.call("scale", 3, np.zeros(3, dtype=np.int64), 2.0)
    with pytest.raises(CallError, match=r"scale takes 3 arguments \(n, x, k\), got 2"):
        client.call("scale", 3, np.zeros(3))
    with pytest.raises(ValueError, match="option 'replicas' is for shipped-code tasks"):
        client.options(replicas=2).call("scale", 3, np.zeros(3), 2.0)
    assert sent == []
    assert first[3][0][0] == "scale"


def test_unknown_function_names_it_and_lists_what_is_served(client, pool):
    fut = pool.submit(client.call, "dmmulx", 1)
    assert answer_functions(client.master)[2] == "dmmulx"  # none
    assert answer_functions(client.master, ("add", "2"), ("add", "1"), ("noop", "1"))[2] == ""
    with pytest.raises(UnknownFunctionError) as info:
        fut.result(5)
    assert str(info.value) == "no worker serves 'dmmulx'; served: add (2, 1), noop (1)"
    # A version nobody serves, likewise.
    fut = pool.submit(client.describe, "add", "7")
    answer_functions(client.master, ("add", "2"))
    answer_functions(client.master, ("add", "2"))
    with pytest.raises(UnknownFunctionError, match="no worker serves 'add' version 7; served: add"):
        fut.result(5)


def test_unknown_function_for_a_cached_version_refetches_once(client, pool):
    fut = pool.submit(client.call, "add", 1, 1)
    answer_functions(client.master, ("add", "2"))
    req_id = recv(client.master, P.CALL)[1]
    client.master.send(P.ACCEPTED, req_id, 1)
    client.master.send(P.RESULTS, 1, [result_entry(0, codec.encode_results([1002]))])
    assert fut.result(5) == 1002
    # Version 2 is gone; the master says so. The client asks again and re-sends once.
    fut = client.call_async("add", 1, 1)
    old = recv(client.master, P.CALL)
    client.master.send(P.ERROR, P.ERR_UNKNOWN_FUNCTION, "no worker serves 'add' version 2", old[1])
    answer_functions(client.master, ("add", "1"))
    new = recv(client.master, P.CALL)
    assert new[1] != old[1] and new[3][0][:2] == ["add", "1"]
    client.master.send(P.ACCEPTED, new[1], 2)
    client.master.send(P.RESULTS, 2, [result_entry(0, codec.encode_results([2]))])
    assert fut.result(5) == 2
    assert client._rpc.interfaces[("add", None)].version == "1"
    # Gone again: this time the call fails (a fresh interface is not retried).
    fut = client.call_async("add", 1, 1)
    old = recv(client.master, P.CALL)
    client.master.send(P.ERROR, P.ERR_UNKNOWN_FUNCTION, "no worker serves 'add' version 1", old[1])
    answer_functions(client.master, ("add", "1"))
    new = recv(client.master, P.CALL)
    client.master.send(P.ERROR, P.ERR_UNKNOWN_FUNCTION, "no worker serves 'add' version 1", new[1])
    with pytest.raises(UnknownFunctionError, match="no worker serves 'add' version 1"):
        fut.result(5)


def test_remote_exception_is_task_failed_with_the_remote_traceback(client, pool):
    fut = pool.submit(client.call, "fail", "bad input")
    answer_functions(client.master, ("fail", "1"))
    req_id = recv(client.master, P.CALL)[1]
    client.master.send(P.ACCEPTED, req_id, 3)
    try:
        raise ValueError("bad input")
    except ValueError as exc:
        report = codec.encode_error(exc)
    client.master.send(P.RESULTS, 3, [result_entry(0, report, P.STATUS_ERROR)])
    with pytest.raises(TaskFailed) as info:
        fut.result(5)
    exc = info.value
    assert str(exc) == "fail raised ValueError: bad input"
    assert (exc.type_name, exc.remote_message) == ("ValueError", "bad input")
    assert "raise ValueError" in exc.remote_traceback


def test_transaction_is_one_call_frame_with_dependencies(client, pool):
    def build():
        with client.transaction() as tx:
            a = tx.call("seed", 4)
            b = tx.call("timed", 4, a, 0.0)
            c = tx.call("timed", 4, a, 0.0, fetch=True)
            d = tx.call("join", c, b)
        return tx, (a, b, c, d)

    fut = pool.submit(build)
    for name in ("seed", "timed", "join"):
        answer_functions(client.master, (name, "1"))
    _, req_id, _, calls = recv(client.master, P.CALL)
    tx, (a, b, c, d) = fut.result(5)
    assert [(name, deps, fetch) for name, _, _, deps, fetch in calls] == [
        ("seed", [], False),
        ("timed", [0], False),
        ("timed", [0], True),
        ("join", [2, 1], False),  # distinct producers in order of first use
    ]
    assert refs(calls[1][2]) == [4, (codec.EXT_REF, [0, 0]), 0.0]
    assert refs(calls[3][2]) == [(codec.EXT_REF, [0, 0]), (codec.EXT_REF, [1, 0])]
    # The master sends no data for the intermediate calls not fetched.
    span = np.array([1.0, 2.0, 6.0])
    client.master.send(P.ACCEPTED, req_id, 9)
    client.master.send(
        P.RESULTS,
        9,
        [
            result_entry(0, b""),
            result_entry(1, b""),
            result_entry(2, codec.encode_results([span])),
            result_entry(3, codec.encode_results([np.concatenate([span, span])])),
        ],
    )
    assert tx.results(5)[:2] == [None, None]
    np.testing.assert_array_equal(c.result(), span)
    assert d.result().shape == (6,)
    with pytest.raises(NotFetchedError, match="call #0 seed was not fetched; pass fetch=True"):
        a.result()
    assert (a.fetched(), c.fetched(), d.fetched()) == (False, True, True)


def test_transaction_checks_each_call_and_sends_nothing_on_an_exception(client, pool):
    def build():
        with client.transaction() as tx:
            a = tx.call("seed", 4)
            with pytest.raises(CallError) as shape:
                tx.call("timed", 5, a, 0.0)  # seed(4) gives 4 values, timed(5, ...) wants 5
            with pytest.raises(CallError) as outside:
                client.call("timed", 4, a, 0.0)  # a future outside its transaction
            raise KeyError("leave the block")
        return tx, a, shape.value, outside.value

    fut = pool.submit(build)
    answer_functions(client.master, ("seed", "1"))
    answer_functions(client.master, ("timed", "1"))
    with pytest.raises(KeyError):
        fut.result(5)
    # Nothing was sent: the next frame is the FUNCTIONS of this probe, not a CALL.
    probe = pool.submit(client.functions)
    msg = answer_functions(client.master, ("seed", "1"))
    assert msg[2] == ""
    assert [i.name for i in probe.result(5)] == ["seed"]


def test_transaction_messages(client, pool):
    def build():
        errors = []
        with client.transaction() as tx:
            a = tx.call("seed", 4)
            t = tx.call("timed", 4, a, 0.0)
            for args in [(5, a, 0.0), (4, t, 0.0)]:
                try:
                    tx.call("timed", *args)
                except CallError as exc:
                    errors.append(str(exc))
            try:
                client.call("timed", 4, a, 0.0)
            except CallError as exc:
                errors.append(str(exc))
            tx.call("noop")
        return tx, errors

    fut = pool.submit(build)
    answer_functions(client.master, ("seed", "1"))
    answer_functions(client.master, ("timed", "1"))
    answer_functions(client.master, ("noop", "1"))
    tx, errors = fut.result(5)
    assert errors == [
        "timed: argument x (output 0 of call #0) has shape (4,), expected (n,) = (5,)",
        "timed: argument x (output 0 of call #1) has shape (3,), expected (n,) = (4,)",
        "timed: argument x is the future of a call of a transaction: futures are data "
        "dependencies only between the calls of one transaction; pass its .result()",
    ]
    _, req_id, _, calls = recv(client.master, P.CALL)
    assert [c[0] for c in calls] == ["seed", "timed", "noop"]
    assert len(tx) == 3


# -- end to end: a LocalCluster whose workers serve named functions -------------------------

SERVED = ["tasks.rpc", "tasks.rpc_v2", "tasks.rpc_e2e", "rtpool.lib.linalg"]


@pytest.fixture(scope="module")
def rpc_cluster():
    with rtpool.LocalCluster(workers=2, serve=SERVED) as cluster:
        cluster.wait_for_workers(timeout=30)  # with serve: until both serve every function
        yield cluster


@pytest.fixture
def rpc_client(rpc_cluster):
    client = rpc_cluster.client()
    yield client
    client.close()


def test_functions_and_describe_list_what_the_workers_serve(rpc_client):
    ifaces = rpc_client.functions()
    listed = [(i.name, i.version) for i in ifaces]
    assert listed.index(("add", "2")) + 1 == listed.index(("add", "1"))  # newest first
    assert {"dmmul", "dgefa", "dgesl", "timed", "noop"} <= {name for name, _ in listed}
    assert listed == sorted(listed, key=lambda nv: nv[0])  # names sorted
    assert all(i.servers == 2 for i in ifaces)
    dmmul = rpc_client.describe("dmmul")
    assert (dmmul.name, dmmul.version, dmmul.servers) == ("dmmul", "1", 2)
    assert str(dmmul).startswith(
        "dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]"
    )
    assert "matrix multiply" in dmmul.doc
    assert rpc_client.describe("add").version == "2"
    assert rpc_client.describe("add", version="1").version == "1"


def test_call_returns_the_result_and_selects_versions(rpc_client):
    assert rpc_client.call("add", 2, 3) == 1005  # the newest: version 2
    assert rpc_client.call("add", 2, 3, version="1") == 5
    assert rpc_client.call("add", 2, 3, version="2") == 1005
    assert rpc_client.call("noop") is None
    assert rpc_client.call_async("add", 20, 22, version="1").result(30) == 42
    # Options apply: with a time limit the call runs in the worker's executor.
    assert rpc_client.options(timeout=30, priority=2).call("add", 1, 2, version="1") == 3


def test_dmmul_ninf_style_fills_the_out_buffer(rpc_client):
    n = 16
    rng = np.random.default_rng(1)
    A, B = rng.random((n, n)), rng.random((n, n))
    C = rpc_client.call("dmmul", n, A, B)
    np.testing.assert_allclose(C, A @ B)
    buffer = np.zeros((n, n))
    assert rpc_client.call("dmmul", n, A, B, buffer) is buffer
    np.testing.assert_allclose(buffer, A @ B)
    # InOut: the caller's array is updated in place.
    x = np.arange(5, dtype=np.float64)
    rpc_client.call("scale", 5, x, 3.0)
    np.testing.assert_array_equal(x, np.arange(5) * 3.0)


def test_large_call_arguments_travel_through_shared_memory(rpc_client):
    from rtpool import _shm

    assert rpc_client._conn.shm_owner  # the master is on loopback
    n = 400  # 1.25 MB per matrix: above SHM_MIN_BYTES
    rng = np.random.default_rng(2)
    A, B = rng.random((n, n)), rng.random((n, n))
    before = _shm.pool().created + _shm.pool().reused
    for _ in range(3):
        np.testing.assert_allclose(rpc_client.call("dmmul", n, A, B), A @ B)
    # Each call's arguments went into a segment of this process's pool, reused after the
    # first, and every segment is free again once its call is done.
    assert _shm.pool().created + _shm.pool().reused == before + 3
    assert _shm.pool().reused >= 2
    assert _shm.pool().lent() == []
    # An In array from shared memory is a read-only view (no copy); a small one, from the
    # frame, the worker's own writable copy.
    assert rpc_client.call("writable", n * n, A.reshape(-1)) == 0
    assert rpc_client.call("writable", 8, np.ones(8)) == 1
    # An InOut argument from shared memory: the worker decodes a writable copy to modify.
    x = rng.random(n * n // 2)
    expected = x * 2.0
    rpc_client.call("scale", x.size, x, 2.0)
    np.testing.assert_array_equal(x, expected)
    assert _shm.pool().lent() == []


def test_remote_exception_is_task_failed(rpc_client):
    with pytest.raises(TaskFailed) as info:
        rpc_client.call("fail", "no such luck")
    assert info.value.type_name == "ValueError"
    assert info.value.remote_message == "no such luck"
    assert "in fail" in info.value.remote_traceback


def test_a_function_nobody_serves_is_unknown(rpc_client):
    with pytest.raises(UnknownFunctionError) as info:
        rpc_client.call("dmmulx", 1)
    message = str(info.value)
    assert message.startswith("no worker serves 'dmmulx'; served: ")
    assert "add (2, 1)" in message and "dmmul (1)" in message
    with pytest.raises(UnknownFunctionError, match="no worker serves 'add' version 3"):
        rpc_client.call("add", 1, 2, version="3")


def test_validation_happens_before_any_round_trip(rpc_cluster, rpc_client):
    n = 8
    A = np.zeros((n, n))
    rpc_client.call("dmmul", n, A, A)  # the interface is cached now
    conn = rpc_client._conn
    frames = []
    real_send = conn._send
    conn._send = lambda frame, *a, **k: (frames.append(frame), real_send(frame, *a, **k))
    before = rpc_cluster.stats()
    with pytest.raises(CallError) as info:
        rpc_client.call("dmmul", n, A, np.zeros((8, 9)))
    assert str(info.value) == "dmmul: argument B has shape (8, 9), expected (n, n) = (8, 8)"
    with pytest.raises(CallError, match="dmmul: argument A has dtype float32, expected float64"):
        rpc_client.call("dmmul", n, A.astype(np.float32), A)
    with pytest.raises(CallError, match="dmmul: argument n has type str, expected int"):
        rpc_client.call("dmmul", "8", A, A)
    after = rpc_cluster.stats()
    assert frames == []  # not even a FUNCTIONS: nothing left the client
    assert after["delivered"] == before["delivered"]
    rpc_client.call("dmmul", n, A, A)  # a valid call does move the counter
    assert rpc_cluster.stats()["delivered"] == before["delivered"] + 1
    assert [P.decode(f)[0] for f in frames if P.decode(f)[0] != P.ACK] == [P.CALL]


def test_transaction_diamond_runs_the_middle_in_parallel():
    # A cluster of its own: the master places a call by estimated completion, and what it
    # learned from the other tests' microsecond calls (each worker's speed relative to the
    # functions' means) is noisy enough to make an idle worker score worse than a busy one.
    # Fresh, both workers are alike and the two middle calls go round robin.
    with rtpool.LocalCluster(workers=2, serve=["tasks.rpc_e2e"]) as cluster:
        cluster.wait_for_workers(timeout=30)
        client = cluster.client()
        with client.transaction() as tx:
            a = tx.call("seed", 4)
            b = tx.call("timed", 4, a, 0.5)
            c = tx.call("timed", 4, a, 0.5)
            d = tx.call("join", b, c)
        spans = d.result(60)
        results = tx.results()
    assert spans[2] == spans[5] == 6.0  # both got seed's [0, 1, 2, 3]
    (b_start, b_end), (c_start, c_end) = spans[0:2], spans[3:5]
    assert max(b_start, c_start) < min(b_end, c_end), f"B and C did not overlap: {spans}"
    assert results[:3] == [None, None, None]
    np.testing.assert_array_equal(results[3], spans)


def test_a_failed_call_fails_its_dependents_only(rpc_client):
    with rpc_client.transaction() as tx:
        a = tx.call("seed", 4)
        b = tx.call("boom", 4, a)
        d = tx.call("timed", 4, b, 0.0)
        e = tx.call("seed", 3)  # independent of the failure
    np.testing.assert_array_equal(e.result(60), [0.0, 1.0, 2.0])
    with pytest.raises(TaskFailed) as info:
        d.result(60)
    assert "call #2 timed not run" in str(info.value)
    assert "call #1 boom" in str(info.value)
    with pytest.raises(TaskFailed) as info:
        b.result(0)
    assert (info.value.type_name, info.value.remote_message) == ("RuntimeError", "boom on 4 values")
    with pytest.raises(NotFetchedError):
        a.result(0)  # it succeeded; its data stayed on the master
    with pytest.raises(TaskFailed):
        tx.results()


def test_intermediate_results_are_not_shipped(rpc_client):
    conn = rpc_client._conn
    sizes = {}
    real = conn._on_results

    def spy(package, results):
        for r in results:
            sizes[(package, r[0])] = len(r[2])
        real(package, results)

    conn._on_results = spy
    n = 100_000
    with rpc_client.transaction() as tx:
        a = tx.call("seed", n)  # 800 kB
        b = tx.call("timed", n, a, 0.0)
    assert b.result(60)[2] == n * (n - 1) / 2
    package = tx._seg.package
    assert sizes[(package, 0)] == 0  # a's array never came to the client
    assert 0 < sizes[(package, 1)] < 100
    with rpc_client.transaction() as tx:
        a = tx.call("seed", n, fetch=True)
        b = tx.call("timed", n, a, 0.0)
    np.testing.assert_array_equal(a.result(60), np.arange(n))
    assert sizes[(tx._seg.package, 0)] > 8 * n


def test_arrays_travel_without_pickle(rpc_client, monkeypatch):
    import cloudpickle

    import rtpool._serialize
    import rtpool._submitter

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was called for a call of a named function")

    for target, name in [
        (pickle, "dumps"),
        (pickle, "loads"),
        (cloudpickle, "dumps"),
        (rtpool._submitter, "_dumps"),
        (rtpool._serialize, "_dumps"),
        (rtpool._connection.receive, "_loads"),
    ]:
        monkeypatch.setattr(target, name, refuse)
    conn = rpc_client._conn
    # The inline TCP layout, whatever RTPOOL_SHM_MIN_KB says (two 32 KiB matrices would go
    # through shared memory when the worker shares the host at a threshold of 64 KiB).
    monkeypatch.setattr(conn, "shm_owner", None)
    frames, data = [], []
    real_send, real_results = conn._send, conn._on_results
    conn._send = lambda frame, *a, **k: (frames.append(frame), real_send(frame, *a, **k))
    conn._on_results = lambda pkg, results: (
        data.extend(bytes(r[2]) for r in results),
        real_results(pkg, results),
    )
    n = 64
    A = np.arange(n * n, dtype=np.float64).reshape(n, n)
    C = rpc_client.call("dmmul", n, A, A)
    np.testing.assert_allclose(C, A @ A)
    (call,) = [P.decode(f) for f in frames if P.decode(f)[0] == P.CALL]
    args = call[3][0][2]
    # [n, A, B]: a 3-list, n, then A's 32 KiB as msgpack ext 1 (ext 16: 0xc8, u16 size, type).
    assert args[0] == 0x93 and args[1] == n
    assert args[2] == 0xC8 and args[5] == codec.EXT_ARRAY
    assert data[0][:1] == b"\x91" and data[0][1] == 0xC8  # the result: [C] as ext 1


def test_a_call_survives_the_loss_of_its_worker(tmp_path):
    with rtpool.LocalCluster(workers=2, serve=["tasks.rpc_e2e"]) as cluster:
        cluster.wait_for_workers(timeout=30)
        client = cluster.client()
        path = tmp_path / "pid"
        fut = client.call_async("pid_after", str(path), 1.0)
        pid = int(wait_until(lambda: path.exists() and path.read_text(), timeout=30))
        os.kill(pid, signal.SIGKILL)  # the worker process running the call
        assert fut.result(60) != pid  # it ran again on another worker


def test_a_function_whose_only_server_died_is_still_callable_within_the_grace(tmp_path):
    # The grace (--service-grace, 30 s by default) keeps a function whose last server left
    # callable: the call waits for the next server instead of UnknownFunctionError.
    with rtpool.LocalCluster(workers=1, serve=["tasks.rpc_e2e"]) as cluster:
        cluster.wait_for_workers(timeout=30)
        client = cluster.client()
        old = cluster.worker_pids[0]
        cluster.stop_worker(0, graceful=False)

        def servers():
            return [i.servers for i in client.functions() if i.name == "pid_after"]

        # Listed with no server once the master noticed the loss (not dropped).
        wait_until(lambda: servers() == [0], timeout=30)
        path = tmp_path / "pid"
        fut = client.call_async("pid_after", str(path), 0.0)
        assert not fut.done()  # accepted and waiting, not refused
        cluster.add_worker()
        pid = fut.result(60)
        assert pid != old and int(path.read_text()) == pid


def test_local_cluster_serve_starts_workers_with_serve(rpc_cluster):
    for pid in rpc_cluster.worker_pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        served = [argv[i + 1].decode() for i, arg in enumerate(argv) if arg == b"--serve"]
        assert served == SERVED


def test_local_cluster_worker_with_a_bad_module_exits():
    with rtpool.LocalCluster(workers=1, serve=["no_such_module_xyz"]) as cluster:
        with pytest.raises(TimeoutError, match=r"0 of 1 workers .* exited: pid \d+ exit 2"):
            cluster.wait_for_workers(timeout=3)


def test_a_call_above_the_frame_limit_is_refused_before_sending(pool):
    with FakeMaster(max_frame_bytes=64 * 1024) as fake:
        client = rtpool.Client(fake.address, "tok")
        conn = fake.accept()
        # Over TCP whatever RTPOOL_SHM_MIN_KB says: through shared memory, 80 KB of arguments
        # would be a small envelope, below any frame limit.
        client._conn.shm_owner = None
        try:
            fut = pool.submit(client.call, "scale", 10_000, np.zeros(10_000), 2.0)
            answer_functions(conn, ("scale", "1"))
            with pytest.raises(ValueError, match="above the master's frame limit of 65536"):
                fut.result(5)
            # The connection is fine: a small call goes out.
            client.call_async("scale", 3, np.zeros(3), 2.0)
            assert recv(conn, P.CALL)[3][0][0] == "scale"
        finally:
            client.close()


def test_cancelling_a_call_cancels_its_dependents(client, pool):
    def build():
        with client.transaction() as tx:
            a = tx.call("seed", 4)
            b = tx.call("timed", 4, a, 0.0)
            c = tx.call("join", b, b)
            d = tx.call("seed", 2)
        return tx, (a, b, c, d)

    fut = pool.submit(build)
    for name in ("seed", "timed", "join"):
        answer_functions(client.master, (name, "1"))
    req_id = recv(client.master, P.CALL)[1]
    tx, (a, b, c, d) = fut.result(5)
    client.master.send(P.ACCEPTED, req_id, 4)
    wait_until(lambda: tx._seg.package == 4)
    assert b.cancel()
    assert (a.cancelled(), b.cancelled(), c.cancelled(), d.cancelled()) == (
        False,
        True,
        True,
        False,
    )
    assert recv(client.master, P.CANCEL) == [P.CANCEL, 4, [1, 2]]
    # The master sends results for a and d only; the package completes.
    seeded = codec.encode_results([np.arange(2.0)])
    client.master.send(P.RESULTS, 4, [result_entry(0, b""), result_entry(3, seeded)])
    np.testing.assert_array_equal(d.result(5), [0.0, 1.0])
    wait_until(lambda: not client._conn._segments)


def test_calls_and_functions_requests_survive_a_reconnection(fake, pool):
    client = rtpool.Client(fake.address, "tok", reconnect_timeout=10)
    try:
        first = fake.accept()
        fut = pool.submit(client.call, "add", 1, 2)
        answer_functions(first, ("add", "2"))
        req_id = recv(first, P.CALL)[1]
        first.send(P.ACCEPTED, req_id, 21)
        wait_until(lambda: 21 in client._conn._segments)
        probe = pool.submit(client.functions)
        assert recv(first, P.FUNCTIONS)[2] == ""
        first.close()  # no answer to either: the client reconnects
        second = fake.accept(timeout=10)
        msgs = [recv(second, P.ATTACH), recv(second, P.FUNCTIONS)]
        assert msgs[0][2] == 21 and msgs[1][2] == ""
        second.send(P.ACCEPTED, msgs[0][1], 21)
        second.send(
            P.FUNCTIONS_REPLY, msgs[1][1], [["add", "2", 1, IFACES[("add", "2")].to_bytes()]]
        )
        second.send(P.RESULTS, 21, [result_entry(0, codec.encode_results([1003]))])
        assert fut.result(5) == 1003
        assert [i.name for i in probe.result(5)] == ["add"]
    finally:
        client.close()
