"""Named remote functions used by the tests: workers serve them with ``--serve tasks.rpc``.

Module-level, as every served function is (this directory is on the workers' PYTHONPATH).
The shape strings are in the annotations, as docs/rpc.md writes them; linters read such a
string as a forward reference, hence the ``noqa: F821``.
"""

import time

import numpy as np

from rtpool import Array, InOut, remote


@remote("add")
def add(a: int, b: int) -> int:
    """add returns a + b (version 1; tasks.rpc_v2 serves version 2)."""
    return a + b


@remote("scale")
def scale(n: int, x: InOut[Array[np.float64, "n"]], k: float) -> None:  # noqa: F821
    """scale multiplies x by k in place."""
    x *= k


@remote("noop")
def noop() -> None:
    """noop does nothing: the round trip of a call."""


@remote("fail")
def fail(msg: str) -> None:
    """fail raises ValueError(msg)."""
    raise ValueError(msg)


@remote("slow")
def slow(seconds: float) -> float:
    """slow sleeps for the given seconds (the call's body, not a test's wait) and returns them."""
    time.sleep(seconds)
    return seconds


@remote("shape_of")
def shape_of(n: int, m: int, A: Array[np.float64, "n, m"]) -> Array[np.int64, "2"]:  # noqa: F821
    """shape_of returns A's shape as an int64 array."""
    return np.array(A.shape, dtype=np.int64)
