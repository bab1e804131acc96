"""LocalCluster: processes, workers, and what is left behind (nothing)."""

from __future__ import annotations

import psutil
import pytest

import rtpool
import tasks
from helpers import wait_until


def descendants() -> dict:
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def assert_all_gone(procs) -> None:
    assert procs, "the cluster should have started processes"
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    left = set(descendants()) & {p.pid for p in procs}
    assert left == set()


def test_close_leaves_no_process_behind():
    before = set(descendants())
    cluster = rtpool.LocalCluster(workers=2)
    client = cluster.client()
    assert client.submit(tasks.square, 3).result(30) == 9
    cluster.wait_for_workers(2)
    # Each worker is a supervisor and its forked child.
    procs = wait_until(
        lambda: (
            (ps := [p for pid, p in descendants().items() if pid not in before])
            and len(ps) >= 4
            and ps
        )
    )
    cluster.close()
    cluster.close()  # idempotent
    assert_all_gone(procs)
    with pytest.raises(RuntimeError, match="closed"):
        cluster.client()


def test_exception_in_with_block_leaves_no_process_behind():
    before = set(descendants())
    procs = []
    with pytest.raises(ZeroDivisionError):
        with rtpool.LocalCluster(workers=2) as cluster:
            cluster.client().submit(tasks.noop).result(30)
            cluster.wait_for_workers(2)
            procs = [p for pid, p in descendants().items() if pid not in before]
            1 / 0  # noqa: B018
    assert_all_gone(procs)


def test_clients_are_closed_with_the_cluster():
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        assert client.submit(tasks.square, 4).result(30) == 16
    with pytest.raises(RuntimeError, match="after shutdown"):
        client.submit(tasks.square, 1)


def test_stats_and_wait_for_workers():
    with rtpool.LocalCluster(workers=2) as cluster:
        cluster.wait_for_workers(2, timeout=30)
        stats = cluster.stats()
        assert stats["workers"] == 2
        assert cluster.address.startswith("127.0.0.1:")
        assert cluster.client_token != cluster.worker_token
        assert len(cluster.worker_pids) == 2
        with pytest.raises(TimeoutError, match="2 of 3 workers"):
            cluster.wait_for_workers(3, timeout=0.2)


def test_worker_env_sets_variables_of_one_worker():
    import tasks.deadline

    with rtpool.LocalCluster(workers=1, worker_env=[{"RTPOOL_TEST_MARK": "first"}]) as cluster:
        client = cluster.client()
        mark, pid = client.submit(tasks.deadline.env_of, "RTPOOL_TEST_MARK").result(30)
        assert mark == "first"
        second = cluster.add_worker(env={"RTPOOL_TEST_MARK": "second"})
        cluster.wait_for_workers(2, timeout=30)
        cluster.stop_worker(0)
        mark, other = client.submit(tasks.deadline.env_of, "RTPOOL_TEST_MARK").result(30)
        assert (mark, second) == ("second", 1) and other != pid
        cluster.add_worker()
        cluster.stop_worker(second)
        assert client.submit(tasks.deadline.env_of, "RTPOOL_TEST_MARK").result(30)[0] is None


def test_worker_env_longer_than_workers_is_refused():
    with pytest.raises(ValueError, match="worker_env has 2 entries for 1 workers"):
        rtpool.LocalCluster(workers=1, worker_env=[{}, {}])
