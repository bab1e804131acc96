"""The log lines of a worker child's failed tasks: task id, function, what went wrong; at most
one a second per function and kind of failure, with a count of those held back, so a package
of a million failing tasks does not flood the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import _protocol as P
from .._ratelimit import LogLimiter, suppressed_note
from ._common import log
from ._task import Task

__all__ = ["FailureLog"]

# Failed-task lines: at most one per function and kind of failure per this many seconds.
_FAILURE_LOG_WINDOW_S = 1.0
_STATUS_WORDS = {
    P.STATUS_FAILED: "failed",
    P.STATUS_TIMEOUT: "timed out",
    P.STATUS_INPUT_LOST: "input lost (the master makes it again)",
}


def _failure_kind(status: int, data: bytes, is_call: bool) -> str:
    """The exception type a failed task raised, or the status and the worker's reason."""
    if status == P.STATUS_ERROR:
        try:  # the report this worker just built: a pickled dict, a msgpack map for a call
            if is_call:
                import msgpack

                return str(msgpack.unpackb(data, raw=False)["type"])
            import pickle

            return str(pickle.loads(data)["type"])
        except Exception:
            return "an error (its report cannot be read here)"
    name = _STATUS_WORDS.get(status, f"status {status}")
    if status == P.STATUS_INPUT_LOST:
        data = data[4:]  # after the input's position
    reason = bytes(data[:200]).decode("utf-8", "replace")
    return f"{name}: {reason}"


class FailureLog:
    """The rate-limited log of the tasks that did not succeed on one worker child."""

    def __init__(self) -> None:
        self._limiter = LogLimiter(_FAILURE_LOG_WINDOW_S)

    def task_failed(self, t: Task, status: int, data: bytes, functions: Any) -> None:
        """One line for task ``t``, which ended with ``status`` and ``data`` (``functions``:
        the worker's loaded functions by hash, for the name of a shipped-code task's)."""
        if t.is_call:
            name, version = t.function
            what = f"{name} version {version}"
        else:
            fn = functions.get(t.function)
            what = getattr(fn, "__qualname__", None) or f"function {t.function.hex()[:12]}"
        kind = _failure_kind(status, data, t.is_call)
        key = (what, status, kind if status == P.STATUS_ERROR else None)
        held = self._limiter.check(key, time.monotonic())
        if held is not None:
            log(
                f"task {t.task_id} (attempt {t.attempt}) of {what} failed: {kind}"
                + suppressed_note(held, _FAILURE_LOG_WINDOW_S),
                logging.WARNING,
            )
