"""Worker supervision against a scripted fake master: time and memory limits (the executor
process), ABORT, reconnection, heartbeats during long tasks. No Rust side needed."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

import psutil
import pytest

import rtpool
import tasks
from fakemaster import FakeConn, FakeMaster
from helpers import stop_process, wait_until, worker_env, worker_processes
from rtpool import _native
from rtpool import _protocol as P
from rtpool import _serialize as S
from rtpool.worker import EXIT_CONFIG, EXIT_LOST, EXIT_OK, WorkerConnection
from rtpool.worker._executor_process import address_space_mib


def fn(f):
    """``(fn_hash, fn_code)`` of a task function."""
    return S.serialize_function(f)


def assign(task, f, *args, timeout_ms=0, attempt=1, send_code=True, kwargs=None):
    fn_hash, code = fn(f)
    payload = pickle.dumps((args, kwargs), 5)
    return [task, attempt, fn_hash, code if send_code else None, payload, timeout_ms]


class LeaseMaster(FakeMaster):
    """A FakeMaster with a short lease and its own instance number.

    ``instance`` and ``token`` may be changed between connections (a restarted master, a
    revoked token); ``hellos`` counts the handshakes.
    """

    def __init__(self, instance: int = 7, lease_ms: int = 3000, **kwargs) -> None:
        self.instance = instance
        self.lease_ms = lease_ms
        super().__init__(**kwargs)


def next_msg(master: FakeConn, kinds, deadline: float) -> list:
    """The next message of one of ``kinds`` before ``deadline`` (monotonic), HEARTBEATs
    skipped; fail on anything else. (FakeConn.recv_kind
    waits forever while heartbeats come.)"""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no message of kinds {kinds} in time"
        msg = master.recv(left)
        assert msg is not None, f"connection closed while waiting for kinds {kinds}"
        if msg[0] == P.HEARTBEAT and P.HEARTBEAT not in kinds:
            continue
        assert msg[0] in kinds, f"expected kinds {kinds}, got {msg!r:.200}"
        return msg


def expect(master: FakeConn, kind: int, timeout: float = 10.0) -> list:
    """The next message (HEARTBEATs skipped), which must be of ``kind``."""
    return next_msg(master, (kind,), time.monotonic() + timeout)


def recv_kind(master: FakeConn, kind: int, timeout: float = 10.0) -> list:
    """The next message of ``kind`` within ``timeout`` s, PULL and HEARTBEAT skipped."""
    end = time.monotonic() + timeout
    while True:
        msg = next_msg(master, (kind, P.PULL), end)
        if msg[0] == kind:
            return msg


def reset(conn: FakeConn) -> None:
    """Close the master's side with a reset (SO_LINGER 0): the worker's next write fails."""
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.sock.close()


class Served:
    """A WorkerConnection serving in a thread, and the master's side of its connection."""

    def __init__(self, fake: FakeMaster, **kwargs) -> None:
        kwargs.setdefault("reconnect_timeout", None)
        self.conn = WorkerConnection(fake.address, "tok", "sup-worker", **kwargs)
        self.code = None
        self.credits = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.master = fake.accept()

    def _serve(self) -> None:
        self.code = self.conn.serve()

    def stop(self) -> None:
        self.conn.stopping = True  # what the SIGTERM handler does
        os.write(self.conn._wake_w, b"\0")

    def join(self, timeout: float = 10.0) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not exit"
        return self.code

    def results(self, n: int, timeout: float = 10.0, master: FakeConn | None = None) -> dict:
        """The next ``n`` results by task id; ``self.credits`` sums the PULLs seen meanwhile."""
        master = master or self.master
        got: dict = {}
        end = time.monotonic() + timeout
        while len(got) < n:
            msg = next_msg(master, (P.RESULT, P.PULL), end)
            if msg[0] == P.PULL:
                self.credits += msg[1]
            else:
                got.update((r[0], r) for r in msg[1])
        return got

    def finish(self) -> None:
        self.stop()
        self.master.close()
        assert self.join() == EXIT_OK


@pytest.fixture
def fake():
    with LeaseMaster() as m:
        yield m


@pytest.fixture(autouse=True)
def no_orphans():
    """Every process a test's worker started (executors, task grandchildren) is gone after it."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield

    def leftovers():
        return [p for p in me.children(recursive=True) if p.pid not in before and _alive(p)]

    try:
        wait_until(lambda: not leftovers(), timeout=5)
    finally:
        for p in leftovers():
            p.kill()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _read_pid(path) -> int:
    wait_until(lambda: path.exists(), timeout=10)
    return int(path.read_text())


# -- time limits ------------------------------------------------------------------------------


@pytest.mark.parametrize("task", [tasks.spin_forever, tasks.spin_in_c])
def test_a_looping_task_is_killed_at_its_time_limit_and_the_next_task_runs(fake, task):
    w = Served(fake)
    assert expect(w.master, P.PULL) == [P.PULL, 2]
    start = time.monotonic()
    w.master.send(P.ASSIGN, [assign(1, task, timeout_ms=300)])
    (r,) = w.results(1).values()
    elapsed = time.monotonic() - start
    assert r[:3] == [1, 1, P.STATUS_TIMEOUT]
    assert r[3].decode() == "task exceeded its time limit of 0.3 s and was killed (attempt 1)"
    assert 300_000 <= r[4] < 5_000_000  # exec_us: the time it ran
    assert elapsed < 5
    # Same connection: an unlimited task runs in-process, a limited one in a fresh executor.
    w.master.send(P.ASSIGN, [assign(2, tasks.square, 5), assign(3, tasks.where, timeout_ms=5000)])
    got = w.results(2)
    assert (got[2][2], pickle.loads(got[2][3])) == (P.STATUS_OK, 25)
    assert got[3][2] == P.STATUS_OK
    pid, pgid = pickle.loads(got[3][3])
    assert pid != os.getpid() and pgid == pid  # an executor leading its own process group
    w.finish()
    assert _gone(pid)


def test_a_task_ignoring_sigterm_is_killed(fake, tmp_path):
    started = tmp_path / "started"
    w = Served(fake)
    expect(w.master, P.PULL)
    w.master.send(
        P.ASSIGN, [assign(1, tasks.ignore_sigterm_and_sleep, str(started), 60, timeout_ms=500)]
    )
    (r,) = w.results(1).values()
    assert r[2] == P.STATUS_TIMEOUT
    assert started.read_text() == "started"
    w.finish()


def test_the_grandchildren_of_a_timed_out_task_are_killed(fake, tmp_path):
    path = tmp_path / "grandchild.pid"
    w = Served(fake)
    expect(w.master, P.PULL)
    w.master.send(P.ASSIGN, [assign(1, tasks.fork_grandchild, str(path), 60, timeout_ms=1000)])
    grandchild = _read_pid(path)
    assert not _gone(grandchild)
    (r,) = w.results(1).values()
    assert r[2] == P.STATUS_TIMEOUT
    wait_until(lambda: _gone(grandchild), timeout=5)
    w.finish()


def test_a_timed_task_that_ends_in_time_reports_as_usual(fake):
    w = Served(fake)
    expect(w.master, P.PULL)
    w.master.send(
        P.ASSIGN,
        [
            assign(1, tasks.square, 7, timeout_ms=5000),
            assign(2, tasks.fail, "boom", timeout_ms=5000),
        ],
    )
    got = w.results(2)
    assert (got[1][2], pickle.loads(got[1][3])) == (P.STATUS_OK, 49)
    assert got[2][2] == P.STATUS_ERROR
    exc = S.error_from_report(got[2][3])
    assert type(exc) is tasks.TaskError and str(exc) == "boom"
    w.finish()


def test_an_executor_that_dies_reports_lost_and_is_replaced(fake):
    # Status LOST: the master blames the task (retried within max_attempts, then poison).
    w = Served(fake)
    expect(w.master, P.PULL)
    w.master.send(P.ASSIGN, [assign(1, tasks.kill_self, signal.SIGKILL, timeout_ms=5000)])
    (r,) = w.results(1).values()
    assert r[2] == P.STATUS_LOST
    text = r[3].decode()
    assert "killed by signal 9 (SIGKILL) while running task 1" in text, text
    assert "out-of-memory" in text, text
    w.master.send(P.ASSIGN, [assign(2, tasks.kill_self, signal.SIGSEGV, timeout_ms=5000)])
    (r,) = w.results(1).values()
    assert r[2] == P.STATUS_LOST and "killed by signal 11 (SIGSEGV)" in r[3].decode()
    w.master.send(P.ASSIGN, [assign(3, tasks.square, 3, timeout_ms=5000)])
    (r,) = w.results(1).values()
    assert (r[2], pickle.loads(r[3])) == (P.STATUS_OK, 9)
    w.finish()


# -- memory limit -----------------------------------------------------------------------------


def test_a_task_over_the_memory_limit_gets_memory_error(fake):
    # The executor is a fork of this (pytest) process: the limit counts its address space.
    limit = address_space_mib() + 256
    w = Served(fake, task_memory_mb=limit)
    expect(w.master, P.PULL)
    w.master.send(
        P.ASSIGN, [assign(1, tasks.allocate_mib, limit), assign(2, tasks.allocate_mib, 16)]
    )
    got = w.results(2, timeout=20)
    assert got[1][2] in (P.STATUS_ERROR, P.STATUS_FAILED)
    if got[1][2] == P.STATUS_ERROR:
        exc = S.error_from_report(got[1][3])
        assert type(exc) is MemoryError
        # It says which limit it hit.
        notes = " ".join(getattr(exc, "__notes__", ()) or exc.args)
        assert f"memory limit of {limit} MiB" in notes and "--task-memory-mb" in notes, notes
    assert (got[2][2], pickle.loads(got[2][3])) == (P.STATUS_OK, 16 << 20)
    assert w.conn._executor is not None  # with a memory limit every task runs there
    w.finish()


def test_a_memory_limit_below_the_worker_itself_is_reported(fake, capsys):
    w = Served(fake, task_memory_mb=1)
    expect(w.master, P.PULL)
    w.master.send(P.ASSIGN, [assign(1, tasks.square, 3)])
    (r,) = w.results(1).values()
    # Small allocations may still fit in memory the interpreter already holds; it must not hang.
    assert r[2] in (P.STATUS_OK, P.STATUS_ERROR, P.STATUS_FAILED)
    w.finish()
    assert "--task-memory-mb 1 is below the address space the executor starts" in (
        capsys.readouterr().err
    )


# -- ABORT ------------------------------------------------------------------------------------


def test_abort_of_a_running_timed_task_kills_it_and_frees_the_slot(fake, tmp_path):
    path = tmp_path / "pid"
    w = Served(fake)
    assert expect(w.master, P.PULL) == [P.PULL, 2]
    w.master.send(P.ASSIGN, [assign(1, tasks.sleep_with_pid, str(path), 60, timeout_ms=60_000)])
    pid = _read_pid(path)
    w.master.send(P.ABORT, [[1, 1]])
    (r,) = w.results(1, timeout=5).values()
    assert r[:3] == [1, 1, P.STATUS_CANCELLED]
    assert "aborted" in r[3].decode()
    wait_until(lambda: _gone(pid), timeout=5)
    # The slot is free: the credits come back and the next task runs.
    assert expect(w.master, P.PULL)[1] >= 1
    w.master.send(P.ASSIGN, [assign(2, tasks.square, 4)])
    (r,) = w.results(1).values()
    assert (r[0], pickle.loads(r[3])) == (2, 16)
    w.finish()


def test_abort_of_a_prefetched_task_drops_it(fake, tmp_path):
    log = tmp_path / "log"
    w = Served(fake)
    assert expect(w.master, P.PULL) == [P.PULL, 2]
    w.master.send(
        P.ASSIGN,
        [
            assign(1, tasks.logged, 1, str(log), 0.5),
            assign(2, tasks.logged, 2, str(log), attempt=2),
        ],
    )
    wait_until(lambda: log.exists())
    w.master.send(P.ABORT, [[2, 2], [99, 1]])  # 99: not held; ignored
    got = w.results(2)
    assert got[1][2] == P.STATUS_OK
    assert got[2][:3] == [2, 2, P.STATUS_CANCELLED]
    assert got[2][3] == b"aborted by the master before it started"
    # 1 + prefetch (1 after a 0.5 s task) credits are out again: the aborted task freed its
    # credit like a finished one. The last PULL comes in the write of task 2's result.
    assert w.credits + expect(w.master, P.PULL)[1] == 2
    assert log.read_text() == "1\n"
    w.finish()


def test_abort_of_an_in_process_task_sends_its_result(fake, tmp_path):
    log = tmp_path / "log"
    w = Served(fake)
    expect(w.master, P.PULL)
    w.master.send(P.ASSIGN, [assign(1, tasks.logged, 1, str(log), 0.3)])
    wait_until(lambda: log.exists())
    w.master.send(P.ABORT, [[1, 1]])
    (r,) = w.results(1).values()
    assert r[2] == P.STATUS_OK  # it could not be interrupted; the master discards the result
    w.finish()


# -- heartbeats -------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout_ms", [0, 10_000], ids=["in-process", "executor"])
def test_heartbeats_continue_while_a_long_task_runs(timeout_ms, tmp_path):
    with LeaseMaster(heartbeat_ms=5000, lease_ms=300) as fake:  # the lease sets the pace
        w = Served(fake)
        expect(w.master, P.PULL)
        w.master.send(P.ASSIGN, [assign(1, tasks.sleep_return, 1, 1.2, timeout_ms=timeout_ms)])
        beats = 0
        while True:
            msg = w.master.recv(5)
            if msg[0] == P.RESULT:
                break
            beats += msg[0] == P.HEARTBEAT
        assert msg[1][0][2] == P.STATUS_OK
        assert beats >= 5  # every 100 ms or so for 1.2 s
        w.finish()


# -- reconnection -----------------------------------------------------------------------------


def _lose_connection_after_a_task(fake, w, log):
    """Task 1 runs (0.5 s, in-process) with task 2 prefetched; the master resets the
    connection meanwhile, so task 1's result cannot be sent."""
    assert expect(w.master, P.PULL) == [P.PULL, 2]
    w.master.send(
        P.ASSIGN, [assign(1, tasks.logged, 1, str(log), 0.5), assign(2, tasks.logged, 2, str(log))]
    )
    wait_until(lambda: log.exists())
    reset(w.master)
    return fake.accept(timeout=10)


def test_reconnect_resends_unsent_results_to_the_same_instance(fake, tmp_path):
    log = tmp_path / "log"
    w = Served(fake, reconnect_timeout=30)
    second = _lose_connection_after_a_task(fake, w, log)
    assert fake.hellos == 2
    # The stale result first (the master counts and discards it), then fresh credits.
    (r,) = expect(second, P.RESULT)[1]
    assert (r[0], r[2], pickle.loads(r[3])[0]) == (1, P.STATUS_OK, 1)
    assert expect(second, P.PULL) == [P.PULL, 2]
    # The prefetched task 2 belonged to the old session: dropped, never run.
    second.send(P.ASSIGN, [assign(3, tasks.logged, 3, str(log))])
    (r,) = w.results(1, master=second).values()
    assert r[0] == 3
    assert log.read_text() == "1\n3\n"
    w.master = second
    w.finish()


def test_reconnect_to_a_restarted_master_drops_unsent_results(fake, tmp_path):
    log = tmp_path / "log"
    w = Served(fake, reconnect_timeout=30)
    fake.instance = 8  # the next WELCOME comes from a "restarted" master
    second = _lose_connection_after_a_task(fake, w, log)
    # Results go out before PULL in the same write: none came.
    assert expect(second, P.PULL) == [P.PULL, 2]
    second.send(P.ASSIGN, [assign(3, tasks.logged, 3, str(log))])
    msg = expect(second, P.RESULT)
    assert [r[0] for r in msg[1]] == [3]
    assert log.read_text() == "1\n3\n"
    w.master = second
    w.finish()


def test_reconnect_clears_the_code_cache(fake):
    w = Served(fake, reconnect_timeout=30)
    expect(w.master, P.PULL)
    w.master.send(P.ASSIGN, [assign(1, tasks.square, 2)])
    w.results(1)
    w.master.send(P.ERROR, "lease_expired", "no frame for 3000 ms", 0)
    w.master.close()
    second = fake.accept(timeout=10)
    expect(second, P.PULL)
    # Code for this hash came on the old connection only: the worker must not use a cache.
    second.send(P.ASSIGN, [assign(2, tasks.square, 3, send_code=False)])
    (r,) = w.results(1, master=second).values()
    assert r[2] == P.STATUS_ERROR
    assert "the master sent no code" in str(S.error_from_report(r[3]))
    w.master = second
    w.finish()


def test_a_connection_loss_kills_the_running_executor_task(fake, tmp_path):
    path = tmp_path / "pid"
    w = Served(fake, reconnect_timeout=30)
    expect(w.master, P.PULL)
    w.master.send(P.ASSIGN, [assign(1, tasks.sleep_with_pid, str(path), 60, timeout_ms=60_000)])
    pid = _read_pid(path)
    w.master.close()
    second = fake.accept(timeout=10)
    wait_until(lambda: _gone(pid), timeout=5)  # the master requeued it; no one wants it here
    assert expect(second, P.PULL) == [P.PULL, 2]
    w.master = second
    w.finish()


def test_reconnection_gives_up_after_the_reconnect_timeout():
    fake = LeaseMaster()
    try:
        w = Served(fake, reconnect_timeout=0.5)
        expect(w.master, P.PULL)
    finally:
        fake.close()  # the listener too: every attempt is refused
    start = time.monotonic()
    assert w.join() == EXIT_LOST
    assert 0.4 < time.monotonic() - start < 5


def test_a_signal_during_the_backoff_exits_promptly():
    fake = LeaseMaster()
    try:
        w = Served(fake, reconnect_timeout=0)  # forever
        expect(w.master, P.PULL)
    finally:
        fake.close()
    wait_until(lambda: w.conn.sock.fileno() == -1)  # the session is closed: backing off
    start = time.monotonic()
    w.stop()
    assert w.join() == EXIT_OK
    assert time.monotonic() - start < 2


def test_a_refused_token_on_reconnect_is_fatal(fake):
    w = Served(fake, reconnect_timeout=30)
    expect(w.master, P.PULL)
    fake.token = "revoked"
    w.master.close()
    assert w.join() == EXIT_CONFIG
    assert fake.hellos == 2


# -- the worker process -----------------------------------------------------------------------


def _worker_process(fake, tmp_path, *extra, buffered=False):
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", fake.address, "--procs", "1"]
    env = worker_env("tok")
    if buffered:
        env.pop("PYTHONUNBUFFERED", None)
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [*cmd, *extra],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    return proc


def test_fast_path_runs_in_the_worker_process_and_limits_in_an_executor(fake, tmp_path):
    proc = _worker_process(fake, tmp_path)
    try:
        master = fake.accept(timeout=30)
        (child,) = psutil.Process(proc.pid).children()
        expect(master, P.PULL)
        master.send(P.ASSIGN, [assign(1, tasks.where)])
        (r,) = recv_kind(master, P.RESULT)[1]
        assert pickle.loads(r[3]) == (child.pid, os.getpgid(proc.pid))
        assert child.children() == []  # no executor for a task without limits
        master.send(P.ASSIGN, [assign(2, tasks.where, timeout_ms=5000)])
        (r,) = recv_kind(master, P.RESULT)[1]
        pid, pgid = pickle.loads(r[3])
        assert [p.pid for p in child.children()] == [pid] and pgid == pid
        # SIGTERM: the worker drains and exits, its executor with it.
        proc.send_signal(signal.SIGTERM)
        assert recv_kind(master, P.DRAIN) == [P.DRAIN]
        master.close()
        assert proc.wait(10) == EXIT_OK
        wait_until(lambda: _gone(pid), timeout=5)
    finally:
        stop_process(proc, group=True)


# -- end to end, with the real master (embedded) ----------------------------------------------


class RawClient:
    """The client side of the protocol, by hand: independent of the Client class."""

    def __init__(self, address: str, token: str, ca_file: str | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        if ca_file is not None:
            context = ssl.create_default_context(cafile=ca_file)
            self.sock = context.wrap_socket(self.sock, server_hostname=host)
        self.reader = P.FrameReader()
        self._msgs: list = []
        self.sock.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "client", token, "raw-client", 0))
        welcome = self.recv(10)
        assert welcome[0] == P.WELCOME, welcome
        self.reader.max_frame = welcome[3]
        self.req_id = 0
        self.acked: dict = {}

    def recv(self, timeout: float) -> list:
        """The next message, the master's HEARTBEATs skipped (it sends one on a link it left
        silent for a lease)."""
        self.sock.settimeout(timeout)
        while True:
            while not self._msgs:
                data = self.sock.recv(1 << 20)
                assert data, "the master closed the client connection"
                self._msgs.extend(self.reader.feed(data))
            msg = self._msgs.pop(0)
            if msg[0] != P.HEARTBEAT:
                return msg

    def submit(self, f, args_list, **opts) -> int:
        fn_hash, code = fn(f)
        self.req_id += 1
        payloads = [pickle.dumps((args, None), 5) for args in args_list]
        self.sock.sendall(P.encode(P.SUBMIT, self.req_id, fn_hash, code, opts, payloads))
        msg = self.recv(10)
        assert msg[:2] == [P.ACCEPTED, self.req_id], msg
        self.acked[msg[2]] = 0
        return msg[2]

    def results(self, package: int, n: int, timeout: float = 30, on_result=None) -> dict:
        """``index -> (status, data)`` of ``n`` results; fails on a duplicate index."""
        got: dict = {}
        end = time.monotonic() + timeout
        while len(got) < n:
            left = end - time.monotonic()
            assert left > 0, f"{len(got)} of {n} results within {timeout} s"
            msg = self.recv(left)
            assert msg[0] == P.RESULTS and msg[1] == package, msg
            for r in msg[2]:
                assert r[0] not in got, f"task {r[0]} got two results"
                got[r[0]] = (r[1], r[2])
                if on_result is not None:
                    on_result(got)
            self.acked[package] += len(msg[2])
            self.sock.sendall(P.encode(P.ACK, package, self.acked[package]))
        return got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def real_master():
    options = {"lease_ms": 900, "timeout_grace_s": 0.5}
    master = _native.Master(listen="127.0.0.1:0", options=options)
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture
def start_worker(real_master, tmp_path):
    with worker_processes(real_master, tmp_path) as start:
        yield start


def _children(proc: subprocess.Popen, n: int) -> list:
    return wait_until(lambda: len(c := psutil.Process(proc.pid).children()) == n and c, timeout=30)


def test_e2e_kill_9_of_a_worker_process_mid_package_loses_nothing(
    real_master, start_worker, raw_client
):
    proc = start_worker(procs_per_worker=2)
    victim = _children(proc, 2)[0]
    n = 300
    package = raw_client.submit(tasks.sleep_return, [(i, 0.005) for i in range(n)])
    killed = []

    def kill_midway(got):
        if not killed and len(got) >= n // 4:
            victim.kill()  # SIGKILL: no DRAIN, no RETURN, results in flight lost
            killed.append(True)

    got = raw_client.results(package, n, timeout=60, on_result=kill_midway)
    assert killed
    assert sorted(got) == list(range(n))  # every task exactly once (duplicates fail above)
    assert all(status == P.STATUS_OK for status, _ in got.values())
    assert [pickle.loads(got[i][1]) for i in range(n)] == list(range(n))
    # The parent restarted the killed process.
    wait_until(lambda: len(psutil.Process(proc.pid).children()) == 2, timeout=10)


def test_e2e_a_timed_task_is_killed_and_the_worker_goes_on(
    real_master, start_worker, raw_client, tmp_path
):
    start_worker()
    looping = raw_client.submit(tasks.spin_forever, [()], timeout_ms=300)
    got = raw_client.results(looping, 1, timeout=30)
    status, data = got[0]
    assert status == P.STATUS_TIMEOUT
    assert data.decode() == "task exceeded its time limit of 0.3 s and was killed (attempt 1)"
    fine = raw_client.submit(tasks.square, [(i,) for i in range(20)])
    got = raw_client.results(fine, 20)
    assert [pickle.loads(got[i][1]) for i in range(20)] == [i * i for i in range(20)]


def test_e2e_a_limited_task_behind_a_long_one_is_given_back_not_timed_out(
    real_master, start_worker, raw_client, tmp_path
):
    log = tmp_path / "log"
    proc = start_worker()
    wait_until(lambda: real_master.stats()["workers"] == 1)
    # B waits behind A in the worker's prefetch queue. It used to wait there past its limit
    # plus the master's grace, and fail (status 4) without ever starting. The watchdog gives
    # it back once A has run 0.5 s; B runs when A is done, timed from its new assignment.
    a = raw_client.submit(tasks.logged, [(1, str(log), 1.5)])
    b = raw_client.submit(tasks.logged, [(2, str(log))], timeout_ms=100)
    assert raw_client.results(a, 1)[0][0] == P.STATUS_OK
    status, data = raw_client.results(b, 1)[0]
    assert status == P.STATUS_OK, data
    c = raw_client.submit(tasks.logged, [(3, str(log))])
    assert raw_client.results(c, 1)[0][0] == P.STATUS_OK
    assert log.read_text() == "1\n2\n3\n"
    assert "gave back the 1 tasks queued behind it" in (tmp_path / "worker-0.log").read_text()
    assert proc.poll() is None


def test_e2e_heartbeats_keep_the_lease_during_a_long_task(real_master, start_worker, raw_client):
    start_worker()
    # 2.5 s in-process and in the executor, with a 0.9 s lease: only heartbeats keep it.
    package = raw_client.submit(tasks.sleep_return, [(1, 2.5)])
    timed = raw_client.submit(tasks.sleep_return, [(2, 2.5)], timeout_ms=10_000)
    assert pickle.loads(raw_client.results(package, 1)[0][1]) == 1
    assert pickle.loads(raw_client.results(timed, 1)[0][1]) == 2
    assert real_master.stats()["stale_results"] == 0


def test_e2e_a_worker_that_lost_its_lease_reconnects(
    real_master, start_worker, raw_client, tmp_path
):
    proc = start_worker()
    (child,) = _children(proc, 1)
    wait_until(lambda: real_master.stats()["workers"] == 1)
    package = raw_client.submit(tasks.sleep_return, [(i, 0.2) for i in range(10)])
    wait_until(lambda: real_master.stats()["running"] >= 1)
    child.suspend()  # SIGSTOP: no heartbeats; the master takes the tasks back after 0.9 s
    try:
        wait_until(lambda: real_master.stats()["workers"] == 0, timeout=10)
    finally:
        child.resume()
    got = raw_client.results(package, 10, timeout=30)
    assert [pickle.loads(got[i][1]) for i in range(10)] == list(range(10))
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=10)
    # The master counts the worker before the worker's line is in its log file (seen once in a
    # full .ci/run next to a CPU hog: the file ended at the first connection's line).
    log = tmp_path / "worker-0.log"
    wait_until(lambda: "reconnected to the master" in log.read_text(), timeout=10)


def test_e2e_a_worker_stopped_past_its_lease_is_not_blamed_for_its_task(
    real_master, start_worker, raw_client
):
    # Poison is a task that kills the workers running it. A worker silent past its lease (here
    # SIGSTOP; a starved host or a cut link alike) may be alive: the master takes its task back
    # and it runs elsewhere, not counted against it. With max_attempts=1 one counted loss would
    # fail it as poison (status 5, what main did).
    first = start_worker()
    (child,) = _children(first, 1)
    wait_until(lambda: real_master.stats()["workers"] == 1)
    package = raw_client.submit(tasks.sleep_return, [(7, 0.5)], max_attempts=1)
    wait_until(lambda: real_master.stats()["running"] == 1)
    child.suspend()  # SIGSTOP mid-task: no heartbeats; the 0.9 s lease ends
    try:
        wait_until(lambda: real_master.stats()["workers"] == 0, timeout=10)
        start_worker()  # the task's second attempt runs here
        status, data = raw_client.results(package, 1, timeout=30)[0]
    finally:
        child.resume()
    assert status == P.STATUS_OK, data
    assert pickle.loads(data) == 7
    stats = real_master.stats()
    assert (stats["poisoned"], stats["requeued"]) == (0, 1), stats


def test_local_cluster_passes_the_memory_limit_to_its_workers(tmp_path):
    with rtpool.LocalCluster(workers=1, task_memory_mb=4096) as cluster:
        (pid,) = cluster.worker_pids
        # (Right after the fork the process may not have exec'd yet: its cmdline is empty.)
        wait_until(lambda: psutil.Process(pid).cmdline()[-2:] == ["--task-memory-mb", "4096"])
        client = RawClient(cluster.address, cluster.client_token)
        try:
            package = client.submit(tasks.where, [()])
            status, data = client.results(package, 1)[0]
        finally:
            client.close()
        assert status == P.STATUS_OK
        executor, pgid = pickle.loads(data)
        (child,) = psutil.Process(pid).children()
        assert [p.pid for p in child.children()] == [executor] and pgid == executor


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--task-memory-mb", "0"], "--task-memory-mb must be at least 1"),
        (["--reconnect-timeout", "-1"], "--reconnect-timeout must be 0 (forever) or more"),
    ],
)
def test_bad_worker_limits_are_refused(flags, message, capsys):
    from rtpool import worker

    assert worker.main(["--master", "127.0.0.1:1", "--token", "t", *flags]) == EXIT_CONFIG
    assert message in capsys.readouterr().err


def test_worker_help_names_the_new_options(capsys):
    from rtpool import worker

    with pytest.raises(SystemExit):
        worker.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--task-memory-mb N" in out and "(default: no limit" in out
    assert "--reconnect-timeout S" in out and "0 = forever (default: 0)" in out


def test_output_buffered_before_an_executor_starts_is_printed_once(fake, tmp_path):
    # Without capture (tasks print to the worker's stdout), a file: block-buffered.
    proc = _worker_process(fake, tmp_path, "--task-output-kb", "0", buffered=True)
    try:
        master = fake.accept(timeout=30)
        master.send(P.ASSIGN, [assign(1, tasks.print_text, "in the worker")])
        master.send(
            P.ASSIGN, [assign(2, tasks.print_text, "in the executor", True, timeout_ms=5000)]
        )
        got = {}
        while len(got) < 2:
            got.update((r[0], r) for r in recv_kind(master, P.RESULT)[1])
        proc.send_signal(signal.SIGTERM)
        master.close()
        assert proc.wait(10) == EXIT_OK
    finally:
        stop_process(proc, group=True)
    out = (tmp_path / "worker.log").read_text()
    assert out.count("in the worker") == 1 and out.count("in the executor") == 1


def test_e2e_over_tls_limits_and_reconnection_work(tmp_path):
    options = {"lease_ms": 900}
    master = _native.Master(
        listen="127.0.0.1:0", data_dir=str(tmp_path), tls_self_signed=True, options=options
    )
    proc = None
    client = None
    try:
        cert = str(master.tls_cert)
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", master.address]
        with open(tmp_path / "worker.log", "wb") as log:
            proc = subprocess.Popen(
                [*cmd, "--ca-file", cert],
                env=worker_env(master.worker_token),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        client = RawClient(master.address, master.client_token, ca_file=cert)
        looping = client.submit(tasks.spin_forever, [()], timeout_ms=300)
        assert client.results(looping, 1)[0][0] == P.STATUS_TIMEOUT
        (child,) = _children(proc, 1)
        child.suspend()  # lose the lease; the worker must reconnect over TLS
        try:
            wait_until(lambda: master.stats()["workers"] == 0, timeout=10)
        finally:
            child.resume()
        wait_until(lambda: master.stats()["workers"] == 1, timeout=10)
        fine = client.submit(tasks.square, [(i,) for i in range(10)], timeout_ms=5000)
        got = client.results(fine, 10)
        assert [pickle.loads(got[i][1]) for i in range(10)] == [i * i for i in range(10)]
    finally:
        if client is not None:
            client.close()
        if proc is not None:
            stop_process(proc, group=True)
        master.stop()
    assert "reconnected to the master" in (tmp_path / "worker.log").read_text()


def test_sigterm_stops_a_worker_process_that_is_reconnecting(tmp_path):
    fake = LeaseMaster()
    proc = _worker_process(fake, tmp_path)
    try:
        expect(fake.accept(timeout=30), P.PULL)
        fake.close()  # the master is gone: the worker backs off and retries, forever by default
        wait_until(lambda: "reconnection attempt 2 failed" in (tmp_path / "worker.log").read_text())
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == EXIT_OK
        assert time.monotonic() - start < 3
    finally:
        stop_process(proc, group=True)


def test_e2e_a_replaced_child_comes_back_under_its_slots_identity(real_master, start_worker):
    # The master keeps a worker's pace (hedging) under its HELLO identity. A slot's child is
    # replaced when it dies, or when the master aborts a task running there: the new child
    # must present the same identity, though it is another process and another connection.
    proc = start_worker()
    (child,) = _children(proc, 1)
    with rtpool.Client(real_master.address, real_master.client_token) as client:

        def workers_other_than(seen: int | None):
            w = client.status()["workers"]
            return w if len(w) == 1 and w[0]["id"] != seen and w[0]["identity"] else None

        (first,) = wait_until(lambda: workers_other_than(None), timeout=30)
        assert first["identity"] == f"{socket.gethostname()}:{proc.pid}/0"
        child.kill()
        (again,) = wait_until(lambda: workers_other_than(first["id"]), timeout=30)
        assert again["identity"] == first["identity"]
        assert again["name"] != first["name"], "another process (host:pid)"
