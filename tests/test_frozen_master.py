"""A master that is itself frozen (SIGSTOP for 8 s, then SIGCONT) does not blame its healthy
workers for the silence: no lease expires, the tasks they run are not taken away and run
again, and the package completes with each task run once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import rtpool
import tasks
from helpers import wait_until

FREEZE_S = 8.0  # well past the default 3 s lease


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_master_stopped_for_8_s_keeps_its_workers_and_their_tasks(
    master, workers, tmp_path: Path
) -> None:
    log = tmp_path / "runs.txt"
    workers.start(procs=2)
    with rtpool.Client(master.address, master.client_token) as client:
        assert client.submit(tasks.square, 3).result(60) == 9
        # One 4 s task per worker process; both running when the master stops.
        package = client.submit_many(
            tasks.logged, [(i, str(log), 4.0) for i in range(2)], star=True
        )
        wait_until(lambda: len(_lines(log)) == 2, timeout=60)
        os.kill(master.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE_S)  # the fault: the master does not run for this long
        finally:
            os.kill(master.proc.pid, signal.SIGCONT)
        values = sorted(x for x, _pid in package.results(timeout=60))
        assert values == [0, 1]
        # The workers kept their leases: nothing ran twice, and they still serve.
        assert sorted(_lines(log)) == ["0", "1"]
        assert [f.result(60) for f in client.submit_many(tasks.square, range(4))] == [0, 1, 4, 9]
    text = master.log_text()
    assert "lease_expired" not in text, text[-3000:]
    assert "stalled" in text, "the master noticed its own stall"
    for proc in workers.procs:
        assert proc.poll() is None, "worker exited"
