"""Idle workers heartbeat slower (issue 25 item 3): a worker that holds no task heartbeats
every ``--idle-heartbeat-ms`` and the master allows it that plus a lease of silence; one that
holds a task is judged by the lease, from its last frame or the assignment. Both are proven on
real processes: a worker process stopped (SIGSTOP) while idle is dropped at the idle limit, one
stopped while it runs a task loses it to another worker at the lease.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env

LEASE_MS, IDLE_MS = 500, 1500


@pytest.fixture
def master(tmp_path):
    args = ["--lease-ms", str(LEASE_MS), "--heartbeat-ms", "100"]
    m = start_master(tmp_path, args=[*args, "--idle-heartbeat-ms", str(IDLE_MS)])
    yield m
    close_master(m)


def _worker(m, log):
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address]
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(m.worker_token),
            start_new_session=True,
        )


def _expiries(m):
    """The silences the master closed workers for: the limit of each, in ms."""
    return [int(x) for x in re.findall(r"lease_expired: silent for (\d+) ms", m.log.read_text())]


def test_an_idle_worker_is_kept_past_the_lease_and_dropped_at_the_idle_limit(tmp_path, master):
    m = master
    worker = _worker(m, tmp_path / "worker.log")
    client = rtpool.Client(m.address, m.client_token)
    try:
        assert client.submit(tasks.square, 3).result(timeout=60) == 9
        # Idle for 6 leases: heartbeating every 1.5 s, it keeps its connection.
        time.sleep(6 * LEASE_MS / 1000)
        assert _expiries(m) == [], m.log.read_text()[-2000:]
        assert client.submit(tasks.square, 4).result(timeout=60) == 16
        os.killpg(worker.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until(lambda: _expiries(m), timeout=30)
        took = time.monotonic() - stopped
        # Judged by the idle limit (idle heartbeat + lease), not the lease.
        assert _expiries(m) == [IDLE_MS + LEASE_MS]
        print(f"idle worker stopped: dropped after {took:.2f} s (limit {IDLE_MS + LEASE_MS} ms)")
    finally:
        client.close()
        os.killpg(worker.pid, signal.SIGCONT)
        stop_process(worker, group=True)


def test_a_worker_stopped_with_a_task_loses_it_at_the_lease(tmp_path, master):
    m = master
    first = _worker(m, tmp_path / "first.log")
    client = rtpool.Client(m.address, m.client_token)
    runs = tmp_path / "runs.txt"
    second = None
    try:
        assert client.submit(tasks.square, 3).result(timeout=60) == 9
        time.sleep(3 * LEASE_MS / 1000)  # idle long past a lease: the idle rate applies
        future = client.submit(tasks.logged, 7, str(runs), 30.0)
        wait_until(lambda: runs.exists() and runs.read_text().strip(), timeout=30)
        os.killpg(first.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        second = _worker(m, tmp_path / "second.log")
        wait_until(lambda: _expiries(m), timeout=30)
        took = time.monotonic() - stopped
        # Holding a task, it is judged by the lease.
        assert _expiries(m) == [LEASE_MS]
        wait_until(lambda: len(runs.read_text().split()) >= 2, timeout=60)
        print(f"worker stopped with a task: lease ended after {took:.2f} s, task re-run")
        future.cancel()
    finally:
        client.close()
        os.killpg(first.pid, signal.SIGCONT)
        stop_process(first, group=True)
        if second is not None:
            stop_process(second, group=True)
