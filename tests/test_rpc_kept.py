"""A transaction's intermediate results stay on the worker that made them (``docs/rpc.md``,
"Transactions"): the master assigns such a call with ``keep``, the worker keeps its result
and answers with a reference (ext 3), and the call that takes it reads it from that worker.

One real worker process serving ``tasks.rpc_e2e`` (so ``tasks.kept_here`` reads the store of
the process that ran the calls); bytes through the client are the kernel's count."""

from __future__ import annotations

import numpy as np
import pytest

import rtpool
import tasks
from helpers import wait_until
from test_kept import received_bytes

N = 2 * 1024 * 1024  # 16 MiB of float64


@pytest.fixture(scope="module")
def cluster():
    with rtpool.LocalCluster(workers=1, serve=["tasks.rpc_e2e"]) as cluster:
        cluster.wait_for_workers(timeout=30)
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    c = cluster.client()
    yield c
    c.close()


def kept_here(client: rtpool.Client) -> int:
    return client.submit(tasks.kept_here).result(timeout=30)[1]


def test_an_intermediate_result_stays_on_its_worker_and_not_through_the_client(client):
    client.call("seed", 4)  # the interfaces are cached and the worker is warm
    before_kept, before_rx = kept_here(client), received_bytes(client)
    with client.transaction() as tx:
        a = tx.call("seed", N)
        t = tx.call("timed", N, a, 0.0)
    start, end, total = t.result(60)
    assert total == float(np.arange(N, dtype=np.float64).sum())
    with pytest.raises(rtpool.NotFetchedError):
        a.result(10)
    # seed's 16 MiB stayed in the worker that made it (main: the master relayed it), and it
    # is dropped there once `timed`, its only reader, is done (below).
    assert received_bytes(client) - before_rx < 64 * 1024
    wait_until(lambda: kept_here(client) <= before_kept, timeout=10)


def test_an_intermediate_is_released_on_its_worker_once_its_dependents_are_done(cluster, client):
    client.call("seed", 4)
    before = kept_here(client)
    released = cluster.stats()["kept_calls_released"]
    with client.transaction() as tx:
        a = tx.call("seed", N)
        t = tx.call("timed", N, a, 0.0)
    assert t.result(60)[2] == float(np.arange(N, dtype=np.float64).sum())
    # The worker process's own store: the 16 MiB went when `timed`, its reader, finished (main:
    # it stayed until --keep-mb evicted it, and the store held N * 8 bytes more).
    wait_until(lambda: kept_here(client) <= before, timeout=10)
    assert cluster.stats()["kept_calls_released"] == released + 1


def test_a_fetched_intermediate_is_not_kept(client):
    before = kept_here(client)
    with client.transaction() as tx:
        a = tx.call("seed", 1000, fetch=True)
        t = tx.call("timed", 1000, a, 0.0)
    assert len(a.result(30)) == 1000
    assert t.result(30)[2] == float(np.arange(1000).sum())
    assert kept_here(client) == before
