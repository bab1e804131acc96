"""Decoding call values (``docs/rpc.md``, "Values"; the extension types are ``schema.py``'s):
argument payloads (worker), result and error payloads (client).

Copies: decoding a top-level array copies it once, out of the payload into a new writable,
aligned, native-order array the caller owns (``np.frombuffer(...).copy()``), except an
``In`` array of a shared-memory payload, which is a **read-only view** of the segment (no
copy; ``invocation.py`` copies an ``InOut`` one, it is written); an array nested in a list or
dict (an ``any`` value) takes one more copy through msgpack. A payload of up to
:data:`~rtpool.rpc.schema.FEED_BYTES` goes to msgpack's C decoder in one go; a larger one is
walked value by value, so a large array is never copied on the way.

numpy is imported only to decode an array: this module imports without it.
"""

from __future__ import annotations

import copy
import struct
from typing import Any

import msgpack

from .. import _shm
from ..errors import CallError
from .schema import EXT_ARRAY, EXT_REF, FEED_BYTES, Ref

__all__ = ["decode_args", "decode_error", "decode_list", "decode_results", "numpy_module", "owned"]

_NO_NUMPY = "this process has no numpy; it cannot decode array arguments"
# numpy dtypes by the dtype string of an ext 1 payload (checked once: no object dtypes).
_DTYPES: dict = {}
# Bytes taken by msgpack values of a fixed size, by their first byte.
_FIXED_SIZE = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9}
_FIXED_SIZE.update({0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9})
# str 8/16/32 and bin 8/16/32: the size of their length field.
_LENGTH_SIZE = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDB: 4, 0xC6: 4}
_FIXEXT_SIZE = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT_LENGTH_SIZE = {0xC7: 1, 0xC8: 2, 0xC9: 4}


def numpy_module() -> Any:
    """numpy, imported now if need be.

    Raises:
        CallError: This process has no numpy.
    """
    try:
        import numpy
    except ImportError:
        raise CallError(_NO_NUMPY) from None
    return numpy


def _array_from(payload: memoryview, copy: bool) -> Any:
    """Decode an ext 1 payload: a new writable array if ``copy``, else a read-only view."""
    n = payload[0]
    if n + 1 < len(payload):
        end = 2 + n + 8 * payload[1 + n]
        known = _HEADERS.get(bytes(payload[:end]))
        if known is not None and len(payload) - end == known[2]:
            # A header seen before (a call repeats its arrays' dtypes and shapes).
            dt, shape, nbytes = known
            arr = _np_module.frombuffer(payload, dtype=dt, offset=end).reshape(shape)
            return arr.copy() if copy else arr
    return _array_from_new(payload, copy)


def _array_from_new(payload: memoryview, copy: bool) -> Any:
    n = payload[0]
    raw_dtype = bytes(payload[1 : 1 + n])
    pos = 1 + n
    ndim = payload[pos]
    shape = struct.unpack_from(_SHAPES[ndim] if ndim < 8 else f"<{ndim}Q", payload, pos + 1)
    pos += 1 + 8 * ndim
    dt = _DTYPES.get(raw_dtype)
    if dt is None:
        try:
            np = numpy_module()
        except CallError:
            if ndim == 0 and raw_dtype == b"<c16" and len(payload) == pos + 16:
                # A complex scalar reaching a process without numpy.
                return complex(*struct.unpack_from("<dd", payload, pos))
            raise
        dt = np.dtype(raw_dtype.decode("ascii"))
        if dt.hasobject or dt.fields is not None or dt.kind == "V":
            raise CallError(
                f"an array of dtype {dt} cannot be received: object and structured dtypes are "
                "refused"
            )
        global _np_module
        _np_module = np
        if len(_DTYPES) < 64:
            _DTYPES[raw_dtype] = dt
    np = _np_module
    count = 1
    for dim in shape:
        count *= dim
    if count * dt.itemsize != len(payload) - pos:
        raise ValueError(
            f"an array of dtype {dt} and shape {shape} needs {count * dt.itemsize} bytes, its "
            f"payload has {len(payload) - pos}"
        )
    if count == 0:
        return np.empty(shape, dt.newbyteorder("="))
    if dt.isnative and len(_HEADERS) < 256:
        _HEADERS[bytes(payload[:pos])] = (dt, shape, count * dt.itemsize)
    arr = np.frombuffer(payload, dtype=dt, count=count, offset=pos).reshape(shape)
    if copy:
        return owned(arr)
    return arr


_SHAPES = [f"<{n}Q" for n in range(8)]
# (dtype, shape, data bytes) by the bytes of a valid ext 1 header of a native, non-empty array.
_HEADERS: dict = {}
_np_module: Any = None


def owned(arr: Any) -> Any:
    """A writable, aligned copy of ``arr`` in native byte order."""
    if arr.dtype.isnative:
        return arr.copy()  # a plain memcpy
    return arr.astype(arr.dtype.newbyteorder("="))


def _ref_from(payload: Any) -> Ref:
    value = msgpack.unpackb(payload)
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int for v in value)
        or value[0] < 0
        or value[1] < -1
    ):
        raise ValueError(f"a reference must be [input >= 0, output >= -1], got {value!r}")
    return Ref(value[0], value[1])


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_ARRAY:
        return _array_from(memoryview(data), copy=True)
    if code == EXT_REF:
        return _ref_from(data)
    raise ValueError(f"unknown msgpack extension type {code}")


def _unpack_opts() -> dict:
    return {"raw": False, "ext_hook": _ext_hook, "strict_map_key": False}


_UNPACK_OPTS = _unpack_opts()


def _ext_at(mv: memoryview, pos: int) -> Any:
    """``(code, start, end)`` of the ext value at ``pos``, or None if it is not an ext."""
    first = mv[pos]
    size = _FIXEXT_SIZE.get(first)
    if size is not None:
        start = pos + 2
    else:
        width = _EXT_LENGTH_SIZE.get(first)
        if width is None:
            return None
        size = int.from_bytes(mv[pos + 1 : pos + 1 + width], "big")
        start = pos + 2 + width
    code = struct.unpack_from("b", mv, start - 1)[0]
    if start + size > len(mv):
        raise ValueError("truncated payload")
    return code, start, start + size


def _scalar_end(mv: memoryview, pos: int) -> Any:
    """Where the value at ``pos`` ends if it is not a list, map or ext, else None."""
    first = mv[pos]
    if first < 0x80 or first >= 0xE0:
        return pos + 1
    if 0xA0 <= first < 0xC0:
        return pos + 1 + (first & 0x1F)
    size = _FIXED_SIZE.get(first)
    if size is not None:
        return pos + size
    width = _LENGTH_SIZE.get(first)
    if width is not None:
        return pos + 1 + width + int.from_bytes(mv[pos + 1 : pos + 1 + width], "big")
    return None


def _unpack_one(mv: memoryview, pos: int) -> tuple:
    """Decode the (list or map) value at ``pos``: ``(value, end)``. The payload is fed to
    msgpack in growing pieces, so what follows the value (a large array) is not copied."""
    unpacker = msgpack.Unpacker(max_buffer_size=0, **_unpack_opts())
    fed, step = pos, FEED_BYTES
    while True:
        if fed >= len(mv):
            raise ValueError("truncated payload")
        end = min(len(mv), fed + step)
        unpacker.feed(mv[fed:end])
        fed, step = end, step * 2
        try:
            value = unpacker.unpack()
        except msgpack.OutOfData:
            continue
        return value, pos + unpacker.tell()


def _decode_value(mv: memoryview, pos: int, copy: bool) -> tuple:
    if pos >= len(mv):
        raise ValueError("truncated payload")
    ext = _ext_at(mv, pos)
    if ext is not None:
        code, start, end = ext
        if code == EXT_ARRAY:
            return _array_from(mv[start:end], copy), end
        if code == EXT_REF:
            return _ref_from(mv[start:end]), end
        raise ValueError(f"unknown msgpack extension type {code}")
    end = _scalar_end(mv, pos)
    if end is None:
        return _unpack_one(mv, pos)
    if end > len(mv):
        raise ValueError("truncated payload")
    return msgpack.unpackb(mv[pos:end], raw=False), end


def decode_list(payload: Any, copy: bool = True) -> list:
    """The values of a payload (a msgpack list, or a shared-memory envelope of one).

    Args:
        copy: Arrays as new writable arrays (else read-only views of the payload; those of a
            shared-memory payload always are).

    Raises:
        CallError: The payload is corrupt (or holds arrays and this process has no numpy).
    """
    if payload and payload[0] == _shm.SHM_TAG:  # never a msgpack list's first byte
        try:
            payload = _shm.read_joined(memoryview(payload))[0]
        except (OSError, ValueError, struct.error) as exc:
            raise CallError(f"cannot read the call's shared-memory payload: {exc}") from None
        # Arrays are read-only views of the mapping (no copy): the segment stays lent until
        # they are gone; invoke() copies the InOut ones, which the function writes.
        return decode_list(payload, False)
    if copy and len(payload) <= FEED_BYTES:
        # Small: msgpack's C decoder in one go (the walker below avoids copying large arrays).
        # A bad payload goes on to the walker, whose messages say what is wrong.
        try:
            values = msgpack.unpackb(payload, **_UNPACK_OPTS)
        except CallError:
            raise
        except Exception:
            values = None
        if isinstance(values, list):
            return values
    mv = memoryview(payload).cast("B") if not isinstance(payload, bytes) else memoryview(payload)
    try:
        first = mv[0]
        if 0x90 <= first <= 0x9F:
            n, pos = first & 0x0F, 1
        elif first == 0xDC:
            n, pos = int.from_bytes(mv[1:3], "big"), 3
        elif first == 0xDD:
            n, pos = int.from_bytes(mv[1:5], "big"), 5
        else:
            raise ValueError("the payload is not a msgpack list")
        values = []
        for _ in range(n):
            value, pos = _decode_value(mv, pos, copy)
            values.append(value)
        if pos != len(mv):
            raise ValueError(f"{len(mv) - pos} bytes past the end of the list")
    except CallError:
        raise
    except Exception as exc:
        raise CallError(f"corrupt call payload: {exc}") from None
    return values


def decode_results(payload: bytes) -> list:
    """The outputs of a result payload, arrays as new writable arrays.

    Raises:
        CallError: The payload is not a valid result list (or holds arrays and this process has
            no numpy).
    """
    return decode_list(payload)


def decode_args(payload: bytes, inputs: list) -> list:
    """The values of an argument payload, with each :class:`Ref` replaced by what it names.

    Args:
        payload: The argument payload.
        inputs: The result payloads of the call's dependencies (``ASSIGN_CALLS`` ``inputs``);
            each is decoded at most once.

    Raises:
        CallError: A corrupt payload, or a reference to an input or output that does not exist.
    """
    values = decode_list(payload)
    decoded: dict = {}
    used: set = set()
    for i, value in enumerate(values):
        if type(value) is not Ref:
            continue
        if not 0 <= value.input < len(inputs):
            raise CallError(
                f"argument {i} refers to input {value.input}, but the call has {len(inputs)}"
            )
        results = decoded.get(value.input)
        if results is None:
            results = decoded[value.input] = decode_results(inputs[value.input])
        if value.output == -1:
            resolved: Any = results
        elif value.output < len(results):
            resolved = results[value.output]
        else:
            raise CallError(
                f"argument {i} refers to output {value.output} of input {value.input}, which "
                f"has {len(results)}"
            )
        if value.input in used:
            # Two arguments from one input must not share an array a function may modify.
            resolved = copy.deepcopy(resolved)
        used.add(value.input)
        values[i] = resolved
    return values


def decode_error(data: bytes) -> dict:
    """The ``{"type", "message", "traceback"}`` of an error payload (strings). An unreadable
    payload gives a message saying so rather than raising."""
    try:
        report = msgpack.unpackb(data, raw=False)
        return {key: str(report[key]) for key in ("type", "message", "traceback")}
    except Exception as exc:
        return {
            "type": "",
            "message": f"the call's error report is unreadable: {exc}",
            "traceback": "",
        }
