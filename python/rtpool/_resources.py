"""Resources and labels (issue 26, ``docs/resources.md``): the names and values both sides
accept, checked here once for the client's ``options(resources=, labels=)`` and the worker's
``--resources``/``--label``.

A resource name (and a label key) is ``[a-z][a-z0-9_]{0,31}``; a resource value a non-negative
integer below 2**64; a label value a string of at most 128 UTF-8 bytes; at most 32 of each.
Maps go on the wire with their keys sorted (bytewise), as ``docs/protocol.md`` says, so
:func:`check_resources` and :func:`check_labels` return sorted dicts (msgpack keeps a dict's
order).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Mapping

__all__ = [
    "MAX_ENTRIES",
    "MAX_LABEL_VALUE_BYTES",
    "check_labels",
    "check_resources",
    "class_name",
    "parse_labels",
    "parse_resources",
]

#: Most resources (and most labels) of one worker or request.
MAX_ENTRIES = 32
#: Longest label value, in UTF-8 bytes.
MAX_LABEL_VALUE_BYTES = 128
_U64_MAX = 2**64 - 1
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_NAME_RULE = "a lowercase letter, then up to 31 lowercase letters, digits or '_'"


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} {name!r} must be a str, got {type(name).__name__}")
    if not _NAME.match(name):
        raise ValueError(f"{what} {name!r} is not a valid name: use {_NAME_RULE}")
    return name


def check_resources(values: Any, what: str = "resources") -> Dict[str, int]:
    """A resource map checked and sorted by name.

    Args:
        values: ``{name: count}``.
        what: How the messages name the map (``"option 'resources'"``, ``"--resources"``).

    Raises:
        TypeError: Not a mapping, a name that is not a str, a count that is not an int.
        ValueError: A bad name, a negative or too large count, too many entries.
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"{what} must be a dict of resource name to count, e.g. {{'gpu': 1}}, "
            f"got {type(values).__name__}"
        )
    if len(values) > MAX_ENTRIES:
        raise ValueError(f"{what} has {len(values)} resources; at most {MAX_ENTRIES} are allowed")
    out: Dict[str, int] = {}
    for name in sorted(values, key=lambda n: n.encode() if isinstance(n, str) else b""):
        _check_name(f"{what}: resource", name)
        count = values[name]
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(
                f"{what}: resource {name!r} must be a whole number, got {type(count).__name__} "
                f"{count!r}"
            )
        if not 0 <= count <= _U64_MAX:
            raise ValueError(f"{what}: resource {name!r} must be 0 or more, got {count}")
        out[name] = count
    return out


def check_labels(values: Any, what: str = "labels") -> Dict[str, str]:
    """A label map checked and sorted by key.

    Raises:
        TypeError: Not a mapping, or a key or value that is not a str.
        ValueError: A bad key, a value past 128 UTF-8 bytes, too many entries.
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"{what} must be a dict of label key to value, e.g. {{'zone': 'a'}}, "
            f"got {type(values).__name__}"
        )
    if len(values) > MAX_ENTRIES:
        raise ValueError(f"{what} has {len(values)} labels; at most {MAX_ENTRIES} are allowed")
    out: Dict[str, str] = {}
    for key in sorted(values, key=lambda k: k.encode() if isinstance(k, str) else b""):
        _check_name(f"{what}: label", key)
        value = values[key]
        if not isinstance(value, str):
            raise TypeError(
                f"{what}: label {key!r} must have a str value, got {type(value).__name__}"
            )
        if len(value.encode()) > MAX_LABEL_VALUE_BYTES:
            raise ValueError(
                f"{what}: label {key!r} has a value of {len(value.encode())} bytes; at most "
                f"{MAX_LABEL_VALUE_BYTES} UTF-8 bytes are allowed"
            )
        out[key] = value
    return out


def parse_resources(texts: Iterable[str], what: str = "--resources") -> Dict[str, int]:
    """``["gpu=2,mem_gb=64", "license_x=1"]`` -> ``{"gpu": 2, "license_x": 1, "mem_gb": 64}``.

    A name given twice is an error (which value was meant?).

    Raises:
        ValueError: An entry that is not ``name=count``, a bad name or count, a repeat.
    """
    out: Dict[str, int] = {}
    for text in texts:
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            name, eq, count = entry.partition("=")
            name, count = name.strip(), count.strip()
            if not eq or not count.isdigit():
                raise ValueError(
                    f"{what}: {entry!r} is not NAME=COUNT (a whole number 0 or more), e.g. "
                    "--resources gpu=2,mem_gb=64"
                )
            if name in out:
                raise ValueError(f"{what}: resource {name!r} is given twice")
            out[name] = int(count)
    return check_resources(out, what)


def parse_labels(texts: Iterable[str], what: str = "--label") -> Dict[str, str]:
    """``["zone=a", "cuda=12.4"]`` -> ``{"cuda": "12.4", "zone": "a"}``.

    Raises:
        ValueError: An entry that is not ``key=value``, a bad key or value, a repeat.
    """
    out: Dict[str, str] = {}
    for text in texts:
        key, eq, value = text.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"{what}: {text!r} is not KEY=VALUE, e.g. --label zone=a")
        if key in out:
            raise ValueError(f"{what}: label {key!r} is given twice")
        out[key] = value
    return check_labels(out, what)


def class_name(resources: Mapping[str, int], labels: Mapping[str, str]) -> str:
    """A request's class as one short string: ``gpu=1,zone=a`` (``default`` for none), as
    ``/metrics`` names it."""
    parts = [f"{k}={v}" for k, v in sorted(resources.items())]
    parts += [f"{k}={v}" for k, v in sorted(labels.items())]
    return ",".join(parts) or "default"
