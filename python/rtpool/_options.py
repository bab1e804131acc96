"""Package options: validation of ``Client.options()`` keywords and their wire form.

Every check happens here, on the client, before anything is sent, so a bad value is a
``TypeError``/``ValueError`` naming the option rather than an ``ERROR rejected`` later. The
result is the ``SUBMIT`` opts map in wire form (``_protocol.submit_opts``: defaults left out,
spec order), computed once per view. An absolute deadline (a ``datetime``) is the exception:
it is kept aside and turned into ``deadline_ms`` with this machine's clock at each submission
(:func:`resolve`).
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from typing import Any, Dict, Tuple

from ._protocol import submit_opts

__all__ = ["VALID_OPTIONS", "check_options", "resolve", "seconds_until"]

#: The options ``Client.options()`` accepts, in protocol order.
VALID_OPTIONS = (
    "priority",
    "timeout",
    "deadline",
    "on_miss",
    "admit",
    "replicas",
    "quorum",
    "max_copies",
    "hedge",
)
#: Most copies of one task (``replicas``, ``max_copies``), as the protocol allows.
MAX_COPIES = 16
_ON_MISS = ("run", "drop")
_I32 = (-(2**31), 2**31 - 1)
_U32_MAX = 2**32 - 1


def check_options(
    base: Dict[str, Any], base_deadline_at: float | None, new: Dict[str, Any]
) -> Tuple[Dict[str, Any], float | None]:
    """Validate ``options()`` keywords and merge them into a view's options.

    Args:
        base: The view's SUBMIT opts in wire form.
        base_deadline_at: The view's absolute deadline (``time.time()`` seconds), or None.
        new: The keywords given to ``options()``.

    Returns:
        ``(opts, deadline_at)``: the merged opts in wire form and the absolute deadline, if
        the deadline is one (then ``opts`` has no ``deadline_ms``).

    Raises:
        TypeError: An unknown option (the message lists the valid ones) or a wrong type.
        ValueError: A value out of range, or options that contradict each other.
    """
    for key in new:
        if key not in VALID_OPTIONS:
            raise TypeError(f"unknown option {key!r}; valid options: {', '.join(VALID_OPTIONS)}")
    out = dict(base)
    deadline_at = base_deadline_at
    if "priority" in new:
        out["priority"] = _int_option("priority", new["priority"], *_I32, 0)
    if "timeout" in new:
        out["timeout_ms"] = _timeout_ms(new["timeout"])
    if "deadline" in new:
        out["deadline_ms"], deadline_at = _deadline(new["deadline"])
    if "on_miss" in new:
        out["on_miss"] = _on_miss(new["on_miss"])
    for key in ("admit", "hedge"):
        if key in new:
            out[key] = _bool_option(key, new[key])
    if "replicas" in new:
        out["replicas"] = _int_option("replicas", new["replicas"], 1, MAX_COPIES, 1)
    if "quorum" in new:
        out["quorum"] = _int_option("quorum", new["quorum"], 1, MAX_COPIES, 1)
    if "max_copies" in new:
        out["max_copies"] = _int_option("max_copies", new["max_copies"], 0, MAX_COPIES, 0)
    _check_together(out, deadline_at)
    return submit_opts(out), deadline_at


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


def _int_option(name: str, value: Any, lo: int, hi: int, none: int | None = None) -> int:
    if value is None and none is not None:
        return none
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"option {name!r} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        if (lo, hi) == _I32:
            raise ValueError(f"option {name!r} must fit in 32 bits, got {value}")
        raise ValueError(f"option {name!r} must be between {lo} and {hi}, got {value}")
    return value


def _bool_option(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise TypeError(f"option {name!r} must be True or False, got {type(value).__name__}")
    return value


def _on_miss(value: Any) -> str:
    if value is None:
        return "run"
    if not isinstance(value, str):
        raise TypeError(f"option 'on_miss' must be a str, got {type(value).__name__}")
    if value not in _ON_MISS:
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


def _deadline(deadline: Any) -> Tuple[int, float | None]:
    """``(deadline_ms, None)`` for seconds from submission, ``(0, at)`` for a datetime."""
    if deadline is None:
        return 0, None  # the wire default: no deadline
    if isinstance(deadline, _dt.datetime):
        at = deadline.timestamp()  # naive: local time, as datetime.now() gives it
        _to_ms("deadline", _until(at, deadline))  # in the past or too far: raise now
        return 0, at
    _seconds("deadline", deadline, "a number of seconds or a datetime.datetime")
    if not (math.isfinite(deadline) and deadline > 0):
        raise ValueError(
            f"option 'deadline' must be a positive number of seconds from submission or a "
            f"datetime.datetime, got {deadline!r} (use deadline=None for none)"
        )
    return _to_ms("deadline", deadline), None


def _until(at: float, shown: Any) -> float:
    left = at - time.time()
    if left <= 0:
        raise ValueError(f"option 'deadline' is in the past: {shown} was {-left:.3f} s ago")
    return left


def resolve(opts: Dict[str, Any], deadline_at: float | None) -> Dict[str, Any]:
    """The opts of one submission: with an absolute deadline, ``deadline_ms`` from now.

    Raises:
        ValueError: The absolute deadline has passed.
    """
    if deadline_at is None:
        return opts
    left = _until(deadline_at, _dt.datetime.fromtimestamp(deadline_at).isoformat())
    return submit_opts({**opts, "deadline_ms": _to_ms("deadline", left)})


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
