"""``rtpool status`` and ``Client.status()`` against a real master, two workers and load (a
deadline miss and a task still running included): the JSON for scripts, the table a person
reads, the ``--watch`` live view on a real terminal (a pty) left with Ctrl-C, and the errors."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

import rtpool
import tasks
from conftest import Workers, close_master, start_master
from helpers import as_from_a_shell, signal_state, wait_until


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A master (no HTTP listener: status goes over the protocol), two workers, 30 quick
    tasks done, one late result and one task that runs until the module ends."""
    tmp = tmp_path_factory.mktemp("status")
    m = start_master(tmp, args=["--http", "off"])
    workers = Workers(m, tmp)
    client = None
    try:
        workers.start(1)
        workers.start(1)
        client = rtpool.Client(m.address, m.client_token)
        wait_until(lambda: len(client.status()["workers"]) == 2, timeout=30, interval=0.05)
        assert client.submit_many(tasks.square, range(30)).results(timeout=30)[-1] == 29 * 29
        late = client.options(deadline=0.1).submit(tasks.sleep_return, "late", 0.5)
        assert late.result(timeout=30) == "late" and late.lateness > 0
        held = client.options(timeout=120).submit_many(
            tasks.sleep_return, [("held", 60.0)], star=True
        )
        wait_until(
            lambda: any(
                p["id"] == held.id and p["running"] == 1 for p in client.status()["packages"]
            ),
            timeout=30,
            interval=0.05,
        )
        yield m, client, held.id
        held.cancel()
    finally:
        if client is not None:
            client.close()
        workers.stop_all()
        close_master(m)


def _status(m, *args: str, env: dict | None = None, timeout: float = 30):
    return subprocess.run(
        [sys.executable, "-m", "rtpool", "status", "--master", m.address, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "RTPOOL_TOKEN": m.client_token, "COLUMNS": "160", **(env or {})},
    )


def test_client_status_returns_the_snapshot(loaded):
    m, client, held = loaded
    s = client.status()
    assert {
        "master",
        "totals",
        "rates",
        "latency",
        "deadlines",
        "workers",
        "packages",
        "users",
    } <= set(s)
    assert s["master"]["pid"] == m.proc.pid
    assert sorted(w["name"] for w in s["workers"]) == ["test-worker-0", "test-worker-1"]
    assert s["deadlines"]["missed"] >= 1
    assert s["totals"]["done"] >= 31
    assert s["latency"]["assign_to_result"]["max_us"] >= 500_000  # the 0.5 s task


def test_status_json_for_scripts(loaded):
    m, _, held = loaded
    run = _status(m, "--json")
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)
    assert sorted(w["name"] for w in s["workers"]) == ["test-worker-0", "test-worker-1"]
    assert all(w["slots"] == 1 for w in s["workers"])
    assert sum(w["running"] for w in s["workers"]) == 1  # the held task
    assert s["deadlines"]["missed"] >= 1
    (package,) = [p for p in s["packages"] if p["id"] == held]
    assert (package["tasks"], package["running"]) == (1, 1)
    assert s["totals"]["running"] == 1
    assert s["latency"]["submit_to_assign"]["max_us"] > 0


def test_status_table_for_people(loaded):
    m, _, held = loaded
    run = _status(m)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert f"master {m.address}" in out
    assert "workers 2 (2 slots)" in out
    assert "test-worker-0" in out and "test-worker-1" in out
    assert "submit → assign" in out and "assign → result" in out
    assert "late results by lateness: ≤" in out  # the 0.4 s late result's bucket
    # What holds memory: results not acknowledged yet, the journal's queue and buffer.
    assert re.search(r"held: results [\d.]+ \w?i?B \(unacked [\d.]+ \w?i?B\)", out), out
    assert re.search(r"journal queue [\d.]+ \w?i?B, buffer [\d.]+ \w?i?B", out), out
    missed = out.split("deadlines met", 1)[1].split("\n", 1)[0]
    assert "missed 0" not in missed and "missed" in missed, missed
    # The held package's row: id, then 0 of 1 done, running 1.
    row = next(line for line in out.splitlines() if line.startswith(f"│ {held} "))
    assert "0/1" in row, row


def test_status_watch_on_a_terminal_until_ctrl_c(loaded):
    m, _, _ = loaded
    leader, follower = pty.openpty()
    env = {**os.environ, "RTPOOL_TOKEN": m.client_token, "COLUMNS": "160", "LINES": "60"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtpool", "status", "--master", m.address, "--watch"]
        + ["--interval", "0.2"],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=as_from_a_shell,
    )
    os.close(follower)
    out = b""
    try:
        end = time.monotonic() + 30
        # Two redraws (the live view rewrites its lines in place) show it is live.
        while out.count(b"test-worker-1") < 2 and time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], max(0.0, end - time.monotonic()))
            if ready:
                out += os.read(leader, 65536)
        assert out.count(b"test-worker-1") >= 2, out[-2000:]
        proc.send_signal(signal.SIGINT)
        # Keep reading the terminal as a terminal does: the view's last redraw on its way out
        # must not block on a full pty (a test that stopped reading hung it next to a CPU hog).
        end = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    out += os.read(leader, 65536)
                except OSError:  # the last writer closed its end
                    break
        try:
            code = proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within 15 s of Ctrl-C; the test process: {signal_state()}")
        assert code == 0
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        os.close(leader)


def test_status_errors_say_what_to_do(loaded, tmp_path):
    m, _, _ = loaded
    run = _status(m, "--data-dir", str(tmp_path), env={"RTPOOL_TOKEN": ""})
    assert run.returncode == 1
    assert "no client token: set RTPOOL_TOKEN or pass --token-file" in run.stderr
    run = _status(m, "--interval", "0.01", "--watch")
    assert run.returncode == 1 and "--interval must be 0.2 to 60 seconds" in run.stderr
    port = _closed_port()
    run = subprocess.run(
        [sys.executable, "-m", "rtpool", "status", "--master", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "RTPOOL_TOKEN": "x"},
    )
    assert run.returncode == 1
    assert f"127.0.0.1:{port}" in run.stderr and "Traceback" not in run.stderr


def test_status_reads_a_local_masters_token_from_its_data_dir(loaded):
    m, _, _ = loaded
    run = _status(m, "--json", "--data-dir", str(m.data_dir), env={"RTPOOL_TOKEN": ""})
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["workers"]) == 2


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
