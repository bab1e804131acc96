"""Value checks shared by interfaces and the call codec (grid RPC, ``docs/rpc.md``): whether a
scalar is an acceptable ``int``/``float``/... argument, whether msgpack can carry a value, and
numpy lookups that never import numpy first (a worker without numpy can serve scalar
functions).
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

__all__ = ["dtype_matches", "loaded_numpy", "scalar_problem", "unsendable"]

_INT64_MIN = -(1 << 63)
_UINT64_MAX = (1 << 64) - 1


_DTYPES: dict = {}


def loaded_numpy() -> Any:
    """numpy if this process imports it, else None (never imports it first). A plain
    ``sys.modules`` lookup could return a module another thread is still initializing; the
    ``import`` statement waits for that import to finish."""
    if sys.modules.get("numpy") is None:  # absent, or blocked (None)
        return None
    import numpy

    return numpy


def dtype_matches(dtype: Any, name: str) -> bool:
    """``dtype`` is the numpy dtype named ``name`` (any byte order). The common case, the
    native dtype object itself, is an identity test; ``dtype.name`` is slow."""
    want = _DTYPES.get(name)
    if want is None:
        np = loaded_numpy()
        want = _DTYPES[name] = np.dtype(name)
    return dtype is want or dtype == want or dtype.name == name


# --- scalar checks -------------------------------------------------------------------------


def scalar_problem(type_name: str, value: Any) -> str | None:
    """Why ``value`` is not an acceptable ``type_name`` scalar (``"has type str, expected
    int"``), or None if it is."""
    t = type(value)
    if type_name == "int":
        if t is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
            if not _INT64_MIN <= int(value) <= _UINT64_MAX:
                return f"is {int(value)}, out of the 64-bit integer range"
            return None
    elif type_name == "float":
        if t is float or t is int or _is_real(value):
            return None
    elif type_name == "complex":
        if t is complex or t is float or t is int or _is_number(value):
            return None
    elif type_name == "bool":
        if t is bool or _is_numpy_bool(value):
            return None
    elif type_name == "str":
        if isinstance(value, str):
            return None
    elif type_name == "bytes":
        if isinstance(value, (bytes, bytearray)):
            return None
    elif type_name == "any":
        bad = unsendable(value, 0)
        if bad is None:
            return None
        return (
            f"contains a {bad}, which cannot be sent (a value is None, bool, int, float, "
            "complex, str, bytes, a list, tuple or dict of those, or a numpy array)"
        )
    else:
        return f"has type {t.__name__}, and the interface's type {type_name!r} is unknown"
    return f"has type {t.__name__}, expected {type_name}"


def _is_numpy_bool(value: Any) -> bool:
    np = loaded_numpy()
    return np is not None and isinstance(value, np.bool_)


def _is_real(value: Any) -> bool:
    # int (not bool), float, numpy integers and floats
    if isinstance(value, bool) or _is_numpy_bool(value):
        return False
    return isinstance(value, numbers.Real) and _is_plain_number(value)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or _is_numpy_bool(value):
        return False
    return isinstance(value, numbers.Number) and _is_plain_number(value)


def _is_plain_number(value: Any) -> bool:
    # numbers.Real also covers Fraction and user classes msgpack cannot send: keep builtins and
    # numpy scalars.
    if isinstance(value, (int, float, complex)):
        return True
    np = loaded_numpy()
    return np is not None and isinstance(value, np.number)


def unsendable(value: Any, depth: int) -> str | None:
    """The type name of the first part of ``value`` msgpack cannot carry, or None."""
    if depth > 100:
        return "structure nested deeper than 100 levels"
    if value is None or isinstance(value, (bool, str, bytes, bytearray, float, complex)):
        return None
    if isinstance(value, int):
        ok = _INT64_MIN <= value <= _UINT64_MAX
        return None if ok else "int out of the 64-bit range"
    if isinstance(value, (list, tuple)):
        for item in value:
            bad = unsendable(item, depth + 1)
            if bad is not None:
                return bad
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            bad = unsendable(k, depth + 1) or unsendable(v, depth + 1)
            if bad is not None:
                return bad
        return None
    np = loaded_numpy()
    if np is not None:
        if isinstance(value, np.ndarray):
            return None if value.dtype.kind not in "OV" else f"array of dtype {value.dtype}"
        if isinstance(value, np.generic) and value.dtype.kind in "biufc":
            return None
    return type(value).__name__
