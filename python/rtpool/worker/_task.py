"""A task as the worker queues it: named fields, built once where ``ASSIGN`` and
``ASSIGN_CALLS`` are decoded.

The wire entries are positional arrays (``docs/protocol.md``: ``Assignment``,
``CallAssignment``); everything after this module reads fields by name. A call of a named
function queues as a task whose ``function`` is its ``(name, version)`` and whose ``inputs``
are its dependencies' result blobs, so both kinds share the queue, the credits, the executor
and the result batching.

Every field of an entry is required, but for an ``ASSIGN`` entry's seventh, its inputs (only
a task the master held for another task's result has them: ``docs/data.md``), and its eighth,
``res``, the resources its package asks for (only with a request: ``docs/resources.md``); on
the link from a host's relay to its child (never from the master) a ninth follows, the device
ids the relay gave the task (``_devices.py``). An ``ASSIGN_CALLS`` entry has the same tail
one field later: ``keep`` eighth (when true or when ``res`` follows), ``res`` ninth, the
relay's device ids tenth. An entry of the wrong shape is a
:class:`~rtpool.errors.ProtocolError` that names the message and the fields.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Tuple

from .._kept import args_with_inputs
from ..errors import ProtocolError

_ASSIGNMENT_FIELDS = "task, attempt, fn_hash, fn_code, args, timeout_ms[, inputs[, res]]"
_CALL_FIELDS = "task, attempt, name, version, args, inputs, timeout_ms[, keep[, res]]"


class Task(NamedTuple):
    """One assigned task or call of a named function, queued on the worker."""

    #: The master's task id, opaque to the worker.
    task_id: int
    #: Attempt number, from 1.
    attempt: int
    #: A task's function hash (bytes), or a call's ``(name, version)``.
    function: Any
    #: ``perf_counter_ns()`` of when the assignment arrived (``wait_us`` starts there).
    received_ns: int
    #: A task's pickled ``(args, kwargs)``, or a call's msgpack argument payload.
    args: bytes
    #: Execution time limit in ms; 0 = none.
    timeout_ms: int
    #: A call's input blobs (its dependencies' results, in order); None for a task.
    inputs: List[bytes] | None
    #: A call whose result is kept here (an intermediate result of a transaction): it is
    #: answered with a reference (``docs/rpc.md``).
    keep: bool = False
    #: The resources the task holds while it runs (``ASSIGN``'s ``res``), or None.
    res: Dict[str, int] | None = None
    #: The device ids given to it by the host's relay (``CUDA_VISIBLE_DEVICES``), or None:
    #: this process picks them (``res`` asks for a GPU) or there are none.
    devices: Tuple[str, ...] | None = None

    @property
    def is_call(self) -> bool:
        """Whether this is a call of a named function (not a pickled task)."""
        return self.inputs is not None


# tuple.__new__ skips NamedTuple's Python-level __new__: this runs once per task.
_new = tuple.__new__


def queue_assignments(
    entries: List[list], codes: Dict[bytes, bytes], now: int, put: Callable[[Task], None]
) -> None:
    """Queue the tasks of an ``ASSIGN`` with ``put``; keep the function code it carries.

    Args:
        entries: ``ASSIGN``'s task entries, ``[task, attempt, fn_hash, fn_code|nil, args,
            timeout_ms]`` each, or with a seventh field, ``inputs``.
        codes: Function code by hash, updated with the code the entries carry.
        now: ``perf_counter_ns()`` of the receipt.
        put: Called with each task, in order.

    Raises:
        ProtocolError: An entry does not have six or seven fields.
    """
    try:
        for entry in entries:
            res = devices = None
            if len(entry) > 6:
                if len(entry) > 7:  # a package with a resource request (docs/resources.md)
                    res = entry[7]
                    if len(entry) == 9:  # from the host's relay: the task's devices
                        devices = tuple(entry[8])
                    elif len(entry) != 8 or not isinstance(res, dict):
                        raise ValueError
                    del entry[7:]
                # A task the master held: its producer's result comes along.
                task_id, attempt, fn_hash, fn_code, args, timeout_ms, inputs = entry
                if inputs or res is None:  # (with a request, [] stands for none)
                    args = args_with_inputs(args, inputs)
            else:
                task_id, attempt, fn_hash, fn_code, args, timeout_ms = entry
            if fn_code is not None:
                codes[fn_hash] = fn_code
            put(
                _new(
                    Task,
                    (task_id, attempt, fn_hash, now, args, timeout_ms, None, False, res, devices),
                )
            )
    except (TypeError, ValueError):
        raise _malformed("ASSIGN", entries, _ASSIGNMENT_FIELDS) from None


def queue_calls(entries: List[list], now: int, put: Callable[[Task], None]) -> None:
    """Queue the calls of an ``ASSIGN_CALLS`` with ``put``.

    Args:
        entries: ``ASSIGN_CALLS``'s entries, ``[task, attempt, name, version, args, inputs,
            timeout_ms]`` each, or with an eighth field, ``keep``, and a ninth, ``res``.
        now: ``perf_counter_ns()`` of the receipt.
        put: Called with each call, in order.

    Raises:
        ProtocolError: An entry does not have seven to nine fields.
    """
    try:
        for entry in entries:
            res = devices = None
            if len(entry) > 8:  # a package with a resource request (docs/resources.md)
                res = entry[8]
                if len(entry) == 10:  # from the host's relay: the call's devices
                    devices = tuple(entry[9])
                elif len(entry) != 9 or not isinstance(res, dict):
                    raise ValueError
                del entry[8:]
            keep = len(entry) == 8 and entry.pop() is True
            task_id, attempt, name, version, args, inputs, timeout_ms = entry
            task = (task_id, attempt, (name, version), now, args, timeout_ms, inputs, keep)
            put(_new(Task, (*task, res, devices)))
    except (TypeError, ValueError, AttributeError):
        raise _malformed("ASSIGN_CALLS", entries, _CALL_FIELDS) from None


def _malformed(kind: str, entries: Any, fields: str) -> ProtocolError:
    count = len(fields.split(","))
    # Bracketed trailing fields are optional, each within the one before.
    counts = tuple(range(count - fields.count("["), count + 1))
    bad = next(
        (e for e in (entries if isinstance(entries, list) else [entries]) if not _fits(e, counts)),
        entries,
    )
    return ProtocolError(
        f"malformed {kind} from the master: entry {bad!r:.100} is not [{fields}]; "
        "are the master and the worker the same rtpool version?"
    )


def _fits(entry: Any, counts: tuple) -> bool:
    return isinstance(entry, list) and len(entry) in counts
