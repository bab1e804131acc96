"""Task functions and the named function of ``rtpool bench soak``, importable by workers.

Every task returns a value derived from its tag (a number unique in the run), so the harness
can tell a result that belongs to another task from the right one.
"""

from __future__ import annotations

import os
import time

import rtpool


def tagged(tag: int) -> int:
    """A no-op that returns its tag."""
    return tag


def tagged_sleep(tag: int, ms: float) -> int:
    """Sleeps ``ms`` milliseconds (a 10 ms task), then returns its tag."""
    time.sleep(ms / 1000)
    return tag


def tagged_blob(tag: int, size_bytes: int) -> bytes:
    """A ``size_bytes`` result (1 MiB in the soak) starting with the tag's 8 bytes."""
    head = tag.to_bytes(8, "little")
    return head + bytes(size_bytes - len(head))


def kept_value(tag: int) -> list:
    """A result kept on its worker (``keep=True``) for :func:`kept_sum` to read."""
    return [tag] * 1000


def kept_sum(values: list) -> int:
    """Reads a kept result, wherever it lives: ``1000 * tag``."""
    return sum(values)


def poison(tag: int) -> int:
    """Kills the worker process that runs it: every attempt dies, the task fails as poison."""
    os._exit(13)
    return tag  # pragma: no cover


@rtpool.remote("soak_add", version="1")
def soak_add(a: int, b: int) -> int:
    """soak_add adds two integers (the soak's grid-RPC call)."""
    return a + b


@rtpool.remote("powerloss_wait", version="1")
def powerloss_wait(flag: str, tag: int) -> int:
    """Returns ``tag`` once the file ``flag`` is gone (at most 120 s): the call of
    ``rtpool bench powerloss --calls``, which must still be running when the power goes."""
    end = time.monotonic() + 120.0
    while os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.01)
    return tag
