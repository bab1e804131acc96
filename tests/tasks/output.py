"""Tasks that print and log (tests/test_task_output.py): module-level, so workers import them."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time


def chatty(i: int, lines: int = 3) -> int:
    """Print ``lines`` lines to stdout, one to stderr, log one warning, print once more."""
    for k in range(lines):
        print(f"out {i}.{k}")
    print(f"err {i}", file=sys.stderr)
    logging.getLogger("tests.chatty").warning("log %d", i)
    sys.stdout.write(f"last {i}\n")
    return i * i


def print_then_fail(text: str) -> None:
    print(text)
    raise ValueError(f"failed after printing {text!r}")


def print_then_crash(text: str, how: str) -> None:
    """Print ``text``, then end this process: ``exit`` (os._exit) or ``kill`` (SIGKILL)."""
    print(text)
    if how == "exit":
        os._exit(7)
    os.kill(os.getpid(), signal.SIGKILL)


def print_then_sleep(text: str, seconds: float) -> None:
    print(text)
    time.sleep(seconds)


def print_megabytes(mb: int) -> int:
    """Print ``mb`` MiB (lines of 1 KiB); return this process's peak resident set in KiB."""
    line = "x" * 1023
    for _ in range(mb * 1024):
        print(line)
    return peak_rss_kib()


def peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        for row in f:
            if row.startswith("VmHWM:"):
                return int(row.split()[1])
    return -1
