"""Deadlines, hedging and quorum in the SDK: option validation and wire form, result decoding
(``late_us``, statuses 7 and 8, ``ERROR admission``), the deadline report, anytime gather.

Against the scripted fake master, plus one anytime gather against a real LocalCluster (it
needs only ``CANCEL``). The end-to-end tests of the master's side are in
``test_deadline_e2e.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import pickle
import threading
import time

import msgpack
import pytest

import rtpool
import tasks
from fakemaster import FakeMaster
from helpers import wait_until
from rtpool import _protocol as P
from rtpool._options import WIRE_DEFAULTS
from rtpool._serialize import dumps_error
from rtpool.errors import (
    AdmissionError,
    DeadlineMissedError,
    ProtocolError,
    QuorumError,
    SubmitRejected,
    TaskFailed,
)

SPEC_ORDER = list(WIRE_DEFAULTS)


def recv(conn, kind):
    """The next message of ``kind``, skipping heartbeats and ACKs."""
    return conn.recv_kind(kind, skip=(P.HEARTBEAT, P.ACK))


def entry(index, value=None, status=P.STATUS_OK, late_us=0):
    """A TaskResult (9 fields, the last one ``late_us``)."""
    data = pickle.dumps(value, 5) if status == P.STATUS_OK else value
    return [index, status, data, 11, 22, 33, 44, 55, late_us]


def accept(fake, conn=None, package=7):
    """Read the next SUBMIT (on ``conn``, or the next connection) and accept it as
    ``package``; return (conn, submit message)."""
    conn = fake.accept() if conn is None else conn
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ACCEPTED, msg[1], package)
    return conn, msg


def task_error_report(message="boom"):
    try:
        tasks.fail(message)
    except tasks.TaskError as exc:
        return dumps_error(exc)


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


@pytest.fixture
def client(fake):
    c = rtpool.Client(fake.address, "tok", name="unit")
    yield c
    c.close()


# -- options: validation and wire form ---------------------------------------------------------


def test_every_option_goes_on_the_wire_in_spec_order(fake, client):
    view = client.options(
        hedge=True,
        max_copies=5,
        quorum=2,
        replicas=3,
        admit=True,
        on_miss="drop",
        deadline=1.5,
        timeout=3,
        priority=2,
        max_attempts=4,
        resources={"mem_gb": 8, "gpu": 1},
        labels={"zone": "a"},
        unschedulable="wait",
    )
    view.submit(tasks.square, 2)
    opts = fake.accept().recv_kind(P.SUBMIT)[4]
    # "key" in its place, after timeout_ms; "near" only for kept inputs (test_kept.py),
    # "after"/"after_index" only for a dependent held by the master (test_kept_held.py).
    internal = {"near", "after", "after_index"}
    assert list(opts) == [k for k in SPEC_ORDER if k not in internal]
    assert {k: v for k, v in opts.items() if k != "key"} == {
        "priority": 2,
        "timeout_ms": 3000,
        "deadline_ms": 1500,
        "on_miss": "drop",
        "admit": True,
        "replicas": 3,
        "quorum": 2,
        "max_copies": 5,
        "hedge": True,
        "max_attempts": 4,
        "resources": {"gpu": 1, "mem_gb": 8},
        "labels": {"zone": "a"},
        "unschedulable": "wait",
    }
    assert len(opts["key"]) == 32


def test_the_frame_is_canonical_wire_form(fake, client):
    client.options(deadline=2, replicas=2).submit_many(tasks.square, [1, 2])
    conn = fake.accept()
    conn.sock.settimeout(5)
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        data += conn.sock.recv(1 << 16)
    frame = data[: 4 + int.from_bytes(data[:4], "big")]
    msg = P.decode(frame)
    assert list(msg[4]) == ["key", "deadline_ms", "replicas"]
    assert msg[4]["deadline_ms"] == 2000 and msg[4]["replicas"] == 2
    # Byte-exact: the client wrote the opts map in wire form (spec order, defaults left out),
    # and encode() writes it as given.
    assert P.encode(*msg) == frame


def test_defaults_are_left_out(client):
    view = client.options(
        deadline=None, on_miss="run", admit=False, replicas=1, quorum=1, max_copies=0, hedge=False
    )
    assert view._opts == {}
    assert client.options(replicas=None, quorum=None, max_copies=None)._opts == {}


@pytest.mark.parametrize(
    ("seconds", "ms"), [(2, 2000), (0.0101, 11), (1e-7, 1), (0.5, 500), (4_000_000, 4_000_000_000)]
)
def test_relative_deadline_is_rounded_up_to_ms(client, seconds, ms):
    assert client.options(deadline=seconds)._opts == {"deadline_ms": ms}


def test_absolute_deadline_is_converted_at_each_submission(fake, client, monkeypatch):
    now = time.time()
    at = dt.datetime.fromtimestamp(now + 100, dt.timezone.utc)  # aware
    view = client.options(deadline=at)
    assert view._opts == {}  # nothing fixed yet
    monkeypatch.setattr(time, "time", lambda: now + 60)
    view.submit(tasks.square, 1)
    conn = fake.accept()
    ms = conn.recv_kind(P.SUBMIT)[4]["deadline_ms"]
    assert 39_000 < ms <= 40_001
    monkeypatch.setattr(time, "time", lambda: now + 90)
    view.submit_many(tasks.square, [1, 2])
    ms = recv(conn, P.SUBMIT)[4]["deadline_ms"]
    assert 9_000 < ms <= 10_001


def test_naive_datetime_is_local_time(fake, client):
    client.options(deadline=dt.datetime.now() + dt.timedelta(seconds=30)).submit(tasks.noop)
    ms = fake.accept().recv_kind(P.SUBMIT)[4]["deadline_ms"]
    assert 25_000 < ms <= 30_000


def test_absolute_deadline_in_the_past(fake, client, monkeypatch):
    with pytest.raises(ValueError, match="option 'deadline' is in the past"):
        client.options(deadline=dt.datetime.now() - dt.timedelta(seconds=1))
    now = time.time()
    view = client.options(deadline=dt.datetime.fromtimestamp(now + 5))
    monkeypatch.setattr(time, "time", lambda: now + 6)
    with pytest.raises(ValueError, match="in the past"):
        view.submit(tasks.square, 1)
    with pytest.raises(ValueError, match="in the past"):
        view.submit_many(tasks.square, [1])
    monkeypatch.undo()
    client.submit(tasks.square, 3)  # nothing of the refused ones was sent
    assert fake.accept().recv_kind(P.SUBMIT)[5] == [pickle.dumps(((3,), None), 5)]


@pytest.mark.parametrize(
    ("opts", "error", "match"),
    [
        ({"deadline": 0}, ValueError, "option 'deadline' must be a positive number"),
        ({"deadline": -1.0}, ValueError, "option 'deadline' must be a positive"),
        ({"deadline": float("nan")}, ValueError, "option 'deadline'"),
        ({"deadline": float("inf")}, ValueError, "option 'deadline'"),
        ({"deadline": 2**32}, ValueError, "option 'deadline' must be at most"),
        ({"deadline": "5"}, TypeError, "option 'deadline' must be a number of seconds or a dat"),
        ({"deadline": True}, TypeError, "option 'deadline'"),
        ({"deadline": dt.date.today()}, TypeError, "option 'deadline'"),
        ({"on_miss": "skip"}, ValueError, "option 'on_miss' must be 'run' or 'drop'"),
        ({"on_miss": 1}, TypeError, "option 'on_miss' must be a str"),
        ({"replicas": 0}, ValueError, "option 'replicas' must be between 1 and 16, got 0"),
        ({"replicas": 17}, ValueError, "option 'replicas' must be between 1 and 16"),
        ({"replicas": 2.0}, TypeError, "option 'replicas' must be an int"),
        ({"quorum": 0}, ValueError, "option 'quorum' must be between 1 and 16"),
        ({"quorum": 2}, ValueError, r"option 'quorum' \(2\) must be at most 'replicas' \(1\)"),
        ({"replicas": 2, "quorum": 3}, ValueError, "option 'quorum'"),
        ({"max_copies": 17}, ValueError, "option 'max_copies' must be between 0 and 16"),
        ({"max_copies": -1}, ValueError, "option 'max_copies'"),
        ({"replicas": 3, "max_copies": 2}, ValueError, "option 'max_copies' .2. must be at lea"),
        ({"hedge": 1}, TypeError, "option 'hedge' must be True or False"),
        ({"admit": "yes"}, TypeError, "option 'admit' must be True or False"),
        ({"admit": True}, ValueError, "option 'admit' needs a deadline"),
        ({"on_miss": "drop"}, ValueError, "option on_miss='drop' needs a deadline"),
        ({"priority": True}, TypeError, "option 'priority' must be an int"),
    ],
)
def test_bad_option_values_name_the_option(client, opts, error, match):
    with pytest.raises(error, match=match):
        client.options(**opts)


def test_unknown_option_lists_every_valid_one(client):
    with pytest.raises(TypeError) as info:
        client.options(dedline=3)
    assert str(info.value) == (
        "unknown option 'dedline'; valid options: priority, timeout, deadline, on_miss, admit, "
        "replicas, quorum, max_copies, hedge, max_attempts, resources, labels, unschedulable"
    )


def test_none_resets_an_option_to_its_default(client):
    view = client.options(priority=3, timeout=2, deadline=1, on_miss="drop", replicas=2, hedge=True)
    reset = view.options(
        priority=None, timeout=None, deadline=None, on_miss=None, replicas=None, hedge=None
    )
    assert reset._opts == {} and reset._deadline_at is None


def test_options_merge_across_views_and_are_checked_together(client):
    assert client.options(replicas=3).options(quorum=2)._opts == {"replicas": 3, "quorum": 2}
    assert client.options(deadline=5).options(admit=True)._opts == {
        "deadline_ms": 5000,
        "admit": True,
    }
    with pytest.raises(ValueError, match="'quorum' .3. must be at most 'replicas' .2."):
        client.options(replicas=3, quorum=3).options(replicas=2)
    with pytest.raises(ValueError, match="'admit' needs a deadline"):
        client.options(deadline=5, admit=True).options(deadline=None)
    future = dt.datetime.now() + dt.timedelta(hours=1)
    absolute = client.options(deadline=future, admit=True)
    assert absolute._deadline_at is not None and absolute._opts == {"admit": True}
    relative = absolute.options(deadline=2)
    assert relative._deadline_at is None
    assert relative._opts == {"deadline_ms": 2000, "admit": True}


# -- results: late_us, statuses 7 and 8 --------------------------------------------------------


def test_results_report_their_lateness_only_with_a_deadline(fake, client):
    plain = client.submit_many(tasks.square, [0, 1])
    conn, _ = accept(fake, package=1)
    conn.send(P.RESULTS, 1, [entry(0, 0), entry(1, 1, late_us=0)])
    assert plain.results(5) == [0, 1]
    assert [f.lateness for f in plain] == [None, None]  # no deadline
    assert plain[0].timings["late_us"] == 0

    timed = client.options(deadline=1).submit_many(tasks.square, range(3))
    assert [f.lateness for f in timed] == [None] * 3  # no result yet
    accept(fake, conn, package=2)
    conn.send(P.RESULTS, 2, [entry(0, 0, late_us=0), entry(1, 1, late_us=250_000), entry(2, 4)])
    assert timed.results(5) == [0, 1, 4]
    assert [f.lateness for f in timed] == [0.0, 0.25, 0.0]
    assert [f.timings["late_us"] for f in timed] == [0, 250_000, 0]
    assert timed[1].timings["flush_us"] == 55


def test_status_7_is_deadline_missed(fake, client):
    fut = client.options(deadline=0.1, on_miss="drop").submit(tasks.square, 3)
    conn, _ = accept(fake)
    conn.send(P.RESULTS, 7, [entry(0, b"deadline passed 12 ms ago", P.STATUS_MISSED, 12_000)])
    with pytest.raises(DeadlineMissedError, match="deadline passed 12 ms ago") as info:
        fut.result(5)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, TaskFailed)
    assert fut.lateness == 0.012


def disagreement(message, copies):
    return msgpack.packb([message, [list(c) for c in copies]], use_bin_type=True)


def test_status_8_is_a_quorum_error_with_every_copy(fake, client):
    copies = [
        ("w1", P.STATUS_OK, pickle.dumps(4)),
        ("w2", P.STATUS_OK, pickle.dumps(5)),
        ("w3", P.STATUS_ERROR, task_error_report("bad copy")),
        ("w4", P.STATUS_TIMEOUT, b"ran past 100 ms"),
        ("w5", P.STATUS_OK, b"not a pickle"),
    ]
    fut = client.options(replicas=2, quorum=2).submit(tasks.square, 2)
    conn, _ = accept(fake)
    data = disagreement("no 2 of 5 copies agreed", copies)
    conn.send(P.RESULTS, 7, [entry(0, data, P.STATUS_DISAGREE, 0)])
    with pytest.raises(QuorumError, match="5 copies did not reach a quorum: no 2 of 5") as info:
        fut.result(5)
    results = info.value.results
    assert [(w, s) for w, s, _ in results] == [(w, s) for w, s, _ in copies]
    assert results[0][2] == 4 and results[1][2] == 5
    assert isinstance(results[2][2], tasks.TaskError) and str(results[2][2]) == "bad copy"
    assert "in fail" in results[2][2].__cause__.tb
    assert results[3][2] == "ran past 100 ms"
    assert isinstance(results[4][2], TaskFailed)  # a copy whose value does not unpickle
    assert fut.lateness is None


def test_unreadable_disagreement_report_is_still_a_quorum_error(fake, client):
    fut = client.submit(tasks.square, 2)
    conn, _ = accept(fake)
    conn.send(P.RESULTS, 7, [entry(0, b"\xc1", P.STATUS_DISAGREE)])
    with pytest.raises(QuorumError, match="cannot be read") as info:
        fut.result(5)
    assert info.value.results == []


def test_quorum_error_pickles_with_its_results():
    err = QuorumError("no quorum", [("w1", 0, 4), ("w2", 4, "slow")])
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is QuorumError
    assert str(copy) == "no quorum" and copy.results == err.results


def test_decode_disagreement():
    data = disagreement("m", [("a", 0, b"x"), ("b", 1, b"")])
    assert P.decode_disagreement(data) == ("m", [("a", 0, b"x"), ("b", 1, b"")])
    assert P.decode_disagreement(disagreement("none", [])) == ("none", [])
    bad = [
        b"\xc1",
        msgpack.packb(["m"]),
        msgpack.packb([1, []]),
        msgpack.packb(["m", "not a list"]),
        msgpack.packb(["m", [["a", 0]]]),
        msgpack.packb(["m", [["a", "0", b""]]], use_bin_type=True),
        msgpack.packb(["m", [["a", 0, "str, not bin"]]], use_bin_type=True),
    ]
    for data in bad:
        with pytest.raises(ProtocolError, match="malformed"):
            P.decode_disagreement(data)


# -- admission ---------------------------------------------------------------------------------


def test_admission_refusal_fails_the_package_and_keeps_the_connection(fake, client):
    view = client.options(deadline=0.5, admit=True)
    pkg = view.submit_many(tasks.square, range(3))
    conn = fake.accept()
    msg = conn.recv_kind(P.SUBMIT)
    assert msg[4]["admit"] is True
    reason = "admission refused: 3 tasks are estimated to finish 900000 us after submission"
    conn.send(P.ERROR, "admission", reason, msg[1])
    with pytest.raises(AdmissionError, match="cannot finish by its deadline: admission refused"):
        pkg[0].result(5)
    assert all(isinstance(f.exception(0), AdmissionError) for f in pkg)
    assert isinstance(pkg[0].exception(0), SubmitRejected)
    with pytest.raises(AdmissionError):
        _ = pkg.id  # waits for the master's answer
    it = view.map(tasks.square, [1])
    msg = recv(conn, P.SUBMIT)
    conn.send(P.ERROR, "admission", reason, msg[1])
    with pytest.raises(AdmissionError, match="900000 us"):
        next(it)
    good = client.submit(tasks.square, 3)
    accept(fake, conn, package=1)
    conn.send(P.RESULTS, 1, [entry(0, 9)])
    assert good.result(5) == 9


# -- status and deadline report ----------------------------------------------------------------


def ask_status(pkg):
    out = {}
    t = threading.Thread(target=lambda: out.update(pkg.status(timeout=5)))
    t.start()
    return t, out


def test_status_reports_met_and_missed_from_a_9_field_reply(fake, client):
    pkg = client.options(deadline=1).submit_many(tasks.square, range(10))
    conn, _ = accept(fake, package=3)
    t, out = ask_status(pkg)
    req = recv(conn, P.STATUS)
    conn.send(P.STATUS_REPLY, req[1], 3, 10, 5, 2, 3, 0, 2, 1)
    t.join(5)
    assert out == {
        "total": 10,
        "queued": 5,
        "running": 2,
        "done": 3,
        "cancelled": 0,
        "met": 2,
        "missed": 1,
    }


def test_status_of_a_finished_package_with_a_deadline_is_local(fake, client):
    pkg = client.options(deadline=1).submit_many(tasks.square, range(3))
    conn, _ = accept(fake, package=3)
    conn.send(
        P.RESULTS, 3, [entry(0, 0, late_us=0), entry(1, 1, late_us=5), entry(2, 4, late_us=0)]
    )
    pkg.results(5)
    assert pkg.status() == {
        "total": 3,
        "queued": 0,
        "running": 0,
        "done": 3,
        "cancelled": 0,
        "met": 2,
        "missed": 1,
    }


def test_deadline_report(fake, client):
    pkg = client.options(deadline=0.2, on_miss="drop").submit_many(tasks.square, range(6))
    conn, _ = accept(fake, package=4)
    assert pkg[4].cancel()
    conn.send(
        P.RESULTS,
        4,
        [
            entry(0, 0, late_us=0),
            entry(1, 1, late_us=500_000),
            entry(2, b"dropped", P.STATUS_MISSED, late_us=1000),
            entry(5, task_error_report(), P.STATUS_ERROR, late_us=0),
        ],
    )
    wait_until(lambda: pkg[5].done())
    assert pkg.deadline_report() == {
        "met": 2,  # index 0, and 5 (an error, but by the deadline)
        "missed": 2,
        "dropped": 1,
        "cancelled": 1,
        "pending": 1,
        "lateness": {1: 0.5, 2: 0.001},
    }


def test_deadline_report_needs_a_deadline(fake, client):
    pkg = client.submit_many(tasks.square, range(2))
    with pytest.raises(ValueError, match="no deadline"):
        pkg.deadline_report()


# -- anytime gather ----------------------------------------------------------------------------


def test_gather_takes_what_is_done_and_cancels_the_rest_by_index(fake, client):
    pkg = client.submit_many(tasks.square, range(5))
    conn, _ = accept(fake, package=8)
    conn.send(P.RESULTS, 8, [entry(0, 0), entry(3, 9)])
    wait_until(lambda: pkg[3].done())
    t0 = time.monotonic()
    out = client.gather(pkg.futures, deadline=0.2, default="late")
    assert time.monotonic() - t0 >= 0.2
    assert out == [0, "late", "late", 9, "late"]
    assert [f.cancelled() for f in pkg] == [False, True, True, False, True]
    assert recv(conn, P.CANCEL) == [P.CANCEL, 8, [1, 2, 4]]  # one frame for the package


def test_gather_over_several_packages_sends_one_cancel_each(fake, client):
    a = client.submit_many(tasks.square, range(3))
    b = client.submit(tasks.square, 5)
    conn, _ = accept(fake, package=1)
    accept(fake, conn, package=2)
    conn.send(P.RESULTS, 1, [entry(1, 1)])
    wait_until(lambda: a[1].done())
    out = client.gather([b, *a], deadline=0.05)
    assert out == [None, None, 1, None]
    cancels = sorted([recv(conn, P.CANCEL), recv(conn, P.CANCEL)])
    assert cancels == [[P.CANCEL, 1, [0, 2]], [P.CANCEL, 2, [0]]]


def test_gather_without_deadline_waits_for_all(fake, client):
    pkg = client.submit_many(tasks.square, range(3))
    conn, _ = accept(fake, package=2)
    conn.send(P.RESULTS, 2, [entry(2, 4)])
    threading.Timer(0.05, conn.send, (P.RESULTS, 2, [entry(0, 0), entry(1, 1)])).start()
    assert client.gather(pkg.futures) == [0, 1, 4]


def test_gather_raises_the_first_failure_at_once(fake, client):
    pkg = client.submit_many(tasks.square, range(3))
    conn, _ = accept(fake, package=2)
    conn_entries = [entry(1, task_error_report("one"), P.STATUS_ERROR)]
    threading.Timer(0.05, conn.send, (P.RESULTS, 2, conn_entries)).start()
    t0 = time.monotonic()
    with pytest.raises(tasks.TaskError, match="one"):
        client.gather(pkg.futures, deadline=30)
    assert time.monotonic() - t0 < 10  # not at the deadline
    assert not pkg[0].cancelled() and not pkg[2].cancelled()  # left running, as asyncio does


def test_gather_return_exceptions(fake, client):
    pkg = client.submit_many(tasks.square, range(3))
    conn, _ = accept(fake, package=2)
    conn.send(P.RESULTS, 2, [entry(0, task_error_report("zero"), P.STATUS_ERROR), entry(2, 4)])
    wait_until(lambda: pkg[2].done())
    out = client.gather(pkg.futures, deadline=0.05, default=-1, return_exceptions=True)
    assert isinstance(out[0], tasks.TaskError) and out[1:] == [-1, 4]
    assert recv(conn, P.CANCEL) == [P.CANCEL, 2, [1]]


def test_gather_deadline_in_the_past_and_foreign_futures(client):
    foreign = [cf.Future(), cf.Future()]
    foreign[0].set_result("done")
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    assert client.gather(foreign, deadline=past, default=0) == ["done", 0]
    assert foreign[1].cancelled()
    with pytest.raises(TypeError, match="'deadline' must be a number of seconds or a datetime"):
        client.gather(foreign, deadline="soon")


def test_gather_gives_default_for_tasks_the_master_cancelled(fake, client):
    pkg = client.submit_many(tasks.square, range(2))
    conn, _ = accept(fake, package=2)
    conn.send(P.RESULTS, 2, [entry(0, b"master shutting down", P.STATUS_CANCELLED), entry(1, 1)])
    assert client.gather(pkg.futures, deadline=5, default="x") == ["x", 1]


def test_package_results_until(fake, client):
    pkg = client.submit_many(tasks.square, range(3))
    conn, _ = accept(fake, package=6)
    conn.send(P.RESULTS, 6, [entry(1, 1)])
    wait_until(lambda: pkg[1].done())
    assert pkg.results(until=0.05, default=0.5) == [0.5, 1, 0.5]
    assert recv(conn, P.CANCEL) == [P.CANCEL, 6, [0, 2]]
    at = dt.datetime.now() + dt.timedelta(seconds=1)
    with pytest.raises(TypeError, match="timeout= or until="):
        pkg.results(1, until=at)


def test_gather_against_a_cluster_cancels_and_aborts_the_long_tasks():
    # Fast tasks first (FIFO), slow ones after; every task has a timeout, so the workers run
    # them in their supervised executor and can kill the running slow ones when aborted.
    with rtpool.LocalCluster(workers=2) as cluster:
        cluster.wait_for_workers(2, timeout=30)
        client = cluster.client()
        assert client.submit(tasks.square, 2).result(30) == 4  # warm: code cached, workers up
        fast = [(i, 0.05) for i in range(4)]
        slow = [(i, 60.0) for i in range(4, 8)]
        pkg = client.options(timeout=120).submit_many(tasks.sleep_return, fast + slow, star=True)
        out = client.gather(pkg.futures, deadline=2.0, default=None)
        assert out == [0, 1, 2, 3, None, None, None, None]
        assert all(f.cancelled() for f in pkg.futures[4:])
        # The queued slow tasks are dropped and the running ones aborted and killed: the master
        # holds nothing within seconds, though they would run for a minute.
        wait_until(lambda: cluster.stats()["tasks"] == 0, timeout=15)
        stats = cluster.stats()
        assert stats["queued"] == 0 and stats["running"] == 0
        assert client.submit(tasks.square, 3).result(15) == 9  # the workers are free again
