"""Results kept on their workers and futures as task arguments (``docs/data.md``).

Real workers (a LocalCluster of two); the faults are real too: the worker process that holds
a kept value is killed with SIGKILL. Bytes through the client are the kernel's count for the
client's connection (``TCP_INFO``), not the SDK's.
"""

from __future__ import annotations

import os
import signal
import socket
import struct

import pytest

import rtpool
import tasks
from helpers import wait_until
from rtpool import _deps
from rtpool._kept import KeptRef
from rtpool.errors import DependencyFailed, KeptResultLost

MIB = 1 << 20
# struct tcp_info: tcpi_bytes_received (Linux 4.1+).
_TCPI_BYTES_RECEIVED = 128


def received_bytes(client: rtpool.Client) -> int:
    info = client._conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, _TCPI_BYTES_RECEIVED)[0]


def test_a_chain_of_kept_results_never_reaches_the_client(client):
    kept = client.options(keep=True)
    client.submit(tasks.square, 2).result(timeout=30)
    before = received_bytes(client)
    f = kept.submit(tasks.make_bytes, 8 * MIB)
    g = kept.submit(tasks.reverse, f)
    h = client.submit(tasks.length, g)
    assert h.result(timeout=60) == 8 * MIB
    # Three results, as references and an int: a few hundred bytes, not 16 MiB.
    assert received_bytes(client) - before < 64 * 1024
    assert isinstance(f._result, KeptRef) and f._result.size_bytes == 8 * MIB
    # result() reads the value from its worker, not through the master.
    assert f.result(timeout=30) == b"x" * 8 * MIB
    assert received_bytes(client) - before < 64 * 1024


def test_a_dependent_task_runs_where_its_large_input_is_kept(client):
    # Two idle workers: without `near` each dependent lands on either (1 in 2^6 to pass).
    kept = client.options(keep=True)
    for _ in range(6):
        f = kept.submit(tasks.make_bytes, 256 * 1024)
        pid, n = client.submit(tasks.pid_and_length, f).result(timeout=30)
        assert (pid, n) == (f._result.pid, 256 * 1024)


def test_a_small_kept_input_does_not_pin_its_dependent(client):
    f = client.options(keep=True).submit(tasks.make_bytes, 10)
    f.exception(timeout=30)
    assert _deps._nearest((f._result,), {}) == 0
    assert _deps._nearest((f._result, f._result), {"x": 1}) == 0


def test_keep_bytes_keeps_only_large_results(client):
    view = client.options(keep_bytes=MIB)
    small, large = view.submit(tasks.make_bytes, 10), view.submit(tasks.make_bytes, 2 * MIB)
    assert small.result(timeout=30) == b"x" * 10 and small._result == b"x" * 10
    assert len(large.result(timeout=30)) == 2 * MIB and isinstance(large._result, KeptRef)


def test_keep_options_are_checked_on_the_client(client):
    with pytest.raises(TypeError, match="keep"):
        client.options(keep="yes")
    with pytest.raises(ValueError, match="keep_bytes"):
        client.options(keep_bytes=-1)
    assert client.options(keep=True).options(keep=None)._keep is None


def test_losing_the_worker_that_holds_a_result_reruns_its_producer(client):
    f = client.options(keep=True).submit(tasks.make_bytes, MIB)
    ref = f._result if f.exception(timeout=30) is None else None
    assert isinstance(ref, KeptRef)
    os.kill(ref.pid, signal.SIGKILL)  # the worker child that holds it; its supervisor restarts it
    wait_until(lambda: not _alive(ref.pid), timeout=10)
    g = client.submit(tasks.length, f)
    assert g.result(timeout=60) == MIB
    assert f._lineage.attempts == 2
    assert f._result.key != ref.key


def test_result_of_a_lost_value_reruns_its_producer(client):
    f = client.options(keep=True).submit(tasks.make_bytes, 1000)
    f.exception(timeout=30)
    pid = f._result.pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _alive(pid), timeout=10)
    assert f.result(timeout=60) == b"x" * 1000
    assert f._lineage.attempts == 2


def test_lineage_stops_at_max_attempts(client):
    f = client.options(keep=True, max_attempts=1).submit(tasks.make_bytes, 1000)
    f.exception(timeout=30)
    pid = f._result.pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _alive(pid), timeout=10)
    with pytest.raises(KeptResultLost, match="is gone"):
        f.result(timeout=60)


def test_a_failed_dependency_fails_its_dependents(client):
    f = client.submit(tasks.length, 5)  # len(int): TypeError on the worker
    g = client.submit(tasks.square, f)
    with pytest.raises(DependencyFailed, match="failed"):
        g.result(timeout=30)


def test_a_cancelled_dependency_fails_its_dependent_which_never_runs(client, tmp_path):
    f = client.submit(tasks.sleep_return, 1, 30.0)
    log = tmp_path / "ran"
    g = client.submit(tasks.logged, f, str(log))
    assert f.cancel()
    with pytest.raises(DependencyFailed, match="cancelled"):
        g.result(timeout=30)
    assert not log.exists()


def test_cancelling_a_waiting_dependent_keeps_it_from_running(client, tmp_path):
    f = client.submit(tasks.sleep_return, 1, 0.3)
    log = tmp_path / "ran"
    g = client.submit(tasks.logged, f, str(log))
    assert g.cancel()
    assert f.result(timeout=30) == 1
    # g's thread sees the cancel before sending: nothing for the master, nothing ran.
    h = client.submit(tasks.square, f)
    assert h.result(timeout=30) == 1
    assert g.cancelled() and not log.exists()


def test_an_unkept_future_is_passed_as_its_value(client):
    assert client.submit(tasks.square, client.submit(tasks.square, 3)).result(timeout=30) == 81


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def test_a_store_evicts_the_least_recently_read_past_its_bound_and_serves_the_rest():
    from rtpool._kept import fetch, release
    from rtpool.worker._kept import KeptStore

    st = KeptStore("127.0.0.1", MIB)
    old = st.put(b"a" * (600 * 1024))
    new = st.put(b"b" * (600 * 1024))
    assert len(st) == 1 and st.used_bytes == 600 * 1024
    # Another process's view (the pid differs from ours): read over the data port.
    old.pid = new.pid = -1
    with pytest.raises(KeptResultLost, match="does not hold it"):
        fetch(old)
    assert fetch(new) == b"b" * (600 * 1024)
    release(new)
    assert len(st) == 0 and st.used_bytes == 0
    with pytest.raises(KeptResultLost, match="does not hold it"):
        fetch(new)


def test_a_numpy_array_travels_out_of_band():
    np = pytest.importorskip("numpy")
    from rtpool._kept import fetch
    from rtpool.worker._kept import KeptStore

    st = KeptStore("127.0.0.1", 64 * MIB)
    ref = st.put(np.arange(1 << 18, dtype=np.float64))
    ref.pid = -1
    got = fetch(ref)
    assert got.dtype == np.float64 and got.shape == (1 << 18,) and got[-1] == (1 << 18) - 1


def test_bad_keep_mb_is_refused(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "worker", "--master", "127.0.0.1:1", "--keep-mb", "0"],
        env={**os.environ, "RTPOOL_WORKER_TOKEN": "x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "--keep-mb must be at least 1" in proc.stderr
