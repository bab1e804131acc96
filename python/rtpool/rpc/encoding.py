"""Encoding call values (``docs/rpc.md``, "Values"; the extension types are ``schema.py``'s):
argument payloads (client), result and error payloads (worker).

Copies: encoding copies an array's bytes once, straight into the payload (an array under
64 KiB twice, ``tobytes()`` then the join: cheaper than a view at that size; plus one more
for a non-contiguous or big-endian array, made contiguous little-endian first); when the
client's workers share its host, an argument payload of 256 KiB or more is that copy, into a
shared-memory segment (``rtpool._shm``).

numpy is never imported here: an array to encode comes from a process that has it.
"""

from __future__ import annotations

import struct
import traceback
from typing import Any

import msgpack

from .. import _shm
from .._frame import Payload
from ..errors import CallError
from .schema import EXT_ARRAY, EXT_REF, Ref
from .values import loaded_numpy

__all__ = ["encode_args", "encode_error", "encode_results"]

_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
# ext 1 headers (msgpack ext header + our array header) by (dtype.str, shape): a call repeats
# its arrays' sizes, and building the header is most of encoding a small array.
_ARRAY_HEADERS: dict = {}
# Arrays below this size are copied into the payload with tobytes() (one small copy is
# cheaper than a view); larger ones are joined from a view of their data.
_SMALL_ARRAY_BYTES = 64 * 1024


def _ext_header(code: int, size: int) -> bytes:
    # The smallest msgpack ext form, as msgpack's own packer picks it.
    fixed = _FIXEXT.get(size)
    if fixed is not None:
        return struct.pack(">Bb", fixed, code)
    if size < 1 << 8:
        return struct.pack(">BBb", 0xC7, size, code)
    if size < 1 << 16:
        return struct.pack(">BHb", 0xC8, size, code)
    if size < 1 << 32:
        return struct.pack(">BIb", 0xC9, size, code)
    raise CallError(f"a value of {size} bytes is too large for a call (4 GiB at most)")


def _list_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return struct.pack(">BH", 0xDC, n)
    return struct.pack(">BI", 0xDD, n)


def _array_parts(arr: Any) -> tuple:
    """``(ext 1 payload header, array data)``: the data as a contiguous little-endian uint8
    view (no copy when the array already is one)."""
    np = loaded_numpy()
    arr = np.asarray(arr)  # a subclass (np.matrix) travels as its plain array
    dt = arr.dtype
    if dt.hasobject or dt.fields is not None or dt.kind == "V":
        raise CallError(
            f"an array of dtype {dt} cannot be sent: object and structured dtypes are refused"
        )
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
        arr = arr.astype(dt)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    dtype_str = dt.str.encode("ascii")
    header = (
        bytes([len(dtype_str)])
        + dtype_str
        + bytes([arr.ndim])
        + struct.pack(f"<{arr.ndim}Q", *arr.shape)
    )
    return header, arr.reshape(-1).view(np.uint8)


def _as_bytes(arr: Any) -> Any:
    """A C-contiguous array's data as a flat uint8 view (no copy)."""
    return arr.reshape(-1).view(loaded_numpy().uint8)


def _array_ext(arr: Any) -> msgpack.ExtType:
    header, data = _array_parts(arr)
    return msgpack.ExtType(EXT_ARRAY, header + data.tobytes())


def _complex_ext(value: complex) -> msgpack.ExtType:
    # A 0-d complex128 array, built without numpy.
    return msgpack.ExtType(EXT_ARRAY, b"\x04<c16\x00" + struct.pack("<dd", value.real, value.imag))


def _ref_ext(ref: Ref) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_REF, msgpack.packb([ref.input, ref.output]))


def _default(obj: Any) -> Any:
    # strict_types: subclasses of the builtin types come here too (np.float64, a NamedTuple),
    # so a Ref is not packed as a plain list.
    if type(obj) is Ref:
        return _ref_ext(obj)
    np = loaded_numpy()
    if np is not None:
        if isinstance(obj, np.ndarray):
            return _array_ext(obj)
        if isinstance(obj, np.generic) and obj.dtype.kind in "biufc":
            obj = obj.item()
            return _complex_ext(obj) if isinstance(obj, complex) else obj
    if isinstance(obj, complex):
        return _complex_ext(obj)
    if isinstance(obj, bool):
        return bool(obj)
    for base in (int, float, str, bytes, dict):
        if isinstance(obj, base):
            return base(obj)
    if isinstance(obj, (tuple, list)):
        return list(obj)
    raise TypeError(f"cannot send a {type(obj).__name__} (not a msgpack value)")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, strict_types=True, default=_default)


def _encode_list(values: list) -> bytes:
    return b"".join(_encode_chunks(values))


def _encode_chunks(values: list) -> list:
    """The msgpack list of ``values`` as pieces to join (arrays as views of their data)."""
    np = loaded_numpy()
    chunks: list = [_list_header(len(values))]
    for value in values:
        if np is not None and isinstance(value, np.ndarray):
            key = (value.dtype, value.shape)
            header = _ARRAY_HEADERS.get(key) if value.flags.c_contiguous else None
            if header is not None:  # (only native little-endian dtypes are cached)
                chunks.append(header)
                # A small array's bytes at once (a view costs more to make and to join).
                n = value.nbytes
                chunks.append(value.tobytes() if n < _SMALL_ARRAY_BYTES else _as_bytes(value))
                continue
            header, data = _array_parts(value)
            header = _ext_header(EXT_ARRAY, len(header) + data.nbytes) + header
            if value.flags.c_contiguous and value.dtype.byteorder != ">":
                if len(_ARRAY_HEADERS) >= 1024:
                    _ARRAY_HEADERS.clear()
                _ARRAY_HEADERS[key] = header
            chunks.append(header)
            chunks.append(data)  # joined without an intermediate copy
        else:
            chunks.append(_pack(value))
    return chunks


def encode_args(values: list, shm_owner: str | None = None) -> Any:
    """An argument payload: the msgpack list of a call's ``In`` and ``InOut`` values
    (:attr:`BoundCall.values`); :class:`Ref` values become ext 2.

    Args:
        shm_owner: The client's shared-memory owner tag when its workers share its host: a
            payload of ``SHM_MIN_BYTES`` or more is then written (once, from the arrays
            themselves) into a shared-memory segment, and the result is a
            :class:`~rtpool._frame.Payload` of its envelope whose ``shm`` names the segment,
            which the caller releases when the call is done.

    Raises:
        CallError: A value cannot be sent (an object array, a value msgpack cannot carry).
    """
    try:
        chunks = _encode_chunks(values)
    except (TypeError, OverflowError, ValueError) as exc:
        raise CallError(f"cannot encode the call's arguments: {exc}") from None
    if shm_owner and sum(len(c) for c in chunks) >= _shm.SHM_MIN_BYTES:
        envelope, name = _shm.write_joined(chunks, shm_owner)
        return Payload((envelope,), len(envelope), name)
    return b"".join(chunks)


def encode_results(outputs: list) -> bytes:
    """A result payload (status 0): the msgpack list of a call's outputs.

    Raises:
        CallError: An output cannot be sent.
    """
    try:
        return _encode_list(outputs)
    except (TypeError, OverflowError, ValueError) as exc:
        raise CallError(f"cannot encode the call's results: {exc}") from None


def encode_error(exc: BaseException) -> bytes:
    """An error payload (status 1): msgpack ``{"type", "message", "traceback"}``."""
    cls = type(exc)
    module = cls.__module__
    type_name = (
        cls.__qualname__
        if module in ("builtins", "__main__", None)
        else (f"{module}.{cls.__qualname__}")
    )
    try:
        message = str(exc)
    except Exception:
        message = f"<str() of the {cls.__name__} failed>"
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return msgpack.packb(
        {"type": type_name, "message": message, "traceback": tb}, use_bin_type=True
    )
