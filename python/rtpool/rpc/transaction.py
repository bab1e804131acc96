"""Transactions of grid-RPC calls (``docs/rpc.md``): a graph of calls sent as one ``CALL``
frame, where passing a call's future to a later call makes a data dependency the master
resolves without shipping the intermediate result to the client.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Tuple

from .._connection import _Segment
from .._future import Future
from ..errors import CallError
from .calls import NOT_FETCHED, CallFuture, Output, arg_name, call_result
from .channel import RpcChannel
from .encoding import encode_args
from .interface import Interface
from .schema import Ref

__all__ = ["Transaction"]

_perf_ns = time.perf_counter_ns


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

    def __init__(
        self,
        channel: RpcChannel,
        opts: Callable[[], Dict[str, Any]],
        track: Callable[[Iterable[_Segment]], None],
    ) -> None:
        # opts(): the package options in wire form at sending time (checked for calls);
        # track(segments): the executor view that made it waits for them at its shutdown.
        self._channel = channel
        self._options = opts
        self._track = track
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
        iface, cached = self._channel.interface(name, version)
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
                    f"{iface.name}: argument {arg_name(iface, args, i)} is the future of a call "
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
                    values[i] = Ref(c.deps.index(ref[0]), ref[1])
            out.append([c.name, c.iface.version, encode_args(values), c.deps, c.fetch])
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
            self._channel.conn.on_local_cancel(seg, tuple(cancelled), len(cancelled))
        return True

    def _decode(self, index: int, status: int, data: Any) -> Tuple[Any, BaseException | None]:
        c = self._calls[index]
        fetched = c.fetch or index not in self._has_dependents
        label = c.future._label
        return call_result(label, c.iface, c.bound.out_buffers, fetched, status, data)

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
        channel = self._channel
        try:
            calls = self._wire_calls()
            self._opts = opts = self._options()
        except BaseException:
            self._abandon()
            raise
        seg = channel.new_segment(len(self._calls), _perf_ns(), opts)
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
            channel.send_calls(seg, opts, calls)
        except BaseException:  # shut down, connection lost, too large: nothing was sent
            self._abandon()
            raise
        self._seg = seg
        self._track((seg,))
        if cancelled:
            channel.conn.on_local_cancel(seg, tuple(cancelled), len(cancelled))

    def _abandon(self) -> None:
        self._state = "abandoned"
        for c in self._calls:
            c.future._to_cancelled()

    def _retry(self, seg: _Segment, message: str) -> None:
        """``ERROR unknown_function`` with cached interfaces: fetch them again, re-check every
        call, re-send (once)."""
        try:
            for c in self._calls:
                self._channel.forget(c.name, c.version, c.iface)
            for c in self._calls:
                c.iface, _ = self._channel.interface(c.name, c.version)
                c.bound = c.iface.bind(c.args)
                c.future._specs = c.bound.output_specs()
            calls = self._wire_calls()
        except BaseException as exc:
            self._channel.fail_unsent(seg, exc)
            return
        self._channel.resend_calls(seg, self._opts, calls)

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
            out.append(None if value is NOT_FETCHED else value)
        return out
