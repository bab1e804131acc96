"""Compaction of a large journal never holds the master: a real ``rtpool master`` process
compacting a 128 MiB journal obeys SIGTERM within 1 s, accepts (and makes durable) new
packages meanwhile, and a ``kill -9`` in the middle of it loses nothing; its ``/metrics`` show
the compaction running, then how long it took and paused the appends, and the journal's queue.

The journal is filled by a first master (embedded) with packages of one 1 MiB task that no
worker runs; a second master, a subprocess, finds it over the compaction threshold (64 MiB) at
start and compacts it in the background, which is where the tests act. Its compaction is paced
(``--journal-compact-mb-per-s``, at 32 MB/s about 4 s for 128 MiB), so the faults land in the
middle of it on a fast disk too.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import rtpool
from conftest import close_master, start_master
from helpers import wait_until
from rtpool import _native
from test_metrics import get, metric

# 128 packages of one 1 MiB task: a 128 MiB journal, over the 64 MiB threshold, whose
# rewrite takes long enough (~0.7 s on a fast disk) for the tests to act in the middle of it.
PACKAGES = 128
TASK_BYTES = 1 << 20
# The compaction's pace: about 4 s for the 128 MiB, a window the faults cannot miss.
PACED = ["--journal-compact-mb-per-s", "32"]


def _fill(data_dir: Path) -> None:
    """Journal PACKAGES packages of one TASK_BYTES task each, then stop cleanly."""
    m = _native.Master(data_dir=str(data_dir), options={"fsync": "off"})
    try:
        # No worker: the packages stay queued, and in the journal, when the master stops.
        c = rtpool.Client(m.address, m.client_token, reconnect_timeout=0)
        for i in range(PACKAGES):
            c.submit_many(len, [(bytes([i]) * TASK_BYTES,)], star=True)
        # Submissions are pipelined: stop only once the master has accepted them all.
        wait_until(lambda: m.stats()["packages"] == PACKAGES, timeout=30)
        c.shutdown(wait=False)
    finally:
        m.stop()
    assert (data_dir / "journal.log").stat().st_size > 64 << 20


def _restored(data_dir: Path) -> dict:
    """What a fresh master replays from `data_dir`."""
    m = _native.Master(data_dir=str(data_dir))
    try:
        return m.stats()
    finally:
        m.stop()


def _compacting(master) -> bool:
    return (master.data_dir / "journal.log.compact").exists()


def test_sigterm_mid_compaction_of_a_64_mib_journal_is_obeyed_within_a_second(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    _fill(data)
    before = (data / "journal.log").read_bytes()
    m = start_master(tmp_path, data_dir=data, args=PACED)
    try:
        wait_until(lambda: "journal compaction started" in m.log_text(), timeout=10)
        sent = time.monotonic()
        m.proc.send_signal(signal.SIGTERM)
        code = m.proc.wait(10)
        took = time.monotonic() - sent
    finally:
        close_master(m)
    log = m.log_text()
    assert code == 0, log[-2000:]
    # It was mid-compaction (not after it), and it left the old file as it was.
    assert "journal compaction abandoned" in log, log[-2000:]
    assert "journal compacted" not in log, log[-2000:]
    assert took < 1.0, f"the master took {took:.2f} s to obey SIGTERM"
    assert (data / "journal.log").read_bytes() == before
    assert not (data / "journal.log.compact").exists()
    s = _restored(data)
    assert s["replay_packages"] == PACKAGES and s["queued"] == PACKAGES, s


def test_kill_9_mid_compaction_loses_no_package_accepted_before_or_during_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    _fill(data)
    # `always`: ACCEPTED only once the package's record is on disk.
    m = start_master(tmp_path, data_dir=data, args=[*PACED, "--fsync", "always"])
    accepted = []
    try:
        wait_until(lambda: _compacting(m), timeout=10)
        c = rtpool.Client(m.address, m.client_token, reconnect_timeout=0)
        started = time.monotonic()
        for i in range(5):
            accepted.append(c.submit_many(pow, [(i, 2)], star=True).id)
        took = time.monotonic() - started
        # The compaction was still running when all five were on disk: appends do not wait
        # for it.
        assert _compacting(m), "the compaction ended before the submissions"
        m.proc.kill()
        m.proc.wait(10)
        c.shutdown(wait=False)
    finally:
        close_master(m)
    assert "journal compacted" not in m.log_text()
    assert took < 5.0, took
    s = _restored(data)
    assert s["replay_packages"] == PACKAGES + len(accepted), s
    assert not (data / "journal.log.compact").exists()


def test_metrics_show_the_compaction_its_pause_and_the_journal_queue(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _fill(data)
    m = start_master(tmp_path, data_dir=data, args=[*PACED, "--http", "127.0.0.1:0"])
    try:
        url = f"{m.dashboard_url}metrics"
        # The snapshot is published once a second; the paced compaction takes about 4 s.
        wait_until(
            lambda: metric(get(url)[1], "rtpool_journal_compacting") == 1, timeout=10, interval=0.1
        )
        done = wait_until(
            lambda: (
                (t := get(url)[1])
                and metric(t, "rtpool_journal_compactions_total") == 1
                and metric(t, "rtpool_journal_last_compaction_seconds")
                and t
            ),
            timeout=30,
            interval=0.2,
        )
        log = m.log_text()
    finally:
        close_master(m)
    assert metric(done, "rtpool_journal_compacting") == 0, done
    took = metric(done, "rtpool_journal_last_compaction_seconds")
    pause = metric(done, "rtpool_journal_last_compaction_pause_seconds")
    # The master's log line says the same (in whole milliseconds).
    logged = re.search(r"took_ms=(\d+) appends_paused_ms=(\d+)", log)
    assert logged, log[-2000:]
    assert abs(took - int(logged[1]) / 1e3) < 2e-3 and abs(pause - int(logged[2]) / 1e3) < 2e-3
    # Paced at 32 MB/s, 128 MiB take seconds; the appends paused only for the final rename.
    assert took > 1.0 and 0 < pause < took / 4, (took, pause)
    # The queue to the writer is empty once idle; nothing here outran the disk.
    assert metric(done, "rtpool_journal_queued_bytes") == 0, done
    assert metric(done, "rtpool_journal_backpressure_waits_total") == 0
    assert metric(done, "rtpool_journal_backpressure_seconds_total") == 0
