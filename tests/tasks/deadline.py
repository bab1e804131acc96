"""Task functions of the deadline, hedging and quorum tests: module-level, so workers can
import them by name (workers started by the fixtures and LocalCluster have this directory on
their PYTHONPATH).

Each reads an environment variable that the test sets on one worker only
(``LocalCluster(worker_env=...)``) to make that worker misbehave.
"""

from __future__ import annotations

import os
import time

#: A worker with this set to 1 lies: :func:`square_or_lie` returns a wrong value there.
LIE_ENV = "RTPOOL_TEST_LIE"
#: A worker with this set to N is N times slower in :func:`sleep_scaled`.
SLOW_ENV = "RTPOOL_TEST_SLOW"


def env_of(name: str):
    """``(value of the environment variable name, or None; pid)`` of the worker process."""
    return os.environ.get(name), os.getpid()


def square_or_lie(x: int) -> int:
    """``x * x``, or ``x * x + 1`` on a worker started with ``RTPOOL_TEST_LIE=1``."""
    return x * x + (1 if os.environ.get(LIE_ENV) == "1" else 0)


def sleep_scaled(x, seconds: float):
    """Sleep ``seconds`` (times ``$RTPOOL_TEST_SLOW`` on a slow worker); return ``(x, pid)``."""
    time.sleep(seconds * float(os.environ.get(SLOW_ENV) or 1))
    return x, os.getpid()
