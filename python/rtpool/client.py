"""The rtpool client: :class:`Client`, a ``concurrent.futures.Executor`` backed by an rtpool
master, its :meth:`~Client.options` views, and :class:`Package`.

The connection itself (socket, reader thread, routing of the master's answers) is in
``_connection.py``; the futures are in ``_future.py``; calls of named functions
(:meth:`~Client.call`, :meth:`~Client.transaction`) in ``_calls.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import os
import pickle
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List

from . import _calls
from ._anytime import gather as _gather
from ._connect import Address, TlsOption, default_name
from ._connection import _Connection, _Segment
from ._future import Future
from ._options import check_options, resolve
from ._protocol import STATUS_MISSED
from ._serialize import PICKLE_PROTOCOL, dumps_args, run_chunk, serialize_function
from .errors import AuthenticationError

if TYPE_CHECKING:
    from ._interface import Interface

__all__ = ["CallFuture", "Client", "ClientView", "Future", "Package", "Transaction"]

CallFuture = _calls.CallFuture
Transaction = _calls.Transaction

_perf_ns = time.perf_counter_ns
_dumps = pickle.dumps


class Package:
    """The tasks of one :meth:`Client.submit_many` call: one function, many argument sets.

    Iterating a package yields its futures in input order; ``len()`` is the number of tasks.
    """

    def __init__(self, conn: _Connection, futures: List[Future], segments: List[_Segment]):
        self._conn = conn
        self.futures: List[Future] = futures
        self._segments = segments

    def __len__(self) -> int:
        return len(self.futures)

    def __iter__(self) -> Iterator[Future]:
        return iter(self.futures)

    def __getitem__(self, index: int) -> Future:
        return self.futures[index]

    def __repr__(self) -> str:
        done = sum(1 for f in self.futures if f.done())
        return f"<rtpool.Package ids={self.ids} tasks={len(self.futures)} done={done}>"

    @property
    def id(self) -> int | None:
        """The master's package id (of the first frame when the package needed several).

        Waits (up to 10 s) for the master to accept the package. None for an empty package.

        Raises:
            SubmitRejected: The master refused the package.
            ConnectionLost: The connection broke before the master answered.
        """
        ids = self._ids(self._segments[:1])
        return ids[0] if ids else None

    @property
    def ids(self) -> List[int]:
        """The master's package ids, one per ``SUBMIT`` frame (usually one)."""
        return self._ids(self._segments)

    def _ids(self, segments: List[_Segment]) -> List[int]:
        return [self._conn.wait_accepted(seg, 10.0) for seg in segments]

    def done(self) -> bool:
        """True when every task has a result (or was cancelled)."""
        return all(f.done() for f in self.futures)

    def results(
        self, timeout: float | None = None, *, until: Any = None, default: Any = None
    ) -> List[Any]:
        """Wait for every task and return the values in input order.

        With ``until``, an anytime result: wait until that time at most, give ``default`` for
        each task without a result by then and cancel those tasks (as :meth:`Client.gather`
        does: the master drops the queued ones and aborts the running ones, which a worker
        kills only in packages with a ``timeout``).

        Args:
            timeout: Seconds to wait for the whole package; None waits forever.
            until: Seconds from now, or a ``datetime.datetime``: return at that time with what
                is done. Not together with ``timeout``.
            default: With ``until``, the value of each unfinished (or cancelled) task.

        Returns:
            One value per task, in input order.

        Raises:
            TimeoutError: The package did not finish within ``timeout``.
            Exception: The first failed task's exception, in input order (with ``until``: as
                soon as a task fails, see :meth:`Client.gather`).
            TypeError: Both ``timeout`` and ``until`` were given.
        """
        if until is not None:
            if timeout is not None:
                raise TypeError("pass timeout= or until=, not both")
            return _gather(self.futures, until, default=default)
        if timeout is None:
            return [f.result() for f in self.futures]
        end = time.monotonic() + timeout
        return [f.result(max(0.0, end - time.monotonic())) for f in self.futures]

    def deadline_report(self) -> Dict[str, Any]:
        """How the package's tasks fared against its deadline, from the results received.

        Returns:
            ``{"met", "missed", "dropped", "cancelled", "pending", "lateness"}``: ``met``
            counts results that came by the deadline (whatever their status), ``missed`` the
            late ones and the dropped ones (``on_miss="drop"``, status 7, also counted in
            ``dropped``), ``cancelled`` the cancelled tasks, ``pending`` those not done yet;
            ``lateness`` maps the index of each late task to its lateness in seconds. Tasks
            that failed on the client (the package was refused, the connection lost) are in
            none of these.

        Raises:
            ValueError: The package was submitted without a deadline.
        """
        if not any(seg.has_deadline for seg in self._segments):
            raise ValueError(
                "the package has no deadline; submit it with client.options(deadline=...)"
            )
        counts = _deadline_counts(self.futures)
        lateness = counts.pop("lateness")
        counts["pending"] = sum(1 for f in self.futures if not f.done())
        counts["lateness"] = lateness
        return counts

    def as_completed(self, timeout: float | None = None) -> Iterator[Future]:
        """Yield the futures as they complete (``concurrent.futures.as_completed``).

        Raises:
            TimeoutError: Not all futures completed within ``timeout`` seconds.
        """
        return cf.as_completed(self.futures, timeout)

    def cancel(self) -> int:
        """Cancel every task that has no result yet (one ``CANCEL`` per master package).

        Returns:
            The number of futures this call cancelled.
        """
        return sum(self._conn.cancel_segment(seg) for seg in self._segments)

    def status(self, timeout: float = 10.0) -> Dict[str, int]:
        """Ask the master for the package's counters.

        Args:
            timeout: Seconds to wait for the master's answer.

        Returns:
            ``{"total", "queued", "running", "done", "cancelled"}`` summed over the package's
            frames, and ``"met"`` and ``"missed"`` from a master with deadlines (results by
            the deadline; late results and tasks dropped for it). ``done`` counts results the
            master has sent; parts the master already freed are counted from the futures here.

        Raises:
            TimeoutError: The master did not answer in time.
            ConnectionLost: The connection broke (or is being re-established: ask again).
        """
        total = dict.fromkeys(_STATUS_KEYS, 0)
        deadline_counts = False
        pos = 0
        for seg in self._segments:
            futures = self.futures[pos : pos + seg.n]
            pos += seg.n
            reply = None
            if seg.futures is not None:
                self._conn.wait_accepted(seg, timeout)
                reply = self._conn.status(seg, timeout)
            if reply is None:
                cancelled = sum(1 for f in futures if f.cancelled())
                reply = (seg.n, 0, 0, seg.n - cancelled, cancelled)
                if seg.has_deadline:
                    counts = _deadline_counts(futures)
                    reply += (counts["met"], counts["missed"])
            deadline_counts = deadline_counts or len(reply) > 5
            for key, value in zip(_STATUS_KEYS, reply):
                total[key] += value
        if not deadline_counts:
            del total["met"], total["missed"]
        return total


#: Counters of STATUS_REPLY, in wire order (a master without deadlines sends the first five).
_STATUS_KEYS = ("total", "queued", "running", "done", "cancelled", "met", "missed")


def _deadline_counts(futures: List[Future]) -> Dict[str, Any]:
    """``met``, ``missed``, ``dropped``, ``cancelled`` and ``lateness`` of these futures."""
    met = missed = dropped = cancelled = 0
    lateness: Dict[int, float] = {}
    for i, fut in enumerate(futures):
        r = fut._entry
        if fut.cancelled():
            cancelled += 1
            continue
        if r is None:
            continue
        late_us = r[8] if len(r) > 8 else 0
        if r[1] == STATUS_MISSED:
            dropped += 1
            missed += 1
        elif late_us > 0:
            missed += 1
        else:
            met += 1
        if late_us > 0:
            lateness[i] = late_us / 1e6
    return {
        "met": met,
        "missed": missed,
        "dropped": dropped,
        "cancelled": cancelled,
        "lateness": lateness,
    }


class _Submitter(cf.Executor):
    """What :class:`Client` and its :meth:`~Client.options` views share."""

    _conn: _Connection
    _opts: Dict[str, Any]
    # An absolute deadline (time.time() seconds): deadline_ms is computed at each submission.
    _deadline_at: float | None = None

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker.

        Every keyword argument goes to ``fn``; package options are set with :meth:`options`.

        Args:
            fn: A picklable callable (cloudpickle: lambdas and closures work).
            *args: Positional arguments of ``fn``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The task's :class:`Future`.

        Raises:
            TypeError: ``fn`` or the arguments cannot be pickled.
            ValueError: The executor's absolute ``deadline`` has passed.
            RuntimeError: The executor was shut down.
            ConnectionLost: The connection to the master is gone.
        """
        t0 = _perf_ns()
        digest, code = serialize_function(fn)
        payload = dumps_args(args, kwargs or None)
        t1 = _perf_ns()
        opts = self._opts if self._deadline_at is None else resolve(self._opts, self._deadline_at)
        fut, seg = self._conn.submit_one(digest, code, opts, payload, t0, t1 - t0)
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
        opts = self._opts if self._deadline_at is None else resolve(self._opts, self._deadline_at)
        futures, segments = self._conn.submit(digest, code, opts, payloads, t0, t1 - t0)
        self._track(segments)
        return Package(self._conn, futures, segments)

    def map(
        self,
        fn: Callable,
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
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

    def options(self, **opts: Any) -> ClientView:
        """An executor sharing this connection that submits with these package options.

        Options given here are merged into this executor's own (``client.options(a=1)
        .options(b=2)`` has both); ``None`` resets one to its default. Everything is checked
        here, before anything is sent. See ``docs/deadlines.md`` for deadlines, hedging and
        quorum.

        Args:
            **opts: Package options:

                * ``priority`` (int, default 0): higher runs first. Within one priority users
                  take turns, and each user's packages run earliest deadline first.
                * ``timeout`` (seconds, default None: no limit): each task's execution time
                  limit; a task past it is killed and its future raises
                  :class:`~rtpool.errors.TaskTimeoutError`.
                * ``deadline`` (default None): every task's deadline, as seconds from
                  submission (int or float > 0) or an absolute ``datetime.datetime`` (aware,
                  or naive in local time), turned into milliseconds from now with this
                  machine's clock at each submission (rounded up).
                * ``on_miss`` (``"run"``, default, or ``"drop"``): late tasks run anyway and
                  report ``future.lateness``, or are dropped and raise
                  :class:`~rtpool.errors.DeadlineMissedError`.
                * ``admit`` (bool, default False): admission control; the master refuses a
                  package that cannot finish by its deadline and its futures raise
                  :class:`~rtpool.errors.AdmissionError`. Needs ``deadline``.
                * ``replicas`` (1 to 16, default 1): copies of each task, on distinct workers.
                * ``quorum`` (1 to ``replicas``, default 1): byte-equal results needed; copies
                  that never agree raise :class:`~rtpool.errors.QuorumError`.
                * ``max_copies`` (0 to 16, default 0: ``replicas + quorum``): most copies of
                  one task ever started; at least ``replicas``.
                * ``hedge`` (bool, default False): a straggling task gets one backup copy on
                  another worker; the first result wins.

        Returns:
            A :class:`ClientView`; its ``submit``/``submit_many``/``map`` pass every keyword
            argument to the task function.

        Raises:
            TypeError: An unknown option name (the message lists the valid ones) or a wrong
                type.
            ValueError: A value out of range (``timeout`` not positive, ``deadline`` in the
                past, ``quorum`` above ``replicas``, ...) or ``admit`` without a deadline.
        """
        # In wire form once per view (defaults left out, spec order), not once per submission.
        merged, deadline_at = check_options(self._opts, self._deadline_at, opts)
        return ClientView(self._conn, merged, deadline_at)

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
        return _calls.call(self, name, args, version, timeout)

    def call_async(self, name: str, /, *args: Any, version: str | None = None) -> CallFuture:
        """:meth:`call` without waiting: check and send the call, return its future.

        Returns:
            A :class:`CallFuture` whose ``result()`` gives the outputs.

        Raises:
            CallError, UnknownFunctionError: As :meth:`call`, at once.
        """
        return _calls.call_async(self, name, args, version)

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
        return _calls.lookup(self._conn, name, version)

    def functions(self) -> List[Interface]:
        """Every function the connected workers serve: one :class:`~rtpool.Interface` per name
        and version (names sorted, newest version first), with ``servers`` filled in."""
        return _calls.fetch_interfaces(self._conn, "")

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
        return _calls.Transaction(self)

    def _call_opts(self) -> Dict[str, Any]:
        """This executor's package options for calls (checked once, deadline resolved now)."""
        if not self.__dict__.get("_call_opts_checked"):
            _calls.call_opts(self._opts, None)
            self._call_opts_checked = True
        return self._opts if self._deadline_at is None else resolve(self._opts, self._deadline_at)


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


class ClientView(_Submitter):
    """An executor view of a :class:`Client` with package options (see :meth:`Client.options`).

    It shares the client's connection; shutting the view down only stops it from accepting
    work (and waits for what it submitted), the client stays open.
    """

    def __init__(
        self, conn: _Connection, opts: Dict[str, Any], deadline_at: float | None = None
    ) -> None:
        self._conn = conn
        self._opts = opts
        self._deadline_at = deadline_at
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

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return super().submit(fn, *args, **kwargs)

    def submit_many(self, fn: Callable, iterable: Iterable[Any], *, star: bool = False) -> Package:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
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


class Client(_Submitter):
    """A connection to an rtpool master, usable as a ``concurrent.futures.Executor``.

    Example::

        with rtpool.Client("127.0.0.1:7070", token) as client:
            print(list(client.map(pow, range(10), range(10))))

    Args:
        address: The master's ``"host:port"`` or ``(host, port)``.
        token: The master's client token; by default ``$RTPOOL_TOKEN``.
        name: Name shown in the master's log and status (default ``hostname:pid``).
        connect_timeout: Seconds to wait for the connection and the handshake.
        tls: ``True`` to connect with TLS (checked against the system trust store, or
            ``ca_file``), or a ready ``ssl.SSLContext``; ``False`` (default): plain TCP.
        ca_file: PEM certificate(s) to trust, e.g. the ``cert.pem`` a master started with
            ``--tls-self-signed`` prints; implies ``tls=True``.
        reconnect_timeout: When the connection drops with tasks pending, seconds to keep
            trying to reconnect (backoff from 0.05 s doubling to 5 s, with jitter); packages
            are then re-attached and no result is lost or delivered twice. 0 disables it:
            pending futures fail with :class:`~rtpool.errors.ConnectionLost` at once.

    Raises:
        ConnectError: The master cannot be reached (or the TLS handshake failed).
        AuthenticationError: The master refused the token (or none was given).
        ProtocolError: The master answered the handshake with something unexpected.
    """

    def __init__(
        self,
        address: Address,
        token: str | None = None,
        *,
        name: str | None = None,
        connect_timeout: float = 10.0,
        tls: TlsOption = False,
        ca_file: str | None = None,
        reconnect_timeout: float = 60.0,
    ) -> None:
        if not reconnect_timeout >= 0:
            raise ValueError(f"reconnect_timeout must be >= 0 seconds, got {reconnect_timeout!r}")
        if token is None:
            token = os.environ.get("RTPOOL_TOKEN")
        if not token:
            raise AuthenticationError(
                "no client token: pass token= or set RTPOOL_TOKEN (the master prints it on "
                "first start and keeps it in its data dir as client.token)"
            )
        self._opts: Dict[str, Any] = {}
        self._conn = _Connection(
            address,
            token,
            name or default_name(),
            connect_timeout,
            tls,
            ca_file,
            reconnect_timeout,
        )
        # A client dropped without shutdown() closes once its pending tasks are done.
        self._finalizer = weakref.finalize(self, self._conn.shutdown, False)

    def __repr__(self) -> str:
        state = " closed" if self._conn.closing else ""
        return f"<rtpool.Client {self._conn.address} session={self._conn.session}{state}>"

    @property
    def address(self) -> str:
        """The master's ``host:port``."""
        return self._conn.address

    @property
    def session(self) -> int:
        """The session id the master gave this connection."""
        return self._conn.session

    @property
    def reconnects(self) -> int:
        """How many times the client reconnected to the master after losing the connection."""
        return self._conn.reconnects

    @property
    def max_frame_bytes(self) -> int:
        """The master's frame limit; larger packages are split into several frames."""
        return self._conn.max_frame_bytes

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks and close the connection when nothing is pending.

        Args:
            wait: Block until every pending task has a result, then close (across
                reconnections).
            cancel_futures: First cancel every task that has no result yet (the master is
                told with one ``CANCEL`` per package).
        """
        self._conn.shutdown(wait, cancel_futures)

    def close(self) -> None:
        """Cancel every pending task and close the connection now. Idempotent."""
        self._conn.shutdown(wait=True, cancel_futures=True)
