"""Package options: the one table that turns ``Client.options()`` keywords into the wire
``opts`` map of ``SUBMIT`` and ``CALL`` (``docs/protocol.md``).

Each :class:`Option` names the keyword users write, the wire key, the wire default (left out of
the map), the converter that checks a value and turns it into its wire form, whether calls of
named functions take it, and its documentation (``Client.options``'s docstring is built from
it). Every check happens here, on the client, before anything is sent, so a bad value is a
``TypeError``/``ValueError`` naming the option rather than an ``ERROR rejected`` later.

A view keeps its options in wire form (defaults left out, spec order), computed once by
:func:`merge`; :func:`for_submission` gives the map of one submission. An absolute deadline (a
``datetime``) is the one value kept aside: it becomes ``deadline_ms`` with this machine's clock
at each submission. ``_protocol`` only encodes the map.

Adding an option: one :class:`Option` row below (in the position the protocol lists its key).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from typing import Any, Callable, Dict, NamedTuple, Tuple

__all__ = [
    "OPTIONS",
    "VALID_OPTIONS",
    "WIRE_DEFAULTS",
    "for_calls",
    "for_submission",
    "merge",
    "options_doc",
    "seconds_until",
    "with_key",
]

#: Most copies of one task (``replicas``, ``max_copies``), as the protocol allows.
MAX_COPIES = 16
_I32 = (-(2**31), 2**31 - 1)
_U32_MAX = 2**32 - 1
_urandom = os.urandom


class Option(NamedTuple):
    """One package option, from the ``options()`` keyword to the wire."""

    #: The keyword of ``Client.options()``.
    name: str
    #: The key in the SUBMIT/CALL ``opts`` map.
    wire: str
    #: The wire value meaning "not set"; it is left out of the map.
    default: Any
    #: ``convert(value)``: the wire value of a user value (None: the default). Raises
    #: TypeError/ValueError naming the option.
    convert: Callable[[Any], Any]
    #: Whether calls of named functions take it: True, False (only its default), or the wire
    #: values they take.
    calls: Any
    #: Its entry in ``Client.options``'s docstring.
    doc: str


def _int(name: str, lo: int, hi: int, none: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if value is None:
            return none
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"option {name!r} must be an int, got {type(value).__name__}")
        if not lo <= value <= hi:
            if (lo, hi) == _I32:
                raise ValueError(f"option {name!r} must fit in 32 bits, got {value}")
            raise ValueError(f"option {name!r} must be between {lo} and {hi}, got {value}")
        return value

    return convert


def _bool(name: str) -> Callable[[Any], bool]:
    def convert(value: Any) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise TypeError(f"option {name!r} must be True or False, got {type(value).__name__}")
        return value

    return convert


def _on_miss(value: Any) -> str:
    if value is None:
        return "run"
    if not isinstance(value, str):
        raise TypeError(f"option 'on_miss' must be a str, got {type(value).__name__}")
    if value not in ("run", "drop"):
        raise ValueError(f"option 'on_miss' must be 'run' or 'drop', got {value!r}")
    return value


def _seconds(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"option {name!r} must be {what}, got {type(value).__name__}")
    return value


def _to_ms(name: str, seconds: float) -> int:
    ms = max(1, math.ceil(seconds * 1000))
    if ms > _U32_MAX:
        raise ValueError(
            f"option {name!r} must be at most {_U32_MAX // 1000} s away, got {seconds:g} s"
        )
    return ms


def _timeout_ms(timeout: Any) -> int:
    if timeout is None:
        return 0  # the wire default: no limit
    _seconds("timeout", timeout, "a number of seconds")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(
            f"option 'timeout' must be a positive number of seconds, got {timeout!r} "
            "(use timeout=None for no limit)"
        )
    return _to_ms("timeout", timeout)


class _At(float):
    """An absolute deadline (``time.time()`` seconds): ``deadline_ms`` is computed from it at
    each submission, so it is kept aside from the wire map."""


def _deadline_ms(deadline: Any) -> Any:
    """``deadline_ms`` for seconds from submission; an :class:`_At` for a datetime."""
    if deadline is None:
        return 0  # the wire default: no deadline
    if isinstance(deadline, _dt.datetime):
        at = deadline.timestamp()  # naive: local time, as datetime.now() gives it
        _to_ms("deadline", _until(at, deadline))  # in the past or too far: raise now
        return _At(at)
    _seconds("deadline", deadline, "a number of seconds or a datetime.datetime")
    if not (math.isfinite(deadline) and deadline > 0):
        raise ValueError(
            f"option 'deadline' must be a positive number of seconds from submission or a "
            f"datetime.datetime, got {deadline!r} (use deadline=None for none)"
        )
    return _to_ms("deadline", deadline)


def _until(at: float, shown: Any) -> float:
    left = at - time.time()
    if left <= 0:
        raise ValueError(f"option 'deadline' is in the past: {shown} was {-left:.3f} s ago")
    return left


def _key(value: Any) -> str:
    raise TypeError("the idempotency key is drawn per package, not an option")


#: The package options, in the order the protocol lists their wire keys.
OPTIONS: Tuple[Option, ...] = (
    Option(
        name="priority",
        wire="priority",
        default=0,
        convert=_int("priority", *_I32, 0),
        calls=True,
        doc="``priority`` (int, default 0): higher runs first. Within one priority users take "
        "turns, and each user's packages run earliest deadline first.",
    ),
    Option(
        name="timeout",
        wire="timeout_ms",
        default=0,
        convert=_timeout_ms,
        calls=True,
        doc="``timeout`` (seconds, default None: no limit): each task's execution time limit; a "
        "task past it is killed and its future raises :class:`~rtpool.errors.TaskTimeoutError`.",
    ),
    # Not a user option: a fresh random key per package (with_key), in its spec position.
    Option(name="", wire="key", default="", convert=_key, calls=True, doc=""),
    Option(
        name="deadline",
        wire="deadline_ms",
        default=0,
        convert=_deadline_ms,
        calls=True,
        doc="``deadline`` (default None): every task's deadline, as seconds from submission (int "
        "or float > 0) or an absolute ``datetime.datetime`` (aware, or naive in local time), "
        "turned into milliseconds from now with this machine's clock at each submission "
        "(rounded up).",
    ),
    Option(
        name="on_miss",
        wire="on_miss",
        default="run",
        convert=_on_miss,
        calls=("run",),
        doc='``on_miss`` (``"run"``, default, or ``"drop"``): late tasks run anyway and report '
        "``future.lateness``, or are dropped and raise "
        ":class:`~rtpool.errors.DeadlineMissedError`.",
    ),
    Option(
        name="admit",
        wire="admit",
        default=False,
        convert=_bool("admit"),
        calls=False,
        doc="``admit`` (bool, default False): admission control; the master refuses a package "
        "that cannot finish by its deadline and its futures raise "
        ":class:`~rtpool.errors.AdmissionError`. Needs ``deadline``.",
    ),
    Option(
        name="replicas",
        wire="replicas",
        default=1,
        convert=_int("replicas", 1, MAX_COPIES, 1),
        calls=False,
        doc="``replicas`` (1 to 16, default 1): copies of each task, on distinct workers.",
    ),
    Option(
        name="quorum",
        wire="quorum",
        default=1,
        convert=_int("quorum", 1, MAX_COPIES, 1),
        calls=False,
        doc="``quorum`` (1 to ``replicas``, default 1): byte-equal results needed; copies that "
        "never agree raise :class:`~rtpool.errors.QuorumError`.",
    ),
    Option(
        name="max_copies",
        wire="max_copies",
        default=0,
        convert=_int("max_copies", 0, MAX_COPIES, 0),
        calls=False,
        doc="``max_copies`` (0 to 16, default 0: ``replicas + quorum``): most copies of one task "
        "ever started; at least ``replicas``.",
    ),
    Option(
        name="hedge",
        wire="hedge",
        default=False,
        convert=_bool("hedge"),
        calls=False,
        doc="``hedge`` (bool, default False): a straggling task gets one backup copy on another "
        "worker; the first result wins.",
    ),
    Option(
        name="max_attempts",
        wire="max_attempts",
        default=0,
        convert=_int("max_attempts", 1, 255, 0),
        calls=True,
        doc="``max_attempts`` (int 1-255, default None: the master's ``--max-attempts``): how many "
        "times a task may be attempted (run again after its worker was lost or crashed) "
        "before it fails with :class:`~rtpool.errors.PoisonTaskError`.",
    ),
    # Not a user option: the worker session holding a task's kept inputs (_deps.py sets it;
    # docs/data.md).
    Option(
        name="", wire="near", default=0, convert=_int("near", 0, 2**63 - 1, 0), calls=False, doc=""
    ),
    # Not user options either: the package and index of the task whose result is this task's
    # input, held by the master (_deps.py; docs/data.md).
    Option(
        name="",
        wire="after",
        default=0,
        convert=_int("after", 0, 2**63 - 1, 0),
        calls=False,
        doc="",
    ),
    Option(
        name="",
        wire="after_index",
        default=0,
        convert=_int("after_index", 0, 2**32 - 1, 0),
        calls=False,
        doc="",
    ),
)

#: The ``options()`` keywords, in protocol order.
VALID_OPTIONS = tuple(o.name for o in OPTIONS if o.name)
#: Every wire key of the opts map with its default, in spec order.
WIRE_DEFAULTS: Dict[str, Any] = {o.wire: o.default for o in OPTIONS}
_BY_NAME = {o.name: o for o in OPTIONS if o.name}
# The wire keys written before "key".
_BEFORE_KEY = frozenset(list(WIRE_DEFAULTS)[: list(WIRE_DEFAULTS).index("key")])


def merge(
    base: Dict[str, Any], base_deadline_at: float | None, new: Dict[str, Any]
) -> Tuple[Dict[str, Any], float | None]:
    """Validate ``options()`` keywords and merge them into a view's options.

    Args:
        base: The view's opts map in wire form.
        base_deadline_at: The view's absolute deadline (``time.time()`` seconds), or None.
        new: The keywords given to ``options()``; None resets one to its default.

    Returns:
        ``(opts, deadline_at)``: the merged map in wire form (defaults left out, spec order)
        and the absolute deadline, if the deadline is one (then ``opts`` has no
        ``deadline_ms``).

    Raises:
        TypeError: An unknown option (the message lists the valid ones) or a wrong type.
        ValueError: A value out of range, or options that contradict each other.
    """
    for name in new:
        if name not in _BY_NAME:
            raise TypeError(f"unknown option {name!r}; valid options: {', '.join(VALID_OPTIONS)}")
    values = dict(base)
    deadline_at = base_deadline_at
    for name, value in new.items():
        option = _BY_NAME[name]
        wire = option.convert(value)
        if option.wire == "deadline_ms":
            deadline_at = float(wire) if isinstance(wire, _At) else None
            wire = 0 if deadline_at is not None else wire
        values[option.wire] = wire
    out = {
        w: values[w] for w, default in WIRE_DEFAULTS.items() if values.get(w, default) != default
    }
    _check_together(out, deadline_at)
    return out, deadline_at


def _check_together(opts: Dict[str, Any], deadline_at: float | None) -> None:
    replicas = opts.get("replicas", 1)
    quorum = opts.get("quorum", 1)
    max_copies = opts.get("max_copies", 0)
    if quorum > replicas:
        raise ValueError(
            f"option 'quorum' ({quorum}) must be at most 'replicas' ({replicas}): a quorum of "
            f"{quorum} needs {quorum} copies of each task, pass replicas={quorum}"
        )
    if max_copies and max_copies < replicas:
        raise ValueError(
            f"option 'max_copies' ({max_copies}) must be at least 'replicas' ({replicas}), "
            "or 0 for the default (replicas + quorum)"
        )
    has_deadline = bool(opts.get("deadline_ms")) or deadline_at is not None
    if opts.get("admit") and not has_deadline:
        raise ValueError("option 'admit' needs a deadline: pass deadline= too")
    if opts.get("on_miss", "run") == "drop" and not has_deadline:
        raise ValueError("option on_miss='drop' needs a deadline: pass deadline= too")


def for_submission(opts: Dict[str, Any], deadline_at: float | None) -> Dict[str, Any]:
    """The opts map of one submission: with an absolute deadline, ``deadline_ms`` from now.

    Raises:
        ValueError: The absolute deadline has passed.
    """
    if deadline_at is None:
        return opts
    left = _until(deadline_at, _dt.datetime.fromtimestamp(deadline_at).isoformat())
    values = {**opts, "deadline_ms": _to_ms("deadline", left)}
    return {w: values[w] for w in WIRE_DEFAULTS if w in values}


def for_calls(opts: Dict[str, Any]) -> None:
    """Check that calls of named functions take these (wire form) options.

    Raises:
        ValueError: ``replicas``, ``quorum``, ``max_copies``, ``hedge``, ``admit`` or
            ``on_miss="drop"``: those are for shipped-code tasks.
    """
    for option in OPTIONS:
        if option.calls is True or option.wire not in opts:
            continue
        value = opts[option.wire]
        if option.calls is False or value not in option.calls:
            what = f"{option.name!r}" if option.calls is False else f"{option.name}={value!r}"
            raise ValueError(
                f"option {what} is for shipped-code tasks (submit, map); calls of named "
                "functions do not take it"
            )


def with_key(opts: Dict[str, Any]) -> Dict[str, Any]:
    """``opts`` with a fresh random idempotency ``key`` in its spec position.

    128 bits from ``os.urandom`` (as uuid4, at a fifth of its cost): a frame re-sent after a
    reconnection carries the same key, so it never makes a second package.
    """
    key = _urandom(16).hex()
    if opts.keys() <= _BEFORE_KEY:
        return {**opts, "key": key}  # the common case: "key" goes last
    out = {}
    for name, value in opts.items():
        if "key" not in out and name not in _BEFORE_KEY:
            out["key"] = key
        out[name] = value
    return out


def options_doc(indent: str) -> str:
    """The bullet list of the options for ``Client.options``'s docstring."""
    import textwrap

    lines = []
    for option in OPTIONS:
        if option.name:
            lines += textwrap.wrap(
                option.doc,
                width=92,
                initial_indent=indent + "* ",
                subsequent_indent=indent + "  ",
                break_on_hyphens=False,
            )
    return "\n".join(lines)


def seconds_until(deadline: Any, name: str = "deadline") -> float | None:
    """Seconds from now to ``deadline`` (seconds from now, or a ``datetime``), at least 0.

    None stays None (no deadline). A deadline that already passed gives 0.

    Raises:
        TypeError: ``deadline`` is neither a number nor a datetime.
        ValueError: ``deadline`` is NaN.
    """
    if deadline is None:
        return None
    if isinstance(deadline, _dt.datetime):
        return max(0.0, deadline.timestamp() - time.time())
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise TypeError(
            f"{name!r} must be a number of seconds or a datetime.datetime, "
            f"got {type(deadline).__name__}"
        )
    if math.isnan(deadline):
        raise ValueError(f"{name!r} must be a number of seconds, got nan")
    return max(0.0, float(deadline))
