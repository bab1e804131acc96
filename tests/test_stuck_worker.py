"""A task the worker cannot interrupt (issue 12, item 5): it runs in the worker process (no
``timeout=``) and ignores the master's ``--max-task-seconds``, or holds the GIL past the lease.
Its slot must not become a black hole that takes tasks it cannot run: the tasks queued behind
it are given back, the slot is retired and replaced by a fresh process, and what happened is
said (in the worker's log, and in the task's error).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tasks.hostile
from conftest import close_master, start_master
from helpers import wait_until
from rtpool.errors import TaskTimeoutError

QUICK = 40


@pytest.fixture
def strict_master(tmp_path: Path):
    """A master that fails any task running past 2 s (``--max-task-seconds 2``)."""
    m = start_master(tmp_path, args=["--max-task-seconds", "2"])
    try:
        yield m
    finally:
        close_master(m)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of the worker parent's until it reaps it: gone all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_task_past_the_max_task_time_does_not_take_the_quick_tasks_behind_it(
    strict_master, tmp_path: Path
) -> None:
    import rtpool
    from conftest import Workers

    workers = Workers(strict_master, tmp_path)
    client = rtpool.Client(strict_master.address, strict_master.client_token)
    try:
        workers.start(2)
        # Warm up: no-op tasks deepen both slots' prefetch, so the stuck one holds many.
        assert list(
            client.map(tasks.hostile.sleep_then, [0] * 300, range(300), timeout=60)
        ) == list(range(300))
        pid_file = tmp_path / "stuck.pid"
        stuck = client.submit(tasks.hostile.write_pid_then_sleep, str(pid_file), 60)
        quick = [client.submit(tasks.hostile.sleep_then, 0.05, i) for i in range(QUICK)]
        failed = []
        for i, f in enumerate(quick):
            try:
                assert f.result(timeout=60) == i
            except TaskTimeoutError as exc:
                failed.append(str(exc))
        assert not failed, f"{len(failed)} of {QUICK} quick tasks failed: {failed[:3]}"
        with pytest.raises(TaskTimeoutError) as info:
            stuck.result(timeout=30)
        assert "maximum execution time of 2 s" in str(info.value)
        # The stuck task's process was retired (the task dies with it) and replaced.
        pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=10))
        wait_until(lambda: _gone(pid), timeout=10)
        log = workers.log_text(0)
        assert "retiring this process" in log, log
        # Both slots serve again.
        again = client.map(tasks.hostile.sleep_then, [0.2] * 8, range(8), timeout=60)
        assert list(again) == list(range(8))
        assert len({p for _, p in client.map(tasks.pid_of, range(40), [0.05] * 40)}) == 2
    finally:
        client.close()
        workers.stop_all()


def test_a_task_holding_the_gil_past_the_lease_is_named_and_retried_in_isolation(
    master, workers, client_factory
) -> None:
    # Attempt 1 runs in the worker process and starves its heartbeat thread: the worker
    # parent kills that process before the lease (3 s) expires and says why; the retry runs
    # in an executor process, where the GIL it holds is its own, and completes.
    workers.start(1)
    client = client_factory()
    assert client.submit(tasks.hostile.sleep_then, 0, 1).result(timeout=30) == 1
    future = client.submit(tasks.hostile.hold_gil, 5.0)
    assert future.result(timeout=90) >= 18
    log = workers.log_text(0)
    assert "held the GIL for more than" in log and "while running task" in log, log
    assert "was killed (signal 9, SIGKILL) by the worker" in log, log
