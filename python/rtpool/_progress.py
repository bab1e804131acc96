"""Progress of a user's own work on the client: :class:`Progress` (the counts),
:func:`progress` (a live rich bar, like Dask's ``progress``) and :func:`as_completed`.

Counting is done by done-callbacks attached on first use (:class:`_Tracker`), so a package
nobody watches pays nothing, and a watched one pays one short callback per task instead of a
scan of all its futures on every refresh. The counts come from the futures here, not from the
master: no round-trip, and they are exact for what this client has received.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
from typing import Any, Iterator, List, NamedTuple

__all__ = ["Progress", "as_completed", "progress"]


class Progress(NamedTuple):
    """How far a package (or a set of futures) is, as this client sees it.

    ``done`` counts the tasks with an outcome (a value, an error or a cancellation);
    ``failed`` and ``cancelled`` are the parts of ``done`` that raised or were cancelled.
    """

    done: int
    total: int
    failed: int
    cancelled: int

    @property
    def pending(self) -> int:
        """Tasks without an outcome yet."""
        return self.total - self.done

    @property
    def fraction(self) -> float:
        """``done / total`` (1.0 for no task)."""
        return self.done / self.total if self.total else 1.0

    def __str__(self) -> str:
        text = f"{self.done}/{self.total} done"
        if self.failed:
            text += f", {self.failed} failed"
        if self.cancelled:
            text += f", {self.cancelled} cancelled"
        return text


class _Tracker:
    """Counts the outcomes of a fixed list of futures with done-callbacks.

    A future already done when the tracker is made calls back at once, so the counts start
    exact. Callbacks run on whichever thread finishes a future (the reader thread, or the
    thread that cancels); a lock keeps the three counters consistent.
    """

    def __init__(self, futures: List[cf.Future]) -> None:
        self.total = len(futures)
        self._lock = threading.Lock()
        self._done = self._failed = self._cancelled = 0
        self._all_done = threading.Event()
        if not futures:
            self._all_done.set()
        for fut in futures:
            fut.add_done_callback(self._on_done)

    def _on_done(self, fut: cf.Future) -> None:
        cancelled = fut.cancelled()
        # exception() of a done future does not block; a cancelled one would raise.
        failed = not cancelled and fut.exception(0) is not None
        with self._lock:
            self._done += 1
            self._failed += failed
            self._cancelled += cancelled
            if self._done >= self.total:
                self._all_done.set()

    def snapshot(self) -> Progress:
        with self._lock:
            return Progress(self._done, self.total, self._failed, self._cancelled)

    def wait(self, timeout: float | None) -> bool:
        """Wait until every future is done; False when ``timeout`` passed first."""
        return self._all_done.wait(timeout)


def _futures_of(work: Any) -> List[cf.Future]:
    """The futures of a Package, a Future, or an iterable of those."""
    if isinstance(work, cf.Future):
        return [work]
    futures = getattr(work, "futures", None)
    if futures is not None:  # a Package
        return list(futures)
    out: List[cf.Future] = []
    for item in work:
        out.extend(_futures_of(item))
    return out


def _tracker_of(work: Any) -> _Tracker:
    tracker = getattr(work, "_progress_tracker", None)
    if tracker is not None and callable(tracker):
        return tracker()
    return _Tracker(_futures_of(work))


def progress(
    work: Any,
    *,
    show: bool | None = None,
    timeout: float | None = None,
    description: str = "tasks",
    refresh_per_second: float = 4.0,
    console: Any = None,
) -> Progress:
    """Show a live progress bar until ``work`` is done, then return its final counts.

    The bar shows done/total, failed and cancelled counts, the rate (tasks per second) and
    the time left, like Dask's ``progress``. It is drawn only where someone can see it: a
    terminal or a Jupyter notebook (``show=None``, the default); in a log file or a pipe
    nothing is printed, and the call only waits. Ctrl-C closes the bar and raises
    ``KeyboardInterrupt`` as usual; the tasks go on.

    Example::

        package = client.submit_many(f, xs)
        rtpool.progress(package)  # [=========>   ] 712/1000 done, 3 failed, 230 tasks/s, 0:01

    Args:
        work: A :class:`Package`, a future, or an iterable of packages and futures.
        show: True to draw the bar even when the output is not a terminal; False never to.
        timeout: Seconds to wait at most; None waits until every task is done.
        description: The bar's label.
        refresh_per_second: How often the bar is redrawn (0.1 to 30).
        console: A ``rich.console.Console`` to draw on (default: stdout).

    Returns:
        The final :class:`Progress` (then ``done == total``).

    Raises:
        TimeoutError: Not every task was done within ``timeout`` (the message says how many).
        ValueError: ``refresh_per_second`` is out of range.
    """
    if not 0.1 <= refresh_per_second <= 30:
        raise ValueError(f"refresh_per_second must be in 0.1..30, got {refresh_per_second!r}")
    tracker = _tracker_of(work)
    end = None if timeout is None else time.monotonic() + timeout
    if show is None or show:
        if console is None:
            from rich.console import Console

            console = Console(file=sys.stdout)
        if show is None:
            show = console.is_terminal or console.is_jupyter
    if show:
        _draw(tracker, end, description, refresh_per_second, console)
    else:
        tracker.wait(None if end is None else max(0.0, end - time.monotonic()))
    counts = tracker.snapshot()
    if counts.done < counts.total:
        raise TimeoutError(f"{counts} after {timeout} s ({counts.pending} tasks still pending)")
    return counts


def _draw(
    tracker: _Tracker, end: float | None, description: str, refresh: float, console: Any
) -> None:
    from rich import progress as rp

    bar = rp.Progress(
        rp.TextColumn("[bold]{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TextColumn("{task.fields[failed]}"),
        rp.TextColumn("{task.fields[rate]}"),
        rp.TimeElapsedColumn(),
        rp.TextColumn("eta"),
        rp.TimeRemainingColumn(),
        console=console,
        refresh_per_second=refresh,
    )
    rate = _Rate()
    with bar:
        task = bar.add_task(description, total=tracker.total, failed="", rate="")
        while True:
            left = None if end is None else end - time.monotonic()
            finished = tracker.wait(1.0 / refresh if left is None else min(1.0 / refresh, left))
            counts = tracker.snapshot()
            per_s = rate.update(counts.done, final=finished)
            bar.update(
                task,
                completed=counts.done,
                failed=_failed_text(counts),
                rate=f"{per_s:,.1f} tasks/s",
            )
            if finished or (left is not None and left <= 0):
                break


class _Rate:
    """Tasks per second over the last few seconds (over the whole run for the last frame)."""

    WINDOW_S = 5.0

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._samples: List[tuple] = [(self._start, 0)]

    def update(self, done: int, final: bool) -> float:
        now = time.monotonic()
        if final:
            return done / max(now - self._start, 1e-3)
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.WINDOW_S:
            del self._samples[0]
        t0, done0 = self._samples[0]
        return (done - done0) / max(now - t0, 1e-3)


def _failed_text(counts: Progress) -> str:
    parts = []
    if counts.failed:
        parts.append(f"[red]{counts.failed} failed[/]")
    if counts.cancelled:
        parts.append(f"[yellow]{counts.cancelled} cancelled[/]")
    return ", ".join(parts)


def as_completed(work: Any, timeout: float | None = None) -> Iterator[cf.Future]:
    """Yield the futures of ``work`` as they complete (``concurrent.futures.as_completed``).

    Accepts what :func:`progress` accepts (a package, a future, or an iterable of them), so a
    notebook cell can handle results as they arrive::

        for fut in rtpool.as_completed(package):
            print(fut.result())

    Args:
        work: A :class:`Package`, a future, or an iterable of packages and futures.
        timeout: Seconds for all of them; None waits forever.

    Raises:
        TimeoutError: Not all futures completed within ``timeout`` seconds.
    """
    return cf.as_completed(_futures_of(work), timeout)


def _html_bar(counts: Progress, label: str) -> str:
    """A notebook's rendering of ``counts``: a native ``<progress>`` and the numbers."""
    return (
        f"<div><strong>{label}</strong> <progress value='{counts.done}' "
        f"max='{max(counts.total, 1)}' style='width:20em'></progress> {counts}</div>"
    )
