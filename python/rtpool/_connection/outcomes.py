"""What a task's ``TaskResult`` status means on the client: the exception of each status other
than ok (0), error (1) and cancelled (2), and the copies of a task whose quorum failed."""

from __future__ import annotations

from typing import Any

from .. import _protocol as P
from .._output import split as split_output
from .._serialize import error_from_report, loads_result
from ..errors import (
    DeadlineMissedError,
    PoisonTaskError,
    ProtocolError,
    QuorumError,
    QuotaExceededError,
    TaskFailed,
    TaskTimeoutError,
)

__all__ = ["task_error"]


def task_error(status: int, data: bytes) -> BaseException:
    """The exception of a task that ended with a status other than ok/error/cancelled."""
    if status == P.STATUS_DISAGREE:
        return _quorum_error(data)
    data = split_output(data)[1]  # (its output, if any, is the caller's)
    message = bytes(data).decode("utf-8", "replace")
    if status == P.STATUS_TIMEOUT:
        return TaskTimeoutError(f"the task ran past its timeout: {message}", "", message)
    if status == P.STATUS_LOST:
        # The master's message says it already ("poison task: its worker was lost ...").
        text = message if message.startswith("poison task") else f"poison task: {message}"
        return PoisonTaskError(text, "", message)
    if status == P.STATUS_QUOTA:
        return QuotaExceededError(f"the user's quota ran out before the task ran: {message}")
    if status == P.STATUS_MISSED:
        return DeadlineMissedError(
            f"the task could not make its deadline and was dropped (on_miss='drop'): {message}",
            "",
            message,
        )
    return TaskFailed(f"the master could not run the task: {message}", "", message)


def _quorum_error(data: bytes) -> QuorumError:
    """The :class:`QuorumError` of a task with status 8, every copy's result attached."""
    try:
        message, copies = P.decode_disagreement(data)
    except ProtocolError as exc:
        return QuorumError(
            f"the task's copies did not reach a quorum, and the master's report of them "
            f"cannot be read: {exc}"
        )
    results = [(worker, status, _copy_value(status, data)) for worker, status, data in copies]
    return QuorumError(
        f"the task's {len(results)} copies did not reach a quorum: {message}", results
    )


def _copy_value(status: int, data: bytes) -> Any:
    """One copy's value in a :class:`QuorumError`: what its future would have given."""
    if status == P.STATUS_OK:
        try:
            return loads_result(data)
        except Exception as exc:
            return TaskFailed(f"the copy's result cannot be unpickled on the client: {exc!r}")
    if status == P.STATUS_ERROR:
        return error_from_report(data)
    return bytes(data).decode("utf-8", "replace")
