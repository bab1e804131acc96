"""Task functions used by the tests: module-level, so workers can import them by name.

Workers started by the fixtures have this directory on their PYTHONPATH.
"""

from __future__ import annotations

import os
import time


def noop() -> None:
    return None


def square(x: int) -> int:
    return x * x


def add(a: int, b: int) -> int:
    return a + b


def echo(*args, **kwargs):
    """Return exactly what the function received."""
    return args, kwargs


def apply(fn, *args):
    """Call a function passed as an argument (a lambda exercises the cloudpickle fallback)."""
    return fn(*args)


def pid_of(x: int, seconds: float = 0.0):
    """Return ``(x, pid of the worker process)`` after sleeping ``seconds``."""
    if seconds:
        time.sleep(seconds)
    return x, os.getpid()


def slow_where_marked(x: int, seconds: float):
    """``(x, pid)`` after ``seconds``, or five times that on a worker started with
    ``RTPOOL_TEST_SLOW=1`` (a slow machine among fast ones)."""
    time.sleep(seconds * (5 if os.environ.get("RTPOOL_TEST_SLOW") else 1))
    return x, os.getpid()


def logged(x: int, path: str, seconds: float = 0.0):
    """Append ``x`` to the file at ``path`` (one line per execution), then return ``(x, pid)``."""
    with open(path, "a") as f:
        f.write(f"{x}\n")
    if seconds:
        time.sleep(seconds)
    return x, os.getpid()


def sleep_return(x, seconds: float):
    time.sleep(seconds)
    return x


class TaskError(ValueError):
    """A user-defined exception type that pickles normally."""


def fail(message: str):
    raise TaskError(message)


def fail_builtin(message: str):
    raise KeyError(message)


class UnpicklableError(Exception):
    """Its __init__ needs two arguments but passes one to Exception: unpickling it fails."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def fail_unpicklable(a, b):
    raise UnpicklableError(a, b)


def return_unpicklable():
    return lambda: None  # cloudpickle fallback makes this picklable after all


def return_generator():
    return (i for i in range(3))  # cannot be pickled at all
