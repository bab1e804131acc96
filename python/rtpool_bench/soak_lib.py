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
