"""A per-user priority ceiling set by the admin on the user's tokens: a client asking for more
is refused with an error naming the ceiling; a changed ceiling applies to open sessions."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import wait_until
from rtpool.errors import ConnectionLost, SubmitRejected
from test_tokens import create, listed, plain_log, token_cli


def test_priority_above_the_users_ceiling_is_refused(tmp_path: Path):
    master = start_master(tmp_path)
    where = ["--data-dir", str(master.data_dir)]
    try:
        token, token_id = create(where, "alice", "client", "--max-priority", "2")
        assert listed(where)[token_id][-1] == "2"
        wait_until(lambda: "ceilings=1" in plain_log(master), timeout=15)
        with rtpool.Client(master.address, token) as client:
            with pytest.raises(SubmitRejected, match=r"priority 5 is above the ceiling 2"):
                client.options(priority=5).submit(tasks.square, 2).result(30)
            # At or below the ceiling: accepted (no worker: it only has to get an id).
            assert client.options(priority=2).submit(tasks.square, 2) is not None
            assert client.options(priority=2).submit_many(tasks.square, [1]).id is not None
            # The admin raises the ceiling; the open session follows within a poll period.
            out = token_cli("set", "--user", "alice", "--max-priority", "9", *where).stdout
            assert "priority ceiling of user alice: 9" in out
            wait_until(lambda: plain_log(master).count("ceilings=1") >= 2, timeout=15)
            assert client.options(priority=5).submit_many(tasks.square, [1]).id is not None
            token_cli("set", "--user", "alice", "--no-max-priority", *where)
            wait_until(lambda: "ceilings=0" in plain_log(master), timeout=15)
            assert client.options(priority=1000).submit_many(tasks.square, [1]).id is not None
            # No worker runs them: leave without waiting.
            client.shutdown(wait=False, cancel_futures=True)
        # The built-in token's user has no ceiling.
        with rtpool.Client(master.address, master.client_token) as client:
            assert client.options(priority=1000).submit_many(tasks.square, [1]).id is not None
            client.shutdown(wait=False, cancel_futures=True)
    finally:
        close_master(master)


def test_ceiling_and_revocation_with_a_postgres_store(pg_url: str, tmp_path: Path):
    # The database is shared with other tests and runs: a user of our own.
    user = f"pg-{uuid.uuid4().hex[:12]}"
    where = ["--store", pg_url, "--data-dir", str(tmp_path / "unused")]
    # Before the master starts: it reads the ceilings when it opens the store.
    token, token_id = create(where, user, "client", "--max-priority", "1")
    assert listed(where)[token_id][-1] == "1"
    master = start_master(tmp_path, args=["--store", pg_url])
    try:
        with rtpool.Client(master.address, token) as client:
            with pytest.raises(SubmitRejected, match=r"priority 3 is above the ceiling 1"):
                client.options(priority=3).submit(tasks.square, 2).result(30)
            pending = client.options(priority=1).submit(tasks.square, 2)
            token_cli("revoke", token_id, *where)
            with pytest.raises(ConnectionLost, match=rf"of user {user} was revoked"):
                pending.result(30)
    finally:
        close_master(master)


def test_a_ceiling_out_of_the_priority_range_is_refused_by_the_cli(tmp_path: Path):
    where = ["--data-dir", str(tmp_path / "data")]
    err = token_cli("set", "--user", "a", "--max-priority", "99999999999", *where, expect_rc=2)
    assert "out of range: use -2147483648..2147483647" in err.stderr
    err = token_cli(
        "create", "--user", "a", "--role", "client", "--max-priority", "x", *where, expect_rc=2
    )
    assert "'x' is not an integer" in err.stderr
