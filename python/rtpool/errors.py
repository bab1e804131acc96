"""Exceptions raised by rtpool.

Every error rtpool raises itself derives from :class:`RtpoolError`, so ``except RtpoolError``
catches them all. A task that raises is different: its future re-raises the task's own
exception (with the remote traceback as ``__cause__``), as ``concurrent.futures`` does for a
process pool; only when that exception cannot be rebuilt on the client is it a
:class:`TaskFailed`. Cancelled tasks raise ``concurrent.futures.CancelledError`` and timeouts
``TimeoutError``, as the Executor interface promises; a task killed past its ``timeout``
option raises :class:`TaskTimeoutError`, and one dropped at its deadline
:class:`DeadlineMissedError`; both are ``TimeoutError`` too. See
``docs/reliability.md`` for which error means what.
"""

from __future__ import annotations

import re

__all__ = [
    "AdmissionError",
    "AuthenticationError",
    "CallError",
    "ConnectError",
    "ConnectionLost",
    "DeadlineMissedError",
    "DependencyFailed",
    "KeptResultLost",
    "MasterBusy",
    "NotFetchedError",
    "OverloadWarning",
    "PoisonTaskError",
    "ProtocolError",
    "QuorumError",
    "QuotaExceeded",
    "QuotaExceededError",
    "RemoteTraceback",
    "ResultsLost",
    "RtpoolError",
    "ServeError",
    "SubmitRejected",
    "TaskFailed",
    "TaskTimeoutError",
    "UnknownDependencyError",
    "UnknownFunctionError",
    "UnschedulableError",
    "UnschedulableWarning",
]


_ATTEMPTS = re.compile(r"(\d+) attempts?")


class RtpoolError(Exception):
    """Base class of every error raised by rtpool itself."""


class ConnectError(RtpoolError):
    """The master could not be reached (refused, unresolvable, timed out, closed early)."""


class MasterBusy(ConnectError):
    """The master answered ``busy`` (its connection limits are reached) to every attempt for
    as long as the connection was retried; the message carries the master's reason."""


class AuthenticationError(RtpoolError):
    """The master refused the token (wrong token, or the token of the other role)."""


class ConnectionLost(RtpoolError):
    """The connection to the master broke and could not be re-established (or reconnection is
    off: ``reconnect_timeout=0``); pending tasks of that connection failed with it."""


class ResultsLost(ConnectionLost):
    """After a reconnect, the master no longer knew a package: its results are gone.

    The package stayed detached longer than the master's result TTL (``--result-ttl``), or the
    master restarted without the package in its store. Its unfinished tasks fail with this
    error; resubmit them.
    """


class ProtocolError(RtpoolError):
    """A peer sent bytes that do not follow the rtpool wire protocol (or a frame too large)."""


class SubmitRejected(RtpoolError):
    """The master refused a package (bad option, empty package, ...); nothing of it ran."""


class CallError(RtpoolError, TypeError):
    """A call of a named remote function does not match the function's interface.

    Raised before anything is sent: the wrong number of arguments, a scalar of the wrong type,
    an array of the wrong dtype or shape (``docs/rpc.md``). The message names the function, the
    argument, what was expected and what was given, e.g. ``dmmul: argument B has shape (8, 9),
    expected (n, n) = (8, 8)``. A worker raises it too for a call payload it cannot decode or
    that does not match the interface it serves. It is also a builtin ``TypeError``, as a local
    call with the wrong arguments would raise.
    """


class UnknownFunctionError(RtpoolError, LookupError):
    """No worker serves the named function (or the requested version of it).

    The message names the function and lists what is served. It is also a builtin
    ``LookupError``.
    """


class NotFetchedError(RtpoolError):
    """The outputs of a transaction's call were not sent to the client.

    An intermediate call (one that later calls of the transaction use) keeps its outputs on
    the master unless it was made with ``tx.call(..., fetch=True)``; its future then raises
    this from ``result()`` once the call succeeded (and the call's own error if it failed).
    """


class KeptResultLost(RtpoolError):
    """A result kept on its worker (``options(keep=True)``) can no longer be read: the worker
    process that held it is gone, or evicted it past its bound (``rtpool worker --keep-mb``).

    The client re-runs the task that made it (lineage) up to the package's ``max_attempts``
    before it raises this. ``key`` is the lost value's 16-byte key.
    """

    def __init__(self, message: str, key: bytes = b"") -> None:
        super().__init__(message, key)
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])


class DependencyFailed(RtpoolError):
    """A task that took another task's future as an argument could not run: that task failed
    or was cancelled (its exception is the ``__cause__``)."""


class UnknownDependencyError(SubmitRejected):
    """The master could not hold a task for the task whose result it takes (package option
    ``after``): that task's result was already delivered and acknowledged, or it is not this
    user's. The client then waits for the result itself and sends the task with it
    (``docs/data.md``); users see it only from a master that refuses the option."""


class ServeError(RtpoolError):
    """A ``--serve`` module cannot be served: it does not import, it marks no function, or
    two modules serve the same name and version. The message names the module."""


class TaskFailed(RtpoolError):
    """A task could not produce a result the client can use.

    Raised for a task that raised an exception which could not be unpickled on the client (the
    remote type name, message and traceback are kept as attributes), and for a task the system
    could not run at all (status ``failed``).

    Attributes:
        type_name: Qualified name of the remote exception type (``"mod.Class"``), or ``""``.
        remote_message: ``str()`` of the remote exception, or the master's message.
        remote_traceback: The formatted remote traceback, or ``""``.
    """

    def __init__(
        self,
        message: str,
        type_name: str = "",
        remote_message: str = "",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (
            type(self),
            (self.args[0], self.type_name, self.remote_message, self.remote_traceback),
        )


class RemoteTraceback(Exception):
    """Carries the formatted traceback of a task that raised on a worker.

    rtpool sets it as ``__cause__`` of the re-raised exception, so a traceback printed on the
    client shows where the task failed on the worker (as ``ProcessPoolExecutor`` does).
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


class TaskTimeoutError(TaskFailed, TimeoutError):
    """The task ran longer than its ``timeout`` option and was stopped (status ``timeout``).

    It is also a builtin ``TimeoutError``, so ``except TimeoutError`` catches it along with a
    ``Future.result(timeout)`` that ran out.
    """


class PoisonTaskError(TaskFailed):
    """The task's worker was lost on each of its attempts (status ``lost``): a poison task.

    The master stops retrying a task whose worker died (or lost its lease) ``--max-attempts``
    times, so one task that crashes its worker cannot take down the pool.

    Attributes:
        attempts: The number of attempts the master's message names, or None.
    """

    def __init__(
        self,
        message: str,
        type_name: str = "",
        remote_message: str = "",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message, type_name, remote_message, remote_traceback)
        found = _ATTEMPTS.search(remote_message)
        self.attempts: int | None = int(found.group(1)) if found else None


class QuotaExceededError(TaskFailed):
    """The user's compute-time quota is used up.

    Raised by the futures of a package the master refused for that reason (``ERROR quota``:
    nothing of it ran; the connection stays usable) and by a task whose quota ran out before
    it ran (status ``quota``).
    """


#: The former name of :class:`QuotaExceededError`.
QuotaExceeded = QuotaExceededError


class AdmissionError(SubmitRejected):
    """Admission control refused a package (``options(admit=True)``, ``ERROR admission``).

    By the master's running estimate of the function's execution time, the work queued and
    running ahead of it and the worker slots, the package's last task could not finish by its
    deadline. Nothing of it ran and the connection stays usable; the message states the
    estimate and the shortfall. Every future of the package raises it, and so does
    ``Package.id``.
    """


class OverloadWarning(RuntimeWarning):
    """The master accepted a package with a deadline while it is overloaded: deadlines are
    being missed because more work is offered than its workers can do (the master's
    ``--overload-miss-ratio`` of the deadline results of its ``--overload-window`` missed while
    tasks waited in the queue). The package will likely miss its deadline too.

    A warning, not an error: the package runs. Issued (through :mod:`warnings`, and logged on
    the ``rtpool.client`` logger) at most once per 10 s per client; ``Client.overload_notices``
    counts every notice. To be refused at once instead, submit with ``admit=True``; to have
    late tasks dropped, ``on_miss="drop"``; or add workers.
    """


class UnschedulableError(SubmitRejected):
    """No connected worker could ever run the package (``ERROR unschedulable``): it asks for
    more of a resource than any worker has (``options(resources=...)``), or for labels no
    worker carries (``options(labels=...)``).

    Nothing of it ran and the connection stays usable; the message names the resource or
    label and the most any connected worker has. Add a worker that has it (``rtpool worker
    --resources gpu=4``, ``--label zone=a``), or submit with ``unschedulable="wait"`` to
    queue the package until one joins (``docs/resources.md``).
    """


class UnschedulableWarning(RuntimeWarning):
    """The master accepted a package that no connected worker can run yet
    (``options(unschedulable="wait")``): it waits until a matching worker joins, and ``rtpool
    status`` shows its class as unschedulable. Issued through :mod:`warnings` (and logged on
    the ``rtpool.client`` logger) once per package, with the master's words on what is
    missing."""


class QueueLimitError(SubmitRejected):
    """The package would take its user past a per-user bound of the master (``ERROR
    queue_limit``): too many tasks queued or running (``--max-queued-tasks-per-user``) or too
    many argument bytes held by them (``--max-queued-mb-per-user``).

    Nothing of the package ran and the connection stays usable; the message names the limit,
    the user's current use and what the package would add. Wait for earlier packages to
    finish (or submit smaller ones) and submit again.
    """


class DeadlineMissedError(TaskFailed, TimeoutError):
    """The task could not make its deadline and was dropped (status ``missed``).

    Only with ``options(deadline=..., on_miss="drop")``: a queued task that its function's
    estimate says cannot finish in time is not started, and at the deadline every unfinished
    task fails with this error (running ones are stopped on their workers). It is also a
    builtin ``TimeoutError``. With ``on_miss="run"`` (the default) late tasks run anyway and
    report their lateness in ``future.lateness`` instead.
    """


class QuorumError(TaskFailed):
    """The copies of a task never agreed (status ``disagree``; ``options(quorum=...)``).

    The master ran up to ``max_copies`` copies of the task on distinct workers, and fewer than
    ``quorum`` of their results were byte-equal.

    Attributes:
        results: One ``(worker, status, value)`` per copy: the worker's name, the copy's
            status code (0 ok, 1 error, ...) and its value: the unpickled return value for
            status 0, the exception the copy raised for status 1 (as ``future.result()``
            would raise it), otherwise the master's message (``str``).
    """

    def __init__(self, message: str, results: list | None = None) -> None:
        super().__init__(message, "", message, "")
        self.results: list = list(results or ())

    def __reduce__(self):
        return (type(self), (self.args[0], self.results))
