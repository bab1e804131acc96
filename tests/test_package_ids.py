"""Package ids cannot be confused across master lifetimes: after a restart without a journal, a
client re-attaching to its old package id must not get the package another client of the same
user created since (ids restarted from 1 before: client A got client B's results)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import TESTS_DIR, stop_process, wait_until, worker_env

CLIENT_A = textwrap.dedent(
    """
    import sys, rtpool, tasks
    from rtpool.errors import RtpoolError
    address, token = sys.argv[1], sys.argv[2]
    client = rtpool.Client(address, token, name="client-a")
    pkg = client.submit_many(tasks.square, [1, 2, 3, 4])
    print("submitted", pkg.id, flush=True)
    try:
        print("results", pkg.results(60), flush=True)
    except RtpoolError as exc:
        print("error", type(exc).__name__, exc, flush=True)
    client.close()
    """
)


def free_listen() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def read_line(proc: subprocess.Popen, prefix: str, log: Path, timeout: float = 30) -> str:
    def found():
        for line in log.read_text().splitlines():
            if line.startswith(prefix):
                return line
        return None

    return wait_until(found, timeout=timeout)


def test_reattach_after_a_restart_without_journal_never_gets_another_clients_package(
    tmp_path: Path,
):
    listen = free_listen()  # the restarted master needs the same port
    args = ["--no-journal"]
    master = start_master(tmp_path, listen=listen, args=args)
    out_a = tmp_path / "client-a.out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    worker = None
    with open(out_a, "w") as out:
        proc_a = subprocess.Popen(
            [sys.executable, "-c", CLIENT_A, master.address, master.client_token],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        # No worker yet: A's package stays queued.
        id_a = int(read_line(proc_a, "submitted", out_a).split()[1])
        # Ids carry no volume: not a small counter.
        assert id_a >= 1 << 52, id_a
        # A is frozen while the master dies and comes back, so B submits before A re-attaches.
        os.kill(proc_a.pid, signal.SIGSTOP)
        master.proc.kill()
        master.proc.wait(10)
        close_master(master)
        master = start_master(tmp_path, listen=listen, args=args, log_name="master2.log")
        with rtpool.Client(master.address, master.client_token, name="client-b") as client_b:
            pkg_b = client_b.submit_many(tasks.square, [10, 11, 12, 13])
            id_b = pkg_b.id
            assert id_b != id_a
            os.kill(proc_a.pid, signal.SIGCONT)
            # A reconnects and tries to re-attach before any worker runs B's tasks.
            wait_until(lambda: "client-a" in master.log_text(), timeout=30)
            cmd = [sys.executable, "-m", "rtpool", "worker", "--master", master.address]
            with open(tmp_path / "worker.log", "wb") as wlog:
                worker = subprocess.Popen(
                    cmd + ["--procs", "1"],
                    env=worker_env(master.worker_token),
                    stdout=wlog,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            assert pkg_b.results(60) == [100, 121, 144, 169]
        proc_a.wait(60)
        text = out_a.read_text()
        assert "results [100, 121, 144, 169]" not in text, f"A got B's results:\n{text}"
        assert "error ResultsLost" in text, text
        assert "no longer knows" in text, text
    finally:
        if proc_a.poll() is None:
            os.kill(proc_a.pid, signal.SIGCONT)
            stop_process(proc_a)
        if worker is not None:
            stop_process(worker, group=True)
        close_master(master)
