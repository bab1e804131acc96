"""Dependencies held by the master (``docs/data.md``): ``submit(g, f_future)`` with ``f`` kept
sends ``g`` at once; the master holds it until ``f`` is done, then runs it near ``f``'s worker
with ``f``'s result; it fails, naming ``f``, when ``f`` fails or is cancelled.

Real master and worker processes (a LocalCluster of two); the client that sleeps is a real
process stopped with SIGSTOP; the holder of a kept value is killed with SIGKILL. Tasks wait
on gate files the test creates, so each step happens in a known order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import rtpool
import tasks
from helpers import wait_until
from rtpool.errors import DependencyFailed
from test_kept import _alive, received_bytes

MIB = 1 << 20
TESTS = os.path.dirname(os.path.abspath(__file__))


def is_held(fut: rtpool.Future) -> bool:
    """Whether the task sent for the dependent future ``fut`` was accepted by the master."""
    inner = getattr(fut, "_inner", None)
    return inner is not None and inner._seg is not None and inner._seg.package is not None


def packages(client: rtpool.Client) -> int:
    """Live packages at the master (a held one counts; the ready queue does not hold it)."""
    return client.status()["totals"]["packages"]


def test_a_chain_runs_at_the_master_while_its_client_is_stopped(shared_cluster, client, tmp_path):
    gate = tmp_path / "gate"
    script = textwrap.dedent(
        f"""
        import rtpool, tasks
        from test_kept import received_bytes
        c = rtpool.Client({shared_cluster.address!r}, {shared_cluster.client_token!r})
        c.submit(tasks.length, b"warm").result(timeout=30)
        before = received_bytes(c)
        kept = c.options(keep=True)
        f = kept.submit(tasks.make_bytes_after, {8 * MIB}, {str(gate)!r})
        g = kept.submit(tasks.reverse, f)
        h = c.submit(tasks.length, g)
        print("sent", flush=True)
        print(h.result(timeout=120), received_bytes(c) - before, flush=True)
        c.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "sent"
        # f runs; g and h are at the master already (main: only f, until f's result came).
        wait_until(lambda: packages(client) >= 3, timeout=30)
        done = client.status()["totals"]["done"]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            gate.touch()
            # The client sleeps; the chain runs: f, then g where f's value is, then h.
            wait_until(lambda: client.status()["totals"]["done"] >= done + 3, timeout=60)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    length, through_client = map(int, out.split())
    assert length == 8 * MIB
    # Three results as references and an int: no intermediate through the client.
    assert through_client < 64 * 1024


def test_a_held_dependent_fails_naming_its_failed_producer(client, tmp_path):
    gate = tmp_path / "gate"
    f = client.options(keep=True).submit(tasks.fail_after, "boom in f", str(gate))
    g = client.options(keep=True).submit(tasks.length, f)
    wait_until(lambda: is_held(g), timeout=30)
    gate.touch()
    with pytest.raises(DependencyFailed, match="boom in f") as info:
        g.result(timeout=30)
    # The master's reason names the producer's package.
    assert f"package-{f._seg.package}" in str(info.value)


def test_a_held_dependent_of_a_cancelled_producer_fails(client, tmp_path):
    gate = tmp_path / "gate"
    log = tmp_path / "ran"
    f = client.options(keep=True).submit(tasks.make_bytes_after, 10, str(gate))
    g = client.submit(tasks.length_and_log, f, str(log))
    wait_until(lambda: is_held(g), timeout=30)
    assert f.cancel()
    with pytest.raises(DependencyFailed, match="cancelled"):
        g.result(timeout=30)
    gate.touch()
    wait_until(lambda: packages(client) == 0, timeout=30)
    assert not log.exists()


def test_cancelling_a_held_dependent_removes_it_from_the_master(client, tmp_path):
    gate = tmp_path / "gate"
    log = tmp_path / "ran"
    f = client.options(keep=True).submit(tasks.make_bytes_after, 10, str(gate))
    g = client.submit(tasks.length_and_log, f, str(log))
    wait_until(lambda: is_held(g), timeout=30)
    wait_until(lambda: packages(client) >= 2, timeout=10)  # the status is up to 0.5 s old
    assert g.cancel()
    wait_until(lambda: g._inner.cancelled(), timeout=10)
    gate.touch()
    assert len(f.result(timeout=30)) == 10
    wait_until(lambda: packages(client) == 0, timeout=30)
    assert not log.exists()


def test_killing_the_holder_mid_chain_reruns_the_producer(client, tmp_path):
    marker, gate = tmp_path / "g-pid", tmp_path / "gate"
    kept = client.options(keep=True)
    before = received_bytes(client)
    f = kept.submit(tasks.make_bytes, MIB)
    g = kept.submit(tasks.reverse_after, f, str(marker), str(gate))
    h = client.submit(tasks.length, g)
    wait_until(lambda: is_held(h) or h.done(), timeout=60)
    assert is_held(h), f"h {h!r} not held: g {g!r} sent as {getattr(g, '_inner', None)!r}"
    wait_until(marker.exists, timeout=30)  # g runs: f is done and its value is kept
    holder = f._result.pid
    g_pid = int(wait_until(lambda: marker.read_text() or None, timeout=10))
    for pid in {holder, g_pid}:
        os.kill(pid, signal.SIGKILL)  # the supervisor restarts the child
    wait_until(lambda: not _alive(holder) and not _alive(g_pid), timeout=10)
    gate.touch()
    assert h.result(timeout=120) == MIB
    # f ran again for the lost value, within its attempts (3 unless set).
    assert f._lineage.attempts == 2
    assert received_bytes(client) - before < 64 * 1024


def test_a_dependent_of_a_dependent_is_held_when_the_middle_one_was_sent_again(client, tmp_path):
    # f is fast: by the time g (held for f) reaches the master, f's result may have been
    # delivered and acknowledged, so the master refuses to hold g and g is sent again the
    # usual way. h (held for g) must be held for the g that runs, not wait for g's result:
    # here g waits on a gate that only opens once h is held. Before the fix, h took the
    # refused g in about 3 of 8 chains.
    kept = client.options(keep=True)
    for i in range(12):
        marker, gate = tmp_path / f"m{i}", tmp_path / f"g{i}"
        f = kept.submit(tasks.make_bytes, 1024)
        g = kept.submit(tasks.reverse_after, f, str(marker), str(gate))
        h = client.submit(tasks.length, g)
        try:
            wait_until(lambda: is_held(h), timeout=20)  # noqa: B023 - this iteration's h
        finally:
            gate.touch()
        assert h.result(timeout=60) == 1024
