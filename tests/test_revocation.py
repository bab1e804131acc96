"""Revoking a token closes the sessions open with it: a worker's tasks are requeued and run
elsewhere (nothing lost), a client's pending futures fail with an error saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env
from rtpool.errors import ConnectionLost
from test_tokens import create, plain_log, token_cli


def start_worker(master, token: str, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", master.address, "--procs", "2"]
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            env=worker_env(token),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def test_revoking_a_worker_token_closes_its_session_and_requeues_its_tasks(tmp_path: Path):
    master = start_master(tmp_path)
    where = ["--data-dir", str(master.data_dir)]
    procs = []
    try:
        worker_token, worker_id = create(where, "alice", "worker")
        procs.append(start_worker(master, worker_token, tmp_path / "w1.log"))
        with rtpool.Client(master.address, master.client_token) as client:
            pkg = client.submit_many(tasks.sleep_return, [(i, 1.0) for i in range(8)], star=True)
            # The revoked worker holds tasks when it is revoked.
            wait_until(lambda: plain_log(master).count("user=alice") >= 1, timeout=30)
            wait_until(lambda: sum(f.done() for f in pkg) >= 1, timeout=30)
            token_cli("revoke", worker_id, *where)
            wait_until(lambda: "token revoked: closing the session" in plain_log(master), 15)
            wait_until(
                lambda: (
                    procs[0].poll() is not None
                    or "revoked" in (tmp_path / "w1.log").read_text(errors="replace")
                ),
                timeout=30,
            )
            assert "revoked" in (tmp_path / "w1.log").read_text(errors="replace")
            # Another worker (built-in token) finishes everything: nothing was lost.
            procs.append(start_worker(master, master.worker_token, tmp_path / "w2.log"))
            assert pkg.results(90) == list(range(8))
    finally:
        for proc in procs:
            stop_process(proc, group=True)
        close_master(master)


def test_revoking_a_client_token_closes_its_session(tmp_path: Path):
    master = start_master(tmp_path)
    where = ["--data-dir", str(master.data_dir)]
    try:
        client_token, client_id = create(where, "bob", "client")
        with rtpool.Client(master.address, client_token) as client:
            # No worker: the futures stay pending until the session is closed.
            futures = [client.submit(tasks.square, i) for i in range(3)]
            assert futures[0] is not None
            wait_until(lambda: "user=bob" in plain_log(master), timeout=15)
            token_cli("revoke", client_id, *where)
            with pytest.raises(ConnectionLost, match=r"token .* of user bob was revoked"):
                futures[0].result(30)
        assert master.proc.poll() is None
    finally:
        close_master(master)
