"""Values of named remote calls on the wire (``docs/rpc.md``, "Values"), and running a call.

Arguments and results are msgpack, never pickle, with two extension types:

* ext 1, an array: ``u8 len`` + ``dtype.str`` (``b"<f8"``) + ``u8 ndim`` + ``ndim`` x ``u64``
  little-endian dimensions + the raw bytes in C order;
* ext 2, a reference to another call's result (transactions): msgpack ``[input, output]``;
* ext 3, a whole result blob kept on the worker that made it (a transaction's intermediate
  result): msgpack ``[host, port, key, size, pid, session]``, read from that worker's data port
  by the worker of the call that takes it as an input (:func:`input_blob`).

Copies: encoding copies an array's bytes once, straight into the payload (an array under
64 KiB twice, ``tobytes()`` then the join: cheaper than a view at that size; plus one more
for a non-contiguous or big-endian array, made contiguous little-endian first); when the
client's workers share its host, an argument payload of 256 KiB or more is that copy, into a
shared-memory segment (``rtpool._shm``). Decoding a top-level array copies it once, out of the
payload into a new writable, aligned, native-order array the caller owns
(``np.frombuffer(...).copy()``), except an ``In`` array of a shared-memory payload, which is
a **read-only view** of the segment (no copy; an ``InOut`` one is copied, it is written); an
array nested in a list or dict (an ``any`` value) takes one more copy through msgpack.
:func:`deliver` copies a result array once, straight into the caller's buffer when there is
one.

A worker checks a call's arguments in full the first time it sees their sizes, dtypes and
scalar types (:meth:`Interface._bind_key`), and remembers a plan for the next calls alike
(:class:`_Plan`): they skip the argument checks and the checks of the outputs the worker
allocated, unless the function reshaped or retyped one in place; a return value is always
checked.

A complex scalar has no msgpack form: it travels as a 0-d ``complex128`` array (ext 1), which
:func:`invoke` and :func:`deliver` turn back into a ``complex`` for ``complex`` parameters and
outputs.

numpy is imported only to encode or decode an array: this module imports without it.
"""

from __future__ import annotations

import copy
import functools
import struct
import traceback
from typing import Any, Callable, NamedTuple

import msgpack

from .. import _shm
from .._frame import Payload
from ..errors import CallError
from .interface import Interface, Param
from .values import dtype_matches, loaded_numpy, scalar_problem

__all__ = [
    "EXT_ARRAY",
    "EXT_KEPT",
    "EXT_REF",
    "Ref",
    "decode_args",
    "decode_error",
    "decode_results",
    "deliver",
    "encode_args",
    "encode_error",
    "encode_results",
    "input_blob",
    "invoke",
    "kept_blob",
]

EXT_ARRAY = 1
EXT_REF = 2
EXT_KEPT = 3
# msgpack's ext headers (fixext 1-16, ext 8/16/32): a result blob is an array, never these.
_EXT_MARKERS = frozenset((0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8))


def kept_blob(ref: Any) -> bytes:
    """The result blob that stands for a result kept on this worker (ext 3)."""
    fields = [ref.host, ref.port, ref.key, ref.size_bytes, ref.pid, ref.session]
    return msgpack.packb(msgpack.ExtType(EXT_KEPT, msgpack.packb(fields, use_bin_type=True)))


def input_blob(blob: Any) -> Any:
    """A call's input as the call reads it: a kept result (ext 3) fetched from the worker that
    keeps it, any other blob as it is.

    Raises:
        KeptResultLost: The kept result's worker is gone or evicted it.
    """
    if not blob or blob[0] not in _EXT_MARKERS:
        return blob
    ext = msgpack.unpackb(blob)
    if not isinstance(ext, msgpack.ExtType) or ext.code != EXT_KEPT:
        return blob
    from .._kept import KeptRef, fetch  # _kept is the client's and the worker's

    host, port, key, size, pid, session = msgpack.unpackb(ext.data, raw=False)
    return fetch(KeptRef(host, port, key, size, pid, session))


_NO_NUMPY = "this process has no numpy; it cannot decode array arguments"
# How much of the payload an element that is a list or map is fed to msgpack at first (it
# doubles until the element is complete): bounds the bytes copied past its end.
_FEED_BYTES = 64 * 1024


class Ref(NamedTuple):
    """A reference to an input of a call (ext 2): the ``input``-th dependency blob of the
    assignment and its ``output``-th value (-1: the whole result list)."""

    input: int
    output: int


# --- encoding ------------------------------------------------------------------------------


_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
# ext 1 headers (msgpack ext header + our array header) by (dtype.str, shape): a call repeats
# its arrays' sizes, and building the header is most of encoding a small array.
_ARRAY_HEADERS: dict = {}
# numpy dtypes by the dtype string of an ext 1 payload (checked once: no object dtypes).
_DTYPES: dict = {}
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


# --- decoding ------------------------------------------------------------------------------

# Bytes taken by msgpack values of a fixed size, by their first byte.
_FIXED_SIZE = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9}
_FIXED_SIZE.update({0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9})
# str 8/16/32 and bin 8/16/32: the size of their length field.
_LENGTH_SIZE = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDB: 4, 0xC6: 4}
_FIXEXT_SIZE = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT_LENGTH_SIZE = {0xC7: 1, 0xC8: 2, 0xC9: 4}


def _numpy() -> Any:
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
            np = _numpy()
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
        return _owned(arr)
    return arr


_SHAPES = [f"<{n}Q" for n in range(8)]
# (dtype, shape, data bytes) by the bytes of a valid ext 1 header of a native, non-empty array.
_HEADERS: dict = {}
_np_module: Any = None


def _owned(arr: Any) -> Any:
    """A writable, aligned copy of ``arr`` in native byte order."""
    if arr.dtype.isnative:
        return arr.copy()  # a plain memcpy
    return arr.astype(arr.dtype.newbyteorder("="))


class _Writable:
    writeable = True


_WRITABLE = _Writable()


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
    fed, step = pos, _FEED_BYTES
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


def _decode_list(payload: Any, copy: bool = True) -> list:
    if payload and payload[0] == _shm.SHM_TAG:  # never a msgpack list's first byte
        try:
            payload = _shm.read_joined(memoryview(payload))[0]
        except (OSError, ValueError, struct.error) as exc:
            raise CallError(f"cannot read the call's shared-memory payload: {exc}") from None
        # Arrays are read-only views of the mapping (no copy): the segment stays lent until
        # they are gone; invoke() copies the InOut ones, which the function writes.
        return _decode_list(payload, False)
    if copy and len(payload) <= _FEED_BYTES:
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
    return _decode_list(payload)


def decode_args(payload: bytes, inputs: list) -> list:
    """The values of an argument payload, with each :class:`Ref` replaced by what it names.

    Args:
        payload: The argument payload.
        inputs: The result payloads of the call's dependencies (``ASSIGN_CALLS`` ``inputs``);
            each is decoded at most once.

    Raises:
        CallError: A corrupt payload, or a reference to an input or output that does not exist.
    """
    values = _decode_list(payload)
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


# --- running and delivering calls ----------------------------------------------------------


def _from_wire(p: Param, value: Any) -> Any:
    # A complex scalar arrives as a 0-d array (module docstring).
    if p.type == "complex" and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _output_problem(iface: Interface, spec: Param, value: Any) -> Any:
    """Why ``value`` does not fit the output ``spec`` (a concrete shape, from
    :meth:`BoundCall.output_specs`), or None."""
    if spec.type == "any":
        return None  # encode_results refuses what msgpack cannot carry
    if spec.type != "array":
        return scalar_problem(spec.type, value)
    np = loaded_numpy()
    if np is None or not isinstance(value, np.ndarray):
        return f"has type {type(value).__name__}, expected a numpy array of {spec.dtype}"
    if not dtype_matches(value.dtype, spec.dtype):
        return f"has dtype {value.dtype.name}, expected {spec.dtype}"
    if spec.shape is not None:
        expected = _concrete(spec.shape)
        if value.shape != expected:
            return f"has shape {value.shape}, expected {expected}"
    return None


@functools.lru_cache(maxsize=1024)
def _concrete(shape: str) -> tuple:
    # An output spec's shape, already evaluated ("8, 8").
    return tuple(int(d) for d in shape.split(",")) if shape else ()


class _Plan:
    """How to run a call whose arguments passed :func:`invoke`'s checks, for the next calls
    with the same :meth:`Interface._bind_key` (the same sizes, dtypes, shapes, scalar types):
    they skip the argument checks, and the outputs the worker made itself (``Out`` arrays it
    allocated, ``InOut`` arrays already checked) are not checked again; only a return value
    is (issue 16: dmmul's round trip)."""

    __slots__ = ("complex_at", "inout_at", "order", "returns", "out_params", "out_specs", "zeros")

    def __init__(self, iface: Interface, specs: list) -> None:
        inputs = iface._inputs
        #: Inputs that arrive as 0-d arrays and are complex scalars.
        self.complex_at = [i for i, p in enumerate(inputs) if p.type == "complex"]
        #: InOut inputs (a read-only view of shared memory is copied before the call).
        self.inout_at = [i for i, p in enumerate(inputs) if p.mode == "inout"]
        out_specs = {spec.name: spec for spec in specs}
        #: For each parameter: an input's index, or the (shape, dtype) of an Out array.
        order: list = []
        given = 0
        for p in iface.params:
            if p.mode == "out":
                order.append((_concrete(out_specs[p.name].shape), p.dtype))
            else:
                order.append(given)
                given += 1
        self.order = order
        #: The return value's concrete spec (checked on every call), or None.
        self.returns = specs[0] if iface.returns is not None else None
        #: Parameter positions of the Out and InOut outputs, in output order.
        position = {p.name: i for i, p in enumerate(iface.params)}
        self.out_params = [position[spec.name] for spec in specs if spec.name != "return"]
        #: Their specs: checked again only if the call changed their shape or dtype.
        self.out_specs = [spec for spec in specs if spec.name != "return"]
        self.zeros = _numpy().zeros if iface._has_out else None


def invoke(fn: Callable, iface: Interface, args_payload: bytes, inputs: list) -> bytes:
    """Run one call on a worker: decode, check, allocate the ``Out`` arrays, call, encode.

    Args:
        fn: The served function.
        iface: Its interface.
        args_payload: The call's argument payload.
        inputs: The result payloads of its dependencies.

    Returns:
        The result payload (status 0).

    Raises:
        CallError: The payload is corrupt or does not match the interface, or an output does
            not match its spec (the message names it).
        Exception: Whatever ``fn`` raises, unchanged.
    """
    values = decode_args(args_payload, inputs)
    key = iface._bind_key(values) if len(values) == len(iface._inputs) else None
    plan = iface._plans.get(key) if key is not None else None
    if plan is None:
        return _invoke_checked(fn, iface, values, key)
    for i in plan.complex_at:
        values[i] = _from_wire(iface._inputs[i], values[i])
    for i in plan.inout_at:
        if not values[i].flags.writeable:
            values[i] = _owned(values[i])  # a view of shared memory: the function writes it
    zeros = plan.zeros
    args = [values[x] if type(x) is int else zeros(x[0], dtype=x[1]) for x in plan.order]
    outputs = [args[i] for i in plan.out_params]
    before = [(a.shape, a.dtype) for a in outputs]
    result = fn(*args)
    for spec, a, (shape, dtype) in zip(plan.out_specs, outputs, before):
        if a.shape != shape or a.dtype is not dtype:  # reshaped or retyped in place
            problem = _output_problem(iface, spec, a)
            if problem:
                raise CallError(f"{iface.name}: output {spec.name} {problem}")
    spec = plan.returns
    if spec is not None:
        problem = _output_problem(iface, spec, result)
        if problem:
            raise CallError(f"{iface.name}: the return value {problem}")
        outputs.insert(0, result)
    return encode_results(outputs)


def _invoke_checked(fn: Callable, iface: Interface, values: list, key: Any) -> bytes:
    """:func:`invoke` with every check; remembers a :class:`_Plan` for ``key``."""
    inputs_spec = iface._inputs
    if len(values) != len(inputs_spec):
        raise CallError(
            f"{iface.name}: the call carries {len(values)} values, the interface has "
            f"{len(inputs_spec)} inputs ({', '.join(p.name for p in inputs_spec)})"
        )
    values = [_from_wire(p, v) for p, v in zip(inputs_spec, values)]
    for i, p in enumerate(inputs_spec):
        value = values[i]
        if p.mode == "inout" and not getattr(value, "flags", _WRITABLE).writeable:
            values[i] = _owned(value)  # a view of shared memory: the function writes it
    bound = iface.bind(values)
    specs = bound.output_specs()
    out_specs = {spec.name: spec for spec in specs}
    given = iter(values)
    args = []
    for p in iface.params:
        if p.mode == "out":
            spec = out_specs[p.name]
            args.append(_numpy().zeros(_concrete(spec.shape), dtype=p.dtype))
        else:
            args.append(next(given))
    result = fn(*args)
    outputs = [] if iface.returns is None else [result]
    by_name = {p.name: a for p, a in zip(iface.params, args)}
    outputs += [by_name[spec.name] for spec in specs if spec.name != "return"]
    for spec, value in zip(specs, outputs):
        problem = _output_problem(iface, spec, value)
        if problem:
            what = "the return value" if spec.name == "return" else f"output {spec.name}"
            raise CallError(f"{iface.name}: {what} {problem}")
    if key is not None:
        plans = iface._plans
        if len(plans) >= 256:
            plans.clear()
        plans[key] = _Plan(iface, specs)
    return encode_results(outputs)


def deliver(iface: Interface, payload: bytes, out_buffers: list) -> Any:
    """Turn a result payload into what the client's call returns.

    Each output with a buffer (:attr:`BoundCall.out_buffers`) is copied into it and the buffer
    returned in its place.

    Returns:
        None for no output, the output for one, a tuple for several.

    Raises:
        CallError: The payload is corrupt or does not match the interface's outputs.
    """
    # A small payload: msgpack's C decoder, whose arrays are already copies this call owns;
    # a large one: views of the payload, copied once below (into the caller's buffer).
    owned = len(payload) <= _FEED_BYTES and payload[0] != _shm.SHM_TAG
    values = _decode_list(payload, copy=owned)
    outputs = iface._outputs
    if len(values) != len(outputs):
        raise CallError(
            f"{iface.name}: the result has {len(values)} values, the interface "
            f"{len(outputs)} outputs"
        )
    np = loaded_numpy()
    results = []
    for i, (p, value) in enumerate(zip(outputs, values)):
        buffer = out_buffers[i] if i < len(out_buffers) else None
        is_array = np is not None and isinstance(value, np.ndarray)
        if buffer is not None and is_array:
            try:
                np.copyto(buffer, value)
            except (ValueError, TypeError) as exc:
                raise CallError(
                    f"{iface.name}: cannot fill the buffer of {p.name}: {exc}"
                ) from None
            value = buffer
        elif is_array and not owned:
            value = _owned(value)
        results.append(_from_wire(p, value) if p.type == "complex" else value)
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)
