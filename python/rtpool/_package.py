"""A package of tasks on the client (:class:`Package`, what ``Client.submit_many`` returns):
its futures, results, cancellation, status and deadline report."""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Dict, Iterator, List

from ._anytime import gather as _gather
from ._connection import _Connection, _Segment
from ._future import Future
from ._progress import Progress, _html_bar, _Tracker
from ._protocol import STATUS_MISSED

__all__ = ["Package"]


class Package:
    """The tasks of one :meth:`Client.submit_many` call: one function, many argument sets.

    Iterating a package yields its futures in input order; ``len()`` is the number of tasks.
    """

    def __init__(self, conn: _Connection, futures: List[Future], segments: List[_Segment]):
        self._conn = conn
        self.futures: List[Future] = futures
        self._segments = segments
        self._tracker: _Tracker | None = None

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

    @property
    def progress(self) -> Progress:
        """How far the package is, as this client sees it: ``Progress(done, total, failed,
        cancelled)``, with ``pending`` and ``fraction``. No round-trip to the master.

        Cheap: the first read attaches a done-callback to each future, later reads only copy
        three counters. For the master's view (queued, running) see :meth:`status`; for a
        live bar, ``rtpool.progress(package)``.
        """
        return self._progress_tracker().snapshot()

    def _progress_tracker(self) -> _Tracker:
        if self._tracker is None:
            self._tracker = _Tracker(self.futures)
        return self._tracker

    def _repr_html_(self) -> str:
        # A notebook shows a package as a bar with its counts (re-run the cell to refresh).
        return _html_bar(self.progress, "rtpool.Package")

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
            frames, and for a package with a deadline ``"met"`` and ``"missed"`` (results by
            the deadline; late results and tasks dropped for it). ``done`` counts results the
            master has sent; parts the master already freed are counted from the futures here.

        Raises:
            TimeoutError: The master did not answer in time.
            ConnectionLost: The connection broke (or is being re-established: ask again).
        """
        total = dict.fromkeys(_STATUS_KEYS, 0)
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
                counts = _deadline_counts(futures)
                reply = (seg.n, 0, 0, seg.n - cancelled, cancelled, counts["met"], counts["missed"])
            for key, value in zip(_STATUS_KEYS, reply):
                total[key] += value
        if not any(seg.has_deadline for seg in self._segments):
            del total["met"], total["missed"]
        return total


#: Counters of STATUS_REPLY, in wire order.
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
        late_us = r[8]
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
