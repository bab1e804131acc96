"""Parameters of named remote functions (grid RPC, ``docs/rpc.md``, "Interface"): a
:class:`Param` is one parameter or the return value, with its mode, type, dtype and shape,
and this module checks one, in Python and in its wire form. The whole interface, built from
them, is ``interface.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .annotations import MODE_NAMES
from .shape import normalize_shape, parse_shape

__all__ = [
    "MAX_INTERFACE_BYTES",
    "MODES",
    "Param",
    "TYPES",
    "check_name_version",
    "check_param",
    "param_from_dict",
    "param_text",
]

#: Parameter modes, as they appear on the wire.
MODES = ("in", "out", "inout")
#: Value types, as they appear on the wire.
TYPES = ("int", "float", "complex", "bool", "str", "bytes", "any", "array")

# Sizes the wire format allows (docs/protocol.md, SERVE).
_MAX_NAME_BYTES = 128
_MAX_VERSION_BYTES = 64
MAX_INTERFACE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Param:
    """One parameter (or the return value, named ``"return"``) of an interface.

    Attributes:
        name: The parameter's name.
        mode: ``"in"``, ``"out"`` or ``"inout"`` (the return value is ``"out"``).
        type: ``"int" "float" "complex" "bool" "str" "bytes" "any"`` or ``"array"``.
        dtype: numpy's name of the element type for an array, else None.
        shape: The shape expression for an array (``"n, n"``), None for any shape (and for
            scalars).
    """

    name: str
    mode: str = "in"
    type: str = "any"
    dtype: str | None = None
    shape: str | None = None

    @property
    def is_array(self) -> bool:
        return self.type == "array"

    def type_text(self) -> str:
        """``int``, ``float64[n, n]``, ``float64[...]`` (any shape)."""
        if self.type != "array":
            return self.type
        if self.shape is None:
            return f"{self.dtype}[...]"
        return f"{self.dtype}[{self.shape}]"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "mode": self.mode,
            "type": self.type,
            "dtype": self.dtype,
            "shape": self.shape,
        }


def param_text(p: Param) -> str:
    prefix = "" if p.name == "return" else f"{p.name}: "
    if p.type != "array":
        return prefix + p.type
    return f"{prefix}{MODE_NAMES[p.mode]}[{p.type_text()}]"


def check_param(fname: str, p: Param) -> None:
    where = "the return value" if p.name == "return" else f"parameter {p.name}"
    if not isinstance(p.name, str) or not p.name.isidentifier():
        raise TypeError(f"{fname}: parameter name {p.name!r} is not an identifier")
    if p.mode not in MODES:
        raise TypeError(f"{fname}: {where} has mode {p.mode!r}, not one of {MODES}")
    if p.type not in TYPES:
        raise TypeError(f"{fname}: {where} has type {p.type!r}, not one of {TYPES}")
    if p.type != "array":
        if p.dtype is not None or p.shape is not None:
            raise TypeError(f"{fname}: {where} is a scalar with a dtype or shape")
        if p.mode != "in" and p.name != "return":
            raise TypeError(
                f"{fname}: {where} is {MODE_NAMES[p.mode]}[{p.type}]: only arrays can be "
                f"{MODE_NAMES[p.mode]} (return a scalar instead)"
            )
        return
    if not isinstance(p.dtype, str) or not p.dtype:
        raise TypeError(f"{fname}: {where} is an array without a dtype")
    determined = False
    if p.shape is not None:
        if not isinstance(p.shape, str):
            raise TypeError(f"{fname}: {where} has a shape that is not a string: {p.shape!r}")
        try:
            determined = parse_shape(p.shape).is_determined
        except ValueError as exc:
            raise TypeError(f"{fname}: {where} has an invalid shape {p.shape!r}: {exc}") from None
    if p.mode == "out" and p.name != "return" and not determined:
        raise TypeError(
            f"{fname}: {where} is Out[{p.type_text()}]: an Out array needs a fully determined "
            "shape (no '*', not Array[dtype] alone) for the worker to allocate it"
        )


def param_from_dict(name: Any, d: dict, mode: str | None = None) -> Param:
    fields = {"name": name, "mode": d["mode"] if mode is None else mode}
    fields.update(type=d["type"], dtype=d["dtype"], shape=d["shape"])
    for key, value in fields.items():
        if not (isinstance(value, str) or (value is None and key in ("dtype", "shape"))):
            raise TypeError(f"{key} of a param must be a string, got {value!r}")
    if fields["shape"] is not None and normalize_shape(fields["shape"]) != fields["shape"]:
        raise ValueError(f"shape {fields['shape']!r} is not normalized")
    return Param(**fields)


def check_name_version(name: Any, version: Any) -> None:
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= _MAX_NAME_BYTES:
        raise TypeError(f"a function name is a string of 1 to 128 bytes, got {name!r}")
    if not isinstance(version, str) or len(version.encode()) > _MAX_VERSION_BYTES:
        raise TypeError(f'a version is a string of at most 64 bytes (like "1"), got {version!r}')
