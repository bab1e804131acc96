"""Calls of named remote functions from a client (grid RPC, ``docs/rpc.md``): what
``Client.call``/``call_async`` do, and the futures of calls (:class:`CallFuture`).

A call's interface comes from the connection's :class:`~rtpool.rpc.channel.RpcChannel`
(fetched with ``FUNCTIONS`` on first use, then cached); the arguments are checked against it
(``Interface.bind``) before anything is sent; the call goes out as one ``CALL`` frame, and the
reader thread turns its result's msgpack data into the call's outputs (``invocation.deliver``).
Transactions (graphs of calls in one frame) are in ``transaction.py``. Nothing here pickles.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Callable, Dict, Iterable, List, Tuple

from .. import _shm
from .._connection import _Segment, task_error
from .._frame import Payload
from .._future import Future, prime_layout
from .._protocol import STATUS_ERROR, STATUS_FAILED, STATUS_OK
from ..errors import CallError, NotFetchedError, RemoteTraceback, TaskFailed
from .channel import RpcChannel
from .decoding import decode_error
from .encoding import encode_args
from .interface import Interface, Param
from .invocation import deliver

__all__ = ["CallFuture", "Output", "call", "call_async"]

_perf_ns = time.perf_counter_ns
_deliver = deliver
_encode_args = encode_args
# The value of a call that succeeded but whose data stayed on the master (not fetched).
NOT_FETCHED = object()


# -- results --------------------------------------------------------------------------------


def _remote_error(label: str, data: Any) -> TaskFailed:
    """The :class:`TaskFailed` of a call that raised on its worker (status 1)."""
    report = decode_error(data)
    type_name, message, tb = report["type"], report["message"], report["traceback"]
    exc = TaskFailed(f"{label} raised {type_name}: {message}", type_name, message, tb)
    if tb:
        exc.__cause__ = RemoteTraceback(tb)
    return exc


def call_result(
    label: str, iface: Interface, out_buffers: list, fetched: bool, status: int, data: Any
) -> Tuple[Any, BaseException | None]:
    """``(value, error)`` of one call's ``TaskResult`` (the reader thread runs this)."""
    if status == STATUS_OK:
        if not fetched:
            return NOT_FETCHED, None
        try:
            return _deliver(iface, data, out_buffers), None
        except Exception as exc:
            return None, TaskFailed(f"{label}: its result cannot be decoded here: {exc}")
    if status == STATUS_ERROR:
        return None, _remote_error(label, data)
    if status == STATUS_FAILED:
        # The master's message names the call (and, for a dependency, the failed one).
        message = bytes(data).decode("utf-8", "replace")
        return None, TaskFailed(message, "", message)
    return None, task_error(status, data)


class CallFuture(Future):
    """The future of one call of a named function (a ``concurrent.futures.Future``).

    ``result()`` returns the call's outputs (see ``docs/rpc.md``). In a transaction, passing
    the future as an argument of a later call makes a data dependency on its output (a call
    with one output), and ``fut[i]`` stands for its ``i``-th output.
    """

    _call = 0
    _label = ""
    _tx: Any = None  # its Transaction (transaction.py imports this module)
    _specs: List[Param] | None = None

    def result(self, timeout: float | None = None) -> Any:
        """The call's outputs: None, the single output, or a tuple of them.

        Raises:
            NotFetchedError: The call succeeded in a transaction, but its outputs stayed on the
                master (pass ``fetch=True`` to ``tx.call`` to have them).
            TaskFailed: The call raised on its worker (remote type, message and traceback),
                or could not run (a dependency failed, its workers were lost).
            CancelledError, TimeoutError: As for any future.
        """
        value = Future.result(self, timeout)
        if value is NOT_FETCHED:
            raise NotFetchedError(f"{self._label} was not fetched; pass fetch=True to tx.call")
        return value

    def cancel(self) -> bool:
        """Cancel the call unless its result already arrived; in a transaction, the calls
        that depend on it (transitively) are cancelled with it, as the master does.

        Returns:
            True if the future is cancelled.
        """
        tx = self._tx
        if tx is None:
            return Future.cancel(self)
        return tx._cancel(self._call)

    def fetched(self) -> bool:
        """Whether the call's outputs come to the client (False for an intermediate call of a
        transaction made without ``fetch=True``)."""
        return self._tx is None or self._tx._fetched(self._call)

    @property
    def __rtpool_ref__(self) -> tuple:
        specs = self._specs
        if specs is None:
            raise AttributeError("__rtpool_ref__")  # not a call of a transaction
        if len(specs) != 1:
            raise CallError(
                f"{self._label} has {len(specs)} outputs: pass one of them, fut[i], as an argument"
                if specs
                else f"{self._label} has no output to pass as an argument"
            )
        return (self._call, 0, specs[0])

    def __getitem__(self, index: int) -> Output:
        specs = self._specs
        if specs is None:
            raise TypeError("only the futures of a transaction's calls have outputs to index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"an output index is an int, got {type(index).__name__}")
        n = len(specs)
        if not -n <= index < n:
            raise IndexError(f"{self._label} has {n} outputs; output {index} does not exist")
        return Output(self, index % n)

    def __repr__(self) -> str:
        return f"<rtpool.CallFuture {self._label} state={self._state}>"


prime_layout(CallFuture, ("_call", "_label", "_tx", "_specs"))


class Output:
    """The ``index``-th output of a transaction's call (``fut[index]``): a data dependency
    when passed as an argument of a later call of the same transaction."""

    __slots__ = ("future", "index")

    def __init__(self, future: CallFuture, index: int) -> None:
        self.future = future
        self.index = index

    @property
    def __rtpool_ref__(self) -> tuple:
        fut = self.future
        return (fut._call, self.index, fut._specs[self.index])

    def __repr__(self) -> str:
        return f"<rtpool.Output {self.index} of {self.future._label}>"


# -- single calls ---------------------------------------------------------------------------


def arg_name(iface: Interface, args: tuple, i: int) -> str:
    slots = iface.params if len(args) == len(iface.params) else iface.inputs
    return slots[i].name if i < len(slots) else f"#{i}"


def _refuse_refs(iface: Interface, args: tuple) -> None:
    for i, arg in enumerate(args):
        if type(arg) is Output or (type(arg) is CallFuture and arg._specs is not None):
            raise CallError(
                f"{iface.name}: argument {arg_name(iface, args, i)} is the future of a call of "
                "a transaction: futures are data dependencies only between the calls of one "
                "transaction; pass its .result()"
            )


class _Single:
    """One ``call_async``: what its decoder and its retry need."""

    __slots__ = ("args", "bound", "channel", "iface", "name", "opts", "version")

    def __init__(self, channel, name, version, args, iface, bound, opts) -> None:
        self.channel = channel
        self.name = name
        self.version = version
        self.args = args
        self.iface = iface
        self.bound = bound
        self.opts = opts

    def decode(self, index: int, status: int, data: Any) -> Tuple[Any, BaseException | None]:
        if status == STATUS_OK:  # the hot path
            try:
                return _deliver(self.iface, data, self.bound.out_buffers), None
            except Exception as exc:
                return None, TaskFailed(f"{self.name}: its result cannot be decoded here: {exc}")
        return call_result(self.name, self.iface, self.bound.out_buffers, True, status, data)

    def retry(self, seg: _Segment, message: str) -> None:
        """``ERROR unknown_function`` for the cached interface: fetch it again, re-send."""
        try:
            self.channel.forget(self.name, self.version, self.iface)
            iface, _ = self.channel.interface(self.name, self.version)
            self.bound = iface.bind(self.args)
            self.iface = iface
            calls = [[self.name, iface.version, _encode_args(self.bound.values), [], False]]
        except BaseException as exc:
            self.channel.fail_unsent(seg, exc)
            return
        self.channel.resend_calls(seg, self.opts, calls)


def call_async(
    channel: RpcChannel,
    name: str,
    args: tuple,
    version: str | None,
    opts: Dict[str, Any],
    track: Callable[[Iterable[_Segment]], None],
) -> CallFuture:
    """``Client.call_async``: check, send one ``CALL`` frame, return the future.

    Args:
        channel: The connection's grid-RPC channel.
        name, args, version: The call.
        opts: The package options in wire form, checked for calls (``_options.for_calls``).
        track: Told the call's segment (an executor view waits for it at shutdown).
    """
    t0 = _perf_ns()
    iface = channel.interfaces.get((name, version))
    cached = iface is not None
    if not cached:
        iface, _ = channel.interface(name, version)
    _refuse_refs(iface, args)
    bound = iface.bind(args)
    payload = _encode_args(bound.values, channel.conn.shm_owner)
    single = _Single(channel, name, version, args, iface, bound, opts)
    seg = channel.new_segment(1, t0, opts)
    fut = CallFuture(seg, 0)
    fut._label = name
    seg.futures = [fut]
    seg.decode = single.decode
    if cached:
        seg.retry = single.retry
    if type(payload) is Payload:
        # Its shared-memory segment is lent until the call is done, whatever its outcome.
        fut.add_done_callback(lambda _f, name=payload.shm: _shm.release(name))
    channel.send_calls(seg, opts, [[name, iface.version, payload, [], False]])
    track((seg,))
    return fut


def call(fut: CallFuture, name: str, timeout: float | None) -> Any:
    """``Client.call``: wait for the future of :func:`call_async` (cancelling the call on a
    timeout)."""
    try:
        return fut.result(timeout)
    except cf.TimeoutError:
        if fut.cancel():
            raise TimeoutError(
                f"{name}: no result within {timeout:g} s; the call was cancelled"
            ) from None
        return fut.result()  # the result came meanwhile
