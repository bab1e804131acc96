"""The asyncio client: :class:`AsyncClient` (and its :meth:`~AsyncClient.options` views),
an rtpool :class:`~rtpool.Client` whose methods are coroutines that never block the event loop.

It wraps a :class:`~rtpool.Client`: the same connection, reader thread and futures. Results
come as the client's own futures, which are awaitable (``await fut``, see ``_aio.py``): no
thread per future. What may block is kept off the loop (``docs/asyncio.md`` has the table):

* connecting, ``status``, ``describe``/``functions``, closing, and reading a result kept on
  its worker run in the loop's default executor (``loop.run_in_executor(None, ...)``);
* ``submit`` pickles in the calling coroutine, as any CPU work, and writes its frame inline
  when that cannot block: a frame of 64 KiB or less that fits in the socket's free send
  buffer, with none of this client's sends queued on its sender thread. Otherwise (a large
  frame, a master not reading fast enough, a task with future arguments) the frame goes to
  the client's sender thread, one thread per client that keeps the order of submissions;
* ``submit_many``, ``map`` and ``call`` build and send on that sender thread (one hop per
  package or call, not per task).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import itertools
import socket
import time
from typing import Any, AsyncIterator, Callable, Dict, Generator, Iterable, List

from . import _aio, _deps
from ._anytime import _raise_first, cancel_futures
from ._connection.connection import _queued_bytes
from ._future import Future
from ._options import seconds_until
from ._package import Package
from ._serialize import dumps_args, run_chunk, serialize_function
from ._submitter import _Submitter
from .client import Client
from .rpc.calls import CallFuture

__all__ = ["AsyncClient", "AsyncClientView"]

_perf_ns = time.perf_counter_ns
#: A submission frame up to this size is written from the event loop when the socket's send
#: buffer has room for it; a larger one goes to the sender thread.
INLINE_MAX_BYTES = 64 * 1024


class _Shared:
    """What a client and its views share: the sync client and the sender thread."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.sender = cf.ThreadPoolExecutor(1, thread_name_prefix="rtpool-async-sender")
        self.queued = 0  # sends of this client on the sender thread, not finished yet
        self.sock: Any = None
        self.sndbuf = 0


def _fits(shared: _Shared, conn: Any, size: int) -> bool:
    """Whether writing ``size`` bytes now cannot block: no send of ours is queued, and the
    socket's send buffer has room (half its ``SO_SNDBUF``: the kernel counts its overhead in
    it). While disconnected the frame is not written at all (the reconnection sends it)."""
    if shared.queued or size > INLINE_MAX_BYTES:
        return False
    sock = conn.sock
    if sock is None:
        return True
    if sock is not shared.sock:
        try:
            shared.sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2
        except OSError:
            return False
        shared.sock = sock
    return _queued_bytes(sock) + size <= shared.sndbuf


class _AsyncSubmitter:
    """What :class:`AsyncClient` and its views share: submitting, gathering, calls."""

    _shared: _Shared
    _view: _Submitter | None

    def _executor(self) -> _Submitter:
        view = self._view
        if view is None:
            raise RuntimeError(
                "the AsyncClient is not connected yet: `async with AsyncClient(...)` or "
                "`client = await AsyncClient(...)` first"
            )
        return view

    async def _on_sender(self, fn: Callable[..., Any], *args: Any) -> Any:
        shared = self._shared
        shared.queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(shared.sender, fn, *args)
        finally:
            shared.queued -= 1

    async def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker; ``await`` the returned future for its
        value. As :meth:`rtpool.Client.submit`.

        Returns:
            The task's :class:`~rtpool.Future` (``await fut`` or ``fut.result()``).

        Raises:
            TypeError, ValueError, RuntimeError, ConnectionLost: As ``Client.submit``.
        """
        view = self._executor()
        view._check_open()
        if view._keep is not None or _deps.has_future(args, kwargs):
            return await self._on_sender(lambda: view.submit(fn, *args, **kwargs))
        t0 = _perf_ns()
        digest, code = serialize_function(fn)
        payload = dumps_args(args, kwargs or None, view._conn.shm_owner)
        ser_ns = _perf_ns() - t0
        if _fits(self._shared, view._conn, len(payload) + len(code) + 256):
            return view._send_task(digest, code, payload, t0, ser_ns, None)
        return await self._on_sender(view._send_task, digest, code, payload, t0, ser_ns, None)

    async def submit_many(
        self, fn: Callable, iterable: Iterable[Any], *, star: bool = False
    ) -> Package:
        """:meth:`rtpool.Client.submit_many`, built and sent on the sender thread.

        Returns:
            The :class:`~rtpool.Package`; each of its futures is awaitable, and
            :meth:`gather` or :meth:`as_completed` take it as it is.
        """
        view = self._executor()
        items = list(iterable)  # here: an iterable may belong to the loop's thread
        return await self._on_sender(lambda: view.submit_many(fn, items, star=star))

    def map(
        self,
        fn: Callable,
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> MapResults:
        """``fn`` over the zipped ``iterables`` as one package; results in input order.

        ``await client.map(...)`` gives the list; ``async for value in client.map(...)``
        gives each value once it and those before it are there (leaving the loop early
        cancels what is left).

        Args:
            fn, iterables, chunksize: As :meth:`rtpool.Client.map`.
            timeout: Seconds from the first await until every result must be there.

        Raises:
            ValueError: ``chunksize`` is below 1.
            TimeoutError: (when awaited or iterated) a result is not there in time.
        """
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        view = self._executor()
        items = zip(*iterables)
        if chunksize == 1:
            args = list(items)
            return MapResults(self, lambda: view.submit_many(fn, args, star=True), False, timeout)
        chunks = list(iter(lambda: list(itertools.islice(items, chunksize)), []))
        task = functools.partial(run_chunk, fn)
        return MapResults(self, lambda: view.submit_many(task, chunks), True, timeout)

    async def gather(
        self,
        futures: Iterable[cf.Future],
        deadline: Any = None,
        *,
        default: Any = None,
        return_exceptions: bool = False,
    ) -> List[Any]:
        """:meth:`rtpool.Client.gather` for coroutines: the values of the futures done by
        ``deadline``, ``default`` for the rest, which are cancelled (one ``CANCEL`` per
        package). Cancelling the awaiting coroutine cancels the futures still pending.

        Raises:
            Exception: Without ``return_exceptions``, the first failed future's exception,
                as soon as one fails.
            TypeError: ``deadline`` is neither a number nor a datetime.
        """
        futures = list(futures)
        timeout = seconds_until(deadline)
        try:
            not_done = await _aio.wait(futures, timeout, not return_exceptions)
        except asyncio.CancelledError:
            cancel_futures([f for f in futures if not f.done()])
            raise
        if not return_exceptions:
            _raise_first(futures)
        if not_done:
            cancel_futures(not_done)
        out = []
        for fut in futures:
            if fut.cancelled() or not fut.done():
                out.append(default)
            elif fut.exception(0) is not None:
                if not return_exceptions:
                    raise fut.exception(0)  # failed while the others were being cancelled
                out.append(fut.exception(0))
            else:
                out.append(await fut if isinstance(fut, Future) else fut.result(0))
        return out

    def as_completed(
        self, futures: Iterable[cf.Future], timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """``async for fut in client.as_completed(futures)``: each future once it is done
        (then ``await fut`` or ``fut.result()`` gives its value at once).

        Raises:
            TimeoutError: (from the iteration) not all completed within ``timeout`` seconds.
        """
        return _aio.Completed(list(futures), timeout)

    async def call(
        self, name: str, /, *args: Any, version: str | None = None, timeout: float | None = None
    ) -> Any:
        """:meth:`rtpool.Client.call` for coroutines: check and send the call (sender thread;
        the first call of a function fetches its interface), then await its outputs.

        Raises:
            CallError, UnknownFunctionError, TaskFailed: As ``Client.call``.
            TimeoutError: No result within ``timeout``; the call was cancelled.
        """
        fut = await self.call_async(name, *args, version=version)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"{name}: no result within {timeout:g} s; the call was cancelled"
            ) from None

    async def call_async(self, name: str, /, *args: Any, version: str | None = None) -> CallFuture:
        """:meth:`rtpool.Client.call_async`: the call's awaitable :class:`~rtpool.CallFuture`."""
        view = self._executor()
        return await self._on_sender(lambda: view.call_async(name, *args, version=version))

    async def describe(self, name: str, version: str | None = None) -> Any:
        """:meth:`rtpool.Client.describe`, from the default executor (a round trip)."""
        view = self._executor()
        return await asyncio.get_running_loop().run_in_executor(None, view.describe, name, version)

    async def functions(self) -> List[Any]:
        """:meth:`rtpool.Client.functions`, from the default executor (a round trip)."""
        view = self._executor()
        return await asyncio.get_running_loop().run_in_executor(None, view.functions)

    def options(self, **opts: Any) -> AsyncClientView:
        """An asyncio view with these package options (:meth:`rtpool.Client.options`)."""
        return AsyncClientView(self._shared, self._executor().options(**opts))


class MapResults:
    """What :meth:`AsyncClient.map` returns: awaitable (the list of results) and async
    iterable (each result in input order)."""

    def __init__(
        self,
        owner: _AsyncSubmitter,
        submit: Callable[[], Package],
        chunked: bool,
        timeout: float | None,
    ) -> None:
        self._owner = owner
        self._submit = submit
        self._chunked = chunked
        self._timeout = timeout

    def __await__(self) -> Generator[Any, None, List[Any]]:
        return self._collect().__await__()

    async def _collect(self) -> List[Any]:
        return [value async for value in self]

    async def __aiter__(self) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        end = None if self._timeout is None else loop.time() + self._timeout
        package = await self._owner._on_sender(self._submit)
        left = list(reversed(package.futures))
        try:
            while left:
                fut = left[-1]
                if end is None:
                    value = await fut
                else:
                    try:
                        value = await asyncio.wait_for(fut, end - loop.time())
                    except asyncio.TimeoutError:
                        raise TimeoutError(
                            f"map: {len(left)} results not there within {self._timeout:g} s"
                        ) from None
                left.pop()
                if self._chunked:
                    for v in value:
                        yield v
                else:
                    yield value
        finally:
            if left:
                cancel_futures(left)


class AsyncClient(_AsyncSubmitter):
    """An asyncio client of an rtpool master: coroutine methods that never block the loop.

    Example::

        async with rtpool.AsyncClient("127.0.0.1:7070", token) as client:
            fut = await client.submit(pow, 2, 10)
            print(await fut)                                  # 1024
            print(await client.map(pow, range(5), range(5)))  # [1, 1, 4, 27, 256]

    ``client = await rtpool.AsyncClient(...)`` connects too (then ``await client.close()``).
    The connection is opened in the loop's default executor; the futures are the
    :class:`~rtpool.Client`'s own, awaitable without a thread per future
    (``docs/asyncio.md``).

    Args:
        address: The master's ``"host:port"`` or ``(host, port)``, or several (a leader and
            its standbys) as :class:`~rtpool.Client` takes them.
        token: The client token; by default ``$RTPOOL_TOKEN``.
        **kwargs: The other arguments of :class:`~rtpool.Client` (``tls``, ``ca_file``,
            ``connect_timeout``, ``reconnect_timeout``, ...).

    Raises:
        ConnectError, AuthenticationError, ProtocolError: (when connecting) as ``Client``.
    """

    def __init__(self, address: Any, token: str | None = None, **kwargs: Any) -> None:
        self._args = (address, token)
        self._kwargs = kwargs
        self._shared = _Shared()
        self._view = None

    @classmethod
    def from_client(cls, client: Client) -> AsyncClient:
        """An :class:`AsyncClient` over an open :class:`~rtpool.Client` (closing it closes
        ``client``)."""
        self = cls(client.address)
        self._shared.client = self._view = client
        return self

    def __repr__(self) -> str:
        client = self._shared.client
        return f"<rtpool.AsyncClient {client!r}>" if client else "<rtpool.AsyncClient unconnected>"

    async def connect(self) -> AsyncClient:
        """Open the connection (in the loop's default executor); nothing if it is open."""
        if self._shared.client is None:
            address, token = self._args
            loop = asyncio.get_running_loop()
            client = await loop.run_in_executor(
                None, lambda: Client(address, token, **self._kwargs)
            )
            self._shared.client = self._view = client
        return self

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self.connect().__await__()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.shutdown(wait=True)

    @property
    def sync(self) -> Client:
        """The underlying :class:`~rtpool.Client` (for what has no coroutine here, e.g.
        ``transaction()``, whose futures are awaitable too)."""
        self._executor()
        assert self._shared.client is not None
        return self._shared.client

    @property
    def address(self) -> str:
        """The ``host:port`` of the master the client is (or was last) connected to: with
        several addresses, the leader's."""
        return self.sync.address

    async def status(self, timeout: float = 10.0) -> Dict[str, Any]:
        """:meth:`rtpool.Client.status`, from the default executor (a round trip)."""
        client = self.sync
        return await asyncio.get_running_loop().run_in_executor(None, client.status, timeout)

    async def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """:meth:`rtpool.Client.shutdown` from the default executor (waiting for the pending
        tasks does not block the loop), then stop the sender thread."""
        client = self._shared.client
        if client is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                None, lambda: client.shutdown(wait, cancel_futures=cancel_futures)
            )
        self._shared.sender.shutdown(wait=False)

    async def close(self) -> None:
        """Cancel every pending task and close the connection (:meth:`rtpool.Client.close`)."""
        await self.shutdown(wait=True, cancel_futures=True)


class AsyncClientView(_AsyncSubmitter):
    """An asyncio view of an :class:`AsyncClient` with package options (its
    :meth:`~AsyncClient.options`); it shares the client's connection and sender thread."""

    def __init__(self, shared: _Shared, view: _Submitter) -> None:
        self._shared = shared
        self._view = view

    def __repr__(self) -> str:
        return f"<rtpool.AsyncClientView {self._view!r}>"
