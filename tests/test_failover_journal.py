"""A real failover without HA (issue 28 item 3, client and worker side): master A on port P1
with data dir D serves 2 recording clients and 2 workers, all given ``P1,P2``; A is killed
with SIGKILL (by PID) and master B starts on P2 with the same D, so the journal carries over
and B is a new ``instance``: what an HA takeover looks like to clients and workers. The
history checker (``rtpool_bench.history_check``) then proves every acknowledged task
completed, none twice, none with another task's value.

And a client's ``result(timeout)`` keeps its meaning across it: a wait that spans the
failover gets the value, one shorter than the failover times out as ``TimeoutError`` (no
``ConnectionLost``), and its task still completes on B.
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env
from rtpool_bench.history_kill import run_once

KILLS = 3
RESULTS_BETWEEN = 100
TIMEOUT_S = 60.0


def test_clients_and_workers_follow_the_journal_to_the_other_address(tmp_path: Path):
    args = argparse.Namespace(
        kills=KILLS,
        clients=2,
        workers=2,
        tasks=10,
        inflight=4,
        results_between=RESULTS_BETWEEN,
        seconds=50.0,
        fsync="always",
        failover=True,
    )
    out = run_once(tmp_path / "run", args)
    v = out["verdict"]
    print(f"\nfailover to the other port, first result after SIGKILL ms {out['restart_ms']}; {v}")
    assert len(out["restart_ms"]) == KILLS
    # Not vacuous: results came before and after each failover, from both clients.
    assert v["clients"] == 2 and v["unfinished_clients"] == []
    assert v["ok"] >= (KILLS + 1) * RESULTS_BETWEEN
    assert (v["lost"], v["duplicated"], v["wrong"], v["phantom"]) == (0, 0, 0, 0), (
        v["examples"],
        v["lost_errors"],
    )
    assert v["valid"]
    # The workers found the master on the other address (not only the first one).
    run = tmp_path / "run"
    logs = "".join(p.read_text() for p in run.glob("worker*.log"))
    ports = set(re.findall(r"connected to the master at 127\.0\.0\.1:(\d+)", logs))
    assert len(ports) == 2, logs[-3000:]


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture
def pair(tmp_path: Path):
    """Master A on P1 (data dir D) and the address list ``P1,P2``; B is started by the test."""
    a = start_master(tmp_path, args=["--fsync", "always"], log_name="a.log")
    started = [a]
    p2 = _free_port()
    try:
        yield a, f"{a.address},127.0.0.1:{p2}", p2, started
    finally:
        for m in started:
            close_master(m)


def test_result_timeout_keeps_its_meaning_across_a_failover(pair, tmp_path: Path):
    a, addresses, p2, started = pair
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", addresses, "--procs", "2"]
    with open(tmp_path / "w.log", "wb") as log:
        worker = subprocess.Popen(
            cmd,
            env=worker_env(a.worker_token),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    client = rtpool.Client(addresses, a.client_token)
    try:
        assert client.submit(tasks.square, 3).result(TIMEOUT_S) == 9  # the worker is up
        spanning = client.submit(tasks.sleep_return, "spanning", 1.0)
        short = client.submit(tasks.sleep_return, "short", 1.0)
        wait_until(lambda: spanning.running() or spanning.done(), TIMEOUT_S)
        a.proc.send_signal(signal.SIGKILL)  # by PID
        a.proc.wait(TIMEOUT_S)
        wait_until(lambda: client._conn.sock is None, TIMEOUT_S)
        with pytest.raises(TimeoutError):
            short.result(timeout=0.05)  # A is gone, B not yet up: a plain timeout
        b = start_master(tmp_path, data_dir=a.data_dir, listen=f"127.0.0.1:{p2}", log_name="b.log")
        started.append(b)
        assert spanning.result(timeout=TIMEOUT_S) == "spanning"
        assert short.result(timeout=TIMEOUT_S) == "short"
        assert client.address == b.address
        assert client.reconnects == 1
    finally:
        client.close()
        stop_process(worker, group=True)
