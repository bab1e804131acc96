"""One master connection per worker host (issue 13): ``rtpool worker --procs N --connection
host``. The parent holds the only connection (``slots=N``) and relays tasks and results to its
children over socket pairs (``worker/_relay.py``). Real master, real worker processes, real
signals: frames per task seen at the master, a child killed with SIGKILL mid-package, SIGTERM
drain, a relay cut off from its master and back.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import tasks
import tasks.hostile
from helpers import stop_process, wait_until, worker_env, worker_processes
from rtpool import _native
from rtpool import _protocol as P
from test_worker_supervisor import RawClient, _children

PROCS = 4


@pytest.fixture
def real_master():
    master = _native.Master(listen="127.0.0.1:0", options={"lease_ms": 900})
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture
def start_worker(real_master, tmp_path):
    with worker_processes(real_master, tmp_path, procs=PROCS, connection="host") as start:
        yield start


def _status(real_master) -> dict:
    """The master's status snapshot (rebuilt once a second) through a client."""
    import rtpool

    with rtpool.Client(real_master.address, real_master.client_token) as client:
        return client.status()


def _frames(real_master) -> int:
    totals = _status(real_master)["totals"]
    return totals["worker_frames_in"] + totals["worker_frames_out"]


def _frames_per_task(real_master, raw_client, n: int) -> float:
    """Worker frames (in + out) the master handled per task over a package of ``n`` 1 ms
    tasks, from its status counters once they have settled."""
    before = _frames(real_master)
    package = raw_client.submit(tasks.sleep_return, [(i, 0.001) for i in range(n)])
    got = raw_client.results(package, n, timeout=120)
    assert sorted(got) == list(range(n))
    # The snapshot is rebuilt once a second: wait for two equal readings past the package.
    last = [None]

    def settled():
        now = _frames(real_master)
        same, last[0] = now == last[0], now
        return same and now

    after = wait_until(settled, timeout=10, interval=1.1)
    return (after - before) / n


def test_the_master_sees_one_worker_and_fewer_frames_per_task_with_one_connection_per_host(
    real_master, start_worker, raw_client, tmp_path
):
    n = 1200
    per_process = start_worker(connection="process")
    wait_until(lambda: real_master.stats()["workers"] == PROCS, timeout=30)
    process_frames = _frames_per_task(real_master, raw_client, n)
    stop_process(per_process, group=True)
    wait_until(lambda: real_master.stats()["workers"] == 0, timeout=10)

    start_worker(connection="host")
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=30)
    # (The snapshot is rebuilt once a second.)
    wait_until(lambda: [w["slots"] for w in _status(real_master)["workers"]] == [PROCS], 10)
    host_frames = _frames_per_task(real_master, raw_client, n)
    print(f"worker frames per task: {process_frames:.2f} per process, {host_frames:.2f} per host")
    # One connection for 4 processes: the master reads and writes a frame per round for the
    # host, not one per process and task (each child alone batches only its own results).
    assert host_frames < process_frames / 2, (process_frames, host_frames)
    log = (tmp_path / "worker-1.log").read_text()
    assert f"one connection for {PROCS} worker processes" in log


def test_a_child_killed_mid_task_loses_and_duplicates_nothing(
    real_master, start_worker, raw_client
):
    proc = start_worker()
    victim = _children(proc, PROCS)[0]
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=30)
    n = 400
    package = raw_client.submit(tasks.sleep_return, [(i, 0.005) for i in range(n)])
    killed = []

    def kill_midway(got):
        if not killed and len(got) >= n // 4:
            victim.kill()  # SIGKILL: its running task and its queue are the relay's to settle
            killed.append(True)

    got = raw_client.results(package, n, timeout=60, on_result=kill_midway)
    assert killed
    assert sorted(got) == list(range(n))  # every task exactly once (duplicates fail above)
    assert all(status == P.STATUS_OK for status, _ in got.values())
    assert [pickle.loads(got[i][1]) for i in range(n)] == list(range(n))
    # The parent restarted the killed process; the host kept its one connection.
    wait_until(lambda: len(psutil.Process(proc.pid).children()) == PROCS, timeout=10)
    assert real_master.stats()["workers"] == 1


def test_a_child_killed_by_its_task_is_blamed_on_the_task(real_master, start_worker, raw_client):
    """The task that kills its process is reported lost by the parent (the slot board) on
    the host's connection: the master blames that task (``max_attempts``), not its neighbours."""
    start_worker()
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=30)
    hows = ["sigkill" if i == 7 else "none" for i in range(40)]
    package = raw_client.submit(tasks.hostile.crash, list(zip(hows, range(40))), max_attempts=2)
    got = raw_client.results(package, 40, timeout=60)
    assert got[7][0] != P.STATUS_OK
    assert b"killed by signal 9 (SIGKILL) while running task" in got[7][1], got[7][1]
    for i in range(40):
        if i != 7:
            assert got[i][0] == P.STATUS_OK and pickle.loads(got[i][1]) == i


def test_sigterm_drains_the_host_returning_unstarted_tasks(
    real_master, start_worker, raw_client, tmp_path
):
    log = tmp_path / "runs"
    proc = start_worker("--prefetch", "4")
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=30)
    n = 40
    package = raw_client.submit(tasks.logged, [(i, str(log), 0.2) for i in range(n)])
    wait_until(lambda: log.exists() and len(log.read_text().split()) >= PROCS, timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    text = (tmp_path / "worker-0.log").read_text()
    assert "unstarted tasks back to the master" in text
    # Handed back (RETURN) before the host closed its connection: none was in flight then (a
    # task requeued at the close counts as a loss).
    assert real_master.stats()["requeued"] == 0
    started = len(log.read_text().split())
    assert started < n, "the host ran everything before the signal: nothing to return"
    # Another worker finishes the package: the drained host returned what it did not start.
    start_worker(procs_per_worker=2, connection="process")
    got = raw_client.results(package, n, timeout=60)
    assert sorted(got) == list(range(n))
    runs = sorted(int(x) for x in log.read_text().split())
    assert runs == list(range(n)), "a task ran twice or never"
    assert real_master.stats()["stale_results"] == 0


def test_a_host_cut_off_past_its_lease_reconnects_and_its_children_go_on(
    real_master, start_worker, raw_client, tmp_path
):
    proc = start_worker()
    _children(proc, PROCS)
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=30)
    package = raw_client.submit(tasks.sleep_return, [(i, 0.05) for i in range(60)])
    wait_until(lambda: real_master.stats()["running"] >= 1)
    parent = psutil.Process(proc.pid)
    parent.suspend()  # the relay: no heartbeats; the master takes the tasks back after 0.9 s
    try:
        wait_until(lambda: real_master.stats()["workers"] == 0, timeout=10)
    finally:
        parent.resume()
    got = raw_client.results(package, 60, timeout=60)
    assert sorted(got) == list(range(60))
    assert [pickle.loads(got[i][1]) for i in range(60)] == list(range(60))
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=10)
    text = (tmp_path / "worker-0.log").read_text()
    assert "reconnected to the master" in text
    # The same children serve the new session (no restart).
    assert len(parent.children()) == PROCS
    again = raw_client.submit(tasks.square, [(i,) for i in range(50)])
    got = raw_client.results(again, 50)
    assert [pickle.loads(got[i][1]) for i in range(50)] == [i * i for i in range(50)]


def test_bad_connection_mode_is_refused(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "rtpool", "worker", "--master", "127.0.0.1:1", "--token", "x"]
        + ["--connection", "shared"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "--connection must be one of auto, host, process, not 'shared'" in out.stderr


def test_a_refused_token_stops_the_host_with_exit_code_2(real_master, tmp_path: Path):
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", real_master.address]
    cmd += ["--procs", "2", "--connection", "host"]
    out = subprocess.run(
        cmd, env=worker_env("wrong-token"), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert "refused the worker token" in out.stderr


def test_a_stopped_child_past_the_lease_gives_its_tasks_to_its_siblings(
    real_master, start_worker, raw_client, tmp_path
):
    """SIGSTOP of one child: the relay's heartbeats keep the host's lease, so the relay itself
    takes back what the silent child held (as the master would from a child with its own
    connection) and its siblings run it; resumed, the child starts a new session."""
    proc = start_worker()
    children = _children(proc, PROCS)
    wait_until(lambda: real_master.stats()["workers"] == 1, timeout=30)
    n = 40
    package = raw_client.submit(tasks.pid_of, [(i, 0.1) for i in range(n)])
    got: dict = {}
    stopped = []

    def stop_one(results):
        if not stopped and len(results) >= 4:
            children[0].suspend()
            stopped.append(time.monotonic())

    try:
        got = raw_client.results(package, n, timeout=60, on_result=stop_one)
    finally:
        children[0].resume()
    assert sorted(got) == list(range(n))
    values = [pickle.loads(got[i][1]) for i in range(n)]
    assert [v[0] for v in values] == list(range(n))
    text = (tmp_path / "worker-0.log").read_text()
    assert "was silent for" in text and "past the master's lease" in text
    # Resumed, the child starts a new session (or, if the parent's GIL check saw its stale
    # heartbeat stamp first, is replaced): the host goes on with all its slots, one connection.
    parent = psutil.Process(proc.pid)
    wait_until(lambda: len(parent.children()) == PROCS, timeout=10)
    again = raw_client.submit(tasks.pid_of, [(i, 0.05) for i in range(4 * PROCS)])
    got = raw_client.results(again, 4 * PROCS)
    assert sorted(pickle.loads(r[1])[0] for r in got.values()) == list(range(4 * PROCS))
    assert real_master.stats()["workers"] == 1


def test_results_of_several_children_stay_within_the_masters_frame_limit(tmp_path: Path):
    """Each child keeps its RESULT frames within the master's limit; the relay batches the
    results of several children and must split them again (else the master closes the host's
    connection, ``too_large``, and every task it held runs again)."""
    master = _native.Master(listen="127.0.0.1:0", options={"max_frame_mb": 1})
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", master.address]
    cmd += ["--procs", str(PROCS), "--connection", "host"]
    log = tmp_path / "worker.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd,
            env=worker_env(master.worker_token),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = RawClient(master.address, master.client_token)
    try:
        wait_until(lambda: master.stats()["workers"] == 1, timeout=30)
        n = 8 * PROCS
        package = client.submit(tasks.hostile.blob, [(400 << 10,) for _ in range(n)])
        got = client.results(package, n, timeout=60)
        assert sorted(got) == list(range(n))
        assert all(s == P.STATUS_OK for s, _ in got.values())
        assert all(len(d) > 400 << 10 for _, d in got.values())  # (pickle 5, out of band)
        text = log.read_text()
        assert "reconnecting" not in text, text
        assert master.stats()["requeued"] == 0
    finally:
        client.close()
        stop_process(proc, group=True)
        master.stop()


@pytest.mark.parametrize(
    "procs, connection, realtime, host",
    [
        (7, "auto", False, False),
        (8, "auto", False, True),
        (64, "auto", True, False),  # the relay would run at normal priority
        (1, "host", False, True),
        (64, "process", False, False),
    ],
)
def test_auto_holds_one_connection_per_host_from_8_processes(procs, connection, realtime, host):
    import argparse

    from rtpool.worker._supervisor import host_connection

    args = argparse.Namespace(procs=procs, connection=connection, realtime=realtime)
    assert host_connection(args) is host
