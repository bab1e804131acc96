"""The worker's pull loop against a scripted fake master (no Rust side needed)."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time

import pytest

import tasks
from fakemaster import FakeMaster
from helpers import wait_until
from rtpool import _protocol as P
from rtpool import _serialize as S
from rtpool.worker import EXIT_LOST, EXIT_OK, WorkerConnection, adaptive_prefetch

HASH = b"\x01" * 32
CODE = S.serialize_function(tasks.square)[1]


class Running:
    """A WorkerConnection serving in a thread, and the master's side of its connection."""

    def __init__(self, fake: FakeMaster, **kwargs) -> None:
        # These tests end a worker by closing its connection: no reconnection unless asked.
        kwargs.setdefault("reconnect_timeout", None)
        self.conn = WorkerConnection(fake.address, "tok", "unit-worker", **kwargs)
        self.code = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.master = fake.accept()

    def _serve(self) -> None:
        self.code = self.conn.serve()

    def stop(self) -> None:
        # What the SIGTERM handler does: set the flag, wake the select().
        self.conn.stopping = True
        os.write(self.conn._wake_w, b"\0")

    def join(self) -> int:
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.code


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


def assignment(task, fn_code=CODE, args=((3,), None), fn_hash=HASH, attempt=1, timeout_ms=0):
    return [task, attempt, fn_hash, fn_code, pickle.dumps(args, 5), timeout_ms]


def test_hello_then_pull_then_result(fake):
    w = Running(fake)
    # The trailing identity is this process's ``host:pid``: a lone worker (not supervised).
    identity = f"{socket.gethostname()}:{os.getpid()}"
    # Then empty resources and labels, and the features: it heartbeats slower while idle.
    hello = [P.HELLO, P.PROTOCOL_VERSION, "worker", "tok", "unit-worker", 1, identity, {}, {}, 1]
    assert w.master.hello == hello
    assert w.master.recv_kind(P.PULL) == [P.PULL, 2]  # 1 slot + prefetch 1 until it learns
    w.master.send(P.ASSIGN, [assignment(10)])
    result = w.master.recv_kind(P.RESULT)
    ((task, attempt, status, data, exec_us, wait_us, flush_us),) = result[1]
    assert (task, attempt, status, pickle.loads(data)) == (10, 1, P.STATUS_OK, 9)
    assert min(exec_us, wait_us, flush_us) >= 0
    # Top up to 1 + prefetch (about 2 ms of tasks like this one, at most 64; timing-dependent).
    credits = w.master.recv_kind(P.PULL)[1]
    assert 1 <= credits <= 64
    # The code is cached: later assignments carry no code.
    w.master.send(P.ASSIGN, [assignment(11, fn_code=None, args=((4,), None))])
    assert pickle.loads(w.master.recv_kind(P.RESULT)[1][0][3]) == 16
    w.stop()
    assert w.master.recv_kind(P.DRAIN, skip=(P.PULL, P.HEARTBEAT)) == [P.DRAIN]
    assert w.master.recv(5) is None  # half-closed by the worker
    w.master.close()
    assert w.join() == EXIT_OK


def test_kwargs_reach_the_function(fake):
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    echo = S.serialize_function(tasks.echo)[1]
    w.master.send(P.ASSIGN, [assignment(1, echo, ((1,), {"priority": 2}))])
    assert pickle.loads(w.master.recv_kind(P.RESULT)[1][0][3]) == ((1,), {"priority": 2})
    w.master.close()
    assert w.join() == EXIT_LOST


def test_task_exception_is_reported(fake):
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    fail = S.serialize_function(tasks.fail)[1]
    w.master.send(P.ASSIGN, [assignment(1, fail, (("boom",), None))])
    (r,) = w.master.recv_kind(P.RESULT)[1]
    assert r[2] == P.STATUS_ERROR
    exc = S.error_from_report(r[3])
    assert type(exc) is tasks.TaskError and str(exc) == "boom"
    assert "in fail" in exc.__cause__.tb
    w.master.close()
    w.join()


def test_unpicklable_result_is_an_error(fake):
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    fn = S.serialize_function(tasks.return_generator)[1]
    w.master.send(P.ASSIGN, [assignment(1, fn, ((), None))])
    (r,) = w.master.recv_kind(P.RESULT)[1]
    assert r[2] == P.STATUS_ERROR
    assert "cannot pickle the task's return value" in str(S.error_from_report(r[3]))
    w.master.close()
    w.join()


def test_missing_module_is_named(fake):
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    code = b"\x80\x05\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x0eno_such_mod_xy\x8c\x02fn\x93."
    w.master.send(P.ASSIGN, [assignment(1, code), assignment(2, None)])
    results = w.master.recv_kind(P.RESULT)[1]
    while len(results) < 2:
        results += w.master.recv_kind(P.RESULT)[1]
    for r in results:
        assert r[2] == P.STATUS_ERROR
        exc = S.error_from_report(r[3])
        assert type(exc) is ModuleNotFoundError
        assert exc.name == "no_such_mod_xy"
        assert "install module 'no_such_mod_xy' on the worker" in str(exc)
        assert "unit-worker" in str(exc)
    w.master.close()
    w.join()


def test_results_are_batched_and_each_sent_once(fake, monkeypatch):
    # Batching by count and by an empty queue only: the 1 ms deadline (a result never waits
    # longer than that behind the next task) splits the batch whenever a task is preempted
    # for a millisecond, as next to a CPU hog (2 frames for 2 results in a hog run).
    from rtpool.worker import _results

    monkeypatch.setattr(_results, "FLUSH_AFTER_NS", 60 * 10**9)
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    noop = S.serialize_function(tasks.noop)[1]
    w.master.send(P.ASSIGN, [assignment(0, noop, ((), None))])
    w.master.recv_kind(P.RESULT)
    credits = w.master.recv_kind(P.PULL)[1] + 1  # one credit was left over
    w.master.send(P.ASSIGN, [assignment(i, None, ((), None)) for i in range(1, credits + 1)])
    frames = []
    seen = []
    while len(seen) < credits:
        msg = w.master.recv()
        assert msg is not None, "the worker closed the connection"
        if msg[0] == P.RETURN:
            # The worker hands back what exceeds its prefetch (it depends on how long the
            # first task took): assign those again, as a master would.
            again = [assignment(t, None, ((), None), attempt=a + 1) for t, a in msg[1]]
            w.master.send(P.ASSIGN, again)
        elif msg[0] == P.RESULT:
            frames.append(msg)
            seen += [r[0] for r in msg[1]]
    assert sorted(seen) == list(range(1, credits + 1))
    assert len(frames) < credits  # several results per frame
    assert max(len(f[1]) for f in frames) <= 64
    w.master.close()
    w.join()


def test_graceful_drain_returns_unstarted_tasks(fake, tmp_path):
    log = tmp_path / "started"
    w = Running(fake)
    assert w.master.recv_kind(P.PULL) == [P.PULL, 2]
    fn = S.serialize_function(tasks.logged)[1]
    w.master.send(
        P.ASSIGN,
        [
            assignment(1, fn, ((1, str(log), 0.3), None), attempt=1),
            assignment(2, None, ((2, str(log), 0.3), None), attempt=3),
        ],
    )
    wait_until(lambda: log.exists() and log.read_text() == "1\n")
    w.stop()
    msgs = []
    while (msg := w.master.recv(5)) is not None:
        msgs.append(msg)
    w.master.close()
    assert w.join() == EXIT_OK
    kinds = [m[0] for m in msgs if m[0] not in (P.PULL, P.HEARTBEAT)]
    # Task 1's result may go out before DRAIN (a slow task's result is not held back) or
    # right after it; RETURN of the unstarted task 2 comes last.
    assert kinds in ([P.RESULT, P.DRAIN, P.RETURN], [P.DRAIN, P.RESULT, P.RETURN])
    (r,) = next(m for m in msgs if m[0] == P.RESULT)[1]
    assert (r[0], r[2], pickle.loads(r[3])[0]) == (1, P.STATUS_OK, 1)
    assert msgs[-1] == [P.RETURN, [[2, 3]]]
    assert log.read_text() == "1\n"  # task 2 never started


def test_heartbeat_when_idle():
    with FakeMaster(heartbeat_ms=50) as fake:
        w = Running(fake)
        w.master.recv_kind(P.PULL)
        assert w.master.recv_kind(P.HEARTBEAT, timeout=2) == [P.HEARTBEAT]
        w.master.close()
        assert w.join() == EXIT_LOST


class IdleRateMaster(FakeMaster):
    """A master that offers the idle heartbeat (WELCOME's 7th field)."""

    lease_ms = 300

    def welcome_fields(self) -> list:
        return [*super().welcome_fields(), 2000]


def _heartbeats(conn, seconds: float, stop_at=None) -> int:
    """HEARTBEAT frames read in the next ``seconds`` (or until a frame of ``stop_at``)."""
    count, end = 0, time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            msg = conn.recv(timeout=left)
        except TimeoutError:
            break
        if msg is None:
            break
        if msg[0] == P.HEARTBEAT:
            count += 1
        elif msg[0] == stop_at:
            break
    return count


def test_heartbeats_at_the_idle_rate_unless_a_task_is_held():
    # heartbeat_ms 50 (a lease of 300 allows it), idle rate 2 s: while it holds nothing the
    # worker is silent for 1.8 s at least; while a task runs it beats every 50 ms; after the
    # result it is idle again (the flag is set per batch, so this fails if it never clears).
    with IdleRateMaster(heartbeat_ms=50) as fake:
        w = Running(fake)
        w.master.recv_kind(P.PULL)
        w.master.recv_kind(P.HEARTBEAT, skip=())  # the one sent at the session's start
        assert _heartbeats(w.master, 1.0) == 0
        sleeper = S.serialize_function(tasks.sleep_return)[1]
        w.master.send(
            P.ASSIGN, [assignment(1, sleeper, args=((7, 1.0), None), fn_hash=b"\x02" * 32)]
        )
        assert _heartbeats(w.master, 5.0, stop_at=P.RESULT) >= 3
        # The master speaks (as a real one would within its heartbeat): a worker that hears
        # nothing for its period asks for an answer, which is not what this counts.
        w.master.send(P.HEARTBEAT)
        assert _heartbeats(w.master, 1.0) == 0
        w.master.close()
        assert w.join() == EXIT_LOST


class OlderMaster(FakeMaster):
    """A master from before HELLO.features: a HELLO of 9 fields is malformed to it."""

    max_hello_fields = 8


def test_a_worker_connects_to_a_master_that_predates_hello_features():
    with OlderMaster(heartbeat_ms=50) as fake:
        w = Running(fake)
        # Refused with the features, then welcomed without: host:pid and no trailing maps.
        assert w.master.hello[1:] == [
            P.PROTOCOL_VERSION, "worker", "tok", "unit-worker", 1,
            f"{socket.gethostname()}:{os.getpid()}",
        ]  # fmt: skip
        assert fake.hellos == 2
        w.master.recv_kind(P.PULL)
        # Judged by the lease, always: it heartbeats every heartbeat_ms while idle.
        assert _heartbeats(w.master, 1.0) >= 3
        w.master.close()
        assert w.join() == EXIT_LOST


def test_fatal_error_from_master_ends_the_worker(fake):
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    w.master.send(P.ERROR, "shutdown", "master going down", 0)
    assert w.join() == EXIT_LOST


@pytest.mark.parametrize(
    "entry",
    [
        [1, 1, HASH, CODE, pickle.dumps(((3,), None), 5)],  # no timeout_ms
        [1, 1, HASH, CODE, pickle.dumps(((3,), None), 5), 0, "extra"],
        7,
    ],
    ids=["missing-field", "extra-field", "not-a-list"],
)
def test_a_malformed_assign_is_a_protocol_error(fake, entry, capfd):
    # The protocol has no optional fields: an entry of another shape ends the session with a
    # message that names the message and the expected fields (no task runs).
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    w.master.send(P.ASSIGN, [entry])
    while (msg := w.master.recv(5)) is not None:  # the worker closes the connection
        assert msg[0] in (P.PULL, P.HEARTBEAT), msg  # no result: no task ran
    assert w.join() == EXIT_LOST
    err = capfd.readouterr().err
    assert "malformed ASSIGN from the master" in err
    assert "task, attempt, fn_hash, fn_code, args, timeout_ms" in err


def test_a_malformed_assign_calls_is_a_protocol_error(fake, capfd):
    w = Running(fake)
    w.master.recv_kind(P.PULL)
    w.master.send(P.ASSIGN_CALLS, [[1, 1, "add", "1", b"", []]])  # no timeout_ms
    while (msg := w.master.recv(5)) is not None:  # the worker closes the connection
        assert msg[0] in (P.PULL, P.HEARTBEAT), msg  # no result: no task ran
    assert w.join() == EXIT_LOST
    err = capfd.readouterr().err
    assert "malformed ASSIGN_CALLS from the master" in err
    assert "task, attempt, name, version, args, inputs, timeout_ms" in err


def test_result_above_the_frame_limit_becomes_an_error():
    with FakeMaster(max_frame_bytes=4096) as fake:
        w = Running(fake)
        w.master.recv_kind(P.PULL)
        fn = S.serialize_function(tasks.apply)[1]
        big = S.dumps_args((bytes, 10_000), None)
        small = S.dumps_args((bytes, 1000), None)
        w.master.send(P.ASSIGN, [[1, 1, HASH, fn, big, 0]])
        (r,) = w.master.recv_kind(P.RESULT)[1]
        assert r[2] == P.STATUS_ERROR
        exc = S.error_from_report(r[3])
        assert type(exc) is ValueError
        assert "above the master's frame limit of 4096 bytes" in str(exc)
        # Results that fit alone but not together go out in several frames.
        w.master.send(P.ASSIGN, [[i, 1, HASH, None, small, 0] for i in range(2, 8)])
        got = []
        while len(got) < 6:
            msg = w.master.recv(timeout=10)
            assert msg is not None, "the worker closed the connection"
            if msg[0] in (P.PULL, P.HEARTBEAT):
                continue
            if msg[0] == P.RETURN:
                # The worker hands back what exceeds its prefetch (it depends on how long the
                # first tasks took): assign those again, as a master would.
                w.master.send(P.ASSIGN, [[t, a, HASH, None, small, 0] for t, a in msg[1]])
                continue
            assert msg[0] == P.RESULT, msg
            assert len(P.encode(*msg)) - 4 <= 4096
            got += [r[0] for r in msg[1]]
        assert sorted(got) == list(range(2, 8))
        w.master.close()
        w.join()


def test_wait_us_counts_time_spent_in_the_socket_during_a_task(fake, tmp_path):
    log = tmp_path / "started"
    w = Running(fake)
    assert w.master.recv_kind(P.PULL) == [P.PULL, 2]
    fn = S.serialize_function(tasks.logged)[1]
    w.master.send(P.ASSIGN, [assignment(1, fn, ((1, str(log), 0.3), None))])
    wait_until(lambda: log.exists())
    # Arrives while task 1 runs; the worker reads it only afterwards.
    w.master.send(P.ASSIGN, [assignment(2, None, ((2, str(log)), None))])
    results = {}
    while len(results) < 2:
        for r in w.master.recv_kind(P.RESULT, skip=(P.PULL, P.HEARTBEAT))[1]:
            results[r[0]] = r
    assert results[1][4] >= 250_000  # exec_us of the 0.3 s task
    assert results[2][5] >= 200_000  # wait_us: most of that, spent in the socket
    w.master.close()
    w.join()


def test_prefetch_is_about_2_ms_of_tasks():
    assert adaptive_prefetch(10_000, 64) == 64  # 10 us tasks: capped
    assert adaptive_prefetch(10_000, 8) == 8
    assert adaptive_prefetch(500_000, 64) == 3  # 0.5 ms tasks: a few queued
    assert adaptive_prefetch(10_000_000, 64) == 1  # 10 ms tasks: one queued, for balance
