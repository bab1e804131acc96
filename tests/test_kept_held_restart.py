"""A dependent held by the master (option ``after``) across a master restart: journaled with
its producer, held again by the restarted master (SIGKILL, same data dir), and run with the
producer's result once the producer, restored undecided, ran again (``docs/data.md``,
"Master restarts"; the case of a producer delivered before the restart is a core scenario,
``crates/rtpool-core/tests/held.rs``)."""

from __future__ import annotations

import socket
from pathlib import Path

import rtpool
import tasks
from conftest import Workers, close_master, start_master
from helpers import wait_until
from rtpool.errors import ConnectionLost
from test_kept_held import is_held, packages

MIB = 1 << 20


def _packages_once_connected(client: rtpool.Client) -> int:
    """The master's live packages; 0 while the client is still reconnecting."""
    try:
        return packages(client)
    except (ConnectionLost, TimeoutError):
        return 0


def test_a_held_dependent_survives_a_master_restart(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{s.getsockname()[1]}"  # the restarted master needs the same port
    args = ["--fsync", "always"]  # ACCEPTED once the package is on disk
    master = start_master(tmp_path, listen=listen, args=args)
    workers = Workers(master, tmp_path)
    gate = tmp_path / "gate"
    try:
        workers.start(2, "--reconnect-timeout", "120")
        client = rtpool.Client(master.address, master.client_token)
        try:
            f = client.options(keep=True).submit(tasks.make_bytes_after, MIB, str(gate))
            g = client.submit(tasks.length, f)
            wait_until(lambda: is_held(g), timeout=60)  # both accepted: both journaled
            master.proc.kill()  # SIGKILL: f was running, g held
            master.proc.wait(10)
            close_master(master)
            master = start_master(tmp_path, listen=listen, args=args, log_name="master2.log")
            # The restarted master holds g again (replayed from the journal), f not yet run.
            wait_until(lambda: _packages_once_connected(client) >= 2, timeout=60)
            gate.touch()
            assert g.result(120) == MIB
            assert client.reconnects >= 1
            assert "unknown_package" not in master.log_text()
        finally:
            client.close()
    finally:
        workers.stop_all()
        close_master(master)
