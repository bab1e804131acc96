"""Test helpers: waiting on conditions, processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def wait_until(pred: Callable[[], object], timeout: float = 5.0, interval: float = 0.005) -> object:
    """Poll ``pred`` until it returns something truthy; fail the test after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"condition not met within {timeout} s: {pred}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0, group: bool = False) -> int | None:
    """SIGTERM a process (or its process group), wait, SIGKILL if it does not exit."""
    if proc.poll() is None:
        try:
            if group:
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    if group:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout)
    return proc.returncode


def worker_env(token: str) -> dict:
    """Environment of a worker subprocess: the token, and this directory on PYTHONPATH."""
    env = dict(os.environ)
    env["RTPOOL_WORKER_TOKEN"] = token
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, env.get("PYTHONPATH")) if p)
    return env


@contextlib.contextmanager
def worker_processes(
    master, log_dir: Path, procs: int = 1, connection: str | None = None
) -> Iterator[Callable[..., subprocess.Popen]]:
    """Yields ``start(*extra, procs_per_worker=procs, connection=connection)``, which starts a
    real ``rtpool worker`` against ``master`` (a ``_native.Master``) in a session of its own,
    its log in ``log_dir/worker-N.log``; every worker started is stopped (by process group) on
    exit."""
    started = []

    def start(*extra: str, procs_per_worker: int = procs, connection: str | None = connection):
        n = len(started)
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", master.address]
        cmd += ["--procs", str(procs_per_worker), *extra]
        if connection is not None:
            cmd += ["--connection", connection]
        with open(log_dir / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen(
                cmd,
                env=worker_env(master.worker_token),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            stop_process(proc, group=True)


def as_from_a_shell() -> None:
    """``preexec_fn`` for a child that must take Ctrl-C as a program started from a shell
    does: SIGINT at its default (so Python installs KeyboardInterrupt) and no signal blocked.
    A child inherits an ignored disposition and the signal mask across exec, and the pytest
    process's may have been changed by an earlier test: the Ctrl-C tests hung in the full
    suite only (.ci/run), not alone."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_state() -> str:
    """This process's SIGINT handler and its blocked and ignored signal sets (for a failure
    message)."""
    fields = []
    with open("/proc/self/status") as status:
        fields = [line.strip() for line in status if line.startswith(("SigBlk", "SigIgn"))]
    return f"SIGINT handler {signal.getsignal(signal.SIGINT)!r}; " + "; ".join(fields)
