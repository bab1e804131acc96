"""Tasks for the fault-injection tests, importable by worker processes as ``tasks.faults``
(tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import os
import signal
import time


def kill_own_worker() -> None:
    """Kills the process running it, as a crashing native extension would."""
    os.kill(os.getpid(), signal.SIGKILL)


def busy(seconds: float) -> float:
    """Burns CPU for ``seconds`` (charged to the user's quota as execution time)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return seconds


def mark_then_sleep(marker_dir: str, seconds: float, value: int) -> int:
    """Writes ``<marker_dir>/<pid>`` when it starts, sleeps, returns ``value``."""
    path = os.path.join(marker_dir, str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        f.write(str(time.time()))
    os.replace(path + ".tmp", path)
    time.sleep(seconds)
    return value


def ignore_sigterm_write_pid(path: str, seconds: float) -> None:
    """Ignores SIGTERM, writes its pid to ``path``, sleeps."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(seconds)


def kill_own_worker_once(marker: str, value: int) -> int:
    """Kills the process running it on its first attempt (when ``marker`` does not exist yet,
    which it creates); returns ``value`` on the next one."""
    try:
        with open(marker, "x"):
            pass
    except FileExistsError:
        return value
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")
