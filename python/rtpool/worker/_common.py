"""What every part of the worker shares: exit codes, the exception that ends a session, the
log call (``_logging.py`` writes the lines), the parent-death signal, and the size estimates
of ``RESULT`` frames."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from ._logging import ensure_configured, logger

EXIT_OK = 0
#: The child cannot start: bad address, bad token. Restarting would not help.
EXIT_CONFIG = 2
#: The connection to the master dropped and could not be restored within
#: ``--reconnect-timeout`` (or reconnection is off).
EXIT_LOST = 3
#: The child retired itself: a task it cannot interrupt ran past what the master allows (the
#: master aborted it). The parent starts a fresh child at once, without backoff.
EXIT_RETIRED = 4

#: Most tasks a worker process queues ahead by default (``--prefetch``); the prefetch adapts
#: below that.
DEFAULT_PREFETCH = 64

# Bytes of a RESULT frame besides the data (prefix, headers, ids, times), and per result.
RESULT_FRAME_OVERHEAD = 64
RESULT_OVERHEAD = 64

perf_ns = time.perf_counter_ns


def log(message: str, level: int = logging.INFO) -> None:
    """One record of the worker's log (the ``rtpool.worker`` logger): a line on stderr with
    the time, the level and the process id, unless ``--log-level`` filters it out."""
    if not logger.handlers:
        ensure_configured()
    logger.log(level, message)


class Stop(Exception):
    """The connection is unusable; carries the exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except Exception:
        pass


def describe_exit(status: int) -> str:
    """A ``waitpid`` status as words: ``killed by signal 9 (SIGKILL)``, ``exited with code 3``."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
