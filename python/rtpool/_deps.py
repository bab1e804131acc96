"""Futures as task arguments, kept results and lineage, on the client (``docs/data.md``).

``client.submit(g, client.submit(f, x))``: a task whose arguments hold futures is sent once
every one of them has a result. A future whose result was kept on its worker
(``options(keep=True)``) is passed as its :class:`~rtpool._kept.KeptRef`: the dependent task's
worker reads the value from the producer's worker directly, and the value never comes to the
client. Any other future is passed as its value.

Lineage: every kept task remembers how it was made (its function and arguments). When a kept
value is lost (its worker died, or evicted it), reading it re-runs its producer, up to the
package's ``max_attempts`` (3 unless set), and the reader carries on with the new copy; a
dependent task that failed with :class:`~rtpool.errors.KeptResultLost` is sent again after
its producers ran again. A dependent waits on a thread of a small pool, never on the
connection's reader thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from typing import Any, Callable, Dict, List

from ._future import Future
from ._kept import NOTHING, KeptRef, keep_task
from .errors import DependencyFailed, KeptResultLost

# The executor (``_Submitter``) a task was sent through; not imported: it imports this module.
_Submitter = Any

__all__ = ["has_future", "rerun", "submit"]

_DEFAULT_ATTEMPTS = 3
#: Kept arguments of at least this many bytes on one worker make the task prefer that worker
#: (package option ``near``).
NEAR_MIN_BYTES = 64 * 1024
_MAX_THREADS = 64
_jobs: queue.SimpleQueue = queue.SimpleQueue()
_pool_lock = threading.Lock()
_threads = 0
_idle = 0


class Lineage:
    """How a kept result was made: enough to make it again."""

    __slots__ = ("view", "task", "args", "kwargs", "attempts")

    def __init__(self, view: _Submitter, task: Callable, args: tuple, kwargs: Dict | None):
        self.view = view
        self.task = task
        self.args = args
        self.kwargs = kwargs
        #: Times it ran (the first run included).
        self.attempts = 1

    @property
    def max_attempts(self) -> int:
        return int(self.view._opts.get("max_attempts", _DEFAULT_ATTEMPTS))

    def remake(self, fut: Future) -> KeptRef | None:
        """Run the task again for ``fut`` (see :func:`rerun`)."""
        return rerun(fut)


def has_future(args: tuple, kwargs: Dict[str, Any]) -> bool:
    """Whether an argument is an rtpool future (a dependency)."""
    for a in args:
        if isinstance(a, Future):
            return True
    if kwargs:
        for v in kwargs.values():
            if isinstance(v, Future):
                return True
    return False


def submit(view: _Submitter, fn: Callable, args: tuple, kwargs: Dict[str, Any]) -> Future:
    """Submit a kept task, or one whose arguments hold futures (see the module docstring)."""
    task = keep_task(fn, view._keep)
    deps = _dependencies(args, kwargs)
    if not deps:
        return _send(view, task, args, kwargs)
    proxy = Future()
    _spawn(_run_dependent, view, task, args, kwargs, deps, proxy)
    return proxy


def _dependencies(args: tuple, kwargs: Dict[str, Any]) -> List[Future]:
    deps = [a for a in args if isinstance(a, Future)]
    if kwargs:
        deps += [v for v in kwargs.values() if isinstance(v, Future)]
    return deps


def _spawn(fn: Callable, *args: Any) -> None:
    """Run ``fn(*args)`` on the dependents' thread pool: daemon threads (a dependent left
    waiting never holds the interpreter's exit), at most ``_MAX_THREADS``, FIFO. Dependents
    always wait on earlier futures, so a FIFO pool cannot deadlock."""
    global _threads
    _jobs.put((fn, args))
    with _pool_lock:
        if _idle > 0 or _threads >= _MAX_THREADS:
            return
        _threads += 1
    threading.Thread(target=_pool_thread, name="rtpool-deps", daemon=True).start()


def _pool_thread() -> None:
    global _idle
    while True:
        with _pool_lock:
            _idle += 1
        fn, args = _jobs.get()
        with _pool_lock:
            _idle -= 1
        fn(*args)
        # Not held while idle: the arguments' futures keep kept values alive on their workers.
        del fn, args


def _send(view: _Submitter, task: Callable, args: tuple, kwargs: Dict | None) -> Future:
    """Send the task now; its arguments' futures are done. Raises DependencyFailed."""
    sent_args = tuple(_argument(a, i) for i, a in enumerate(args))
    sent_kwargs = {k: _argument(v, k) for k, v in kwargs.items()} if kwargs else {}
    opts = None
    near = _nearest(sent_args, sent_kwargs)
    if near:
        opts = {**view._submission_opts(), "near": near}
    fut = view._submit_now(task, sent_args, sent_kwargs, opts)
    fut._lineage = Lineage(view, task, args, kwargs)
    return fut


def _nearest(args: tuple, kwargs: Dict[str, Any]) -> int:
    """The session of the worker holding the most bytes of kept arguments, if they are at
    least ``NEAR_MIN_BYTES`` (below that, moving them costs less than waiting); else 0."""
    held: Dict[int, int] = {}
    for a in (*args, *kwargs.values()):
        if type(a) is KeptRef and a.session:
            held[a.session] = held.get(a.session, 0) + a.size_bytes
    if not held:
        return 0
    session, size = max(held.items(), key=lambda kv: kv[1])
    return session if size >= NEAR_MIN_BYTES else 0


def _argument(value: Any, where: Any) -> Any:
    if not isinstance(value, Future):
        return value
    if value.cancelled():
        raise DependencyFailed(f"argument {where!r} is a cancelled task's future")
    exc = value.exception()
    if exc is not None:
        what = f"argument {where!r} is the future of a task that failed: {exc}"
        raise DependencyFailed(what) from exc
    raw = value._result
    if type(raw) is KeptRef:
        return raw  # the dependent's worker reads it from the producer's worker
    return value.result()


def _run_dependent(
    view: _Submitter, task: Callable, args: tuple, kwargs: Dict | None, deps: List, proxy: Future
) -> None:
    """Wait for the dependencies, send the task, re-run lost producers; fill ``proxy``."""
    running: List[Future] = []

    def on_proxy_done(p: Future) -> None:  # the owner cancelled it: so is what runs for it
        if p.cancelled() and running:
            running[-1].cancel()

    proxy.add_done_callback(on_proxy_done)
    try:
        cf.wait(deps)
        while True:
            if proxy.cancelled():
                return
            inner = _send(view, task, args, kwargs)
            running.append(inner)
            if proxy.cancelled():  # cancelled while it was being sent
                inner.cancel()
                return
            exc = inner.exception()
            if isinstance(exc, KeptResultLost) and _rerun_lost(deps, exc.key):
                continue
            break
        _copy(inner, proxy)
    except BaseException as exc:  # noqa: BLE001 - it goes to the future
        if not proxy.done():
            proxy.set_exception(exc)


def _rerun_lost(deps: List[Future], key: bytes) -> bool:
    """Re-run the producer of the lost value ``key``; False when none can be re-run."""
    for dep in deps:
        raw = dep._result if dep.done() and not dep.cancelled() else None
        if type(raw) is KeptRef and (not key or raw.key == key):
            return rerun(dep) is not None
    return False


def rerun(fut: Future) -> KeptRef | None:
    """Make ``fut``'s lost kept value again (its lineage); its new reference, or None when
    its attempts are used up or it has no lineage."""
    lineage: Lineage | None = getattr(fut, "_lineage", None)
    if lineage is None or lineage.attempts >= lineage.max_attempts:
        return None
    lineage.attempts += 1
    # Its own kept arguments may be gone too: _send re-reads them, and a failure of the new
    # run with KeptResultLost re-runs those (recursively, each within its own cap).
    deps = _dependencies(lineage.args, lineage.kwargs or {})
    while True:
        again = _send(lineage.view, lineage.task, lineage.args, lineage.kwargs)
        exc = again.exception()
        if isinstance(exc, KeptResultLost) and _rerun_lost(deps, exc.key):
            continue
        break
    if exc is not None:
        return None
    raw = again._result
    with fut._condition:
        fut._result = raw
        fut._fetched = NOTHING
    return raw if type(raw) is KeptRef else None


def _copy(inner: Future, proxy: Future) -> None:
    if proxy.done():  # cancelled by its owner meanwhile
        inner.cancel()
        return
    if inner.cancelled():
        proxy._to_cancelled()
        return
    exc = inner.exception()
    proxy._lineage = getattr(inner, "_lineage", None)
    proxy._entry = inner._entry
    if exc is not None:
        proxy.set_exception(exc)
    else:
        proxy.set_result(inner._result)
