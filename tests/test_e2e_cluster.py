"""End to end on a LocalCluster: real master, real worker processes, real results."""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections import Counter

import pytest

import rtpool
import tasks
from helpers import wait_until
from rtpool.errors import RemoteTraceback, TaskFailed

N = 10_000


def executions(path) -> Counter:
    """How often each task index ran (tasks.logged appends one line per execution)."""
    if not path.exists():
        return Counter()
    return Counter(int(line) for line in path.read_text().split())


def test_map_10000_in_input_order(cluster_client):
    assert list(cluster_client.map(tasks.square, range(N))) == [x * x for x in range(N)]


def test_submit_many_10000_in_input_order(cluster, cluster_client):
    pkg = cluster_client.submit_many(tasks.add, [(x, 1) for x in range(N)], star=True)
    assert len(pkg) == N
    assert pkg.results(timeout=60) == [x + 1 for x in range(N)]
    assert pkg.status() == {"total": N, "queued": 0, "running": 0, "done": N, "cancelled": 0}
    wait_until(lambda: cluster.stats()["tasks"] == 0)  # the master freed the package
    assert cluster.stats()["delivered"] == N


def test_map_with_chunks_and_several_iterables(cluster_client):
    out = cluster_client.map(tasks.add, range(1000), range(1000, 2000), chunksize=64)
    assert list(out) == [x + x + 1000 for x in range(1000)]


def test_submit_passes_every_kwarg_to_the_function(cluster_client):
    fut = cluster_client.submit(tasks.echo, 1, "two", priority=3, timeout=4, fn=5)
    assert fut.result(10) == ((1, "two"), {"priority": 3, "timeout": 4, "fn": 5})


def test_options_priority_does_not_steal_kwargs(cluster_client):
    view = cluster_client.options(priority=5)
    assert view.submit(tasks.echo, 7, priority=1).result(10) == ((7,), {"priority": 1})
    assert list(view.map(tasks.square, [2, 3])) == [4, 9]
    assert view.submit_many(tasks.square, [4]).results(10) == [16]


def test_unknown_option_raises_type_error_listing_valid_ones(cluster_client):
    with pytest.raises(TypeError, match="unknown option 'timeot'; valid options: priority"):
        cluster_client.options(timeot=3)


def test_exception_keeps_its_type_and_remote_traceback(cluster_client):
    fut = cluster_client.submit(tasks.fail, "boom")
    with pytest.raises(tasks.TaskError, match="^boom$") as info:
        fut.result(10)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert os.path.join("tasks", "__init__.py") in cause.tb and "in fail" in cause.tb
    assert "TaskError: boom" in cause.tb
    with pytest.raises(KeyError, match="missing"):
        cluster_client.submit(tasks.fail_builtin, "missing").result(10)


def test_exception_that_cannot_be_unpickled_is_task_failed(cluster_client):
    with pytest.raises(TaskFailed) as info:
        cluster_client.submit(tasks.fail_unpicklable, 1, 2).result(10)
    assert info.value.type_name == "tasks.UnpicklableError"
    assert "UnpicklableError: 1/2" in info.value.remote_traceback


def test_lambda_and_main_closure_work(cluster_client):
    offset = 40
    assert cluster_client.submit(lambda x: x + offset, 2).result(10) == 42
    ns = {"__name__": "__main__"}
    exec("FACTOR = 3\ndef triple(x):\n    return x * FACTOR\n", ns)
    assert list(cluster_client.map(ns["triple"], [1, 2, 3])) == [3, 6, 9]
    # A lambda as an argument takes the cloudpickle fallback.
    assert cluster_client.submit(tasks.apply, lambda a, b: a * b, 6, 7).result(10) == 42


def test_timings_are_filled(cluster_client):
    fut = cluster_client.submit(tasks.sleep_return, 1, 0.02)
    assert fut.result(10) == 1
    t = fut.timings
    assert set(t) == {
        "serialize_us",
        "queue_us",
        "worker_us",
        "exec_us",
        "wait_us",
        "flush_us",
        "late_us",
        "deserialize_us",
        "total_us",
    }
    assert t["exec_us"] >= 20_000
    assert t["worker_us"] >= t["exec_us"]
    assert t["total_us"] >= t["worker_us"] + t["queue_us"]


def test_cancel_queued_tasks(cluster, cluster_client, tmp_path):
    log = tmp_path / "runs"
    pkg = cluster_client.submit_many(
        tasks.logged, [(i, str(log), 0.05) for i in range(40)], star=True
    )
    assert pkg[39].cancel()  # queued behind 39 others: it must never run
    # as_completed() yields the cancelled pkg[39] too (as for any cancelled future).
    first = next(f for f in pkg.as_completed(timeout=30) if not f.cancelled())
    assert pkg[first.result()[0]] is first
    cancelled = pkg.cancel()
    assert 0 < cancelled < 39
    wait_until(lambda: cluster.stats()["tasks"] == 0, timeout=10)
    done = [f for f in pkg if not f.cancelled()]
    assert 1 <= len(done) == 40 - 1 - cancelled
    for f in done:
        i, _ = f.result(10)
        assert f is pkg[i]
    with pytest.raises(cf.CancelledError):
        pkg[39].result(0)
    runs = executions(log)
    assert 39 not in runs
    # What ran: the finished tasks plus those already on a worker when cancelled (their
    # results are dropped); the queued rest never ran.
    assert {f.result()[0] for f in done} <= set(runs)
    assert len(runs) <= 10


def test_package_status(cluster_client):
    pkg = cluster_client.submit_many(tasks.sleep_return, [(i, 0.05) for i in range(40)], star=True)
    status = pkg.status()
    assert status["total"] == 40
    assert sum(status[k] for k in ("queued", "running", "done", "cancelled")) == 40
    assert status["queued"] >= 20  # 2 workers hold a few at most
    assert pkg.results(30) == list(range(40))
    assert pkg.status()["done"] == 40


def test_priority_runs_first(tmp_path):
    log = tmp_path / "runs"
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        blocker = client.submit(tasks.logged, -1, str(log), 0.3)
        wait_until(lambda: executions(log)[-1] == 1, timeout=20)
        low = client.submit_many(tasks.logged, [(i, str(log)) for i in range(10)], star=True)
        high = client.options(priority=10).submit_many(
            tasks.logged, [(i, str(log)) for i in range(100, 110)], star=True
        )
        high.results(30), low.results(30), blocker.result(30)
    order = [int(x) for x in log.read_text().split()]
    # At most the one low task the worker had prefetched runs before the high ones.
    assert max(order.index(i) for i in range(100, 110)) < order.index(2)


def test_worker_joining_mid_package_gets_work():
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        pkg = client.submit_many(tasks.pid_of, [(i, 0.01) for i in range(300)], star=True)
        wait_until(lambda: sum(f.done() for f in pkg) >= 20, timeout=30)
        cluster.add_worker()
        results = pkg.results(60)
    assert [x for x, _ in results] == list(range(300))
    per_pid = Counter(pid for _, pid in results)
    assert len(per_pid) == 2
    assert min(per_pid.values()) >= 20, per_pid


def _stop_mid_package(tmp_path, graceful):
    log = tmp_path / "runs"
    with rtpool.LocalCluster(workers=2) as cluster:
        client = cluster.client()
        cluster.wait_for_workers(2)
        pkg = client.submit_many(tasks.logged, [(i, str(log), 0.01) for i in range(200)], star=True)
        wait_until(lambda: sum(f.done() for f in pkg) >= 30, timeout=30)
        code = cluster.stop_worker(0, graceful=graceful)
        results = pkg.results(60)
        wait_until(lambda: cluster.stats()["tasks"] == 0)
        delivered = cluster.stats()["delivered"]
    assert [x for x, _ in results] == list(range(200))
    assert delivered == 200  # every result reached the client exactly once
    return code, executions(log), Counter(pid for _, pid in results)


def test_graceful_worker_stop_mid_package_loses_nothing(tmp_path):
    code, runs, per_pid = _stop_mid_package(tmp_path, graceful=True)
    assert code == 0
    assert runs == Counter(range(200))  # drained: nothing ran twice, nothing was lost
    assert len(per_pid) == 2


def test_worker_kill_9_mid_package_loses_nothing(tmp_path):
    code, runs, per_pid = _stop_mid_package(tmp_path, graceful=False)
    assert code == -9
    assert set(runs) == set(range(200))  # the task it was running ran again elsewhere
    assert sum(runs.values()) - 200 <= 70  # at most what it held: running + prefetched


def test_start_to_first_result():
    with rtpool.LocalCluster(workers=1) as cluster:
        assert cluster.client().submit(os.getpid).result(30) != os.getpid()
