"""Package options: the one table that turns ``Client.options()`` keywords into the wire
``opts`` map of ``SUBMIT`` and ``CALL`` (``docs/protocol.md``).

:data:`OPTIONS` is the one list of them on the Python side: each row names the keyword users
write and the wire key once, with the kind of value (which gives the converter that checks a
value and turns it into its wire form, and the wire default, left out of the map), whether
calls of named functions take it, the option it needs, and its documentation
(``Client.options``'s docstring is built from it). Outside this module only ``_deps.py``
names options (``near`` and ``after``, which it sets, and ``max_attempts``). Every check
happens here, on the client, before anything is sent, so a bad value is a
``TypeError``/``ValueError`` naming the option rather than an ``ERROR rejected`` later.

A view keeps its options in wire form (defaults left out, spec order), computed once by
:func:`merge`; :func:`for_submission` gives the map of one submission. An absolute deadline (a
``datetime``) is the one value kept aside: it becomes milliseconds from now with this machine's
clock at each submission. :func:`has_deadline` tells the connection whether a submission's
tasks have a deadline (their futures then report their lateness). ``_protocol`` only encodes
the map.

Adding an option: one row below (in the position the protocol lists its key), the same line
in ``crates/rtpool-proto/src/options.rs``, and the code that honours it.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from typing import (
    Any,
    Callable,
    Dict,
    Literal,
    Mapping,
    NamedTuple,
    Tuple,
    TypedDict,
    Union,
)

from ._resources import check_labels, check_resources

__all__ = [
    "OPTIONS",
    "PackageOptions",
    "VALID_OPTIONS",
    "WIRE_DEFAULTS",
    "for_calls",
    "for_submission",
    "has_deadline",
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
    """One package option, from the ``options()`` keyword to the wire: a row of
    :data:`OPTIONS`, made by :func:`_option` or :func:`_internal`."""

    #: The keyword of ``Client.options()`` ("" for an option the SDK sets itself).
    name: str
    #: The key in the SUBMIT/CALL ``opts`` map.
    wire: str
    #: The wire value meaning "not set" (``convert(None)``); it is left out of the map.
    default: Any
    #: ``convert(value)``: the wire value of a user value (None: the default). Raises
    #: TypeError/ValueError naming the option.
    convert: Callable[[Any], Any]
    #: Whether calls of named functions take it: True, False (only its default), or the wire
    #: values they take.
    calls: Any
    #: Its entry in ``Client.options``'s docstring.
    doc: str
    #: The keyword of an option this one needs set when it is not at its default ("": none).
    needs: str = ""


# A kind of option: given the option's name, the converter of its values.
Kind = Callable[[str], Callable[[Any], Any]]


def _option(
    name: str, kind: Kind, doc: str, *, wire: str = "", calls: Any = True, needs: str = ""
) -> Option:
    """A user option: keyword ``name``, wire key ``wire`` (the keyword unless given)."""
    convert = kind(name)
    return Option(name, wire or name, convert(None), convert, calls, doc, needs)


def _internal(wire: str, kind: Kind, calls: Any = False) -> Option:
    """An option the SDK sets itself (no keyword, no doc)."""
    convert = kind(wire)
    return Option("", wire, convert(None), convert, calls, "")


def _int(lo: int, hi: int, none: int) -> Kind:
    """An int from ``lo`` to ``hi``; None is ``none``."""

    def kind(name: str) -> Callable[[Any], int]:
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

    return kind


def _bool(name: str) -> Callable[[Any], bool]:
    """True or False; None is False."""

    def convert(value: Any) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise TypeError(f"option {name!r} must be True or False, got {type(value).__name__}")
        return value

    return convert


def _choice(*words: str) -> Kind:
    """One of ``words`` (strings); None is the first."""

    def kind(name: str) -> Callable[[Any], str]:
        listed = " or ".join(repr(w) for w in words)

        def convert(value: Any) -> str:
            if value is None:
                return words[0]
            if not isinstance(value, str):
                raise TypeError(f"option {name!r} must be a str, got {type(value).__name__}")
            if value not in words:
                raise ValueError(f"option {name!r} must be {listed}, got {value!r}")
            return value

        return convert

    return kind


def _seconds_ms(name: str, value: Any, none: str, since: str = "", also: str = "") -> int:
    """Milliseconds (rounded up) of ``value``, a positive number of seconds. For the messages:
    ``none`` is what ``name=None`` means, ``since`` when the seconds count from, ``also`` what
    else the option takes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"option {name!r} must be a number of seconds{also}, got {type(value).__name__}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"option {name!r} must be a positive number of seconds{since}{also}, got {value!r} "
            f"(use {name}=None for {none})"
        )
    return _to_ms(name, value)


def _to_ms(name: str, seconds: float) -> int:
    ms = max(1, math.ceil(seconds * 1000))
    if ms > _U32_MAX:
        raise ValueError(
            f"option {name!r} must be at most {_U32_MAX // 1000} s away, got {seconds:g} s"
        )
    return ms


def _limit_ms(name: str) -> Callable[[Any], int]:
    """A positive number of seconds, sent as milliseconds (rounded up); None is 0: none."""

    def convert(value: Any) -> int:
        if value is None:
            return 0  # the wire default: no limit
        return _seconds_ms(name, value, "no limit")

    return convert


class _At(float):
    """An absolute deadline (``time.time()`` seconds): its wire value is computed from it at
    each submission, so it is kept aside from the wire map."""


def _due_ms(name: str) -> Callable[[Any], Any]:
    """Milliseconds from submission for seconds from submission; an :class:`_At` for a
    ``datetime``; None is 0: none."""

    def convert(value: Any) -> Any:
        if value is None:
            return 0  # the wire default: none
        if isinstance(value, _dt.datetime):
            at = value.timestamp()  # naive: local time, as datetime.now() gives it
            _to_ms(name, _until(at, value, name))  # in the past or too far: raise now
            return _At(at)
        return _seconds_ms(name, value, "none", " from submission", " or a datetime.datetime")

    return convert


def _until(at: float, shown: Any, name: str) -> float:
    left = at - time.time()
    if left <= 0:
        raise ValueError(f"option {name!r} is in the past: {shown} was {-left:.3f} s ago")
    return left


def _resource_map(name: str) -> Callable[[Any], Dict[str, int]]:
    """A ``{resource: count}`` dict (``_resources.check_resources``), sorted, zero counts left
    out (asking for none is not asking); None is {}."""

    def convert(value: Any) -> Dict[str, int]:
        if value is None:
            return {}
        checked = check_resources(value, f"option {name!r}")
        return {k: v for k, v in checked.items() if v}

    return convert


def _label_map(name: str) -> Callable[[Any], Dict[str, str]]:
    """A ``{key: value}`` dict of str (``_resources.check_labels``), sorted; None is {}."""

    def convert(value: Any) -> Dict[str, str]:
        return {} if value is None else check_labels(value, f"option {name!r}")

    return convert


def _drawn(name: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value is None:
            return ""
        raise TypeError("the idempotency key is drawn per package, not an option")

    return convert


#: The package options, in the order the protocol lists their wire keys: the one place an
#: option is declared on the Python side (``crates/rtpool-proto/src/options.rs`` declares the
#: wire keys for Rust; ``tests/test_options.py`` checks that the two lists agree).
OPTIONS: Tuple[Option, ...] = (
    _option(
        "priority",
        _int(*_I32, 0),
        "``priority`` (int, default 0): higher runs first. Within one priority users take "
        "turns, and each user's packages run earliest deadline first.",
    ),
    _option(
        "timeout",
        _limit_ms,
        "``timeout`` (seconds, default None: no limit): each task's execution time limit; a "
        "task past it is killed and its future raises :class:`~rtpool.errors.TaskTimeoutError`.",
        wire="timeout_ms",
    ),
    # A fresh random key per package (with_key), in its spec position.
    _internal("key", _drawn, calls=True),
    _option(
        "deadline",
        _due_ms,
        "``deadline`` (default None): every task's deadline, as seconds from submission (int "
        "or float > 0) or an absolute ``datetime.datetime`` (aware, or naive in local time), "
        "turned into milliseconds from now with this machine's clock at each submission "
        "(rounded up).",
        wire="deadline_ms",
    ),
    _option(
        "on_miss",
        _choice("run", "drop"),
        '``on_miss`` (``"run"``, default, or ``"drop"``): late tasks run anyway and report '
        "``future.lateness``, or are dropped and raise "
        ":class:`~rtpool.errors.DeadlineMissedError`.",
        calls=("run",),
        needs="deadline",
    ),
    _option(
        "admit",
        _bool,
        "``admit`` (bool, default False): admission control; the master refuses a package "
        "that cannot finish by its deadline and its futures raise "
        ":class:`~rtpool.errors.AdmissionError`. Needs ``deadline``.",
        calls=False,
        needs="deadline",
    ),
    _option(
        "replicas",
        _int(1, MAX_COPIES, 1),
        "``replicas`` (1 to 16, default 1): copies of each task, on distinct workers.",
        calls=False,
    ),
    _option(
        "quorum",
        _int(1, MAX_COPIES, 1),
        "``quorum`` (1 to ``replicas``, default 1): byte-equal results needed; copies that "
        "never agree raise :class:`~rtpool.errors.QuorumError`.",
        calls=False,
    ),
    _option(
        "max_copies",
        _int(0, MAX_COPIES, 0),
        "``max_copies`` (0 to 16, default 0: ``replicas + quorum``): most copies of one task "
        "ever started; at least ``replicas``.",
        calls=False,
    ),
    _option(
        "hedge",
        _bool,
        "``hedge`` (bool, default False): a straggling task gets one backup copy on another "
        "worker; the first result wins.",
        calls=False,
    ),
    _option(
        "max_attempts",
        _int(1, 255, 0),
        "``max_attempts`` (int 1-255, default None: the master's ``--max-attempts``): how many "
        "times a task may be attempted (run again after its worker was lost or crashed) "
        "before it fails with :class:`~rtpool.errors.PoisonTaskError`.",
    ),
    # The worker session holding a task's kept inputs (_deps.py sets it; docs/data.md).
    _internal("near", _int(0, 2**63 - 1, 0)),
    # The package and index of the task whose result is this task's input, held by the
    # master (_deps.py; docs/data.md).
    _internal("after", _int(0, 2**63 - 1, 0)),
    _internal("after_index", _int(0, 2**32 - 1, 0)),
    _option(
        "resources",
        _resource_map,
        "``resources`` (dict, default None: one slot only): what each task holds on its worker "
        'while it runs, e.g. ``{"gpu": 1, "mem_gb": 8}``; it runs only on a worker whose '
        "``--resources`` cover it, and a ``gpu`` task's process sees its own devices in "
        "``CUDA_VISIBLE_DEVICES`` (``docs/resources.md``).",
    ),
    _option(
        "labels",
        _label_map,
        "``labels`` (dict, default None): labels the worker must have, equal, e.g. "
        '``{"zone": "a"}`` (``rtpool worker --label zone=a``).',
    ),
    _option(
        "unschedulable",
        _choice("error", "wait"),
        '``unschedulable`` (``"error"``, default, or ``"wait"``): when no connected worker '
        "could ever run the request, its futures raise "
        ":class:`~rtpool.errors.UnschedulableError` at once, or the package waits for such a "
        "worker to join, with an :class:`~rtpool.errors.UnschedulableWarning`.",
    ),
)


class PackageOptions(TypedDict, total=False):
    """The keywords of ``Client.options()`` with their types, for type checkers and IDEs: the
    names of :data:`OPTIONS` (in the same order), then ``keep`` and ``keep_bytes``, which the
    client handles itself (``_submitter._keep_option``). None resets an option to its default.
    ``tests/test_typing.py`` checks that these names are those of :data:`OPTIONS`: an option
    added there is added here too."""

    priority: int | None
    timeout: float | None
    deadline: Union[float, _dt.datetime, None]
    on_miss: Literal["run", "drop"] | None
    admit: bool | None
    replicas: int | None
    quorum: int | None
    max_copies: int | None
    hedge: bool | None
    max_attempts: int | None
    resources: Mapping[str, int] | None
    labels: Mapping[str, str] | None
    unschedulable: Literal["error", "wait"] | None
    keep: bool | None
    keep_bytes: int | None


#: The ``options()`` keywords, in protocol order.
VALID_OPTIONS = tuple(o.name for o in OPTIONS if o.name)
#: Every wire key of the opts map with its default, in spec order.
WIRE_DEFAULTS: Dict[str, Any] = {o.wire: o.default for o in OPTIONS}
_BY_NAME = {o.name: o for o in OPTIONS if o.name}
# The wire keys written before "key".
_BEFORE_KEY = frozenset(list(WIRE_DEFAULTS)[: list(WIRE_DEFAULTS).index("key")])
# The deadline, whose value may be absolute (resolved at each submission), which other
# options may need, and whose presence makes futures report their lateness.
_DEADLINE = _BY_NAME["deadline"]
# Options that need another one set, each with the option it needs.
_NEEDS = tuple((o, _BY_NAME[o.needs]) for o in OPTIONS if o.needs)


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
        and the absolute deadline, if the deadline is one (then ``opts`` leaves it out).

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
        if option is _DEADLINE:
            deadline_at = float(wire) if isinstance(wire, _At) else None
            wire = option.default if deadline_at is not None else wire
        values[option.wire] = wire
    out = {
        w: values[w] for w, default in WIRE_DEFAULTS.items() if values.get(w, default) != default
    }
    _check_copies(out)
    _check_needs(out, deadline_at)
    return out, deadline_at


def _check_needs(opts: Dict[str, Any], deadline_at: float | None) -> None:
    for option, needed in _NEEDS:
        value = opts.get(option.wire, option.default)
        if value == option.default or needed.wire in opts:
            continue
        if needed is _DEADLINE and deadline_at is not None:
            continue
        what = f"{option.name!r}" if value is True else f"{option.name}={value!r}"
        raise ValueError(f"option {what} needs a {needed.name}: pass {needed.name}= too")


def _check_copies(opts: Dict[str, Any]) -> None:
    # The limits between the copy options (the core checks them again).
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


def for_submission(opts: Dict[str, Any], deadline_at: float | None) -> Dict[str, Any]:
    """The opts map of one submission: with an absolute deadline, the deadline from now.

    Raises:
        ValueError: The absolute deadline has passed.
    """
    if deadline_at is None:
        return opts
    name = _DEADLINE.name
    left = _until(deadline_at, _dt.datetime.fromtimestamp(deadline_at).isoformat(), name)
    values = {**opts, _DEADLINE.wire: _to_ms(name, left)}
    return {w: values[w] for w in WIRE_DEFAULTS if w in values}


def has_deadline(opts: Dict[str, Any]) -> bool:
    """Whether a submission's opts map (:func:`for_submission`) gives its tasks a deadline."""
    return _DEADLINE.wire in opts


def for_calls(opts: Dict[str, Any]) -> None:
    """Check that calls of named functions take these (wire form) options.

    Raises:
        ValueError: An option (or a value of one) that only shipped-code tasks take (the
            table's ``calls``); the message names it.
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
