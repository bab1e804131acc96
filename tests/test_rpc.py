"""Calls of named functions from a client (docs/rpc.md).

First the client against the scripted fake master (the frames it sends, interface caching,
the retry after ``unknown_function``, transactions on the wire), then end to end against a
LocalCluster whose workers serve ``rpc_funcs``, ``rpc_funcs_v2``, ``rpc_e2e_funcs`` and
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
from rtpool import _callcodec as codec
from rtpool import _interface
from rtpool import _protocol as P
from rtpool.errors import CallError, NotFetchedError, TaskFailed, UnknownFunctionError

IFACES = {
    (iface.name, iface.version): iface
    for module in ("rpc_funcs", "rpc_funcs_v2", "rpc_e2e_funcs")
    for _, iface in _interface.served_functions(module)
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
    return [index, status, data, 11, 22, 33, 44, 55]


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
    assert set(client._conn.interfaces) == {("add", "1")}
    fut.cancel()


def test_validation_errors_send_nothing(client, pool):
    fut = pool.submit(client.call_async, "scale", 3, np.zeros(3), 2.0)
    answer_functions(client.master, ("scale", "1"))
    first = recv(client.master, P.CALL)
    fut.result(5).cancel()
    sent = []
    real_send = client._conn._send
    client._conn._send = lambda frame, *a, **k: (sent.append(frame), real_send(frame, *a, **k))
    with pytest.raises(CallError, match=r"scale: argument x has shape \(4,\), expected \(n,\) = \(3,\)"):
        client.call("scale", 3, np.zeros(4), 2.0)
    with pytest.raises(CallError, match="scale: argument x has dtype int64, expected float64"):
        client.call("scale", 3, np.zeros(3, dtype=np.int64), 2.0)
    with pytest.raises(CallError, match=r"scale takes 3 arguments \(n, x, k\), got 2"):
        client.call("scale", 3, np.zeros(3))
    with pytest.raises(ValueError, match="option 'replicas' is for shipped-code tasks"):
        client.options(replicas=2).call("scale", 3, np.zeros(3), 2.0)
    assert [P.decode(f)[0] for f in sent if P.decode(f)[0] != P.CANCEL] == []
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
    assert client._conn.interfaces[("add", None)].version == "1"
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
