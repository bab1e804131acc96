"""What a future tells while it waits (issue 26, item 7): ``running()`` while a worker has the
task, and one warning from a ``result()`` without a timeout that nothing can serve. Real
master and worker processes; tasks block on files the test creates."""

from __future__ import annotations

import logging
import threading

import pytest

import tasks
from helpers import wait_until


def test_running_is_true_while_a_worker_runs_the_task(master, workers, client_factory, tmp_path):
    client = client_factory()
    gate, marker = tmp_path / "gate", tmp_path / "started"
    fut = client.submit(tasks.mark_then_return_after, 7, str(marker), str(gate))
    # No worker yet: the task is queued at the master (which says so).
    wait_until(lambda: client.status()["totals"]["queued"] == 1, timeout=10)
    assert fut.running() is False
    assert not marker.exists()
    workers.start(1)
    wait_until(marker.exists, timeout=30)
    # The task has started on the worker (it made the marker): the master has it assigned.
    assert fut.running() is True
    assert fut.done() is False
    gate.touch()
    assert fut.result(timeout=30) == 7
    assert fut.running() is False


def test_running_in_a_package_once_none_of_it_is_queued(master, workers, client_factory, tmp_path):
    client = client_factory()
    gate = tmp_path / "gate"
    pkg = client.submit_many(tasks.return_after, [(1, str(gate))] * 2, star=True)
    wait_until(lambda: client.status()["totals"]["queued"] == 2, timeout=10)
    assert [f.running() for f in pkg] == [False, False]
    # Two processes: each runs one, nothing of the package is queued at the master.
    workers.start(2, "--connection", "process")
    wait_until(lambda: client.status()["totals"]["queued"] == 0, timeout=30)
    assert [f.running() for f in pkg] == [True, True]
    gate.touch()
    assert [f.result(timeout=30) for f in pkg] == [1, 1]
    assert [f.running() for f in pkg] == [False, False]


def test_result_without_timeout_warns_once_when_no_worker_is_connected(
    master, workers, client_factory, caplog
):
    client = client_factory(stall_warning=0.2)
    fut = client.submit(pow, 2, 10)
    got = []
    waiter = threading.Thread(target=lambda: got.append(fut.result()), daemon=True)
    with caplog.at_level(logging.WARNING, logger="rtpool.client"):
        waiter.start()

        def stalled():
            return [r for r in caplog.records if "has had no result for" in r.getMessage()]

        (record,) = wait_until(stalled, timeout=10)
        text = record.getMessage()
        assert record.levelno == logging.WARNING
        assert f"no worker is connected to the master at {master.address}" in text
        assert f"rtpool worker --master {master.address}" in text
        assert "result() keeps waiting" in text
        # It keeps waiting, and gets the result once a worker comes.
        workers.start(1)
        waiter.join(timeout=30)
        assert got == [1024]
        assert len(stalled()) == 1, "warned once"


def test_stall_warning_is_checked(master):
    import rtpool

    for bad in (0, -1, float("nan"), float("inf"), "10", True):
        with pytest.raises(ValueError, match="stall_warning must be a positive number"):
            rtpool.Client(master.address, master.client_token, stall_warning=bad)
