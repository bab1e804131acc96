"""What :class:`~rtpool.Client` and its :meth:`~rtpool.Client.options` views share: submitting
tasks (``submit``, ``submit_many``, ``map``), ``gather``, package options, and calls of named
functions (grid RPC, ``rtpool.rpc``); and :class:`ClientView`.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import pickle
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, TypeVar, overload

from . import _deps, _options, _shm
from ._anytime import gather as _gather
from ._connection import _Connection, _Segment
from ._frame import Payload
from ._future import Future
from ._kept import keep_task
from ._package import Package
from ._serialize import PICKLE_PROTOCOL, dumps_args, run_chunk, serialize_function
from .rpc import calls as _calls
from .rpc.calls import CallFuture
from .rpc.channel import RpcChannel
from .rpc.transaction import Transaction

if TYPE_CHECKING:
    # typing_extensions for Python 3.9 (ParamSpec and Unpack are in typing from 3.10 and
    # 3.11); type checkers bundle it, so nothing imports it at run time.
    from typing_extensions import ParamSpec, Unpack

    from ._options import PackageOptions
    from .rpc.interface import Interface

    _P = ParamSpec("_P")

_T = TypeVar("_T")
_A = TypeVar("_A")
_B = TypeVar("_B")

__all__ = ["ClientView"]

_perf_ns = time.perf_counter_ns
_dumps = pickle.dumps


class _Submitter(cf.Executor):
    """What :class:`Client` and its :meth:`~Client.options` views share."""

    _conn: _Connection
    _rpc: RpcChannel
    # The package options in wire form (_options.merge made them).
    _opts: Dict[str, Any]
    # An absolute deadline (time.time() seconds), kept aside: its wire value is computed at
    # each submission (_options.for_submission).
    _deadline_at: float | None = None
    # Whether _opts were checked for calls of named functions (once per executor).
    _calls_checked = False
    # Results kept on their workers: None no, 0 every result, N those of N bytes or more.
    _keep: int | None = None

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Run ``fn(*args, **kwargs)`` on a worker.

        Every keyword argument goes to ``fn``; package options are set with :meth:`options`.
        An argument may be another task's :class:`Future` (``submit(g, submit(f, x))``): the
        task is sent once that future has its result, and gets its value; a result kept on its
        worker (``options(keep=True)``) goes from that worker to this task's worker directly,
        never through the client (``docs/data.md``).

        Args:
            fn: A picklable callable (cloudpickle: lambdas and closures work).
            *args: Positional arguments of ``fn``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The task's :class:`Future` (a ``Future[T]`` for a ``fn`` returning ``T``).

        Raises:
            TypeError: ``fn`` or the arguments cannot be pickled.
            ValueError: The executor's absolute ``deadline`` has passed.
            RuntimeError: The executor was shut down.
            ConnectionLost: The connection to the master is gone.
        """
        if self._keep is not None or _deps.has_future(args, kwargs):
            return _deps.submit(self, fn, args, kwargs)
        return self._submit_now(fn, args, kwargs)

    def _submit_now(
        self, fn: Callable, args: tuple, kwargs: Dict[str, Any], opts: Dict | None = None
    ) -> Future:
        t0 = _perf_ns()
        digest, code = serialize_function(fn)
        payload = dumps_args(args, kwargs or None, self._conn.shm_owner)
        return self._send_task(digest, code, payload, t0, _perf_ns() - t0, opts)

    def _send_task(
        self,
        digest: bytes,
        code: bytes,
        payload: Any,
        t0: int,
        serialize_ns: int,
        opts: Dict | None,
    ) -> Future:
        """Send one serialized task (the second half of ``submit``; ``AsyncClient`` pickles
        first, then sends here or from its sender thread)."""
        if opts is None:
            opts = self._opts if self._deadline_at is None else self._submission_opts()
        fut, seg = self._conn.submit_one(digest, code, opts, payload, t0, serialize_ns)
        if type(payload) is Payload and payload.shm:
            # The segment lives until the task is done, whatever its outcome (retries on
            # other workers read it again); a dead client's segments are swept.
            fut.add_done_callback(lambda _f, name=payload.shm: _shm.release(name))
        self._track((seg,))
        return fut

    def submit_many(self, fn: Callable, iterable: Iterable[Any], *, star: bool = False) -> Package:
        """Run ``fn`` once per item of ``iterable``, as one package (one ``SUBMIT`` frame).

        Args:
            fn: A picklable callable, pickled once for the whole package.
            iterable: The items; each becomes ``fn(item)``, or ``fn(*item)`` with ``star``.
            star: Unpack each item as positional arguments.

        Returns:
            The :class:`Package`, whose futures are in input order.

        Raises:
            TypeError: ``fn`` or an item cannot be pickled.
            ValueError: One item alone is larger than the master's frame limit, or the
                executor's absolute ``deadline`` has passed.
            RuntimeError: The executor was shut down.
            ConnectionLost: The connection to the master is gone.
        """
        t0 = _perf_ns()
        if self._keep is not None:
            fn = keep_task(fn, self._keep)
        digest, code = serialize_function(fn)
        items = list(iterable)
        if not items:
            return Package(self._conn, [], [])
        try:
            if star:
                payloads = [
                    _dumps((a if type(a) is tuple else tuple(a), None), PICKLE_PROTOCOL)
                    for a in items
                ]
            else:
                payloads = [_dumps(((a,), None), PICKLE_PROTOCOL) for a in items]
        except Exception:
            if star:
                payloads = [dumps_args(tuple(a), None) for a in items]
            else:
                payloads = [dumps_args((a,), None) for a in items]
        t1 = _perf_ns()
        opts = self._opts if self._deadline_at is None else self._submission_opts()
        futures, segments = self._conn.submit(digest, code, opts, payloads, t0, t1 - t0)
        self._track(segments)
        return Package(self._conn, futures, segments)

    # Overloads by the number of iterables, so that a checker matches each item type against
    # fn's parameters (typeshed's Executor.map, Callable[..., T], checks nothing); from three
    # on it cannot. Narrower than Executor.map by the call map(fn) with no iterable at all.
    @overload  # type: ignore[override]
    def map(
        self,
        fn: Callable[[_A], _T],
        iterable: Iterable[_A],
        /,
        *,
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[_T]: ...

    @overload
    def map(
        self,
        fn: Callable[[_A, _B], _T],
        iterable: Iterable[_A],
        iterable2: Iterable[_B],
        /,
        *,
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[_T]: ...

    @overload
    def map(
        self,
        fn: Callable[..., _T],
        iterable: Iterable[Any],
        iterable2: Iterable[Any],
        iterable3: Iterable[Any],
        /,
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[_T]: ...

    def map(
        self,
        fn: Callable[..., _T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[_T]:
        """Like ``Executor.map``: submit everything now, yield results in input order.

        Args:
            fn: A picklable callable taking one argument per iterable.
            *iterables: Argument iterables, zipped.
            timeout: Seconds from this call until every result must be there.
            chunksize: Items per task; above 1, each task runs ``fn`` over a chunk (fewer,
                larger tasks for very cheap functions).

        Returns:
            An iterator of results in input order; it raises the first failing task's
            exception when it reaches it, and cancels what is left if it is closed early.

        Raises:
            ValueError: ``chunksize`` is below 1.
            TimeoutError: (from the iterator) a result is not there by the deadline.
        """
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        end = None if timeout is None else time.monotonic() + timeout
        items = zip(*iterables)
        if chunksize == 1:
            package = self.submit_many(fn, items, star=True)
        else:
            chunks = iter(lambda: list(itertools.islice(items, chunksize)), [])
            package = self.submit_many(functools.partial(run_chunk, fn), chunks)
        return _result_iterator(package, end, chunksize > 1)

    def gather(
        self,
        futures: Iterable[cf.Future],
        deadline: Any = None,
        *,
        default: Any = None,
        return_exceptions: bool = False,
    ) -> List[Any]:
        """Anytime gather: the values of the futures done by ``deadline``, ``default`` for
        the rest, which are cancelled.

        Waits without polling until every future is done or the deadline passes, then cancels
        those still pending with one ``CANCEL`` per master package: the master drops the
        queued tasks and sends ``ABORT`` for the running ones. A worker kills a running task
        only if it runs in its supervised executor, that is, if its package has a
        ``timeout`` (``client.options(timeout=...)``); otherwise the task runs to its end on
        the worker and its result is discarded.

        Example::

            futures = [client.submit(refine, x) for x in inputs]
            best_effort = client.gather(futures, deadline=0.5, default=None)

        Args:
            futures: Futures of this client (of any packages), or any
                ``concurrent.futures.Future``.
            deadline: Seconds from now, or an absolute ``datetime.datetime`` (aware, or naive
                in local time); one already passed takes what is done now. None (default)
                waits for every future.
            default: The value of each future without a result by the deadline, and of each
                cancelled future.
            return_exceptions: Put the exception of a failed future in the list instead of
                raising it (as ``asyncio.gather``).

        Returns:
            One entry per future, in input order.

        Raises:
            Exception: Without ``return_exceptions``, the first failed future's exception, as
                soon as one fails; the other futures are then left running.
            TypeError: ``deadline`` is neither a number nor a datetime.
        """
        return _gather(futures, deadline, default=default, return_exceptions=return_exceptions)

    def options(self, **opts: Unpack[PackageOptions]) -> ClientView:
        """An executor sharing this connection that submits with these package options.

                Options given here are merged into this executor's own (``client.options(a=1)
                .options(b=2)`` has both); ``None`` resets one to its default. Everything is checked
                here, before anything is sent. See ``docs/deadlines.md`` for deadlines, hedging and
                quorum.

                Args:
                    **opts: Package options (one table, ``_options.OPTIONS``):

        {options}
                    keep: Keep each task's result on the worker that made it (default False);
                        ``future.result()`` fetches it from there, and a task given the future
                        as an argument reads it worker to worker (``docs/data.md``). Client
                        side: the master never sees it.
                    keep_bytes: Keep only results of at least this many bytes (0: all).

                Returns:
                    A :class:`ClientView`; its ``submit``/``submit_many``/``map`` pass every keyword
                    argument to the task function.

                Raises:
                    TypeError: An unknown option name (the message lists the valid ones) or a wrong
                        type.
                    ValueError: A value out of range, or options that contradict each other (the
                        message names them and says what to pass instead).
        """
        given: Dict[str, Any] = dict(opts)
        keep = _keep_option(self._keep, given)
        # In wire form once per view (defaults left out, spec order), not once per submission.
        merged, deadline_at = _options.merge(self._opts, self._deadline_at, given)
        return ClientView(self._conn, self._rpc, merged, deadline_at, keep)

    def _track(self, segments: Iterable[_Segment]) -> None:
        pass

    # -- named functions (grid RPC, docs/rpc.md) ----------------------------------------------

    def call(
        self, name: str, /, *args: Any, version: str | None = None, timeout: float | None = None
    ) -> Any:
        """Call the named function ``name`` on a worker that serves it, and wait.

        The function's interface is fetched from the master on first use (and cached); the
        arguments are checked against it before anything is sent.

        Example::

            C = client.call("dmmul", n, A, B)     # returns C
            client.call("dmmul", n, A, B, C)      # Ninf style: fills C in place too

        Args:
            name: The function's name.
            *args: Its ``In`` and ``InOut`` arguments in order; or every parameter, the
                ``Out`` ones being arrays of the right dtype and shape to fill in place.
            version: The version to call; None: the newest served.
            timeout: Seconds to wait for the result (None: no limit); the call is cancelled
                when it runs out. The worker's execution limit is ``options(timeout=)``.

        Returns:
            The outputs: the return value (if any), then the ``Out`` and ``InOut`` arrays; None
            for no output, the output itself for one, a tuple for several.

        Raises:
            CallError: The arguments do not match the interface (nothing was sent).
            UnknownFunctionError: No worker serves ``name`` (or that version); the message
                lists what is served.
            TaskFailed: The function raised on the worker (remote type, message and
                traceback), or the call could not run.
            TimeoutError: No result within ``timeout``.
        """
        fut = self.call_async(name, *args, version=version)
        return _calls.call(fut, name, timeout)

    def call_async(self, name: str, /, *args: Any, version: str | None = None) -> CallFuture:
        """:meth:`call` without waiting: check and send the call, return its future.

        Returns:
            A :class:`CallFuture` whose ``result()`` gives the outputs.

        Raises:
            CallError, UnknownFunctionError: As :meth:`call`, at once.
        """
        opts = self._call_opts()
        return _calls.call_async(self._rpc, name, args, version, opts, self._track)

    def describe(self, name: str, version: str | None = None) -> Interface:
        """The interface of a named function, fresh from the master.

        ``print()`` (or ``help()``) of it shows the signature and the docstring, e.g.
        ``dmmul(n: int, A: In[float64[n, n]], B: In[float64[n, n]]) -> C: Out[float64[n, n]]``.

        Args:
            name: The function's name.
            version: A version; None: the newest served.

        Returns:
            An :class:`~rtpool.Interface` (``name``, ``version``, ``doc``, ``params``,
            ``returns``, and ``servers``: the connected workers serving it).

        Raises:
            UnknownFunctionError: No worker serves it; the message lists what is served.
        """
        return self._rpc.lookup(name, version)

    def functions(self) -> List[Interface]:
        """Every function the connected workers serve: one :class:`~rtpool.Interface` per name
        and version (names sorted, newest version first), with ``servers`` filled in; a
        function whose last server left less than the master's ``--service-grace`` ago is
        listed with ``servers == 0`` (calls of it wait for a server)."""
        return self._rpc.fetch_interfaces("")

    def transaction(self) -> Transaction:
        """A graph of calls sent as one frame when the ``with`` block exits.

        Example::

            with client.transaction() as tx:
                a = tx.call("dgefa", n, A)              # futures of (info, LU, ipvt)
                x = tx.call("dgesl", n, a[1], a[2], b)  # LU and ipvt stay on the master
            x.result()

        The calls use this executor's options (``client.options(priority=...)
        .transaction()``). See :class:`Transaction` and ``docs/rpc.md``.
        """
        return Transaction(self._rpc, self._call_opts, self._track)

    def _check_open(self) -> None:
        """Raise RuntimeError if this executor was shut down (a view; the client's connection
        refuses by itself)."""

    def _submission_opts(self) -> Dict[str, Any]:
        """The package options of one submission (an absolute deadline resolved now)."""
        return _options.for_submission(self._opts, self._deadline_at)

    def _call_opts(self) -> Dict[str, Any]:
        """:meth:`_submission_opts` for calls of named functions (checked once for them)."""
        self._check_open()
        if not self._calls_checked:
            _options.for_calls(self._opts)
            self._calls_checked = True
        return self._submission_opts()


if _Submitter.options.__doc__:  # None under python -OO
    _Submitter.options.__doc__ = _Submitter.options.__doc__.replace(
        "{options}", _options.options_doc(" " * 12)
    )


def _result_iterator(package: Package, end: float | None, chunked: bool) -> Iterator[Any]:
    futures = list(reversed(package.futures))
    try:
        while futures:
            fut = futures[-1]
            if end is None:
                value = fut.result()
            else:
                value = fut.result(max(0.0, end - time.monotonic()))
            futures.pop()
            if chunked:
                yield from value
            else:
                yield value
    finally:
        if futures:
            package.cancel()


def _keep_option(keep: int | None, opts: Dict[str, Any]) -> int | None:
    """Take the client-side options ``keep`` and ``keep_bytes`` out of ``opts``: the view's
    new ``_keep`` (None: results come to the client; 0: every result is kept on its worker;
    N: results of N bytes or more are).

    Raises:
        TypeError: ``keep`` is not a bool, or ``keep_bytes`` not an int.
        ValueError: ``keep_bytes`` is negative.
    """
    if "keep" in opts:
        value = opts.pop("keep")
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"option 'keep' must be a bool, got {type(value).__name__}")
        keep = 0 if value else None
    if "keep_bytes" in opts:
        value = opts.pop("keep_bytes")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"option 'keep_bytes' must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"option 'keep_bytes' must be 0 or more bytes, got {value}")
        keep = value
    return keep


class ClientView(_Submitter):
    """An executor view of a :class:`Client` with package options (see :meth:`Client.options`).

    It shares the client's connection; shutting the view down only stops it from accepting
    work (and waits for what it submitted), the client stays open.
    """

    def __init__(
        self,
        conn: _Connection,
        rpc: RpcChannel,
        opts: Dict[str, Any],
        deadline_at: float | None = None,
        keep: int | None = None,
    ) -> None:
        self._conn = conn
        self._rpc = rpc
        self._opts = opts
        self._deadline_at = deadline_at
        self._keep = keep
        self._submitted: List[_Segment] = []
        self._shut = False

    def __repr__(self) -> str:
        return f"<rtpool.ClientView {self._conn.address} {self._opts}>"

    def _track(self, segments: Iterable[_Segment]) -> None:
        if self._shut:
            return
        submitted = self._submitted
        if len(submitted) >= 256:
            submitted[:] = [s for s in submitted if s.futures is not None]
        submitted.extend(segments)

    def _check_open(self) -> None:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        self._check_open()
        return super().submit(fn, *args, **kwargs)

    def submit_many(self, fn: Callable, iterable: Iterable[Any], *, star: bool = False) -> Package:
        self._check_open()
        return super().submit_many(fn, iterable, star=star)

    submit.__doc__ = _Submitter.submit.__doc__
    submit_many.__doc__ = _Submitter.submit_many.__doc__

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work through this view; the client's connection stays open.

        Args:
            wait: Wait for the tasks submitted through this view.
            cancel_futures: Cancel those that have no result yet.
        """
        self._shut = True
        segments, self._submitted = self._submitted, []
        if cancel_futures:
            for seg in segments:
                self._conn.cancel_segment(seg)
        if wait:
            cf.wait([f for seg in segments for f in (seg.futures or ()) if not f.done()])
