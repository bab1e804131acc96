"""Fault injection end to end, each a real fault: a task that kills its worker (poison), a user
running out of quota, a worker cut off by a network partition whose late result must be
ignored, and the PostgreSQL user store.

Worker kill -9, time limits and reconnection are in ``test_worker_supervisor.py``; master
kill -9 and restart in ``test_client_reconnect.py``; the journal in ``test_journal_e2e.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

import pytest

import rtpool
import tasks.faults
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env
from rtpool import _native
from rtpool.errors import PoisonTaskError, QuotaExceededError


def _worker(address: str, token: str, log: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", "1"]
    with open(log, "ab") as f:
        return subprocess.Popen(
            [*cmd, *extra],
            env=worker_env(token),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def test_poison_task_fails_naming_its_attempts_and_other_work_goes_on(
    master, workers, client_factory
) -> None:
    workers.start(2)
    client = client_factory()
    poison = client.submit(tasks.faults.kill_own_worker)
    others = client.map(pow, range(40), [2] * 40)
    assert list(others) == [i * i for i in range(40)]
    with pytest.raises(PoisonTaskError) as info:
        poison.result(timeout=60)
    text = str(info.value)
    assert "3 times" in text, text
    assert text.count("attempt ") >= 3, text
    # The pool still works after its workers were killed three times.
    assert client.submit(pow, 3, 3).result(timeout=30) == 27


def test_max_attempts_per_package_bounds_the_retries_after_a_crash(
    master, workers, client_factory, tmp_path: Path
) -> None:
    # Needs a master that takes the max_attempts option (the rvocab branch of issue 11).
    workers.start(2)
    client = client_factory()
    once = client.options(max_attempts=1).submit(tasks.faults.kill_own_worker)
    with pytest.raises(PoisonTaskError) as info:
        once.result(timeout=60)
    text = str(info.value)
    assert "1 times" in text and "attempt 1 on" in text, text
    assert "attempt 2" not in text, text  # the master default (3) would have retried it
    # A task that crashes only on its first attempt succeeds on its second.
    marker = tmp_path / "crashed-once"
    twice = client.options(max_attempts=2).submit(tasks.faults.kill_own_worker_once, str(marker), 7)
    assert twice.result(timeout=60) == 7
    assert marker.exists()


def test_quota_exhaustion_fails_the_users_tasks_and_refuses_new_packages(
    master, workers, client_factory
) -> None:
    token, _ = _native.token_create(str(master.data_dir), "quser", "client", quota_seconds=0.4)
    workers.start(1)
    limited = rtpool.Client(master.address, token)
    other = client_factory()
    try:
        # 0.1 s of CPU each, one at a time: the 0.4 s quota runs out a few tasks in.
        futures = [limited.submit(tasks.faults.busy, 0.1) for _ in range(40)]
        ok, refused = 0, 0
        for f in futures:
            try:
                assert f.result(timeout=60) == 0.1
                ok += 1
            except QuotaExceededError:
                refused += 1
        assert ok >= 1 and refused >= 1, (ok, refused)
        assert ok <= 30, "the quota was not enforced"

        def refused_now() -> bool:
            try:
                limited.submit(pow, 2, 2).result(timeout=30)
            except QuotaExceededError:
                return True
            return False

        wait_until(refused_now, timeout=30, interval=0.2)
        # Other users are not affected.
        assert other.submit(pow, 2, 5).result(timeout=30) == 32

        def used_us() -> int:
            quotas = {q["user"]: q for q in _native.token_quotas(str(master.data_dir))}
            return quotas["quser"]["used_us"]

        # Written behind to the store about once a second.
        wait_until(lambda: used_us() >= 400_000, timeout=30, interval=0.2)
    finally:
        limited.close()


class _Proxy:
    """A TCP relay the test controls: ``freeze()`` stops forwarding both ways (a network
    partition: bytes stay queued), ``thaw()`` resumes. Each accepted connection gets a fresh
    upstream connection."""

    def __init__(self, upstream: tuple) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.open = threading.Event()
        self.open.set()
        self.stopping = False
        self.socks: List[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                down.close()
                continue
            self.socks += [down, up]
            for a, b in ((down, up), (up, down)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.stopping:
                data = src.recv(65536)
                if not data:
                    break
                self.open.wait(60)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def freeze(self) -> None:
        self.open.clear()

    def thaw(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.stopping = True
        self.open.set()
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        for t in self.threads:
            t.join(5)


def test_partitioned_workers_late_result_is_ignored(tmp_path: Path) -> None:
    m = _native.Master(data_dir=str(tmp_path / "data"), options={"lease_ms": 1000})
    host, port = m.address.rsplit(":", 1)
    proxy = _Proxy((host, int(port)))
    procs = []
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        cut_off = _worker(proxy.address, m.worker_token, tmp_path / "w-cut.log")
        procs.append(cut_off)
        with rtpool.Client(m.address, m.client_token) as client:
            wait_until(lambda: m.stats()["workers"] == 1, timeout=30)
            fut = client.submit(tasks.faults.mark_then_sleep, str(markers), 3.0, 42)
            first = wait_until(lambda: [p.name for p in markers.iterdir()], timeout=30)
            proxy.freeze()  # the worker runs on, unheard: its lease expires after 1 s
            wait_until(lambda: m.stats()["requeued"] >= 1, timeout=30)
            procs.append(_worker(m.address, m.worker_token, tmp_path / "w-ok.log"))
            wait_until(
                lambda: [p.name for p in markers.iterdir() if p.name not in first], timeout=30
            )
            # Heal the partition while both run: the cut-off worker learns its lease is gone,
            # finishes its attempt, reconnects and sends that late result, which the master
            # drops as stale. The client gets one result, the other worker's.
            proxy.thaw()
            assert fut.result(timeout=60) == 42
            wait_until(lambda: m.stats()["stale_results"] >= 1, timeout=30)
            s = m.stats()
            assert s["delivered"] == 1, s
            assert client.submit(pow, 2, 10).result(timeout=30) == 1024
    finally:
        for p in procs:
            stop_process(p, group=True)
        proxy.close()
        m.stop()


def test_postgres_store_end_to_end(tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "data"
    m = start_master(tmp_path, data_dir=data, args=["--store", pg_url])
    procs = []
    try:
        token, info = _native.token_create(
            str(data), "pguser", "client", quota_seconds=100.0, store=pg_url
        )
        assert info["user"] == "pguser"
        procs.append(_worker(m.address, m.worker_token, tmp_path / "w.log"))
        with rtpool.Client(m.address, token) as c:
            assert c.submit(tasks.faults.busy, 0.05).result(timeout=60) == 0.05

        def charged() -> bool:
            q = {x["user"]: x for x in _native.token_quotas(str(data), store=pg_url)}
            return q.get("pguser", {}).get("used_us", 0) >= 50_000

        wait_until(charged, timeout=30, interval=0.2)
        # The tokens live in PostgreSQL, not in the data dir's SQLite store.
        assert "pguser" in {t["user"] for t in _native.token_list(str(data), store=pg_url)}
        assert "pguser" not in {t["user"] for t in _native.token_list(str(data))}
    finally:
        for p in procs:
            stop_process(p, group=True)
        close_master(m)
    # A PostgreSQL client must not be used or dropped inside the master's runtime.
    assert "panicked" not in m.log_text(), m.log_text()[-3000:]


def test_options_timeout_ends_endless_tasks_end_to_end(
    master, workers, client_factory, tmp_path: Path
) -> None:
    import tasks

    workers.start(1)
    client = client_factory()
    view = client.options(timeout=0.5)
    loop = view.submit(tasks.spin_forever)
    stubborn = view.submit(tasks.faults.ignore_sigterm_write_pid, str(tmp_path / "pid"), 60.0)
    for fut in (loop, stubborn):
        with pytest.raises(TimeoutError) as info:
            fut.result(timeout=60)
        assert isinstance(info.value, rtpool.TaskTimeoutError)
        assert "time limit" in str(info.value)
    # The process that ignored SIGTERM is gone, and the worker is ready for the next task.
    pid = int((tmp_path / "pid").read_text())
    wait_until(lambda: not _alive(pid), timeout=10)
    assert view.submit(pow, 2, 8).result(timeout=30) == 256


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
