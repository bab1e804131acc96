"""Named functions for the end-to-end call tests (``tests/test_rpc.py``): transaction graphs
whose nodes report when they ran, a failing node, a call that tells which process ran it.

Served with ``--serve tasks.rpc_e2e`` (this directory is on the workers' PYTHONPATH).
"""

import os
import time

import numpy as np

from rtpool import Array, remote

Vector = Array[np.float64, "n"]
#: [start, end] wall-clock seconds of a call, then a checksum of its input.
Span = Array[np.float64, "3"]
Spans = Array[np.float64, "6"]


@remote("seed")
def seed(n: int) -> Vector:
    """seed returns [0, 1, ..., n - 1] as float64."""
    return np.arange(n, dtype=np.float64)


@remote("timed")
def timed(n: int, x: Vector, seconds: float) -> Span:
    """timed sleeps, then returns [start, end, sum(x)] (wall-clock start and end)."""
    start = time.time()
    time.sleep(seconds)
    return np.array([start, time.time(), x.sum()])


@remote("join")
def join(p: Span, q: Span) -> Spans:
    """join returns p and q end to end."""
    return np.concatenate([p, q])


@remote("boom")
def boom(n: int, x: Vector) -> Vector:
    """boom raises RuntimeError: a failing node of a graph."""
    raise RuntimeError(f"boom on {n} values")


@remote("pid_after")
def pid_after(path: str, seconds: float) -> int:
    """pid_after writes this process's PID to path, sleeps, and returns the PID."""
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, path)  # the reader never sees a partial file
    time.sleep(seconds)
    return os.getpid()


@remote("writable")
def writable(n: int, x: Vector) -> int:
    """writable tells whether the worker's In array x can be written (1) or is a view (0)."""
    return int(x.flags.writeable)


@remote("seed_logged")
def seed_logged(n: int, log: str) -> Vector:
    """seed_logged appends this process's PID to log (a line per run), returns [0, ..., n-1]."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return np.arange(n, dtype=np.float64)


@remote("gate")
def gate(path: str, seconds: float) -> Span:
    """gate waits until path exists (at most seconds), then returns [start, end, 0]."""
    start, deadline = time.time(), time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return np.array([start, time.time(), 0.0])


@remote("total_after")
def total_after(n: int, x: Vector, g: Span) -> Span:
    """total_after returns [g's start, g's end, sum(x)]: it runs after the gate g."""
    return np.array([g[0], g[1], x.sum()])


@remote("double_logged")
def double_logged(n: int, x: Vector, log: str) -> Vector:
    """double_logged appends this process's PID to log (a line per run), returns 2 * x."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return 2 * x
