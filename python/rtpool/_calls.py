"""Calls of named remote functions from a client (grid RPC, ``docs/rpc.md``).

What ``Client.call``/``call_async``/``describe``/``functions``/``transaction`` do: fetch a
function's interface from the master (``FUNCTIONS``) on first use and cache it per connection,
check the arguments against it (``Interface.bind``) before anything is sent, send a package of
calls as one ``CALL`` frame through the connection's package machinery (``ACCEPTED``,
``RESULTS``, ``ACK``, ``ATTACH`` and ``CANCEL`` as for ``SUBMIT``), and turn each result's
msgpack data into the call's outputs (``_callcodec.deliver``) in the reader thread.

The values' wire format is ``_callcodec``'s, the interfaces ``_interface``'s; sockets and
routing are ``_connection``'s. Nothing here pickles.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

from . import _callcodec
from ._connection import _Connection, _Segment, _task_error
from ._future import Future
from ._interface import Interface, Param
from ._protocol import STATUS_ERROR, STATUS_FAILED, STATUS_OK
from .errors import CallError, NotFetchedError, RemoteTraceback, TaskFailed, UnknownFunctionError

if TYPE_CHECKING:
    from .client import _Submitter

__all__ = ["CallFuture", "Output", "Transaction"]

_perf_ns = time.perf_counter_ns
_deliver = _callcodec.deliver
_encode_args = _callcodec.encode_args
_Ref = _callcodec.Ref
# Options of shipped-code tasks that calls refuse (docs/rpc.md, "Options"), as wire keys.
_TASK_ONLY_OPTIONS = ("replicas", "quorum", "max_copies", "hedge", "admit")
# A FUNCTIONS request waits at least this long (also across a reconnection).
_FUNCTIONS_TIMEOUT_S = 30.0
# The value of a call that succeeded but whose data stayed on the master (not fetched).
_NOT_FETCHED = object()


# -- interfaces -----------------------------------------------------------------------------


def _functions_timeout(conn: _Connection) -> float:
    return max(_FUNCTIONS_TIMEOUT_S, conn.reconnect_timeout + conn.connect_timeout)


def fetch_interfaces(conn: _Connection, name: str, timeout: float | None = None) -> List[Interface]:
    """The interfaces the master lists for ``name`` (newest version first), or for every
    served function when ``name`` is ``""``, with their ``servers`` filled in."""
    reply = conn.functions(name, _functions_timeout(conn) if timeout is None else timeout)
    return [Interface.from_bytes(blob, servers) for _, _, servers, blob in reply]


def _check_name(name: Any, version: Any) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a function name is a non-empty str, got {name!r}")
    if version is not None and not isinstance(version, str):
        raise TypeError(f'version must be a str (like "1") or None, got {version!r}')


def _describe_served(ifaces: Sequence[Interface]) -> str:
    """``add (2, 1), noop (1)``, as the master writes it, or ``nothing``."""
    versions: Dict[str, List[str]] = {}
    for iface in ifaces:
        versions.setdefault(iface.name, []).append(iface.version or '""')
    if not versions:
        return "nothing"
    return ", ".join(f"{name} ({', '.join(v)})" for name, v in sorted(versions.items()))


def _unknown(conn: _Connection, name: str, version: str | None) -> UnknownFunctionError:
    what = f"'{name}'" if version is None else f"'{name}' version {version}"
    served = _describe_served(fetch_interfaces(conn, ""))
    return UnknownFunctionError(f"no worker serves {what}; served: {served}")


def lookup(
    conn: _Connection, name: str, version: str | None, timeout: float | None = None
) -> Interface:
    """The interface of ``name`` (``version``, or the newest), fresh from the master.

    Raises:
        UnknownFunctionError: No worker serves it; the message lists what is served.
    """
    _check_name(name, version)
    ifaces = fetch_interfaces(conn, name, timeout)
    if version is None:
        if ifaces:
            return ifaces[0]
    else:
        for iface in ifaces:
            if iface.version == version:
                return iface
    raise _unknown(conn, name, version)


def interface(
    conn: _Connection, name: str, version: str | None, timeout: float | None = None
) -> Tuple[Interface, bool]:
    """``(interface, cached)``: from the connection's cache, else fetched and cached."""
    iface = conn.interfaces.get((name, version))
    if iface is not None:
        return iface, True
    iface = lookup(conn, name, version, timeout)
    conn.interfaces[(name, version)] = iface
    return iface, False


def _forget(conn: _Connection, name: str, version: str | None, iface: Interface) -> None:
    if conn.interfaces.get((name, version)) is iface:
        del conn.interfaces[(name, version)]


def call_opts(opts: Dict[str, Any], deadline_at: float | None) -> Dict[str, Any]:
    """The package options of a call: a view's options, refusing those calls do not take.

    Raises:
        ValueError: ``replicas``, ``quorum``, ``max_copies``, ``hedge``, ``admit`` or
            ``on_miss="drop"``.
    """
    from ._options import resolve

    for key in _TASK_ONLY_OPTIONS:
        if key in opts:
            raise ValueError(
                f"option {key!r} is for shipped-code tasks (submit, map); calls of named "
                "functions do not take it"
            )
    if opts.get("on_miss") == "drop":
        raise ValueError(
            "option on_miss='drop' is for shipped-code tasks (submit, map); calls of named "
            "functions do not take it"
        )
    return opts if deadline_at is None else resolve(opts, deadline_at)


# -- results --------------------------------------------------------------------------------


def _remote_error(label: str, data: Any) -> TaskFailed:
    """The :class:`TaskFailed` of a call that raised on its worker (status 1)."""
    report = _callcodec.decode_error(data)
    type_name, message, tb = report["type"], report["message"], report["traceback"]
    exc = TaskFailed(f"{label} raised {type_name}: {message}", type_name, message, tb)
    if tb:
        exc.__cause__ = RemoteTraceback(tb)
    return exc


def _call_result(
    label: str, iface: Interface, out_buffers: list, fetched: bool, status: int, data: Any
) -> Tuple[Any, BaseException | None]:
    """``(value, error)`` of one call's ``TaskResult`` (the reader thread runs this)."""
    if status == STATUS_OK:
        if not fetched:
            return _NOT_FETCHED, None
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
    return None, _task_error(status, data)


class CallFuture(Future):
    """The future of one call of a named function (a ``concurrent.futures.Future``).

    ``result()`` returns the call's outputs (see ``docs/rpc.md``). In a transaction, passing
    the future as an argument of a later call makes a data dependency on its output (a call
    with one output), and ``fut[i]`` stands for its ``i``-th output.
    """

    _call = 0
    _label = ""
    _tx: Transaction | None = None
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
        if value is _NOT_FETCHED:
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


def _arg_name(iface: Interface, args: tuple, i: int) -> str:
    slots = iface.params if len(args) == len(iface.params) else iface.inputs
    return slots[i].name if i < len(slots) else f"#{i}"


def _refuse_refs(iface: Interface, args: tuple) -> None:
    for i, arg in enumerate(args):
        if type(arg) is Output or (type(arg) is CallFuture and arg._specs is not None):
            raise CallError(
                f"{iface.name}: argument {_arg_name(iface, args, i)} is the future of a call of "
                "a transaction: futures are data dependencies only between the calls of one "
                "transaction; pass its .result()"
            )


class _Single:
    """One ``call_async``: what its decoder and its retry need."""

    __slots__ = ("args", "bound", "conn", "iface", "name", "opts", "version")

    def __init__(self, conn, name, version, args, iface, bound, opts) -> None:
        self.conn = conn
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
        return _call_result(self.name, self.iface, self.bound.out_buffers, True, status, data)

    def retry(self, seg: _Segment, message: str) -> None:
        """``ERROR unknown_function`` for the cached interface: fetch it again, re-send."""
        try:
            _forget(self.conn, self.name, self.version, self.iface)
            iface, _ = interface(self.conn, self.name, self.version)
            self.bound = iface.bind(self.args)
            self.iface = iface
            calls = [[self.name, iface.version, _encode_args(self.bound.values), [], False]]
        except BaseException as exc:
            self.conn.fail_unsent(seg, exc)
            return
        self.conn.resend_calls(seg, self.opts, calls)


def call_async(sub: _Submitter, name: str, args: tuple, version: str | None) -> CallFuture:
    """``Client.call_async``: check, send one ``CALL`` frame, return the future."""
    t0 = _perf_ns()
    if sub.__dict__.get("_shut"):
        raise RuntimeError("cannot schedule new futures after shutdown")
    opts = sub._call_opts()
    conn = sub._conn
    iface = conn.interfaces.get((name, version))
    cached = iface is not None
    if not cached:
        iface, _ = interface(conn, name, version)
    _refuse_refs(iface, args)
    bound = iface.bind(args)
    payload = _encode_args(bound.values)
    single = _Single(conn, name, version, args, iface, bound, opts)
    seg = conn.call_segment(1, t0, opts)
    fut = CallFuture(seg, 0)
    fut._label = name
    seg.futures = [fut]
    seg.decode = single.decode
    if cached:
        seg.retry = single.retry
    conn.send_calls(seg, opts, [[name, iface.version, payload, [], False]])
    sub._track((seg,))
    return fut


def call(
    sub: _Submitter, name: str, args: tuple, version: str | None, timeout: float | None
) -> Any:
    """``Client.call``: :func:`call_async`, then wait (cancelling the call on a timeout)."""
    fut = call_async(sub, name, args, version)
    try:
        return fut.result(timeout)
    except cf.TimeoutError:
        if fut.cancel():
            raise TimeoutError(
                f"{name}: no result within {timeout:g} s; the call was cancelled"
            ) from None
        return fut.result()  # the result came meanwhile


# -- transactions ---------------------------------------------------------------------------


class _TxCall:
    """One call of a transaction."""

    __slots__ = ("args", "bound", "deps", "fetch", "future", "iface", "name", "version")

    def __init__(self, name, version, args, fetch, iface, bound, future, deps) -> None:
        self.deps = deps  # the calls it takes inputs from, in order of first use
        self.name = name
        self.version = version
        self.args = args
        self.fetch = fetch
        self.iface = iface
        self.bound = bound
        self.future = future


class Transaction:
    """A graph of calls sent as one ``CALL`` frame when the ``with`` block exits.

    Made by :meth:`Client.transaction`. ``tx.call()`` checks a call and returns its
    :class:`CallFuture` at once; passing a future (or ``fut[i]``) as an argument of a later call
    makes a data dependency, which the master resolves without shipping the intermediate
    result to the client (unless that call was made with ``fetch=True``). Leaving the block
    with an exception sends nothing (and cancels the futures).
    """

    def __init__(self, sub: _Submitter) -> None:
        self._sub = sub
        self._conn: _Connection = sub._conn
        self._calls: List[_TxCall] = []
        self._has_dependents: set = set()
        self._state = "open"  # open -> sent | abandoned
        self._seg: _Segment | None = None
        self._opts: Dict[str, Any] = {}
        self._cached = False

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.send()
        else:
            self._abandon()

    def __len__(self) -> int:
        return len(self._calls)

    def __repr__(self) -> str:
        return f"<rtpool.Transaction {len(self._calls)} calls {self._state}>"

    @property
    def futures(self) -> List[CallFuture]:
        """The futures of the calls, in call order."""
        return [c.future for c in self._calls]

    def call(
        self, name: str, *args: Any, version: str | None = None, fetch: bool = False
    ) -> CallFuture:
        """Add a call to the transaction (sent when the block exits).

        Args:
            name: The function's name.
            *args: Its arguments, as for :meth:`Client.call`; a :class:`CallFuture` of an
                earlier call of this transaction (its only output) or ``fut[i]`` (its ``i``-th
                output) passes that output without it coming to the client.
            version: The version to call; None: the newest served.
            fetch: Send this call's outputs to the client even though later calls use them
                (calls no other call uses are always sent).

        Returns:
            The call's :class:`CallFuture`.

        Raises:
            CallError: The arguments do not match the interface (checked here; a dependency
                against the producing call's declared output).
            UnknownFunctionError: No worker serves the function (or that version).
            RuntimeError: The transaction was already sent or abandoned.
        """
        if self._state != "open":
            raise RuntimeError(f"the transaction was already {self._state}; start a new one")
        iface, cached = interface(self._conn, name, version)
        self._cached = self._cached or cached
        index = len(self._calls)
        self._check_refs(iface, args)
        bound = iface.bind(args)
        fut = CallFuture(None, index)
        fut._call = index
        fut._label = f"call #{index} {name}"
        fut._tx = self
        fut._specs = bound.output_specs()
        deps: List[int] = []
        for value in bound.values:
            ref = getattr(value, "__rtpool_ref__", None)
            if ref is not None and ref[0] not in deps:
                deps.append(ref[0])
        self._has_dependents.update(deps)
        self._calls.append(_TxCall(name, version, args, bool(fetch), iface, bound, fut, deps))
        return fut

    def _check_refs(self, iface: Interface, args: tuple) -> None:
        for i, arg in enumerate(args):
            if type(arg) is Output:
                fut = arg.future
            elif type(arg) is CallFuture and arg._specs is not None:
                fut = arg
            else:
                continue
            if fut._tx is not self:
                raise CallError(
                    f"{iface.name}: argument {_arg_name(iface, args, i)} is the future of a call "
                    "of another transaction; pass its .result() instead"
                )

    def _fetched(self, index: int) -> bool:
        return self._calls[index].fetch or index not in self._has_dependents

    def _wire_calls(self) -> list:
        """The ``CALL`` entries: ``[name, version, args, deps, fetch]`` per call."""
        out = []
        for c in self._calls:
            values = list(c.bound.values)
            for i, value in enumerate(values):
                ref = getattr(value, "__rtpool_ref__", None)
                if ref is not None:
                    values[i] = _Ref(c.deps.index(ref[0]), ref[1])
            out.append([c.name, c.iface.version, _encode_args(values), c.deps, c.fetch])
        return out

    def _cancel(self, index: int) -> bool:
        """Cancel call ``index`` and, if that worked, its dependents (transitively): the
        master cancels them too and sends no result for them."""
        fut = self._calls[index].future
        if not fut._to_cancelled():
            return fut.cancelled()
        gone = {index}
        cancelled = [index]
        for j in range(index + 1, len(self._calls)):
            c = self._calls[j]
            if any(d in gone for d in c.deps):
                gone.add(j)
                if c.future._to_cancelled():
                    cancelled.append(j)
        seg = self._seg
        if seg is not None:  # else send() tells the master
            self._conn.on_local_cancel(seg, tuple(cancelled), len(cancelled))
        return True

    def _decode(self, index: int, status: int, data: Any) -> Tuple[Any, BaseException | None]:
        c = self._calls[index]
        fetched = c.fetch or index not in self._has_dependents
        label = c.future._label
        return _call_result(label, c.iface, c.bound.out_buffers, fetched, status, data)

    def send(self) -> None:
        """Send the calls as one ``CALL`` frame (the ``with`` block does it on exit).

        Raises:
            CallError: An argument cannot be encoded.
            ValueError: The calls' arguments are above the master's frame limit.
            RuntimeError: Already sent or abandoned, or the client was shut down.
            ConnectionLost: The connection is gone.

        On an error nothing was sent and the futures are cancelled.
        """
        if self._state != "open":
            raise RuntimeError(f"the transaction was already {self._state}")
        self._state = "sent"
        if not self._calls:
            return
        conn = self._conn
        try:
            calls = self._wire_calls()
            self._opts = opts = self._sub._call_opts()
        except BaseException:
            self._abandon()
            raise
        seg = conn.call_segment(len(self._calls), _perf_ns(), opts)
        futures = [c.future for c in self._calls]
        cancelled = []
        for i, fut in enumerate(futures):
            fut._seg = seg
            if fut.cancelled():  # cancelled before the block ended: tell the master
                cancelled.append(i)
        seg.futures = futures
        seg.decode = self._decode
        if self._cached:
            seg.retry = self._retry
        try:
            conn.send_calls(seg, opts, calls)
        except BaseException:  # shut down, connection lost, too large: nothing was sent
            self._abandon()
            raise
        self._seg = seg
        self._sub._track((seg,))
        if cancelled:
            conn.on_local_cancel(seg, tuple(cancelled), len(cancelled))

    def _abandon(self) -> None:
        self._state = "abandoned"
        for c in self._calls:
            c.future._to_cancelled()

    def _retry(self, seg: _Segment, message: str) -> None:
        """``ERROR unknown_function`` with cached interfaces: fetch them again, re-check every
        call, re-send (once)."""
        try:
            for c in self._calls:
                _forget(self._conn, c.name, c.version, c.iface)
            for c in self._calls:
                c.iface, _ = interface(self._conn, c.name, c.version)
                c.bound = c.iface.bind(c.args)
                c.future._specs = c.bound.output_specs()
            calls = self._wire_calls()
        except BaseException as exc:
            self._conn.fail_unsent(seg, exc)
            return
        self._conn.resend_calls(seg, self._opts, calls)

    def results(self, timeout: float | None = None) -> List[Any]:
        """Wait for every call; return each one's outputs in call order (None for a call whose
        outputs were not fetched).

        Raises:
            RuntimeError: The transaction has not been sent.
            TimeoutError: Not every call finished within ``timeout`` seconds.
            Exception: The first failed call's error, in call order.
        """
        if self._state != "sent":
            raise RuntimeError(f"the transaction is {self._state}: nothing to wait for")
        end = None if timeout is None else time.monotonic() + timeout
        out = []
        for c in self._calls:
            left = None if end is None else max(0.0, end - time.monotonic())
            value = Future.result(c.future, left)
            out.append(None if value is _NOT_FETCHED else value)
        return out
