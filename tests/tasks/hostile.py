"""Tasks for the hostile-peer tests (issue 12, worker side), importable by worker processes as
``tasks.hostile``: tasks that crash the process running them in different ways, ignore their
time limit, hold the GIL, or return more than a frame can carry."""

from __future__ import annotations

import os
import signal
import time


def crash(how: str, value: int) -> int:
    """Crash the process running it: ``"sigkill"`` (SIGKILL to itself), ``"exit3"``
    (``os._exit(3)``), ``"segv"`` (a NULL read through ctypes); anything else returns
    ``value``."""
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit3":
        os._exit(3)
    elif how == "segv":
        import ctypes

        ctypes.string_at(0)
    return value


def sleep_then(seconds: float, value: int) -> int:
    """Sleep ``seconds`` (a task that ignores a time limit it was not told about)."""
    time.sleep(seconds)
    return value


def hold_gil(seconds: float) -> int:
    """Hold the GIL for ``seconds`` without a bytecode boundary (as a C extension that does not
    release it): a single ``re`` match with catastrophic backtracking runs in C."""
    import re

    # Each extra character doubles the time; calibrated once per process below.
    n = _gil_length(seconds)
    re.match(r"(a+)+$", "a" * n + "b")
    return n


_CALIBRATION: dict = {}


def _gil_length(seconds: float) -> int:
    import re

    if "per_char" not in _CALIBRATION:
        n = 18
        t0 = time.perf_counter()
        re.match(r"(a+)+$", "a" * n + "b")
        _CALIBRATION["base"] = (n, max(time.perf_counter() - t0, 1e-6))
    n, t = _CALIBRATION["base"]
    while t < seconds:
        n += 1
        t *= 2
    return n


def blob(size: int) -> bytes:
    """Return ``size`` bytes."""
    return b"x" * size


def write_pid_then_sleep(path: str, seconds: float) -> int:
    """Write this process's pid to ``path``, then sleep ``seconds``."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(seconds)
    return os.getpid()
