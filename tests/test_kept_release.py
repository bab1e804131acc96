"""Freeing kept results (``docs/data.md``, "Freeing"): when the client drops the last future of
a kept value, or calls ``Future.release()``, its worker is told to forget it (``RELEASE`` to the
master, ``DROP`` to the worker) and the worker's kept bytes fall.

One real worker process, so every task (and ``tasks.kept_here``, which reads its store) runs in
the process that holds the values.
"""

from __future__ import annotations

import gc

import rtpool
import tasks
from helpers import wait_until
from rtpool._kept import KeptRef

MIB = 1 << 20


# The conftest's shared_cluster and client, with one worker: the tests read its store.
CLUSTER_WORKERS = 1


def kept_bytes(client: rtpool.Client, pid: int) -> int:
    """What the worker process ``pid`` keeps now (it is the cluster's only one)."""
    ran_on, used = client.submit(tasks.kept_here).result(timeout=30)
    assert ran_on == pid, "the task ran in another process than the holder"
    return used


def kept(client: rtpool.Client, n: int) -> tuple:
    f = client.options(keep=True).submit(tasks.make_bytes, n)
    assert f.exception(timeout=30) is None
    ref = f._result
    assert isinstance(ref, KeptRef)
    return f, ref.pid


def test_dropping_the_last_future_frees_the_value_on_its_worker(client):
    f, pid = kept(client, 8 * MIB)
    base = kept_bytes(client, pid)
    assert base >= 8 * MIB
    sent = client._conn.released
    del f
    gc.collect()
    wait_until(lambda: kept_bytes(client, pid) <= base - 8 * MIB, timeout=10)
    assert client._conn.released == sent + 1


def test_release_frees_the_value_now_and_only_once(client):
    f, pid = kept(client, 4 * MIB)
    base = kept_bytes(client, pid)
    assert f.release() is True
    assert f.release() is False
    wait_until(lambda: kept_bytes(client, pid) <= base - 4 * MIB, timeout=10)
    assert client.submit(tasks.square, 3).result(timeout=30) == 9  # the worker is fine


def test_a_value_a_live_dependent_holds_is_not_freed(client):
    f, pid = kept(client, 4 * MIB)
    g = client.options(keep=True).submit(tasks.reverse, f)
    assert g.exception(timeout=30) is None
    base = kept_bytes(client, pid)
    assert base >= 8 * MIB
    del f  # g's lineage still names it: a lost g re-runs from it
    gc.collect()
    # Nothing is released: the count of keys sent stays, and g's input is still there.
    sent = client._conn.released
    assert client.submit(tasks.length, g).result(timeout=30) == 4 * MIB
    assert client._conn.released == sent
    assert kept_bytes(client, pid) == base
    del g
    gc.collect()
    wait_until(lambda: kept_bytes(client, pid) <= base - 8 * MIB, timeout=10)


def test_a_released_value_is_made_again_when_read(client):
    f, pid = kept(client, 1000)
    first = f._result.key
    base = kept_bytes(client, pid)
    assert f.release() is True
    wait_until(lambda: kept_bytes(client, pid) <= base - 1000, timeout=10)
    # The worker dropped it: reading it re-runs its producer (lineage), within its attempts.
    assert f.result(timeout=60) == b"x" * 1000
    assert f._lineage.attempts == 2 and f._result.key != first
