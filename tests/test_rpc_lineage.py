"""Lineage of transaction intermediates (``docs/rpc.md``, "Transactions"): when the worker
process that keeps a call's result is killed before the call that reads it ran, the master
runs the producer call again on a live worker and the reader gets the new value.

Real master and two real worker processes serving ``tasks.rpc_e2e``; the holder is killed
with SIGKILL by its PID (the worker's supervisor restarts it). A gate call that waits for a
file the test creates keeps the reader from running until the holder is gone."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import rtpool
from helpers import wait_until
from test_kept import _alive

N = 1 << 20  # 8 MiB of float64


# The conftest's shared_cluster and client: 2 workers serving the transactions' functions.
CLUSTER_SERVE = ["tasks.rpc_e2e"]


def test_killing_the_holder_of_an_intermediate_reruns_its_producer(
    shared_cluster, client, tmp_path
):
    log, gate = tmp_path / "a-pids", tmp_path / "gate"
    with client.transaction() as tx:
        a = tx.call("seed_logged", N, str(log))
        b = tx.call("gate", str(gate), 60.0)
        c = tx.call("total_after", N, a, b)
    # a is done (its value kept on its worker, not fetched) while c waits for the gate.
    wait_until(a.done, timeout=30)
    with pytest.raises(rtpool.NotFetchedError):
        a.result(0)
    holder = int(log.read_text().split()[0])
    os.kill(holder, signal.SIGKILL)  # the supervisor restarts the worker's child
    wait_until(lambda: not _alive(holder), timeout=10)
    gate.touch()
    # main: c failed with KeptResultLost (nothing made a again).
    assert c.result(timeout=120)[2] == float(np.arange(N, dtype=np.float64).sum())
    pids = log.read_text().split()
    assert len(pids) == 2, f"a ran {len(pids)} times: {pids}"
    assert int(pids[1]) != holder
    assert shared_cluster.stats()["kept_calls_rerun"] == 1


def test_a_reader_that_finds_its_input_evicted_gets_it_made_again(tmp_path):
    # One worker whose store holds 1 MiB: b's value evicts a's before c reads it, so c's
    # worker answers "input lost" (the running-reader path) and the master makes a again.
    n = 1 << 17  # 1 MiB of float64: one such value fits, a second evicts the first
    logs = [tmp_path / "a-pids", tmp_path / "b-pids"]
    with rtpool.LocalCluster(
        workers=1, serve=["tasks.rpc_e2e"], worker_env=[{"RTPOOL_KEEP_MB": "1"}]
    ) as cluster:
        cluster.wait_for_workers(1, timeout=30)
        with cluster.client() as client:
            with client.transaction() as tx:
                a = tx.call("seed_logged", n, str(logs[0]))
                b = tx.call("seed_logged", n, str(logs[1]))
                c = tx.call("timed", n, a, 0.0)
                d = tx.call("timed", n, b, 0.0)
            total = float(np.arange(n, dtype=np.float64).sum())
            # main: c failed with KeptResultLost ("this process no longer holds it").
            assert c.result(timeout=60)[2] == total
            assert d.result(timeout=60)[2] == total
            runs = [len(log.read_text().split()) for log in logs]
            assert runs[0] == 2, f"a ran {runs[0]} times"
            assert cluster.stats()["kept_calls_rerun"] == sum(runs) - 2


def test_in_a_chain_the_lost_value_and_its_dropped_input_are_made_again(
    shared_cluster, client, tmp_path
):
    # a -> b -> c: a's value is dropped once b read it; b's holder is killed before c reads
    # b, so b runs again, and a (dropped) runs again first: the master kept how to make it.
    logs, gate = [tmp_path / "a-pids", tmp_path / "b-pids"], tmp_path / "gate"
    rerun = shared_cluster.stats().get("kept_calls_rerun", 0)  # (main has no such counter)
    with client.transaction() as tx:
        a = tx.call("seed_logged", N, str(logs[0]))
        b = tx.call("double_logged", N, a, str(logs[1]))
        g = tx.call("gate", str(gate), 60.0)
        c = tx.call("total_after", N, b, g)
    wait_until(b.done, timeout=30)
    holder = int(logs[1].read_text().split()[0])
    os.kill(holder, signal.SIGKILL)  # the supervisor restarts the worker's child
    wait_until(lambda: not _alive(holder), timeout=10)
    gate.touch()
    assert c.result(timeout=120)[2] == 2 * float(np.arange(N, dtype=np.float64).sum())
    runs = [len(log.read_text().split()) for log in logs]
    assert runs == [2, 2], f"a and b ran {runs} times"
    assert shared_cluster.stats()["kept_calls_rerun"] == rerun + 2
