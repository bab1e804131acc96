"""Overload protection and hedging that sees stragglers, end to end (issue 17, items 3 and 4).

* A real ``rtpool master`` subprocess with one worker process is offered far more work with a
  deadline than it can do: it says so in ``/metrics`` (``rtpool_overloaded``), in
  ``/api/status`` (``deadlines.overloaded``), in its log, and to the client whose next
  deadline package it accepts (an :class:`rtpool.OverloadWarning`).
* ``--admit-deadlines`` (here the embedded master's ``admit_deadlines`` option) refuses a
  package with a deadline it cannot meet although the package did not ask for ``admit``.
* Of two workers, one 10x slower, tasks submitted one at a time with ``hedge=True``: the
  master judges the slow worker against the fast one's pace, so every result comes from the
  fast worker (today's main learned "slow is normal" from the slow worker's own runs and let
  the slow worker answer).
"""

from __future__ import annotations

import json
import urllib.request
import warnings

import pytest

import rtpool
import tasks
import tasks.deadline
from conftest import Workers, close_master, start_master
from helpers import wait_until


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _metric(text: str, series: str) -> float | None:
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return None


def test_overload_is_said_in_metrics_status_log_and_to_the_client(tmp_path):
    m = start_master(tmp_path, args=["--http", "127.0.0.1:0"])
    workers = Workers(m, tmp_path)
    try:
        base = m.dashboard_url
        assert _metric(_get(base + "metrics"), "rtpool_overloaded") == 0
        workers.start(procs=1)
        client = rtpool.Client(m.address, m.client_token)
        try:
            assert client.submit(tasks.square, 3).result(60) == 9  # the worker is up
            # Offered load far above capacity: 150 tasks of 20 ms on one slot (3 s of work),
            # every one due 0.5 s after submission. The first ~25 are met, the rest late.
            view = client.options(deadline=0.5)
            flood = view.submit_many(tasks.sleep_return, [(i, 0.02) for i in range(150)], star=True)
            snap = wait_until(
                lambda: (
                    (s := json.loads(_get(base + "api/status")))["deadlines"]["overloaded"] and s
                ),
                timeout=30,
                interval=0.2,
            )
            assert snap["deadlines"]["window_missed"] > 0, snap["deadlines"]
            assert snap["totals"]["overloads"] == 1, snap["totals"]
            assert _metric(_get(base + "metrics"), "rtpool_overloaded") == 1
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                more = view.submit_many(tasks.sleep_return, [("more", 0.0)], star=True)
                assert more.id > 0  # accepted: the package runs, with a warning
                wait_until(lambda: client.overload_notices >= 1, timeout=10)
            overload = [w for w in caught if issubclass(w.category, rtpool.OverloadWarning)]
            assert overload, [str(w.message) for w in caught]
            assert "overloaded" in str(overload[0].message)
            assert "admit=True" in str(overload[0].message)
            # A package without a deadline gets no warning.
            before = client.overload_notices
            assert client.submit_many(tasks.square, [2]).results(60) == [4]
            assert client.overload_notices == before
            wait_until(lambda: "overloaded:" in m.log_text(), timeout=15)
            assert flood.results(120)[149] == 149
            assert more.results(60) == ["more"]
        finally:
            client.close()
    finally:
        workers.stop_all()
        close_master(m)
    # One warning line per window, not one per check.
    assert m.log_text().count("overloaded:") <= 3, m.log_text()


def test_admit_deadlines_refuses_a_deadline_package_that_cannot_make_it():
    with rtpool.LocalCluster(workers=1, master_options={"admit_deadlines": True}) as cluster:
        client = cluster.client()
        # The master learns the function's time (20 ms).
        warm = client.submit_many(tasks.sleep_return, [(i, 0.02) for i in range(10)], star=True)
        assert warm.results(60) == list(range(10))
        # 100 x 20 ms on one slot cannot finish in 0.2 s: refused at once, nothing runs.
        doomed = client.options(deadline=0.2).submit_many(
            tasks.sleep_return, [(i, 0.02) for i in range(100)], star=True
        )
        with pytest.raises(rtpool.AdmissionError):
            _ = doomed.id
        # What can make it, and what has no deadline, runs.
        ok = client.options(deadline=30).submit_many(tasks.sleep_return, [(1, 0.0)], star=True)
        assert ok.results(60) == [1]
        assert client.submit_many(tasks.sleep_return, [(2, 0.0)], star=True).results(60) == [2]


def test_hedging_protects_one_task_at_a_time_from_a_slow_worker():
    env = [{tasks.deadline.SLOW_ENV: "10"}, {}]
    with rtpool.LocalCluster(workers=2, worker_env=env) as cluster:
        cluster.wait_for_workers(2, timeout=30)
        client = cluster.client()
        # One task at a time: the two idle workers take turns, so each runs about half of
        # them; the master learns the function's time on each (20 ms and 200 ms).
        slow_pids, all_pids = set(), []
        for i in range(16):
            fut = client.submit(tasks.deadline.sleep_scaled, i, 0.02)
            x, pid = fut.result(60)
            assert x == i
            all_pids.append(pid)
            if fut.timings["exec_us"] > 100_000:
                slow_pids.add(pid)
        assert len(slow_pids) == 1, "the slow worker took part in the warm-up"
        # Each worker ran enough of them for the master to know its pace (5 results).
        assert min(all_pids.count(p) for p in set(all_pids)) >= 5, all_pids
        hedged = client.options(hedge=True)
        pids = []
        for i in range(20):
            x, pid = hedged.submit(tasks.deadline.sleep_scaled, i, 0.02).result(60)
            assert x == i
            pids.append(pid)
        stats = cluster.stats()
    # The slow worker got tasks (hedges were needed) and lost every race: every answer came
    # from the fast worker's process (a slow worker's child killed on ABORT comes back with
    # another pid, so the check names the fast one).
    assert stats["hedges"] >= 1, stats
    fast_pids = set(all_pids) - slow_pids
    assert len(fast_pids) == 1 and set(pids) == fast_pids, (slow_pids, pids, stats)
    assert client._conn.duplicate_results == 0
