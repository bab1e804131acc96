"""Anytime results: take what is done by a deadline, cancel the rest.

:func:`gather` waits with ``concurrent.futures.wait`` (one blocking wait on the futures'
conditions, no polling), then cancels the futures still pending with one ``CANCEL`` per master
package, naming their indices. The master drops those tasks from its queue and sends ``ABORT``
for the running ones; a worker kills a running task only when it runs in the worker's
supervised executor, that is, when its package has a ``timeout``. Without one the task runs to
its end on the worker and its result is discarded.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Dict, Iterable, List, Tuple

from ._future import Future
from ._options import seconds_until

__all__ = ["cancel_futures", "gather"]


def gather(
    futures: Iterable[cf.Future],
    deadline: Any = None,
    *,
    default: Any = None,
    return_exceptions: bool = False,
) -> List[Any]:
    """Wait for ``futures`` until ``deadline``; return their values, ``default`` for the rest.

    Futures still pending at the deadline are cancelled (see :func:`cancel_futures`); one
    whose result arrives while it is being cancelled keeps its result.

    Args:
        futures: rtpool futures (of any packages, of this or other clients), or any
            ``concurrent.futures.Future``.
        deadline: Seconds from now (a number) or an absolute ``datetime.datetime`` (aware, or
            naive in local time); one that already passed takes what is done now. None waits
            for every future.
        default: The value given for each future without a result by the deadline, and for
            each cancelled future.
        return_exceptions: Put the exception of a failed future in the list instead of
            raising it.

    Returns:
        One entry per future, in input order.

    Raises:
        Exception: Without ``return_exceptions``, the exception of a failed future (the first
            one in input order, among those failed when the wait ended). It is raised as soon
            as a future fails, as ``asyncio.gather`` does; the other futures are then left as
            they are, neither waited for nor cancelled.
        TypeError: ``deadline`` is neither a number nor a datetime.
    """
    futures = list(futures)
    timeout = seconds_until(deadline)
    pending = [f for f in futures if not f.done()]
    if pending:
        return_when = cf.ALL_COMPLETED if return_exceptions else cf.FIRST_EXCEPTION
        _, not_done = cf.wait(pending, timeout, return_when)
        if not return_exceptions:
            _raise_first(futures)
        if not_done:
            cancel_futures(not_done)
    out = []
    for fut in futures:
        if fut.cancelled() or not fut.done():  # not done: a foreign future already running
            out.append(default)
            continue
        exc = fut.exception(0)
        if exc is None:
            out.append(fut.result(0))
        elif return_exceptions:
            out.append(exc)
        else:
            raise exc  # failed while the others were being cancelled
    return out


def _raise_first(futures: List[cf.Future]) -> None:
    for fut in futures:
        if fut.done() and not fut.cancelled():
            exc = fut.exception(0)
            if exc is not None:
                raise exc


def cancel_futures(futures: Iterable[cf.Future]) -> int:
    """Cancel the futures that have no result yet, with one ``CANCEL`` per master package.

    Args:
        futures: rtpool futures, or any ``concurrent.futures.Future`` (cancelled with
            ``cancel()``).

    Returns:
        The number of futures this call cancelled.
    """
    by_segment: Dict[int, Tuple[Any, List[int]]] = {}
    n = 0
    for fut in futures:
        seg = fut._seg if isinstance(fut, Future) else None
        if seg is None:
            n += bool(not fut.done() and fut.cancel())
        elif fut._to_cancelled():
            by_segment.setdefault(id(seg), (seg, []))[1].append(fut._index)
    for seg, indices in by_segment.values():
        indices.sort()
        seg.conn.on_local_cancel(seg, tuple(indices), len(indices))
        n += len(indices)
    return n
