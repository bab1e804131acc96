"""Tasks of tests/test_payload.py (importable by workers)."""

from __future__ import annotations

import time


def describe(arr):
    """What the worker got: (sum, owns its memory, writeable, address % 64)."""
    return (
        float(arr.sum()),
        bool(arr.flags.owndata),
        bool(arr.flags.writeable),
        arr.ctypes.data % 64,
    )


def echo(value):
    return value


def double(arr):
    return arr * 2


def boom(arr):
    raise ValueError(f"refused an array of {arr.nbytes} bytes")


def hold(arr, seconds):
    time.sleep(seconds)
    return arr.nbytes
