"""Real-time mode over the whole path: ``Client(realtime=True)``, the clients of
``LocalCluster(realtime=True)`` and its embedded master, checked from ``/proc`` (each thread's
policy and priority, locked memory), and the refusal path in a child process that may not use
SCHED_FIFO or lock memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, wait_until

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="real-time mode is Linux-only"
)

PERMITTED = os.geteuid() == 0
_FIFO = getattr(os, "SCHED_FIFO", 1)


def _policy(tid: int) -> tuple:
    """(policy without SCHED_RESET_ON_FORK, priority) of one thread of this process."""
    raw = os.sched_getscheduler(tid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    return raw, os.sched_getparam(tid).sched_priority


def _fifo_threads(priority: int) -> dict:
    """tid -> name of this process's threads under SCHED_FIFO ``priority``."""
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if _policy(tid) == (_FIFO, priority):
                with open(f"/proc/self/task/{tid}/comm") as f:
                    out[tid] = f.read().strip()
        except (ProcessLookupError, FileNotFoundError):
            pass  # a thread that just ended
    return out


def _vmlck_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    raise AssertionError("no VmLck line")


@pytest.mark.skipif(not PERMITTED, reason="needs root (SCHED_FIFO, mlockall)")
def test_local_cluster_puts_client_threads_and_master_on_fifo_not_the_callers():
    import rtpool

    main_before = _policy(0)
    with rtpool.LocalCluster(workers=1, realtime=True, rt_priority=20) as cluster:
        client = cluster.client()
        assert client.submit(pow, 3, 4).result(timeout=30) == 81
        conn = client._conn
        reader, heartbeat = conn._thread.native_id, conn._heartbeat_thread.native_id
        # One above the workers' 20: the I/O preempts a task rather than wait for its end.
        assert _policy(reader) == (_FIFO, 21)
        assert _policy(heartbeat) == (_FIFO, 21)
        fifo = _fifo_threads(21)
        assert "rtpool-master" in fifo.values(), fifo  # the embedded master's runtime thread
        assert {reader, heartbeat} <= set(fifo), fifo
        # The caller's thread is left alone ...
        assert _policy(0) == main_before and os.getpid() not in fifo
        # ... unless asked, for the block only.
        with client.realtime_thread() as entered:
            assert entered is True
            assert _policy(0) == (_FIFO, 21)
            assert client.realtime["user_threads"] == 1
            assert client.submit(pow, 2, 5).result(timeout=30) == 32
        assert _policy(0) == main_before
        rt = cluster.stats()["realtime"]
        assert rt["priority"] == 21 and rt["fifo_threads"] >= 1, rt
        [mine] = rt["clients"]
        assert mine["active"] is True and mine["memory_locked"] is True, mine
        assert mine["threads"] == {"reader": True, "heartbeat": True}, mine
        assert (mine["fifo_threads"], mine["user_threads"], mine["warnings"]) == (2, 0, [])
        # The worker, at the priority asked for.
        from tasks.realtime import policy

        assert client.submit(policy).result(timeout=30)["policy"] == _FIFO
    assert _policy(0) == main_before


def _child_cpus(supervisor: int) -> list:
    """The CPU sets of a worker supervisor's children (the processes that run tasks)."""
    try:
        with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
            children = [int(x) for x in f.read().split()]
        return [os.sched_getaffinity(c) for c in children]
    except (FileNotFoundError, ProcessLookupError):
        return []


@pytest.mark.skipif(not PERMITTED, reason="needs root (SCHED_FIFO, mlockall)")
@pytest.mark.parametrize("pin_workers", [True, False])
def test_local_cluster_pins_each_realtime_worker_to_a_cpu_of_its_own(pin_workers):
    import rtpool

    usable = sorted(os.sched_getaffinity(0))
    # One worker more than CPUs: the last one has none of its own and keeps the whole set.
    n = len(usable) + 1
    if pin_workers:
        expected = [{c} for c in usable] + [set(usable)]
    else:
        expected = [set(usable)] * n
    with rtpool.LocalCluster(workers=n, realtime=True, pin_workers=pin_workers) as cluster:
        cluster.wait_for_workers(n, timeout=60)
        pids = cluster.worker_pids
        assert len(pids) == n
        # Each child pins itself as it enters real-time mode, right after it starts.
        seen: list = []

        def as_expected() -> bool:
            seen[:] = [_child_cpus(p) for p in pids]
            return seen == [[e] for e in expected]

        try:
            wait_until(as_expected, 30)
        except AssertionError:
            raise AssertionError(f"worker children's CPUs {seen}, expected {expected}") from None
        from tasks.realtime import policy

        client = cluster.client()
        assert client.submit(policy).result(timeout=30)["policy"] == _FIFO


@pytest.mark.skipif(not PERMITTED, reason="needs root (SCHED_FIFO, mlockall)")
def test_a_realtime_client_keeps_memory_locked_after_the_embedded_master_stops():
    import rtpool

    assert _vmlck_kb() == 0
    cluster = rtpool.LocalCluster(workers=0, realtime=True)
    client = rtpool.Client(cluster.address, cluster.client_token, realtime=True, rt_priority=30)
    try:
        wait_until(lambda: client.realtime["fifo_threads"] == 2, timeout=10)
        assert _policy(client._conn._thread.native_id) == (_FIFO, 30)
        cluster.close()  # the master lets go of its hold; the client still holds one
        assert _vmlck_kb() > 0
    finally:
        client.close()
        cluster.close()
    # Its threads end after close; the last one lets go of the lock.
    wait_until(lambda: _vmlck_kb() == 0, timeout=10)
    assert client.realtime["memory_locked"] is False


def test_a_normal_client_reports_no_realtime_and_touches_no_thread():
    import rtpool

    with rtpool.LocalCluster(workers=0) as cluster:
        client = cluster.client()
        assert client.realtime is None
        assert _policy(client._conn._thread.native_id)[0] == os.SCHED_OTHER
        assert "realtime" not in cluster.stats()


_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import rtpool
with rtpool.LocalCluster(workers=1, realtime=True) as cluster:
    client = cluster.client()
    result = client.submit(pow, 2, 10).result(timeout=60)
    with client.realtime_thread() as entered:
        pass
    stats = cluster.stats()["realtime"]
    conn = client._conn
    policies = [os.sched_getscheduler(t.native_id) & ~os.SCHED_RESET_ON_FORK
                for t in (conn._thread, conn._heartbeat_thread)]
    print(json.dumps({"result": result, "client": client.realtime, "master": stats,
                      "entered": entered, "policies": policies}))
"""


def test_refused_client_realtime_warns_and_the_client_still_works(tmp_path):
    """The child may not use SCHED_FIFO (RLIMIT_RTPRIO 0, and without CAP_SYS_NICE when run as
    root) nor lock memory (RLIMIT_MEMLOCK 64 KiB, without CAP_IPC_LOCK)."""
    cmd = [sys.executable, "-c", _CHILD, TESTS_DIR]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root the refusal needs setpriv (util-linux) to drop CAP_SYS_NICE")
        cmd = [setpriv, "--bounding-set", "-sys_nice,-ipc_lock", "--inh-caps", "-all", *cmd]

    def limits() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))

    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, preexec_fn=limits, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["result"] == 1024  # the cluster works in normal mode
    client = report["client"]
    assert client["active"] is False and client["fifo_threads"] == 0, client
    assert client["memory_locked"] is False, client
    assert report["entered"] is False
    assert report["policies"] == [os.SCHED_OTHER, os.SCHED_OTHER]
    # One warning per refused step (not one per thread), naming what failed and the remedy.
    assert len(client["warnings"]) == 2, client
    fifo = [w for w in client["warnings"] if "SCHED_FIFO" in w]
    assert len(fifo) == 1 and "CAP_SYS_NICE" in fifo[0] and "RLIMIT_RTPRIO" in fifo[0], fifo
    assert "the client's" in fifo[0] and "thread" in fifo[0], fifo
    assert any("RLIMIT_MEMLOCK" in w and "client process" in w for w in client["warnings"])
    assert report["master"]["fifo_threads"] == 0 and report["master"]["warnings"], report
    # Logged on stderr (the rtpool.client logger's last resort handler), once each.
    assert out.stderr.count("cannot run the client's") == 1, out.stderr
