"""Large payloads (issue 16, items 1 and 2): out-of-band pickle buffers in segmented frames
over TCP, shared memory on one host, and the lifetimes of shared-memory segments (no
``/dev/shm`` leak after a result, a task failure, a client killed with ``kill -9``, a master
killed with ``kill -9``). Against a real master and real worker processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import tasks.payload
from conftest import close_master, start_master
from helpers import stop_process, worker_env

MIB = 1 << 20


@pytest.fixture
def shm(monkeypatch):
    """Shared memory on (the master is on loopback, so clients use it by default)."""
    import gc

    from rtpool import _shm

    # The pool and the count of attached clients are the process's, and a client an earlier
    # test left open (in this pytest process) would keep "the last client closes" from ever
    # happening here. These tests count this process's segments: they start from an empty
    # pool, as if their clients were the process's only ones (the count is restored after).
    gc.collect()
    if _shm._pool is not None:
        _shm._pool.clear()
    monkeypatch.setattr(_shm, "_attached", 0)
    monkeypatch.setattr(_shm, "_enabled", True)
    return _shm


@pytest.fixture
def tcp_only(monkeypatch):
    from rtpool import _shm

    monkeypatch.setattr(_shm, "_enabled", False)


def _wait_for(cond, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_arrays_cross_tcp_as_segments_and_arrive_as_views(
    tcp_only, workers, client_factory
) -> None:
    workers.start(1)
    client = client_factory()
    assert client._conn.shm_owner is None
    arr = np.arange(2 * MIB // 8, dtype="f8")
    total, owns, writeable, misalign = client.submit(tasks.payload.describe, arr).result(30)
    assert total == float(arr.sum())
    # A view of the worker's receive buffer, not a copy made by unpickling.
    assert not owns and writeable
    back = client.submit(tasks.payload.double, arr).result(30)
    assert back.dtype == arr.dtype and np.array_equal(back, arr * 2) and not back.flags.owndata
    data = bytes(range(256)) * 4096  # 1 MiB of bytes: out of band too
    assert client.submit(tasks.payload.echo, data).result(30) == data
    small = client.submit(tasks.payload.echo, b"x" * 1024).result(30)
    assert small == b"x" * 1024


def test_shared_memory_argument_is_read_only_view_and_segments_are_reused(
    shm, workers, client_factory
) -> None:
    workers.start(1)
    client = client_factory()
    owner = client._conn.shm_owner
    assert owner
    arr = np.arange(4 * MIB // 8, dtype="f8")
    fut = client.submit(tasks.payload.describe, arr)
    total, owns, writeable, misalign = fut.result(30)
    assert total == float(arr.sum()) and not owns and not writeable and misalign == 0
    back = client.submit(tasks.payload.double, arr).result(30)
    assert np.array_equal(back, arr * 2) and not back.flags.writeable
    del back
    worker = client.submit(tasks.payload.owner).result(30)
    mine, theirs = shm.leftovers(owner), shm.leftovers(worker)
    assert len(mine) == 1 and len(theirs) == 1, (mine, theirs)
    for i in range(10):
        value = np.full(4 * MIB // 8, float(i))
        back = client.submit(tasks.payload.echo, value).result(30)
        assert np.array_equal(back, value)
        del back
    # Ten more round trips wrote into the same two segments: none was added, none leaked.
    assert shm.leftovers(owner) == mine and shm.leftovers(worker) == theirs
    assert shm.pool().lent() == []
    client.close()
    # The process's last client removes its segments (at close, or when its heartbeat thread
    # ends if a package was still registered).
    _wait_for(lambda: shm.leftovers(owner) == [], "the last client's segments to go")


def test_a_result_the_client_holds_is_never_overwritten(shm, workers, client_factory) -> None:
    workers.start(1)
    client = client_factory()
    worker = client.submit(tasks.payload.owner).result(30)
    held = client.submit(tasks.payload.copy, np.ones(MIB, dtype="f8")).result(30)
    for i in range(5):
        value = np.full(MIB, float(i + 2))
        assert np.array_equal(client.submit(tasks.payload.copy, value).result(30), value)
    # The worker took a second segment for the later results: the held one is still read.
    assert held.min() == held.max() == 1.0
    assert len(shm.leftovers(worker)) == 2
    del held
    for i in range(3):
        value = np.full(MIB, float(i + 10))
        assert np.array_equal(client.submit(tasks.payload.copy, value).result(30), value)
    assert len(shm.leftovers(worker)) == 2  # reused once dropped, not a third one


def test_a_result_made_of_its_argument_refers_to_it(shm, workers, client_factory) -> None:
    # A task that returns its argument (or a slice of it) sends offsets into the client's own
    # argument segment: the worker copies nothing; the segment stays the client's, lent
    # while the result is held, reused once it is dropped.
    workers.start(1)
    client = client_factory()
    owner = client._conn.shm_owner
    worker = client.submit(tasks.payload.owner).result(30)
    arr = np.arange(MIB, dtype="f8")
    held = client.submit(tasks.payload.echo, arr).result(30)
    half = client.submit(tasks.payload.tail, arr).result(30)
    assert np.array_equal(held, arr) and np.array_equal(half, arr[MIB // 2 :])
    assert not held.flags.writeable and not half.flags.writeable
    assert shm.leftovers(worker) == []  # the worker wrote no segment
    assert len(shm.leftovers(owner)) == 2  # one per held result: neither was rewritten
    for i in range(3):
        value = np.full(MIB, float(i))
        assert np.array_equal(client.submit(tasks.payload.echo, value).result(30), value)
    assert np.array_equal(held, arr) and np.array_equal(half, arr[MIB // 2 :])
    assert len(shm.leftovers(owner)) == 3
    del held, half
    for i in range(3):
        value = np.full(MIB, float(i + 5))
        assert np.array_equal(client.submit(tasks.payload.echo, value).result(30), value)
    assert len(shm.leftovers(owner)) == 3 and shm.leftovers(worker) == []
    assert shm.pool().lent() == []


def test_an_argument_the_task_keeps_is_never_overwritten(shm, workers, client_factory) -> None:
    workers.start(1)
    client = client_factory()
    owner = client._conn.shm_owner
    client.submit(tasks.payload.stash, np.ones(MIB, dtype="f8")).result(30)
    for _ in range(5):
        assert client.submit(tasks.payload.describe, np.full(MIB, 7.0)).result(30)[0] == 7.0 * MIB
    assert client.submit(tasks.payload.stashed).result(30) == [(1.0, 1.0)]
    assert len(shm.leftovers(owner)) == 2  # the stashed argument's segment was not reused
    client.submit(tasks.payload.unstash).result(30)
    for _ in range(3):
        assert client.submit(tasks.payload.describe, np.full(MIB, 5.0)).result(30)[0] == 5.0 * MIB
    assert len(shm.leftovers(owner)) == 2


def test_a_reader_after_a_rewrite_gets_an_error_not_new_data(shm) -> None:
    from rtpool._serialize import _dumps_oob, loads_payload

    owner = shm.owner()
    first = _dumps_oob(np.ones(MIB), "a test value", owner)
    shm.release(first.shm)  # its task is done: the segment is free
    second = _dumps_oob(np.zeros(MIB), "a test value", owner)
    assert second.shm == first.shm  # the same segment, rewritten
    with pytest.raises(FileNotFoundError, match="was released by its writer"):
        loads_payload(bytes(first))
    value = loads_payload(bytes(second))
    assert value.max() == 0.0
    shm.release(second.shm)
    # While a value made from the segment lives, the segment is not rewritten.
    third = _dumps_oob(np.full(MIB, 3.0), "a test value", owner)
    assert third.shm != second.shm and value.max() == 0.0
    shm.release(third.shm)
    shm.pool().clear()


def test_a_reused_segment_costs_no_name_and_an_argument_no_claim(shm, monkeypatch) -> None:
    import struct

    from rtpool._serialize import dumps_args, loads_args, loads_payload

    owner = shm.owner()
    first = dumps_args((np.ones(MIB),), None, owner)
    path = os.path.join(shm.SHM_DIR, first.shm)

    def claimed() -> int:
        with open(path, "rb") as f:
            return struct.unpack_from("=Q", f.read(24), 16)[0]

    (arr,), _ = loads_args(bytes(first))
    shm.set_result_owner(None)
    assert arr.max() == 1.0 and claimed() == 0  # an argument's reader writes no claim
    del arr
    shm.release(first.shm)

    def no_new_name(n: int) -> str:
        raise AssertionError("a reused segment asked for a new name")

    monkeypatch.setattr(shm.secrets, "token_hex", no_new_name)
    second = dumps_args((np.zeros(MIB),), None, owner)
    assert second.shm == first.shm  # rewritten in place, under its old name
    (value,), _ = loads_payload(bytes(second))  # a result's reader claims (generation 2)
    assert value.max() == 0.0 and claimed() == 2
    del value
    shm.release(second.shm)
    shm.pool().clear()


def test_a_reference_envelope_is_read_only_from_our_own_segment(shm, monkeypatch) -> None:
    import struct

    from rtpool._serialize import dumps_args, dumps_result, loads_args, loads_result

    owner = shm.owner()
    arg = dumps_args((np.arange(MIB, dtype="f8"),), None, owner)
    (arr,), _ = loads_args(bytes(arg))  # as a worker would: the task's argument segment
    envelope = bytes(dumps_result(arr[MIB // 2 :]))
    shm.set_result_owner(None)
    del arr
    assert envelope[0] == shm.SHM_REF_TAG and len(envelope) < 1024  # offsets, not data
    back = loads_result(envelope)
    assert np.array_equal(back, np.arange(MIB // 2, MIB, dtype="f8")) and not back.flags.writeable
    del back
    # A span outside the segment is refused (the offset is the first u64 after the head).
    bad = bytearray(envelope)
    struct.pack_into(">Q", bad, 28, 1 << 40)
    with pytest.raises(ValueError, match="outside segment"):
        loads_result(bytes(bad))
    shm.release(arg.shm)
    shm.pool().clear()
    # So is another process's segment: only the client's own argument may be referred to.
    monkeypatch.setattr(shm, "_OWNER", "1-1")
    with pytest.raises(ValueError, match="not one of ours"):
        loads_result(envelope)


def test_a_bytes_result_that_is_its_argument_refers_to_it_and_no_other_does(shm) -> None:
    from rtpool._serialize import dumps_args, dumps_result, loads_args, loads_result

    data = os.urandom(MIB)
    arg = dumps_args((data, b"small"), None, shm.owner())
    (got, small), _ = loads_args(bytes(arg))  # as a worker would: the task's argument segment
    assert type(got) is bytes and got == data
    same = bytes(dumps_result(got))  # the task returned its argument: offsets into the segment
    assert same[0] == shm.SHM_REF_TAG and len(same) < 1024
    # Equal bytes that are another object are written out, never assumed to be the argument.
    (got, small), _ = loads_args(bytes(arg))
    other = bytes(dumps_result(bytes(bytearray(got))))
    assert other[0] == shm.SHM_TAG
    # What a task returns after another task's arguments arrived is not referred either.
    (got, small), _ = loads_args(bytes(arg))
    loads_args(dumps_args((1,), None))
    stale = bytes(dumps_result(got))
    assert stale[0] != shm.SHM_REF_TAG
    shm.set_result_owner(None)
    back = loads_result(same)
    assert type(back) is bytes and back == data
    del back, got
    shm.release(arg.shm)
    shm.pool().clear()


def test_a_bytes_echo_through_shared_memory_copies_nothing_on_the_worker(
    shm, workers, client_factory
) -> None:
    workers.start(1)
    client = client_factory()
    worker = client.submit(tasks.payload.owner).result(30)
    for i in range(3):
        data = bytes([i]) * (2 * MIB)
        back = client.submit(tasks.payload.echo, data).result(30)
        assert back == data and type(back) is bytes
    assert shm.leftovers(worker) == []  # the result was offsets into the argument segment
    # A task that returns something else leaves no copy of its argument behind.
    assert client.submit(tasks.payload.length, data).result(30) == len(data)
    assert client.submit(tasks.payload.holds_argument_copies).result(30) is False
    changed = client.submit(tasks.payload.flip_first, data).result(30)
    assert changed == b"\xff" + data[1:]
    assert len(shm.leftovers(worker)) == 1  # a new value: written to the worker's segment


def test_a_worker_reuses_its_freed_heap_for_the_next_large_values(workers, client_factory) -> None:
    # 40 MiB built and dropped per round: with glibc's own policy the worker returns it to the
    # kernel every round and faults it in again (10,240 pages); by default (--heap-keep-mb 64)
    # it keeps it, and only the first round faults.
    pages = (40 * MIB) // os.sysconf("SC_PAGE_SIZE")
    workers.start(1)
    workers.start(1, "--heap-keep-mb", "0")
    workers.start(1, "--heap-keep-mb", "-1")
    client = client_factory()
    assert "--heap-keep-mb must be 0" in _wait_log(workers, 2)
    by_pid = {}
    deadline = time.monotonic() + 60
    while len(by_pid) < 2 and time.monotonic() < deadline:  # until both workers answered
        futures = [client.submit(tasks.payload.heap_page_faults, 16 * MIB) for _ in range(4)]
        by_pid.update(f.result(60) for f in futures)
    assert len(by_pid) == 2, by_pid
    kept, returned = sorted(by_pid.values(), key=lambda faults: sum(faults[1:]))
    assert sum(kept[1:]) < 0.02 * pages, kept
    assert min(returned[1:]) > 0.5 * pages, returned


def _wait_log(workers, index: int) -> str:
    _wait_for(lambda: workers.procs[index].poll() is not None, "the worker to refuse")
    return workers.log_text(index)


def test_no_leak_after_a_task_failure(shm, workers, client_factory) -> None:
    workers.start(1)
    client = client_factory()
    owner = client._conn.shm_owner
    fut = client.submit(tasks.payload.boom, np.zeros(MIB, dtype="u1"))
    with pytest.raises(ValueError, match="refused an array of 1048576 bytes"):
        fut.result(30)
    _wait_for(lambda: shm.pool().lent() == [], "the failed task's segment to be released")
    client.close()
    assert shm.leftovers(owner) == []


def test_no_leak_after_the_worker_is_killed(shm, workers, client_factory) -> None:
    workers.start(1)
    client = client_factory()
    worker = client.submit(tasks.payload.owner).result(30)
    held = client.submit(tasks.payload.copy, np.ones(MIB)).result(30)
    (segment,) = shm.leftovers(worker)
    assert segment in shm.mappings().names()
    os.kill(int(worker.split("-")[0]), signal.SIGKILL)
    # The master's sweep (every 2 s) finds the owner gone.
    _wait_for(lambda: shm.leftovers(worker) == [], "the dead worker's segment to be swept")
    assert held.min() == held.max() == 1.0  # the client's mapping outlives the file
    del held
    # The client's heartbeat thread drops its mapping of the removed file (its memory).
    _wait_for(lambda: segment not in shm.mappings().names(), "the mapping to be dropped")


_CLIENT = textwrap.dedent(
    """
    import sys, numpy as np, rtpool, tasks.payload
    client = rtpool.Client(sys.argv[1], sys.argv[2])
    fut = client.submit(tasks.payload.hold, np.ones(1 << 20, dtype="u1"), 60)
    print(client._conn.shm_owner, flush=True)
    fut.result()
    """
)


def test_no_leak_after_the_client_is_killed(shm, master, workers, tmp_path: Path) -> None:
    workers.start(1)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, master.address, master.client_token],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=worker_env(master.worker_token),  # tests/ on PYTHONPATH, for tasks.payload
    )
    try:
        owner = proc.stdout.readline().strip()
        assert owner and owner.split("-")[0] == str(proc.pid), owner
        assert len(shm.leftovers(owner)) == 1  # the argument, held while the task runs
        proc.kill()  # SIGKILL: the client frees nothing itself
        proc.wait(10)
        # The master's sweep (every 2 s) finds the owner gone.
        _wait_for(lambda: shm.leftovers(owner) == [], "the dead client's segment to be swept")
    finally:
        stop_process(proc)
        proc.stdout.close()


def test_no_leak_after_the_master_is_killed(shm, tmp_path: Path) -> None:
    import rtpool
    from conftest import Workers

    m = start_master(tmp_path)
    workers = Workers(m, tmp_path)
    client = None
    try:
        workers.start(1)
        client = rtpool.Client(m.address, m.client_token)
        owner = client._conn.shm_owner
        fut = client.submit(tasks.payload.hold, np.ones(MIB, dtype="u1"), 60)
        _wait_for(lambda: len(shm.leftovers(owner)) == 1, "the argument segment")
        m.proc.kill()  # SIGKILL the master while the task runs
        m.proc.wait(10)
        client.close()  # the client gives up on its tasks: their segments go with them
        client = None
        assert fut.done()
        _wait_for(lambda: shm.leftovers(owner) == [], "the segment to be freed")
    finally:
        if client is not None:
            client.close()
        workers.stop_all()
        close_master(m)


THRESHOLD_SIZES = (
    64 * 1024 - 1,
    64 * 1024,
    64 * 1024 + 1,
    128 * 1024 - 1,
    128 * 1024,
    256 * 1024 - 1,
    256 * 1024,
    MIB,
)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_sizes_at_each_threshold_echo_correctly(
    transport, monkeypatch, workers, client_factory
) -> None:
    # Right below, at and above the old segment threshold (64 KiB), the out-of-band and segment
    # one (128 KiB) and the shared-memory one (256 KiB; RTPOOL_SHM_MIN_KB), over both transports.
    from rtpool import _serialize, _shm

    monkeypatch.setattr(_shm, "_enabled", transport == "shm")
    assert _serialize.OOB_MIN_BYTES == 128 * 1024 and _shm.SHM_MIN_BYTES == 256 * 1024
    workers.start(1)
    client = client_factory()
    assert (client._conn.shm_owner is not None) == (transport == "shm")
    for size in THRESHOLD_SIZES:
        data = bytes(range(251)) * (size // 251) + b"z" * (size % 251)
        assert client.submit(tasks.payload.echo, data).result(30) == data, size
        arr = np.frombuffer(data, dtype=np.uint8)
        back = client.submit(tasks.payload.echo, arr).result(30)
        assert np.array_equal(back, arr), size


def test_the_shared_memory_threshold_decides_the_transport(shm) -> None:
    from rtpool import _serialize

    owner = shm.owner()
    below = _serialize.dumps_args((b"a" * (shm.SHM_MIN_BYTES - 1),), None, owner)
    at = _serialize.dumps_args((b"a" * shm.SHM_MIN_BYTES,), None, owner)
    try:
        assert not getattr(below, "shm", "")  # bytes in the stream, or a TCP segment
        assert at.shm and bytes(at)[0] == shm.SHM_TAG  # an envelope naming a segment
    finally:
        shm.release(at.shm)
