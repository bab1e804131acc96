"""Packages of calls (grid RPC) are journaled: a client whose call was accepted, when the
master is killed (SIGKILL) and restarted on the same data dir, re-attaches and gets its
call's result instead of ``unknown_package``."""

from __future__ import annotations

import socket
from pathlib import Path

import rtpool
from conftest import Workers, close_master, start_master
from helpers import wait_until


def test_a_call_accepted_before_a_master_kill_gets_its_result_after_the_restart(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{s.getsockname()[1]}"  # the restarted master needs the same port
    args = ["--fsync", "always"]
    master = start_master(tmp_path, listen=listen, args=args)
    workers = Workers(master, tmp_path)
    try:
        # The worker reconnects to the restarted master and serves the function again.
        workers.start(1, "--serve", "tasks.rpc", "--reconnect-timeout", "120")
        client = rtpool.Client(master.address, master.client_token)
        try:
            wait_until(lambda: any(f.name == "slow" for f in client.functions()), timeout=60)
            journal = master.data_dir / "journal.log"
            fut = client.call_async("slow", 3.0)
            # Accepted and journaled (its record, naming the function, is in the file) while
            # the call runs.
            wait_until(lambda: b"slow" in journal.read_bytes(), timeout=30)
            master.proc.kill()  # SIGKILL: no goodbye to anyone
            master.proc.wait(10)
            close_master(master)
            master = start_master(tmp_path, listen=listen, args=args, log_name="master2.log")
            assert fut.result(90) == 3.0
            assert client.reconnects >= 1
            assert "unknown_package" not in master.log_text()
        finally:
            client.close()
    finally:
        workers.stop_all()
        close_master(master)
