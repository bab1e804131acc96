"""Per-user bounds on queued tasks and their argument bytes, against a real master: a package
past a bound is refused with ``QueueLimitError`` naming the limit, the user's use and what
the package adds; the connection stays usable; another user's tasks still run; finished
tasks make room again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import rtpool
import tasks
from conftest import Workers, close_master, start_master
from rtpool import _native
from rtpool.errors import QueueLimitError, SubmitRejected


@pytest.fixture
def bounded(tmp_path: Path):
    m = start_master(
        tmp_path,
        args=["--max-queued-tasks-per-user", "1000", "--max-queued-mb-per-user", "1"],
    )
    try:
        yield m
    finally:
        close_master(m)


def test_a_user_past_its_queued_task_bound_is_refused_and_another_users_tasks_run(
    bounded, tmp_path: Path
) -> None:
    token_b, _ = _native.token_create(str(bounded.data_dir), "bob", "client")
    workers = Workers(bounded, tmp_path)
    try:
        with rtpool.Client(bounded.address, bounded.client_token) as alice:
            # No worker yet: alice's tasks stay queued.
            held = alice.submit_many(tasks.square, range(600))
            assert held.id is not None
            with pytest.raises(QueueLimitError) as refused:
                _ = alice.submit_many(tasks.square, range(600)).id
            text = str(refused.value)
            assert "has 600 tasks queued or running and this package adds 600" in text, text
            assert "limit of 1000 (master option --max-queued-tasks-per-user)" in text, text
            assert isinstance(refused.value, SubmitRejected)
            with rtpool.Client(bounded.address, token_b) as bob:
                theirs = bob.submit_many(tasks.square, range(50))
                workers.start(procs=1)
                assert [f.result(60) for f in theirs] == [i * i for i in range(50)]
            # The connection stays usable, and finished tasks make room.
            assert [f.result(60) for f in held] == [i * i for i in range(600)]
            again = alice.submit_many(tasks.square, range(900))
            assert sum(f.result(60) for f in again) == sum(i * i for i in range(900))
    finally:
        workers.stop_all()


def test_a_package_past_the_queued_bytes_bound_is_refused_naming_the_bytes(bounded) -> None:
    alice = rtpool.Client(bounded.address, bounded.client_token)
    try:
        refused = alice.submit_many(tasks.echo, [b"x" * 400_000] * 3)
        with pytest.raises(QueueLimitError, match="argument bytes.*--max-queued-mb-per-user"):
            _ = refused.id
        with pytest.raises(QueueLimitError):
            refused[0].result(30)
        # Under the bound it is accepted (nothing runs it: no worker), on the same connection.
        assert alice.submit_many(tasks.echo, [b"x" * 400_000] * 2).id is not None
    finally:
        # Nothing runs the accepted package (no worker): do not wait for it.
        alice.shutdown(wait=False, cancel_futures=True)


def test_master_help_documents_the_bounds_and_their_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rtpool", "master", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag, default in (
        ("--max-queued-tasks-per-user", "1048576"),
        ("--max-queued-mb-per-user", "1024"),
        ("--max-unacked-mb", "256"),
        ("--max-unacked-results", "1048576"),
    ):
        assert flag in out
        after = out[out.index(flag) :]
        assert f"default: {default}" in " ".join(after[:600].split()), after[:600]
