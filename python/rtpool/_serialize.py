"""What crosses the wire inside the protocol's opaque ``bin`` fields.

* The function of a package: cloudpickle (so lambdas, closures and functions defined in
  ``__main__`` work), pickled once per function object and cached with its SHA-256.
* A task's arguments: ``pickle.dumps((args, kwargs_or_None), protocol=5)``, with cloudpickle as
  the fallback for arguments plain pickle refuses (a lambda passed as an argument). Large
  buffers (numpy arrays, ``bytes``, ``bytearray``, ``memoryview`` of 64 KiB or more) are taken
  out of band: the payload is then a buffer envelope (``docs/protocol.md``, "Payloads with
  out-of-band buffers"), a :class:`~rtpool._frame.Payload` of parts that are sent as they lie
  and, on the receiving side, unpickled as views of the receive buffer.
* A result: the same, for the return value.
* An error report: a pickled dict ``{type, message, traceback, exc}`` where ``exc`` is the
  pickled exception, or ``None`` when it cannot be pickled (or unpickled) on the worker.

The client rebuilds a task's exception with the remote traceback as its ``__cause__``, as
``concurrent.futures.ProcessPoolExecutor`` does, or raises :class:`~rtpool.errors.TaskFailed`
when the exception cannot be rebuilt. cloudpickle is imported lazily: a worker that runs only
importable functions never loads it.
"""

from __future__ import annotations

import hashlib
import linecache
import pickle
import struct
import threading
import traceback
import types
import weakref
from typing import Any, Callable, Dict, List, Tuple

from . import _output, _shm
from ._frame import SEGMENT_MIN_BYTES, Payload
from ._output import OUTPUT_TAG
from .errors import RemoteTraceback, TaskFailed

PICKLE_PROTOCOL = 5

_dumps = pickle.dumps
_loads = pickle.loads

# fn -> (digest, code). Weak keys so a cached function can still be garbage collected.
_fn_cache: weakref.WeakKeyDictionary[Any, Tuple[bytes, bytes]] = weakref.WeakKeyDictionary()
# id(fn) -> (fn, digest, code) for callables that take no weak reference (builtins, objects
# with __slots__): the entry keeps fn alive so its id cannot be reused by another object.
_fn_cache_by_id: Dict[int, Tuple[Any, bytes, bytes]] = {}
_FN_CACHE_BY_ID_MAX = 1024
_fn_cache_lock = threading.Lock()
# The function submitted last and its entry: most loops submit one function over and over, and
# an identity check is cheaper than a weak-key lookup. It keeps that one function alive.
_last: Tuple[Any, Tuple[bytes, bytes] | None] = (object(), None)


def _cloudpickle():
    import cloudpickle

    return cloudpickle


def serialize_function(fn: Callable) -> Tuple[bytes, bytes]:
    """Pickle a task function with cloudpickle, once per function object.

    The result is cached per function object for the life of the object: a function (or a
    closure, or a callable object) is pickled the first time it is submitted, and later changes
    to the globals or state it captured by value are not seen by later submissions.

    Args:
        fn: Any callable cloudpickle can pickle.

    Returns:
        ``(sha256 digest of the code, code)``.

    Raises:
        TypeError: ``fn`` is not callable or cannot be pickled.
    """
    global _last
    last = _last
    if last[0] is fn:
        return last[1]
    try:
        entry = _fn_cache[fn]
        _last = (fn, entry)
        return entry
    except KeyError:
        pass
    except TypeError:  # not weakref-able or not hashable
        entry = _fn_cache_by_id.get(id(fn))
        if entry is not None and entry[0] is fn:
            return entry[1], entry[2]
    if not callable(fn):
        raise TypeError(f"the task function must be callable, got {type(fn).__name__}")
    try:
        code = _cloudpickle().dumps(_with_source(fn), protocol=PICKLE_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"cannot pickle the task function {fn!r:.100}: {exc}; define it at module level "
            "or make what it captures picklable"
        ) from exc
    digest = hashlib.sha256(code).digest()
    _last = (fn, (digest, code))
    with _fn_cache_lock:
        try:
            _fn_cache[fn] = (digest, code)
        except TypeError:
            if len(_fn_cache_by_id) >= _FN_CACHE_BY_ID_MAX:
                _fn_cache_by_id.clear()
            _fn_cache_by_id[id(fn)] = (fn, digest, code)
    return digest, code


class _WithSource:
    """A function pickled by value, with the file name and source lines cloudpickle drops
    (its code objects say ``<dynamic-code>``): unpickling calls :func:`_relocate`, so a
    remote traceback names the function's real file and line and shows its source."""

    __slots__ = ("fn", "filename", "first", "lines")

    def __init__(self, fn: Any, filename: str, first: int, lines: List[str]) -> None:
        self.fn, self.filename, self.first, self.lines = fn, filename, first, lines

    def __reduce__(self) -> tuple:
        return (_relocate, (self.fn, self.filename, self.first, self.lines))


def _by_value(fn: Any) -> bool:
    """Whether cloudpickle ships ``fn``'s code (not a reference to an importable function)."""
    try:
        from cloudpickle.cloudpickle import _should_pickle_by_reference

        return not _should_pickle_by_reference(fn)
    except Exception:  # another cloudpickle version: the common cases
        qualname = getattr(fn, "__qualname__", "")
        return fn.__module__ == "__main__" or "<" in qualname


def _with_source(fn: Any) -> Any:
    """``fn``, wrapped in :class:`_WithSource` when it is a function pickled by value."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or not isinstance(fn, types.FunctionType):
        return fn
    if code.co_filename.startswith("<") or not _by_value(fn):
        return fn  # no file to name (exec'd code, a REPL), or the worker imports it
    import inspect  # only for functions pickled by value

    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        lines, first = [], code.co_firstlineno
    return _WithSource(fn, code.co_filename, max(first, 1), lines)


def _relocate(fn: Any, filename: str, first: int, lines: List[str]) -> Any:
    """Unpickling side of :class:`_WithSource`: give ``fn``'s code (and the code nested in
    it) its file name back and register its source lines with :mod:`linecache`."""
    code = fn.__code__
    if code.co_filename != filename:
        fn.__code__ = _renamed(code, filename)
    if lines and filename not in linecache.cache:
        # mtime None: linecache.checkcache() keeps the entry (the file may not exist here).
        text = [""] * (first - 1) + list(lines)
        linecache.cache[filename] = (sum(map(len, text)), None, text, filename)
    return fn


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(
        _renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def _dumps_fallback(obj: Any, what: str) -> bytes:
    try:
        return _cloudpickle().dumps(obj, protocol=PICKLE_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"cannot pickle {what}: {exc}") from exc


#: First byte of a buffer envelope (a plain pickle starts with 0x80, the PROTO opcode).
ENVELOPE_TAG = 0xB5
#: Buffers in an envelope start at multiples of this many bytes from its first byte.
ENVELOPE_ALIGN = 64
#: Buffers smaller than this stay inside the pickle stream (cheaper than a table entry and
#: the envelope around it), and the payload inline in its frame. Measured for issue 25
#: (docs/benchmarks.md, "GC objects per future and the 64 KiB step"): a 64 KiB ``bytes`` echo
#: was 10-25 % faster in the stream than out of band in every one of 8 interleaved rounds, and
#: inline in the frame 7-16 % faster again than as a segment in 4 of 4; the segment threshold
#: (``_frame.SEGMENT_MIN_BYTES``, the Rust codec's too) moved to 128 KiB with it.
OOB_MIN_BYTES = SEGMENT_MIN_BYTES
_ENV_HEAD = struct.Struct(">B3xIQ")
_shm_local = _shm._local
# Results that never hold a buffer to take out of band (a large str stays in the stream).
_SCALARS = frozenset({type(None), bool, int, float, str, complex})
_ZEROS = bytes(ENVELOPE_ALIGN)


class _OutOfBand:
    """A top-level ``bytes`` or ``memoryview`` argument or result, pickled as a buffer out of
    band (pickle itself never hands ``bytes`` to ``buffer_callback``, and refuses
    ``memoryview``)."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: int) -> tuple:
        rebuild = _shm.bytes_of if type(self.data) is bytes else _as_view
        return rebuild, (pickle.PickleBuffer(self.data),)


def _as_view(buf: Any) -> memoryview:
    return memoryview(buf)


def _is_large(obj: Any) -> bool:
    # Cheap on the no-op path: no exception, no memoryview for the common small values.
    t = type(obj)
    if t is bytes or t is bytearray:
        return len(obj) >= OOB_MIN_BYTES
    if t is int or t is str or t is float or obj is None:
        return False
    nbytes = getattr(obj, "nbytes", None)  # numpy arrays, memoryview, PickleBuffer
    return type(nbytes) is int and nbytes >= OOB_MIN_BYTES


def _wrap(obj: Any) -> Any:
    t = type(obj)
    if (t is bytes or t is memoryview) and _is_large(obj):
        return _OutOfBand(obj)
    return obj


def _has_large(args: tuple, kwargs: dict | None) -> bool:
    """Whether a top-level argument holds a large buffer (a cheap look, no pickling)."""
    for a in args:
        if _is_large(a):
            return True
    return bool(kwargs) and any(_is_large(v) for v in kwargs.values())  # type: ignore[union-attr]


def _dumps_oob(obj: Any, what: str, shm_owner: str | None = None, shm_reader: str = "") -> Any:
    """``obj`` pickled with its large buffers out of band: ``bytes`` when it has none (and
    is small), else a :class:`Payload` (the envelope's parts, nothing joined). With
    ``shm_owner``, large buffers go to a shared-memory segment of this process's pool
    (``shm_reader``: the client a result is for, see :func:`rtpool._shm.write`)."""
    buffers: List[pickle.PickleBuffer] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        # Return False to take the buffer out of band; True keeps it in the stream.
        if buf.raw().nbytes < OOB_MIN_BYTES:
            return True
        buffers.append(buf)
        return False

    try:
        stream = _dumps(obj, PICKLE_PROTOCOL, buffer_callback=keep)
    except Exception:
        buffers.clear()
        try:
            stream = _cloudpickle().dumps(obj, protocol=PICKLE_PROTOCOL, buffer_callback=keep)
        except Exception as exc:
            raise TypeError(f"cannot pickle {what}: {exc}") from exc
    if not buffers:
        return stream if len(stream) < SEGMENT_MIN_BYTES else Payload((stream,), len(stream))
    raws = [b.raw() for b in buffers]
    if shm_owner and sum(r.nbytes for r in raws) >= _shm.SHM_MIN_BYTES:
        if shm_reader:  # a result: if it is (part of) its task's argument, refer to it
            envelope = _shm.refer(raws, stream)
            if envelope is not None:
                return Payload((envelope,), len(envelope))
        envelope, name = _shm.write(raws, stream, shm_owner, shm_reader)
        return Payload((envelope,), len(envelope), name)
    return _envelope(stream, raws)


def _envelope(stream: bytes, raws: List[memoryview]) -> Payload:
    lens = [r.nbytes for r in raws]
    head = _ENV_HEAD.pack(ENVELOPE_TAG, len(raws), len(stream)) + struct.pack(
        f">{len(raws)}Q", *lens
    )
    parts: List[Any] = [head, stream]
    pos = len(head) + len(stream)
    for raw in raws:
        pad = -pos % ENVELOPE_ALIGN
        if pad:
            parts.append(_ZEROS[:pad])
        parts.append(raw)
        pos += pad + raw.nbytes
    return Payload(parts, pos)


def loads_payload(data: Any) -> Any:
    """Unpickle a payload: a plain pickle, or a buffer envelope whose buffers become views of
    ``data`` (a numpy array argument is then a view of the receive buffer, not a copy).

    Raises:
        pickle.UnpicklingError: ``data`` is neither (a truncated or foreign payload).
    """
    return _loads_view(data)[0]


def _loads_view(data: Any, claim: bool = True) -> Tuple[Any, Tuple[str, int] | None]:
    """``(value, its shared-memory segment's (name, generation) or None)`` of a payload.
    ``claim=False``: task arguments, whose segment's writer does not wait for a claim
    (``_shm_pool.Mappings.view``)."""
    if type(data) is Payload:
        data = bytes(data)  # sent to ourselves (tests, a local fallback)
    view = memoryview(data)
    if not view.nbytes or view[0] < ENVELOPE_TAG:
        return _loads(view), None
    if view[0] == _shm.SHM_TAG:
        stream, buffers, offsets, name, gen = _shm.read(view, claim)
        if claim:
            return _loads(stream, buffers=buffers), (name, gen)
        _shm.note_arguments(buffers, offsets)  # a task's arguments
        try:
            return _loads(stream, buffers=buffers), (name, gen)
        finally:
            _shm.arguments_unpickled()
    if view[0] == OUTPUT_TAG:  # a result with its task's output (another worker's input)
        return _loads_view(_output.split(view)[1], claim)
    if view[0] == _shm.SHM_REF_TAG:  # a result made of its own argument's bytes
        stream, buffers = _shm.read_refs(view)
        return _loads(stream, buffers=buffers), None
    if view[0] != ENVELOPE_TAG:
        return _loads(view), None  # not ours: pickle says what is wrong with it
    try:
        _, nbuf, stream_len = _ENV_HEAD.unpack_from(view, 0)
        lens = struct.unpack_from(f">{nbuf}Q", view, _ENV_HEAD.size)
    except struct.error as exc:
        raise pickle.UnpicklingError(f"truncated buffer envelope: {exc}") from None
    pos = _ENV_HEAD.size + 8 * nbuf
    stream = view[pos : pos + stream_len]
    pos += stream_len
    buffers = []
    for n in lens:
        pos += -pos % ENVELOPE_ALIGN
        if pos + n > view.nbytes:
            raise pickle.UnpicklingError(
                f"buffer envelope of {view.nbytes} bytes is truncated: a buffer ends at {pos + n}"
            )
        buffers.append(view[pos : pos + n])
        pos += n
    return _loads(stream, buffers=buffers), None


def dumps_args(args: tuple, kwargs: dict | None, shm_owner: str | None = None) -> Any:
    """Serialize one task's arguments.

    Args:
        args: Positional arguments.
        kwargs: Keyword arguments, or ``None`` (preferred when empty: smaller and faster).
        shm_owner: The owner tag (:func:`rtpool._shm.owner`) of the client when its workers
            share its host: large buffers then go through shared memory, and the returned
            payload's ``shm`` names the segment, which the caller frees when the task is done.

    Returns:
        The payload for ``SUBMIT.tasks[i]``: ``bytes``, or a :class:`~rtpool._frame.Payload`
        when it is large or carries buffers out of band (it is sent as a segment).

    Raises:
        TypeError: Neither pickle nor cloudpickle can pickle the arguments.
    """
    for a in args:  # _has_large, inlined: the no-op task's path pays for a call otherwise
        t = type(a)
        if t is int or t is str or t is float or a is None or not _is_large(a):
            continue
        return _dumps_args_oob(args, kwargs, shm_owner)
    if kwargs and any(_is_large(v) for v in kwargs.values()):
        return _dumps_args_oob(args, kwargs, shm_owner)
    try:
        data = _dumps((args, kwargs), PICKLE_PROTOCOL)
    except Exception:
        return _dumps_oob((args, kwargs), "the task's arguments")
    return data if len(data) < SEGMENT_MIN_BYTES else Payload((data,), len(data))


def _dumps_args_oob(args: tuple, kwargs: dict | None, shm_owner: str | None) -> Any:
    """:func:`dumps_args` of arguments that hold a large buffer."""
    args = tuple(map(_wrap, args))
    if kwargs:
        kwargs = {k: _wrap(v) for k, v in kwargs.items()}
    return _dumps_oob((args, kwargs), "the task's arguments", shm_owner)


def loads_args(payload: Any) -> Tuple[tuple, dict | None]:
    """Inverse of :func:`dumps_args`: ``(args, kwargs_or_None)``. Arguments that came through
    shared memory make this thread's next large result go there too (to the same client)."""
    if payload and payload[0] < ENVELOPE_TAG:  # a plain pickle: the no-op task's path
        _shm_local.owner = None
        return _loads(payload)
    _shm.forget_arguments()
    value, seg = _loads_view(payload, claim=False)
    _shm.set_result_owner(_shm.owner_of(seg[0]) if seg else None, seg)
    return value


def dumps_result(value: Any) -> Any:
    """Serialize a task's return value (pickle protocol 5, large buffers out of band,
    cloudpickle as the fallback): ``bytes`` or a :class:`~rtpool._frame.Payload`.

    Raises:
        TypeError: The value cannot be pickled at all.
    """
    t = type(value)
    if t in _SCALARS:  # the no-op task's path: nothing to take out of band
        return _dumps(value, PICKLE_PROTOCOL)
    if _is_large(value) or ((t is tuple or t is list) and any(map(_is_large, value[:16]))):
        if type(value) in (tuple, list):
            value = type(value)(map(_wrap, value))
        else:
            value = _wrap(value)
        reader = _shm.result_owner()
        if reader is None:
            return _dumps_oob(value, "the task's return value")
        try:
            return _dumps_oob(value, "the task's return value", _shm.owner(), reader)
        finally:
            _shm_local.made = None
    try:
        data = _dumps(value, PICKLE_PROTOCOL)
    except Exception:
        return _dumps_oob(value, "the task's return value")
    return data if len(data) < SEGMENT_MIN_BYTES else Payload((data,), len(data))


def loads_result(data: Any) -> Any:
    """Inverse of :func:`dumps_result`. A result in shared memory is a view of the worker's
    segment, which the worker reuses only once the value is gone."""
    if data and data[0] < ENVELOPE_TAG:  # a plain pickle: the no-op task's path
        return _loads(data)
    return _loads_view(data)[0]


def loads_function(code: bytes) -> Callable:
    """Load a function pickled by :func:`serialize_function`."""
    return _loads(code)


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    if module in ("builtins", "__main__", None):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def _pickle_exception(exc: BaseException) -> bytes | None:
    # An exception may pickle fine and still fail to unpickle (an __init__ with required
    # arguments it does not pass to super()): check here, where the error is still cheap to
    # report, rather than leave the client with an opaque unpickling error.
    for dumps in (_dumps, lambda obj, proto: _cloudpickle().dumps(obj, protocol=proto)):
        try:
            data = dumps(exc, PICKLE_PROTOCOL)
            _loads(data)
            return data
        except Exception:
            continue
    return None


def dumps_error(exc: BaseException, tb: str | None = None) -> bytes:
    """Build the pickled error report of a task that raised.

    Args:
        exc: The exception the task raised.
        tb: The formatted traceback; by default formatted from ``exc.__traceback__``.

    Returns:
        ``pickle.dumps({"type", "message", "traceback", "exc"})``.
    """
    if tb is None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        message = str(exc)
    except Exception:
        message = f"<str() of the {type(exc).__name__} failed>"
    report = {
        "type": _type_name(exc),
        "message": message,
        "traceback": tb,
        "exc": _pickle_exception(exc),
    }
    return _dumps(report, PICKLE_PROTOCOL)


def error_from_report(data: bytes) -> BaseException:
    """Rebuild the exception a task raised on a worker, for the client to raise.

    Args:
        data: The pickled error report (``TaskResult.data`` of status 1).

    Returns:
        The task's own exception with ``__cause__`` set to a
        :class:`~rtpool.errors.RemoteTraceback` carrying the remote traceback text, or a
        :class:`~rtpool.errors.TaskFailed` when the exception cannot be unpickled here (or the
        report itself is unreadable).
    """
    try:
        report = _loads(_output.split(data)[1])  # (its output, if any, is the caller's)
        type_name = str(report["type"])
        message = str(report["message"])
        tb = str(report["traceback"])
        exc_bytes = report["exc"]
    except Exception as exc:
        return TaskFailed(f"the task raised, but its error report cannot be read: {exc}")
    reason = "it could not be pickled on the worker"
    if exc_bytes is not None:
        try:
            exc = _loads(exc_bytes)
        except Exception as load_exc:
            reason = f"it cannot be unpickled on the client: {load_exc}"
        else:
            if isinstance(exc, BaseException):
                exc.__cause__ = RemoteTraceback(tb)
                return exc
            reason = f"it unpickled as a {type(exc).__name__}, not an exception"
    return TaskFailed(
        f"the task raised {type_name}: {message} ({reason}); remote traceback:\n{tb}",
        type_name,
        message,
        tb,
    )


def run_chunk(fn: Callable, chunk: list) -> list:
    """Run ``fn(*args)`` for every argument tuple of a chunk (``Client.map(chunksize=n)``)."""
    return [fn(*args) for args in chunk]
