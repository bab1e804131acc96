"""Pull-based load balance: fast workers take more work, also right after a run of no-ops."""

from __future__ import annotations

from collections import Counter

import tasks
from helpers import wait_until


def test_slow_worker_gives_back_prefetched_tasks_after_a_run_of_noops(
    master, workers, client_factory
):
    workers.start(1)
    workers.start(1, env={"RTPOOL_TEST_SLOW": "1"})
    client = client_factory()
    pids: set = set()

    def both_serving() -> bool:
        pids.update(pid for _, pid in client.map(tasks.pid_of, range(50)))
        return len(pids) == 2

    wait_until(both_serving, timeout=30)
    # A run of no-ops ramps both workers' prefetch to its maximum (64 credits each) ...
    assert list(client.map(tasks.square, range(5000))) == [x * x for x in range(5000)]
    # ... so the master spreads the next package evenly across them. 10 ms tasks on the fast
    # worker, 50 ms on the slow one: the slow one must hand its surplus back instead of
    # sitting on half the package.
    pkg = client.submit_many(tasks.slow_where_marked, [(i, 0.01) for i in range(60)], star=True)
    results = pkg.results(60)
    assert [x for x, _ in results] == list(range(60))
    per_pid = Counter(pid for _, pid in results)
    assert len(per_pid) <= 2
    # The fast worker does ~5x the slow one's work when the pull model works (83 %); a
    # worker that hoards its prefetch leaves it at 50 %.
    fast_share = max(per_pid.values()) / 60
    assert fast_share >= 0.7, per_pid
