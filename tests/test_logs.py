"""Logs worth reading (issue 14, item 5): what the worker and the master write about their
work, read from the real processes' stderr."""

from __future__ import annotations

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
from rtpool.errors import AuthenticationError


def test_worker_logs_connect_failed_tasks_and_shutdown(master, workers, client_factory):
    proc = workers.start(1)
    wait_until(lambda: "connected to the master at" in workers.log_text(0), timeout=20)
    assert f"connected to the master at {master.address} as test-worker-0" in workers.log_text(0)
    client = client_factory()
    fut = client.submit(tasks.fail, "on purpose")
    with pytest.raises(Exception, match="on purpose"):
        fut.result(timeout=30)
    line = wait_until(
        lambda: re.search(r"task \d+ \(attempt 1\) of fail failed: \S+", workers.log_text(0)),
        timeout=10,
    )
    assert line.group(0).endswith("TaskError"), line.group(0)
    assert "on purpose" not in line.string, "the task's message stays out of the log"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    text = workers.log_text(0)
    assert "stopping: sending 0 pending results and handing 0 unstarted tasks back" in text


def test_a_flood_of_failures_is_logged_once_per_second_with_a_count(
    master, workers, client_factory
):
    workers.start(1)
    client = client_factory()
    pkg = client.submit_many(tasks.fail, ["flood"] * 200)
    assert all(f.exception(timeout=60) is not None for f in pkg)
    lines = wait_until(
        lambda: [line for line in workers.log_text(0).splitlines() if " of fail failed: " in line],
        timeout=10,
    )
    # 200 failures within a few seconds: one line, then at most one a second.
    assert 1 <= len(lines) <= 20, lines
    assert lines[0].endswith("failed: tasks.TaskError"), lines[0]
    if len(lines) > 1:
        assert re.search(r"\(\d+ more lines? like it held back in the last 1 s\)$", lines[1])


def test_log_limiter_one_line_per_key_per_window_with_a_count():
    from rtpool._ratelimit import LogLimiter, suppressed_note

    limiter = LogLimiter(10.0)
    assert limiter.check("a", 0.0) == 0
    assert limiter.check("a", 1.0) is None
    assert limiter.check("a", 2.0) is None
    assert limiter.check("b", 2.0) == 0, "keys are independent"
    assert limiter.check("a", 10.0) == 2
    assert limiter.check("a", 25.0) == 0
    for key in range(LogLimiter.MAX_KEYS):
        limiter.check(key, 30.0)
    assert len(limiter) <= LogLimiter.MAX_KEYS + 1, "bounded: newcomers share one slot"
    assert suppressed_note(0, 10) == ""
    assert suppressed_note(3, 10) == " (3 more lines like it held back in the last 10 s)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_started_before_its_master_waits_for_it(tmp_path: Path):
    data = tmp_path / "data"
    created = subprocess.run(
        [sys.executable, "-m", "rtpool", "token", "create", "--user", "w", "--role", "worker"]
        + ["--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    address = f"127.0.0.1:{_free_port()}"
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rtpool", "worker", "--master", address, "--name", "early"]
            + ["--reconnect-timeout", "60"],
            env=worker_env(token),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    master = None
    try:
        wait_until(lambda: "waiting for the master for up to 60 s" in log.read_text(), timeout=20)
        assert worker.poll() is None, "the worker must wait, not exit"
        master = start_master(tmp_path, data_dir=data, listen=address)
        wait_until(lambda: "connected to the master at" in log.read_text(), timeout=30)
        assert re.search(
            r"connected to the master at \S+ as early \(session \d+\) after \d+ "
            r"attempts?",
            log.read_text(),
        )
        with rtpool.Client(master.address, master.client_token) as client:
            assert client.submit(tasks.square, 7).result(timeout=30) == 49
    finally:
        stop_process(worker, group=True)
        if master is not None:
            close_master(master)


def test_worker_gives_up_on_an_absent_master_after_the_reconnect_timeout(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "worker", "--master", f"127.0.0.1:{_free_port()}"]
        + ["--reconnect-timeout", "1"],
        env=worker_env("rtw_unused"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert "could not connect to the master" in proc.stderr
    assert "within 1 s (--reconnect-timeout); exiting" in proc.stderr


def test_master_logs_package_lifecycle_at_debug_and_a_summary(tmp_path: Path):
    m = start_master(tmp_path, args=["--log-summary", "1"])
    worker = None
    try:
        with open(tmp_path / "worker.log", "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "rtpool", "worker", "--master", m.address],
                env=worker_env(m.worker_token),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        with rtpool.Client(m.address, m.client_token) as client:
            pkg = client.submit_many(tasks.square, range(3))
            assert [f.result(timeout=30) for f in pkg] == [0, 1, 4]
            fut = client.submit(tasks.fail, "x")
            assert fut.exception(timeout=30) is not None
        wait_until(lambda: "freed" in m.log_text() and "tasks 4 done" in m.log_text(), 20)
        text = m.log_text()
        # Package ids are unguessable (docs/security.md): the square package's id from the
        # client, the failing task's from the log line of a package of 1 task.
        p1 = pkg.id
        assert re.search(rf'package {p1}: created by user "default": 3 tasks', text), text
        assert re.search(
            rf"package {p1}: first task assigned after \d+ ms \(to the worker of session \d+\)",
            text,
        )
        assert re.search(rf"package {p1}: first result after \d+ ms", text)
        assert re.search(rf"package {p1}: done in \d+ ms: 3 ok, 0 failed", text)
        assert re.search(rf"package (?!{p1}:)\d+: done in \d+ ms: 0 ok, 1 failed", text)
        assert f"package {p1}: freed (every result delivered)" in text
        summary = re.search(r"workers 1 \(1 slot\), tasks 4 done \(\+\d+/min\), 0 queued", text)
        assert summary, text[-2000:]
    finally:
        if worker is not None:
            stop_process(worker, group=True)
        close_master(m)


def test_refused_logins_are_one_readable_line_per_peer(master):
    for _ in range(20):  # a peer retrying a wrong token in a loop
        with pytest.raises(AuthenticationError):
            rtpool.Client(master.address, "rtc_wrong")
    wait_until(lambda: "refused a client login from 127.0.0.1" in master.log_text(), timeout=10)
    lines = [line for line in master.log_text().splitlines() if "refused a" in line]
    assert len(lines) == 1, lines
    assert re.search(
        r"refused a client login from 127\.0\.0\.1:\d+ \(name \"[^\"]*\"\): auth: ", lines[0]
    )
    assert "Error {" not in lines[0], "no Debug dump of the message"


def test_result_timeout_says_no_worker_is_connected(master, workers, client_factory):
    client = client_factory()
    fut = client.submit(tasks.square, 3)
    with pytest.raises(TimeoutError) as info:
        fut.result(timeout=1)
    text = str(info.value)
    assert text.startswith("no result within 1 s: no worker is connected to the master at")
    assert "1 of its package's 1 tasks queued, 0 running" in text
    assert f"rtpool worker --master {master.address}" in text
    # With a worker connected, the message counts it.
    workers.start(1)
    assert fut.result(timeout=30) == 9
    slow = client.submit(tasks.sleep_return, 1, 3.0)
    with pytest.raises(TimeoutError) as info:
        slow.result(timeout=1)
    assert "; 1 worker can run it (0 of its package's 1 tasks queued, 1 running)" in str(
        info.value
    ), str(info.value)
    assert slow.result(timeout=30) == 1


def test_short_timeouts_stay_cheap(client_factory):
    fut = client_factory().submit(tasks.square, 3)
    with pytest.raises(TimeoutError) as info:
        fut.result(timeout=0.01)
    assert str(info.value) == "no result within 0.01 s"
