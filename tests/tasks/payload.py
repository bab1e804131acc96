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


def flip_first(data: bytes) -> bytes:
    """``data`` with its first byte 0xFF: a new ``bytes`` (its argument's length)."""
    return b"\xff" + data[1:]


def heap_page_faults(nbytes: int, rounds: int = 4) -> list:
    """``(pid, page faults of each round)`` of building and dropping 2.5 x ``nbytes`` of
    ``bytes`` (what a task with large arguments and results does to the worker's heap)."""
    import os
    import resource

    faults = []
    for i in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = bytes([i]) * nbytes
        b = bytes([i + 1]) * nbytes
        c = bytes([i + 2]) * (nbytes // 2)
        del a, b, c
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return os.getpid(), faults


def length(data) -> int:
    return len(data)


def holds_argument_copies() -> bool:
    """Whether this worker thread still holds the ``bytes`` copies of an earlier task's
    shared-memory arguments (noted for ``_shm.refer``)."""
    from rtpool import _shm

    return bool(getattr(_shm._local, "made", None))


def double(arr):
    return arr * 2


def copy(arr):
    return arr.copy()


def tail(arr):
    """The second half of the argument: a view of it, not a copy."""
    return arr[len(arr) // 2 :]


def boom(arr):
    raise ValueError(f"refused an array of {arr.nbytes} bytes")


def hold(arr, seconds):
    time.sleep(seconds)
    return arr.nbytes


_stash = []


def owner():
    """This worker child's shared-memory owner tag (its segments are named after it)."""
    from rtpool import _shm

    return _shm.owner()


def stash(arr):
    """Keep the argument (a view of the client's segment) past the task."""
    _stash.append(arr)
    return len(_stash)


def stashed():
    """(min, max) of every array kept by :func:`stash`, in order."""
    return [(float(a.min()), float(a.max())) for a in _stash]


def unstash():
    _stash.clear()
    return 0
