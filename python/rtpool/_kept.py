"""References to results kept on the worker that made them (``docs/data.md``).

:class:`KeptRef` names a value kept in a worker process (``rtpool.worker._kept``); it is what
a kept task returns through the master, a few dozen bytes whatever the value's size.
:func:`fetch` reads the value from that worker's data port (or, in that very process, from its
store without a copy); :class:`KeepTask` is the task function a kept or dependent task runs: it
fetches the kept values among its arguments, runs the user's function and keeps its result.
The client side (futures as arguments, lineage) is in ``_deps.py``.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple

from ._frame import recv_exact
from .errors import KeptResultLost, ProtocolError

__all__ = [
    "HeldInput",
    "KeepTask",
    "KeptRef",
    "fetch",
    "keep_task",
    "read_kept",
    "resolve",
    "value_size",
    "args_with_inputs",
    "with_inputs",
]

MAGIC = b"RTK1"
OP_GET = 1
OP_RELEASE = 2
_HEAD = struct.Struct(">BI")
_LEN = struct.Struct(">Q")
#: Seconds to connect to a data port and between two reads of an answer.
FETCH_TIMEOUT_S = 30.0


class KeptRef:
    """A value kept by the worker process ``pid`` that serves it at ``host:port``."""

    __slots__ = ("host", "port", "key", "size_bytes", "pid", "session", "_finalizer", "__weakref__")

    def __init__(
        self, host: str, port: int, key: bytes, size_bytes: int, pid: int, session: int = 0
    ) -> None:
        self.host = host
        self.port = port
        #: 16 random bytes: the name of the value and the capability to read it.
        self.key = key
        #: The value's size (its buffer's, else its pickle's).
        self.size_bytes = size_bytes
        self.pid = pid
        #: The master session of the worker that holds it (0: unknown): a dependent task's
        #: package option ``near``.
        self.session = session
        #: On the client: the finalizer that releases the value on its worker when this object
        #: is garbage-collected (``_connection/release.py``); None elsewhere.
        self._finalizer: Any = None

    def __reduce__(self) -> tuple:
        args = (self.host, self.port, self.key, self.size_bytes, self.pid, self.session)
        return (KeptRef, args)

    def __repr__(self) -> str:
        return (
            f"<rtpool.KeptRef {self.size_bytes} bytes at {self.host}:{self.port} "
            f"key {self.key.hex()[:8]}>"
        )


def value_size(value: Any) -> int:
    """Bytes of a value: its buffer's size when it has one (bytes, numpy), else its pickle's."""
    try:
        return memoryview(value).nbytes
    except TypeError:
        pass
    try:
        return len(pickle.dumps(value, 5))
    except Exception:
        return sys.getsizeof(value)


def fetch(ref: KeptRef, timeout: float = FETCH_TIMEOUT_S) -> Any:
    """The value ``ref`` names.

    Raises:
        KeptResultLost: Its worker process is gone, or no longer holds it (evicted past its
            bound); the message names the worker. The client then re-runs its producer.
    """
    local = sys.modules.get("rtpool.worker._kept")
    if local is not None and ref.pid == os.getpid():
        st = local._store
        if st is not None and st.pid == ref.pid and st.port == ref.port:
            found, value = st.get(ref.key)
            if found:
                return value
            raise _lost(ref, "this process no longer holds it (evicted)")
    try:
        with socket.create_connection((ref.host, ref.port), timeout=timeout) as sock:
            sock.sendall(MAGIC + bytes((OP_GET,)) + ref.key)
            return _read_value(sock, ref)
    except KeptResultLost:
        raise
    except OSError as exc:
        raise _lost(ref, f"cannot read it from the worker's data port: {exc}") from None


#: A future's ``_fetched`` before its kept value was read.
NOTHING = object()


def read_kept(fut: Any, ref: KeptRef) -> Any:
    """``fut.result()`` of a kept result: read once from its worker (and remembered); when
    it is lost, its producer runs again (``fut._lineage``, ``_deps.py``) within its attempts.

    Raises:
        KeptResultLost: It is lost and cannot be made again.
    """
    value = getattr(fut, "_fetched", NOTHING)
    if value is not NOTHING:
        return value
    while True:
        try:
            value = fetch(ref)
            break
        except KeptResultLost:
            lineage = getattr(fut, "_lineage", None)
            new = lineage.remake(fut) if lineage is not None else None
            if new is None:
                raise
            ref = new
    fut._fetched = value
    return value


def release(ref: KeptRef) -> None:
    """Ask the worker to forget a kept value (best effort: an unreachable worker holds nothing
    that needs freeing)."""
    try:
        with socket.create_connection((ref.host, ref.port), timeout=5.0) as sock:
            sock.sendall(MAGIC + bytes((OP_RELEASE,)) + ref.key)
            sock.recv(16)
    except OSError:
        pass


def _lost(ref: KeptRef, why: str) -> KeptResultLost:
    return KeptResultLost(
        f"kept result {ref.key.hex()[:8]} ({ref.size_bytes} bytes) of the worker at "
        f"{ref.host}:{ref.port} is gone: {why}",
        ref.key,
    )


def _read_value(sock: socket.socket, ref: KeptRef) -> Any:
    head = recv_exact(sock, _HEAD.size)
    if head is None:
        raise _lost(ref, "the worker closed the connection")
    status, count = _HEAD.unpack(head)
    lengths_raw = recv_exact(sock, _LEN.size * (1 + count))
    if lengths_raw is None:
        raise _lost(ref, "the worker closed the connection")
    if status != 0:
        raise _lost(ref, "the worker does not hold it (its process restarted or evicted it)")
    lengths = [_LEN.unpack_from(lengths_raw, i * _LEN.size)[0] for i in range(1 + count)]
    parts: List[bytearray] = []
    for n in lengths:
        part = recv_exact(sock, n)
        if part is None:
            raise _lost(ref, "the worker closed the connection mid-value")
        parts.append(part)
    return pickle.loads(parts[0], buffers=parts[1:])


def resolve(args: tuple, kwargs: Dict[str, Any] | None) -> Tuple[tuple, Dict[str, Any] | None]:
    """``args`` and ``kwargs`` with every :class:`KeptRef` replaced by its value."""
    if any(type(a) is KeptRef for a in args):
        args = tuple(fetch(a) if type(a) is KeptRef else a for a in args)
    if kwargs and any(type(v) is KeptRef for v in kwargs.values()):
        kwargs = {k: fetch(v) if type(v) is KeptRef else v for k, v in kwargs.items()}
    return args, kwargs


class HeldInput:
    """Stands, in a task's pickled arguments, for the ``index``-th result the master holds for
    it (package option ``after``): the worker puts that result in its place
    (:func:`with_inputs`) before the task runs."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple:
        return (HeldInput, (self.index,))

    def __repr__(self) -> str:
        return f"<rtpool.HeldInput {self.index}>"


def with_inputs(payload: bytes, inputs: list) -> Tuple[tuple, Dict[str, Any] | None]:
    """A task's ``(args, kwargs)`` from its argument payload, each top-level
    :class:`HeldInput` replaced by its input (a result payload, which for a kept result is its
    :class:`KeptRef`: the task fetches the value from the producer's worker).

    Raises:
        ProtocolError: An argument names an input the assignment does not carry.
    """
    from ._serialize import loads_args, loads_result  # _serialize imports this module

    args, kwargs = loads_args(payload)

    def put(value: Any) -> Any:
        if type(value) is not HeldInput:
            return value
        if value.index >= len(inputs):
            raise ProtocolError(
                f"the task's argument names input {value.index}, but its assignment carries "
                f"{len(inputs)}; are the master and the worker the same rtpool version?"
            )
        return loads_result(inputs[value.index])

    args = tuple(map(put, args))
    if kwargs:
        kwargs = {k: put(v) for k, v in kwargs.items()}
    return args, kwargs


class _WithInputs:
    """Pickles to a call of :func:`with_inputs`: an argument payload the worker's usual
    ``loads_args`` turns into the task's arguments with its inputs in place."""

    __slots__ = ("payload", "inputs")

    def __init__(self, payload: bytes, inputs: list) -> None:
        self.payload = payload
        self.inputs = inputs

    def __reduce__(self) -> tuple:
        return (with_inputs, (self.payload, self.inputs))


def args_with_inputs(payload: Any, inputs: list) -> bytes:
    """The argument payload of a task the master held, with its inputs (``Assignment.inputs``)
    bundled: decoded by ``loads_args`` into the arguments with the inputs in place."""
    return pickle.dumps(_WithInputs(bytes(payload), [bytes(i) for i in inputs]), 5)


class KeepTask:
    """The function a kept or dependent task runs on its worker: it fetches the kept values
    among its arguments, calls ``fn``, and keeps the result when ``keep_bytes`` says so (None:
    never; 0: always; N: when it is N bytes or more), returning its :class:`KeptRef`."""

    __slots__ = ("fn", "keep_bytes")

    def __init__(self, fn: Callable, keep_bytes: int | None) -> None:
        self.fn = fn
        self.keep_bytes = keep_bytes

    def __reduce__(self) -> tuple:
        return (KeepTask, (self.fn, self.keep_bytes))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kw = resolve(args, kwargs or None)
        value = self.fn(*args, **kw) if kw else self.fn(*args)
        keep = self.keep_bytes
        if keep is None:
            return value
        if keep and value_size(value) < keep:
            return value
        if _keeper is None:
            raise RuntimeError("a kept task runs only on an rtpool worker (rtpool.worker)")
        return _keeper().put(value)


# The worker's store (``rtpool.worker._kept.store``), set when that module loads: this module
# is the client's too and does not import the worker.
_keeper: Callable[[], Any] | None = None


def set_keeper(keeper: Callable[[], Any]) -> None:
    """Install the function that gives this process's store (``rtpool.worker._kept``)."""
    global _keeper
    _keeper = keeper


_tasks: Dict[Tuple[Any, int | None], KeepTask] = {}
_tasks_lock = threading.Lock()


def keep_task(fn: Callable, keep_bytes: int | None) -> KeepTask:
    """One :class:`KeepTask` per ``(fn, keep_bytes)``, so its code is pickled once."""
    try:
        task = _tasks.get((fn, keep_bytes))
    except TypeError:  # fn is not hashable
        return KeepTask(fn, keep_bytes)
    if task is None:
        task = KeepTask(fn, keep_bytes)
        with _tasks_lock:
            if len(_tasks) >= 256:
                _tasks.clear()
            _tasks[(fn, keep_bytes)] = task
    return task
