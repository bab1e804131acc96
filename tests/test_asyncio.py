"""asyncio end to end (docs/asyncio.md): ``await`` on every kind of rtpool future, the
AsyncClient's coroutines against a real LocalCluster (master + worker processes), cancellation
of an awaiting coroutine reaching the master, and an event loop that nothing blocks.

Run under pytest-asyncio (strict mode: each coroutine test is marked).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import threading
from pathlib import Path

import pytest

import rtpool
from helpers import wait_until
from rtpool.errors import NotFetchedError
from tasks import TaskError, fail, noop, return_after, sleep_return, sleep_with_pid, square

CLUSTER_SERVE = ["tasks.rpc"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pid_from(path: Path) -> int:
    wait_until(path.exists, timeout=30)
    return int(path.read_text())


@pytest.fixture
def aclient(client):
    """An AsyncClient over the module's ``client`` (closed with it)."""
    return rtpool.AsyncClient.from_client(client)


@pytest.mark.asyncio
async def test_await_submit_future_gives_the_value_and_starts_no_thread(aclient):
    before = threading.active_count()
    fut = await aclient.submit(square, 7)
    assert isinstance(fut, rtpool.client.Future)
    assert await fut == 49
    futures = [await aclient.submit(square, i) for i in range(300)]
    assert [await f for f in futures] == [i * i for i in range(300)]
    # A thread per future would add 300; the sender thread is the most this client adds.
    assert threading.active_count() <= before + 1


@pytest.mark.asyncio
async def test_await_raises_what_result_raises(aclient):
    fut = await aclient.submit(fail, "boom")
    with pytest.raises(TaskError, match="boom"):
        await fut
    cancelled = aclient.sync.options(timeout=60).submit(sleep_return, 1, 30)
    assert cancelled.cancel()
    with pytest.raises(cf.CancelledError):
        await cancelled


@pytest.mark.asyncio
async def test_package_and_map_futures(aclient):
    pkg = await aclient.submit_many(square, range(50))
    assert isinstance(pkg, rtpool.Package)
    assert [await f for f in pkg] == [i * i for i in range(50)]
    assert await aclient.map(square, range(20)) == [i * i for i in range(20)]
    assert await aclient.map(pow, [2, 3], [5, 2], chunksize=2) == [32, 9]
    seen = [v async for v in aclient.map(square, range(10))]
    assert seen == [i * i for i in range(10)]
    sync_pkg = aclient.sync.submit_many(square, range(5))  # a sync package's futures too
    assert await aclient.gather(sync_pkg) == [0, 1, 4, 9, 16]


@pytest.mark.asyncio
async def test_large_argument_and_future_arguments_go_through_the_sender(aclient):
    big = b"x" * (1 << 20)  # above the inline limit: sent from the sender thread
    fut = await aclient.submit(len, big)
    assert await fut == 1 << 20
    first = await aclient.submit(square, 4)
    dependent = await aclient.submit(square, first)  # a dependency: the sender thread too
    assert await dependent == 256


@pytest.mark.asyncio
async def test_call_and_transaction_futures(aclient):
    assert await aclient.call("add", 2, 3) == 5
    fut = await aclient.call_async("add", 40, 2)
    assert isinstance(fut, rtpool.CallFuture)
    assert await fut == 42
    with aclient.sync.transaction() as tx:
        a = tx.call("add", 1, 2)
        b = tx.call("add", a, 10)
    assert await b == 13
    with pytest.raises(NotFetchedError):
        await a  # an intermediate call's outputs stay on the master


@pytest.mark.asyncio
async def test_cancelling_the_awaiting_task_cancels_the_rtpool_task(aclient, tmp_path):
    # A task with a time limit runs in the worker's executor process, which the master's
    # ABORT kills: a task cancelled only here would sleep its full 60 s.
    path = tmp_path / "pid"
    limited = aclient.options(timeout=120)
    fut = await limited.submit(sleep_with_pid, str(path), 60)
    waiter = asyncio.ensure_future(fut)
    pid = await asyncio.get_running_loop().run_in_executor(None, _pid_from, path)
    assert _alive(pid)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert fut.cancelled()
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_until(lambda: not _alive(pid), timeout=20)
    )


@pytest.mark.asyncio
async def test_wait_for_timeout_cancels_the_call(aclient, tmp_path):
    path = tmp_path / "pid"
    fut = await aclient.options(timeout=120).submit(sleep_with_pid, str(path), 60)
    pid = await asyncio.get_running_loop().run_in_executor(None, _pid_from, path)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(fut, 0.2)
    assert fut.cancelled()
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_until(lambda: not _alive(pid), timeout=20)
    )
    with pytest.raises(TimeoutError, match="the call was cancelled"):
        await aclient.options(timeout=60).call("slow", 30.0, timeout=0.2)


@pytest.mark.asyncio
async def test_gather_and_as_completed(aclient, tmp_path):
    gate = tmp_path / "gate"
    held = await aclient.submit(return_after, "held", str(gate), 60)
    quick = await aclient.submit(square, 5)
    order = []
    async for fut in aclient.as_completed([held, quick], timeout=60):
        order.append(await fut)
        if len(order) == 1:
            gate.touch()  # only now can the held task finish
    assert order == [25, "held"]

    gate2 = tmp_path / "gate2"
    limited = aclient.options(timeout=60)  # a cancelled task of these is killed at once
    slow = await limited.submit(return_after, "late", str(gate2), 60)
    done = await aclient.submit(square, 6)
    assert await aclient.gather([done, slow], deadline=0.3, default="none") == [36, "none"]
    assert slow.cancelled()
    failing = await aclient.submit(fail, "first")
    with pytest.raises(TaskError, match="first"):
        await aclient.gather([failing, await aclient.submit(square, 2)])
    both = [await aclient.submit(fail, "x"), await aclient.submit(square, 3)]
    out = await aclient.gather(both, return_exceptions=True)
    assert isinstance(out[0], TaskError) and out[1] == 9
    slow2 = await limited.submit(sleep_return, 0, 30)
    with pytest.raises(TimeoutError, match="1 futures did not complete within 0.1 s"):
        async for _ in aclient.as_completed([slow2], 0.1):
            pass
    assert slow2.cancel()


@pytest.mark.asyncio
async def test_shutdown_waits_without_blocking_the_loop(client, tmp_path):
    # The only way for the pending task to finish is a coroutine on this loop opening its
    # gate: if shutdown(wait=True) blocked the loop, the watchdog thread would have to.
    gate = tmp_path / "gate"
    opened_by = []

    def watchdog() -> None:
        try:
            wait_until(gate.exists, timeout=15, interval=0.05)
        except AssertionError:  # the loop could not open it: it is blocked
            opened_by.append("watchdog")
            gate.touch()

    ac = rtpool.AsyncClient.from_client(client)
    fut = await ac.submit(return_after, 1, str(gate), 60)
    threading.Thread(target=watchdog, daemon=True).start()

    async def open_gate() -> None:
        await asyncio.sleep(0.05)
        opened_by.append("loop")
        gate.touch()

    opener = asyncio.ensure_future(open_gate())
    await ac.shutdown(wait=True)
    await opener
    assert opened_by == ["loop"]
    assert fut.result(0) == 1 and client.closed


@pytest.mark.asyncio
async def test_async_with_cluster_and_client():
    async with rtpool.LocalCluster(workers=1) as cluster:
        async with rtpool.AsyncClient(cluster.address, cluster.client_token) as ac:
            assert await (await ac.submit(square, 9)) == 81
            assert (await ac.status())["master"]
        assert ac.sync.closed
        other = await cluster.async_client()
        await cluster.wait_for_workers_async(1, timeout=30)
        assert await (await other.submit(noop)) is None
        connected = await rtpool.AsyncClient(cluster.address, cluster.client_token)
        assert await connected.map(square, [1, 2]) == [1, 4]
        await connected.close()
    with pytest.raises(RuntimeError, match="closed"):
        cluster.client()


def test_await_needs_a_running_loop(client):
    fut = client.options(timeout=60).submit(sleep_return, 1, 30)
    with pytest.raises(RuntimeError, match="no running event loop"):
        next(fut.__await__())
    assert fut.cancel()
    with pytest.raises(RuntimeError, match="not connected"):
        asyncio.run(rtpool.AsyncClient("127.0.0.1:1", "t").submit(noop))


def test_a_finished_event_loop_is_not_kept_alive(client):
    import gc
    import weakref

    from rtpool import _aio

    async def one() -> tuple:
        fut = client.submit(sleep_return, 3, 0.3)  # pending when awaited: a waker is made
        value = await fut
        assert _aio._wakers  # the loop's waker
        return value, weakref.ref(asyncio.get_running_loop())

    value, loop_ref = asyncio.run(one())
    assert value == 3
    # The per-loop waker refers to its loop weakly. (The reader thread may hold the last
    # future, whose done callback refers to the loop, until it reads its next frame.)
    client.submit(square, 1).result(30)
    wait_until(lambda: gc.collect() is not None and loop_ref() is None, timeout=5)
    assert len(_aio._wakers) == 0
