"""Deadlines, admission, hedging and quorum end to end: a LocalCluster (embedded master) and
worker processes, one of which can be made to lie or to be slow (``worker_env``).

They exercise the options of ``docs/protocol.md`` (``deadline_ms``, ``on_miss``, ``admit``,
``replicas``, ``quorum``, ``max_copies``, ``hedge``) and the ``late_us`` the master sends.
"""

from __future__ import annotations

import pytest

import rtpool
import tasks
import tasks.deadline
from helpers import wait_until
from rtpool.errors import AdmissionError, DeadlineMissedError, QuorumError


def executions(path) -> list:
    """Task indices in the order they ran (tasks.logged appends one line per execution)."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


# -- replicas and quorum -----------------------------------------------------------------------


def test_quorum_outvotes_a_lying_worker():
    env = [{tasks.deadline.LIE_ENV: "1"}, {}, {}]
    with rtpool.LocalCluster(workers=3, worker_env=env) as cluster:
        cluster.wait_for_workers(3, timeout=30)
        client = cluster.client()
        view = client.options(replicas=2, quorum=2)
        # A worker whose processes start last can miss a package of 60 copies entirely on a
        # busy machine: packages go on until the liar took part (else this proves nothing),
        # at most 10. Every package must still come back right.
        for _ in range(10):
            pkg = view.submit_many(tasks.deadline.square_or_lie, range(30))
            assert pkg.results(60) == [x * x for x in range(30)]
            stats = cluster.stats()
            if stats["disagreements"] >= 1:
                break
    # The liar took part, and lost every vote.
    assert stats["disagreements"] >= 1, stats
    assert stats["quorum_failed"] == 0, stats


def test_quorum_error_carries_every_copy():
    env = [{tasks.deadline.LIE_ENV: "1"}, {}]
    with rtpool.LocalCluster(workers=2, worker_env=env) as cluster:
        cluster.wait_for_workers(2, timeout=30)
        client = cluster.client()
        view = client.options(replicas=2, quorum=2, max_copies=2)
        fut = view.submit(tasks.deadline.square_or_lie, 3)
        with pytest.raises(QuorumError) as info:
            fut.result(60)
        copies = info.value.results
        assert sorted(value for _, _, value in copies) == [9, 10]
        assert [status for _, status, _ in copies] == [0, 0]
        assert len({worker for worker, _, _ in copies}) == 2  # distinct workers
        # The connection and the pool go on.
        assert client.options(replicas=2).submit(tasks.square, 4).result(30) == 16


# -- hedging -----------------------------------------------------------------------------------


def test_hedging_rescues_tasks_stuck_on_a_straggling_worker():
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        # Warm-up on the fast worker only: the function's estimate (p95 ~20 ms) must not
        # include the slow worker's times.
        warm = client.submit_many(
            tasks.deadline.sleep_scaled, [(i, 0.02) for i in range(20)], star=True
        )
        assert [x for x, _ in warm.results(60)] == list(range(20))
        cluster.add_worker(env={tasks.deadline.SLOW_ENV: "10"})
        cluster.wait_for_workers(2, timeout=30)
        before = cluster.stats()["hedges"]
        pkg = client.options(hedge=True).submit_many(
            tasks.deadline.sleep_scaled, [(i, 0.02) for i in range(20)], star=True
        )
        results = pkg.results(60)
        stats = cluster.stats()
    assert [x for x, _ in results] == list(range(20))
    assert stats["hedges"] > before, stats
    assert client._conn.duplicate_results == 0  # exactly one result per task
    assert all(f.timings is not None for f in pkg)


# -- deadlines ---------------------------------------------------------------------------------


def test_on_miss_drop_fails_unfinished_tasks_at_the_deadline():
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        assert client.submit(tasks.square, 2).result(30) == 4  # the worker is up
        view = client.options(deadline=1.0, on_miss="drop", timeout=120)
        args = [(0, 0.01), (1, 60.0), (2, 0.01)]  # 2 queues behind 1, which cannot finish
        pkg = view.submit_many(tasks.sleep_return, args, star=True)
        assert pkg[0].result(30) == 0
        for fut in (pkg[1], pkg[2]):
            with pytest.raises(DeadlineMissedError):
                fut.result(30)  # at the deadline, long before the 60 s task would end
        report = pkg.deadline_report()
        assert (report["met"], report["missed"], report["dropped"]) == (1, 2, 2)
        assert report["pending"] == 0 and report["cancelled"] == 0
        assert pkg[0].lateness == 0.0
        wait_until(lambda: cluster.stats()["running"] == 0, timeout=15)  # aborted
        assert cluster.stats()["deadline_dropped"] == 2


def test_on_miss_run_reports_lateness():
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        assert client.submit(tasks.square, 2).result(30) == 4
        late = client.options(deadline=0.1).submit(tasks.sleep_return, "late", 0.5)
        assert late.result(30) == "late"
        assert late.lateness > 0.2
        assert late.timings["late_us"] == pytest.approx(late.lateness * 1e6)
        on_time = client.options(deadline=30).submit_many(tasks.square, range(3))
        assert on_time.results(30) == [0, 1, 4]
        assert [f.lateness for f in on_time] == [0.0, 0.0, 0.0]
        assert on_time.deadline_report() == {
            "met": 3,
            "missed": 0,
            "dropped": 0,
            "cancelled": 0,
            "pending": 0,
            "lateness": {},
        }
        plain = client.submit(tasks.square, 5)
        assert plain.result(30) == 25 and plain.lateness is None
        stats = cluster.stats()
        assert stats["deadlines_missed"] >= 1 and stats["deadlines_met"] >= 3


def test_status_reply_counts_met_and_missed():
    with rtpool.LocalCluster(workers=2) as cluster:
        client = cluster.client()
        view = client.options(deadline=30, timeout=120)
        pkg = view.submit_many(tasks.sleep_return, [(0, 0.01), (1, 60.0)], star=True)
        assert pkg[0].result(30) == 0
        status = pkg.status()
        assert (status["done"], status["met"], status["missed"]) == (1, 1, 0)
        pkg.cancel()


def test_earliest_deadline_first_within_a_priority(tmp_path):
    log = tmp_path / "runs"
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        blocker = client.submit(tasks.logged, -1, str(log), 0.5)
        wait_until(lambda: executions(log) == [-1], timeout=20)
        later = client.options(deadline=120).submit_many(
            tasks.logged, [(i, str(log)) for i in range(10)], star=True
        )
        sooner = client.options(deadline=60).submit_many(
            tasks.logged, [(i, str(log)) for i in range(100, 110)], star=True
        )
        later.results(30), sooner.results(30), blocker.result(30)
    order = executions(log)
    # At most the one task the worker had prefetched runs before the earlier deadline's.
    assert max(order.index(i) for i in range(100, 110)) < order.index(2)


# -- admission ---------------------------------------------------------------------------------


def test_admission_refuses_what_cannot_make_its_deadline():
    with rtpool.LocalCluster(workers=1) as cluster:
        client = cluster.client()
        warm = client.submit_many(tasks.sleep_return, [(i, 0.1) for i in range(5)], star=True)
        assert warm.results(30) == list(range(5))  # the estimate: ~100 ms per task
        view = client.options(deadline=0.5, admit=True)
        pkg = view.submit_many(tasks.sleep_return, [(i, 0.1) for i in range(40)], star=True)
        with pytest.raises(AdmissionError, match="short by"):
            _ = pkg.id  # refused at once, nothing ran
        assert all(isinstance(f.exception(0), AdmissionError) for f in pkg)
        with pytest.raises(AdmissionError):
            list(view.map(tasks.sleep_return, range(40), [0.1] * 40))
        ok = client.options(deadline=30, admit=True)
        assert ok.submit_many(tasks.sleep_return, [(1, 0.1), (2, 0.1)], star=True).results(30) == [
            1,
            2,
        ]
        assert cluster.stats()["admission_refused"] == 2
