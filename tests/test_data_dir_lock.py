"""One master per data dir: a second ``rtpool master`` on a data dir in use refuses to start,
naming the first's pid and address; after ``kill -9`` of the first, a restart takes the dir
again. The data dir is owner-only (0700, files 0600), and a too-open one is tightened."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import rtpool
from conftest import close_master, start_master


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def second_master(tmp_path: Path, data_dir: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    return subprocess.run(
        cmd + ["--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_a_second_master_on_the_same_data_dir_refuses_and_a_restart_after_kill_9_works(
    tmp_path: Path,
):
    data_dir = tmp_path / "data"
    first = start_master(tmp_path, data_dir=data_dir)
    try:
        proc = second_master(tmp_path, data_dir)
        assert proc.returncode != 0, proc
        err = proc.stderr
        assert f"pid {first.proc.pid}" in err, err
        assert first.address in err, err
        assert "in use by another master" in err, err
        assert "listening on" not in proc.stdout, proc.stdout
        # The first master was not disturbed.
        with rtpool.Client(first.address, first.client_token) as client:
            assert client is not None
        first.proc.kill()  # kill -9: no chance to remove anything
        first.proc.wait(10)
    finally:
        close_master(first)
    # The kernel released the lock with the process: no stale lock to delete by hand.
    again = start_master(tmp_path, data_dir=data_dir, log_name="master2.log")
    try:
        lock = (data_dir / "master.lock").read_text()
        assert f"pid {again.proc.pid}" in lock and again.address in lock, lock
    finally:
        close_master(again)


def test_data_dir_is_owner_only_and_an_open_one_is_tightened(tmp_path: Path):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    journal = data_dir / "journal.log"
    master = start_master(tmp_path, data_dir=data_dir)
    try:
        assert mode(data_dir) == 0o700
        for name in ["journal.log", "rtpool.db", "master.lock", "client.token", "worker.token"]:
            assert mode(data_dir / name) == 0o600, (name, oct(mode(data_dir / name)))
        assert "was mode 0755" in master.log_text(), master.log_text()[-2000:]
    finally:
        close_master(master)
    # A journal left world-readable (by an older rtpool) is tightened at the next start.
    journal.chmod(0o644)
    master = start_master(tmp_path, data_dir=data_dir, log_name="master2.log")
    try:
        assert mode(journal) == 0o600
        assert "journal.log was mode 0644" in master.log_text()
    finally:
        close_master(master)
