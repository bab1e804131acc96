"""Futures as task arguments, kept results and lineage, on the client (``docs/data.md``).

``client.submit(g, client.submit(f, x))``: when ``f`` was submitted with
``options(keep=True)`` on this connection, ``g`` is sent as soon as the master accepted ``f``,
naming ``f``'s package and index (package option ``after``): the master holds ``g`` until
``f`` is done, then gives it ``f``'s result (the :class:`~rtpool._kept.KeptRef`) and places it
near ``f``'s worker; the client takes no part, and a chain runs while it sleeps. Otherwise (a
future of another connection, a result not kept, a master that refuses ``after``, or ``f``
already delivered) the task is sent once every future has a result: a kept one is passed as
its :class:`~rtpool._kept.KeptRef`, any other as its value. Either way the dependent task's
worker reads a kept value from the producer's worker directly, and the value never comes to
the client.

Lineage: every kept task remembers how it was made (its function and arguments). When a kept
value is lost (its worker died, or evicted it), reading it re-runs its producer, up to the
package's ``max_attempts`` (3 unless set), and the reader carries on with the new copy; a
dependent task that failed with :class:`~rtpool.errors.KeptResultLost` is sent again after
its producers ran again. A dependent waits on a thread of a small pool, never on the
connection's reader thread.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
from typing import Any, Callable, Dict, List

from ._future import Future
from ._kept import NOTHING, HeldInput, KeptRef, keep_task
from .errors import DependencyFailed, KeptResultLost, TaskFailed, UnknownDependencyError

# The executor (``_Submitter``) a task was sent through; not imported: it imports this module.
_Submitter = Any

__all__ = ["has_future", "rerun", "submit"]

_DEFAULT_ATTEMPTS = 3
#: Kept arguments of at least this many bytes on one worker make the task prefer that worker
#: (package option ``near``).
NEAR_MIN_BYTES = 64 * 1024
_MAX_THREADS = 64
#: How long a dependent waits for the master to accept its producer before it waits for the
#: producer's result instead.
_ACCEPT_TIMEOUT_S = 30.0
_jobs: collections.deque = collections.deque()
_pool = threading.Condition(threading.Lock())
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
    # The future sent for it (its producer, for the tasks that take it as an argument), and
    # when it was sent.
    proxy._inner = None
    proxy._sent = threading.Event()
    proxy.add_done_callback(lambda p: p._sent.set())
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
    always wait on earlier futures, so a FIFO pool cannot deadlock. A job gets a thread of its
    own whenever the pool is below its bound (counted under one lock: a job queued while an
    idle thread has not yet taken the previous one starts a thread), so a chain's dependents
    are all sent (held by the master) at once."""
    global _threads
    with _pool:
        _jobs.append((fn, args))
        _pool.notify()
        if _idle >= len(_jobs) or _threads >= _MAX_THREADS:
            return
        _threads += 1
    threading.Thread(target=_pool_thread, name="rtpool-deps", daemon=True).start()


def _pool_thread() -> None:
    global _idle
    while True:
        with _pool:
            _idle += 1
            while not _jobs:
                _pool.wait()
            _idle -= 1
            fn, args = _jobs.popleft()
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
        if _send_held(view, task, args, kwargs, deps, proxy, running):
            return
        cf.wait(deps)
        while True:
            if proxy.cancelled():
                return
            inner = _send(view, task, args, kwargs)
            running.append(inner)
            proxy._inner = inner
            proxy._sent.set()
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


def _producer(dep: Future, view: _Submitter) -> Future | None:
    """The future of the task whose result ``dep`` will be, if the master can hold a task for
    it: not done, kept with ``keep=True`` (its result is a small :class:`KeptRef`, never the
    value), sent on ``view``'s connection. A dependent's future stands for the one sent for
    it: waited for until it is sent."""
    if dep.done():
        return None
    sent = getattr(dep, "_sent", None)
    if sent is not None:  # a dependent's proxy: its task is sent once its own input is held
        sent.wait()
        dep = dep._inner
        if dep is None or dep.done():
            return None
    lineage = getattr(dep, "_lineage", None)
    seg = getattr(dep, "_seg", None)
    if lineage is None or seg is None or lineage.view._keep != 0:
        return None
    if seg.conn is not view._conn:
        return None
    return dep


def _send_held(
    view: _Submitter,
    task: Callable,
    args: tuple,
    kwargs: Dict | None,
    deps: List[Future],
    proxy: Future,
    running: List[Future],
) -> bool:
    """Send the task with its last pending dependency held by the master (the others waited
    for here, when there are several); fill ``proxy``. False when the master cannot hold it
    (then the caller waits for every dependency and sends the task itself)."""
    pending = [d for d in deps if not d.done()]
    if not pending:
        return False
    held = pending[-1]
    cf.wait(pending[:-1])
    producer = _producer(held, view)
    if producer is None or proxy.cancelled():
        return False
    try:
        package = view._conn.wait_accepted(producer._seg, _ACCEPT_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - refused, lost: the usual way says why
        return False
    sent_args = tuple(_held_argument(a, i, held) for i, a in enumerate(args))
    sent_kwargs = {k: _held_argument(v, k, held) for k, v in kwargs.items()} if kwargs else {}
    opts = {**view._submission_opts(), "after": package, "after_index": producer._index}
    near = _nearest(sent_args, sent_kwargs)
    if near:
        opts["near"] = near
    inner = view._submit_now(task, sent_args, sent_kwargs, opts)
    inner._lineage = Lineage(view, task, args, kwargs)
    running.append(inner)
    try:
        # Published to this proxy's own dependents only once the master holds it: one that
        # is refused (its input was delivered meanwhile) is sent again the usual way, and a
        # dependent that took the refused one would wait for the result instead of being held.
        view._conn.wait_accepted(inner._seg, _ACCEPT_TIMEOUT_S)
    except UnknownDependencyError:
        return False  # its result was delivered meanwhile: it is at the client now
    except Exception:  # noqa: BLE001 - rejected, lost, slow: inner's own outcome says it
        pass
    proxy._inner = inner
    proxy._sent.set()
    if proxy.cancelled():
        inner.cancel()
        return True
    exc = inner.exception()
    if isinstance(exc, UnknownDependencyError):
        return False
    if isinstance(exc, KeptResultLost) or (
        type(exc) is TaskFailed and "not run: its input" in str(exc)
    ):
        # The producer's worker died (or the producer failed): wait for the producer's own
        # outcome (a proxy's may still come, after its lineage ran it again).
        cf.wait([held])
        if held.cancelled() or held.exception() is not None:
            try:
                _argument(held, _where(args, kwargs, held))
            except DependencyFailed as failed:  # the master's reason names the producer
                raise DependencyFailed(f"{failed} (the master: {exc})") from failed.__cause__
        if isinstance(exc, KeptResultLost):
            _rerun_lost(deps, exc.key)
        return False  # its result exists now: send the task as usual
    _copy(inner, proxy)
    return True


def _held_argument(value: Any, where: Any, held: Future) -> Any:
    return HeldInput(0) if value is held else _argument(value, where)


def _where(args: tuple, kwargs: Dict | None, dep: Future) -> Any:
    for i, a in enumerate(args):
        if a is dep:
            return i
    return next((k for k, v in (kwargs or {}).items() if v is dep), "?")


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
