"""asyncio support of rtpool futures: ``await fut`` without a thread per future, and waiting
on many futures from an event loop (what :class:`~rtpool.AsyncClient`'s ``gather`` and
``as_completed`` use).

An rtpool future is resolved by the client's reader thread. Awaiting it registers a done
callback; the callback hands the wake-up to the event loop with
``loop.call_soon_threadsafe``, batched by one :class:`_Waker` per loop: while a wake-up is
scheduled and not yet run, more resolved futures only join its list, so a package whose
10,000 results arrive in a few ``RESULTS`` batches costs a few self-pipe writes, not 10,000.
No thread is started here, ever.

Cancelling the coroutine (``task.cancel()``, ``asyncio.wait_for`` running out) cancels the
rtpool task: ``fut.cancel()``, which sends the master's ``CANCEL``.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import weakref
from typing import Any, Callable, Collection, Deque, Generator, List, Set, Tuple

from ._kept import KeptRef

__all__ = ["await_future", "wait"]

# One waker per running loop, made on the first await in that loop (a loop type that does not
# take weak references gets a waker per await: correct, only without the batching).
_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waker] = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


class _Waker:
    """Runs callables on one event loop, handed over from any thread in batches."""

    __slots__ = ("_loop", "_lock", "_ready", "_scheduled", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the waker is the loop's value in _wakers, which must not keep it alive.
        try:
            self._loop: Callable[[], Any] = weakref.ref(loop)
        except TypeError:  # a loop without weak references (then not in _wakers either)
            self._loop = lambda: loop
        self._lock = threading.Lock()
        self._ready: Deque[Tuple[Callable[[Any], None], Any]] = collections.deque()
        self._scheduled = False

    def call(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on the loop soon; callable from any thread (the reader thread)."""
        with self._lock:
            self._ready.append((fn, arg))
            if self._scheduled:
                return  # the scheduled drain takes this one too
            self._scheduled = True
        loop = self._loop()
        if loop is None:
            return  # the loop is gone: nobody awaits any more
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop was closed: nobody awaits any more
            pass

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, collections.deque()
            self._scheduled = False
        for fn, arg in ready:
            fn(arg)


def _waker(loop: asyncio.AbstractEventLoop) -> _Waker:
    waker = _wakers.get(loop)
    if waker is None:
        with _wakers_lock:
            waker = _wakers.get(loop)
            if waker is None:
                waker = _Waker(loop)
                try:
                    _wakers[loop] = waker
                except TypeError:  # a loop without weak references
                    pass
    return waker


def _set_none(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def await_future(fut: Any) -> Generator[Any, None, Any]:
    """``fut.__await__()`` of an rtpool future: wait on the running loop, then give what
    ``fut.result()`` gives (its value, or raise its exception, ``CancelledError`` of
    ``concurrent.futures`` for a future cancelled elsewhere).

    Raises:
        RuntimeError: Not awaited inside a running event loop.
    """
    if not fut.done():
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waker = _waker(loop)
        fut.add_done_callback(lambda _f: waker.call(_set_none, waiter))
        try:
            yield from waiter
        except asyncio.CancelledError:
            fut.cancel()  # the awaiting coroutine was cancelled: so is the task (CANCEL)
            raise
    if fut._state == "FINISHED" and type(fut._result) is KeptRef:
        # Kept on its worker (options(keep=True)): reading it is a round trip to that worker.
        loop = asyncio.get_running_loop()
        return (yield from loop.run_in_executor(None, fut.result))
    return fut.result(0)


async def wait(futures: Collection[Any], timeout: float | None, first_exception: bool) -> Set[Any]:
    """Wait until every future is done, one fails (with ``first_exception``), or ``timeout``
    seconds pass; return the futures not done. Cancelling the caller leaves the futures as
    they are (the caller decides)."""
    loop = asyncio.get_running_loop()
    pending = {f for f in futures if not f.done()}
    if not pending:
        return pending
    waiter = loop.create_future()
    waker = _waker(loop)

    def on_done(f: Any) -> None:  # on the loop
        pending.discard(f)
        if waiter.done():
            return
        if not pending or (first_exception and _failed(f)):
            waiter.set_result(None)

    for f in list(pending):
        f.add_done_callback(lambda f: waker.call(on_done, f))
    timer = None if timeout is None else loop.call_later(max(0.0, timeout), _set_none, waiter)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
    return {f for f in futures if not f.done()}


def _failed(fut: Any) -> bool:
    return not fut.cancelled() and fut.exception(0) is not None


class Completed:
    """``async for fut in Completed(futures, timeout)``: the futures as they complete."""

    def __init__(self, futures: List[Any], timeout: float | None) -> None:
        self._left = len(futures)
        self._futures = futures
        self._timeout = timeout
        self._ready: Deque[Any] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._end: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __aiter__(self) -> Completed:
        return self

    def _on_done(self, fut: Any) -> None:  # on the loop
        self._ready.append(fut)
        if self._waiter is not None:
            _set_none(self._waiter)

    def _start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        if self._timeout is not None:
            self._end = loop.time() + self._timeout
        waker = _waker(loop)
        for f in self._futures:
            f.add_done_callback(lambda f: waker.call(self._on_done, f))
        self._futures = []

    async def __anext__(self) -> Any:
        if self._loop is None:
            self._start()
        if self._left == 0:
            raise StopAsyncIteration
        loop = self._loop
        assert loop is not None
        while not self._ready:
            self._waiter = waiter = loop.create_future()
            timer = None
            if self._end is not None:
                timer = loop.call_at(self._end, _set_none, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if not self._ready and self._end is not None and loop.time() >= self._end:
                raise TimeoutError(
                    f"{self._left} futures did not complete within {self._timeout:g} s"
                )
        self._left -= 1
        return self._ready.popleft()
