"""``SlurmCluster.adapt``: how many worker jobs to want, by queue depth and by deadlines.

The rule (``docs/slurm.md``, "adapt") is a pure function, :func:`want_slots`, of a
:class:`Demand`: what the master can tell about the work it holds. Two adapters build one:
:func:`demand_from_status` from the master's status snapshot (``docs/operations.md``: per-package
deadlines, per-worker execution seconds) and :func:`demand_from_stats` from the gauges and
counters of ``stats()`` (no per-package deadlines; the task time estimated by Little's law). The
loop that polls and scales (:func:`adapt_loop`) is the only part with a clock and threads.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, Mapping, NamedTuple, Tuple

__all__ = [
    "Demand",
    "TaskTimer",
    "adapt_loop",
    "demand_from_stats",
    "demand_from_status",
    "serves",
    "unserved",
]

#: Completions needed in the window before a task time estimate is trusted.
_MIN_COMPLETIONS = 3
#: Seconds of history the stats-based task time estimate looks at.
_WINDOW_S = 30.0


class Demand(NamedTuple):
    """The work the master holds, as the adapt rule sees it.

    Attributes:
        tasks: Tasks queued or running (the queue depth).
        task_s: Mean seconds a task takes, or None while unknown.
        deadlines: ``(seconds_left, tasks_left)`` of each package with a deadline and tasks
            not done (``seconds_left`` is negative once the deadline passed).
    """

    tasks: int
    task_s: float | None
    deadlines: Tuple[Tuple[float, int], ...] = ()


def want_slots(demand: Demand, *, target_s: float, startup_s: float) -> Tuple[int, int]:
    """Worker processes wanted as ``(by_queue, by_deadlines)``; the pool wants the larger.

    - By queue: enough slots for the queued and running work to take about ``target_s``
      (``tasks * task_s / target_s``), never more than one per task; one per task while the
      task time is unknown.
    - By deadlines: earliest deadline first, for each deadline ``d_k`` the work of the
      packages due by then over the time left once a new worker has started,
      ``task_s * sum(tasks_left, due <= d_k) / max(d_k - startup_s, 1 s)``; the largest over
      ``k``. No fewer slots can meet every deadline on identical workers (the earliest-deadline-
      first bound). While the task time is unknown, one slot per task of those packages.
    """
    tasks = max(0, demand.tasks)
    if demand.task_s is None:
        by_queue = tasks
    else:
        by_queue = min(tasks, math.ceil(tasks * demand.task_s / target_s))
    by_deadlines = 0
    due = 0
    for seconds_left, left in sorted(demand.deadlines):
        due += max(0, left)
        if demand.task_s is None:
            by_deadlines = due
            continue
        window = max(seconds_left - startup_s, 1.0)
        by_deadlines = max(by_deadlines, min(due, math.ceil(due * demand.task_s / window)))
    return by_queue, by_deadlines


def want_jobs(demand: Demand, procs: int, minimum: int, maximum: int, **rule: float) -> int:
    """Jobs of ``procs`` worker processes wanted, within ``[minimum, maximum]``."""
    slots = max(want_slots(demand, **rule))
    return min(maximum, max(minimum, math.ceil(slots / procs)))


def serves(offer: Mapping[str, Any], cls: Mapping[str, Any]) -> bool:
    """Whether a worker job offering ``offer`` (``{"resources": {...}, "labels": {...}}``,
    what its ``rtpool worker`` declares) could serve the resource class ``cls`` (an entry of
    the snapshot's ``resource_classes``)."""
    have = offer.get("resources") or {}
    labels = offer.get("labels") or {}
    return all(
        int(have.get(n, 0)) >= int(v) for n, v in (cls.get("resources") or {}).items()
    ) and all(labels.get(k) == v for k, v in (cls.get("labels") or {}).items())


def demand_from_status(
    snapshot: Mapping[str, Any], offer: Mapping[str, Any] | None = None
) -> Demand:
    """A :class:`Demand` from the master's status snapshot (the ``STATUS`` answer and
    ``/api/status``: ``totals``, ``workers[].exec_s`` and ``done``, ``packages[]`` with
    ``queued``, ``running``, ``deadline_in_s``). With ``offer`` (what the pool's jobs have,
    see :func:`serves`), the tasks of resource classes they could not serve do not count: new
    jobs would not run them (:func:`unserved` names those classes)."""
    totals = snapshot.get("totals") or {}
    workers = snapshot.get("workers") or []
    exec_s = sum(float(w.get("exec_s") or 0) for w in workers)
    done = sum(int(w.get("done") or 0) for w in workers)
    deadlines = []
    for pkg in snapshot.get("packages") or []:
        left = int(pkg.get("queued") or 0) + int(pkg.get("running") or 0)
        if pkg.get("deadline_in_s") is not None and left > 0:
            deadlines.append((float(pkg["deadline_in_s"]), left))
    tasks = int(totals.get("queued") or 0) + int(totals.get("running") or 0)
    if offer is not None:
        for cls in snapshot.get("resource_classes") or []:
            if not serves(offer, cls):
                tasks -= int(cls.get("queued") or 0)
    return Demand(
        tasks=max(0, tasks),
        task_s=exec_s / done if done >= _MIN_COMPLETIONS and exec_s > 0 else None,
        deadlines=tuple(deadlines),
    )


def unserved(snapshot: Mapping[str, Any], offer: Mapping[str, Any]) -> Tuple[str, ...]:
    """The unschedulable classes of the snapshot that the pool's jobs could not serve either
    (``gpu=4,zone=b``): adapting cannot help them, a pool with more per job can."""
    out = []
    for cls in snapshot.get("resource_classes") or []:
        if cls.get("unschedulable") and not serves(offer, cls):
            name = cls.get("name") or ",".join(
                f"{k}={v}"
                for k, v in sorted({**cls.get("resources", {}), **cls.get("labels", {})}.items())
            )
            out.append(str(name))
    return tuple(out)


class TaskTimer:
    """The mean task time from ``stats()`` polls, by Little's law: tasks running on average
    over the window divided by the rate they completed at (``running`` counts tasks assigned
    to workers, prefetched ones too, so it errs long: towards more workers)."""

    def __init__(self, window_s: float = _WINDOW_S) -> None:
        self.window_s = window_s
        # (time, running, delivered) of each poll in the window.
        self.polls: Deque[Tuple[float, int, int]] = collections.deque()

    def update(self, now: float, running: int, delivered: int) -> float | None:
        """Record one poll; the estimate in seconds, or None with too few completions."""
        self.polls.append((now, running, delivered))
        while len(self.polls) > 2 and now - self.polls[1][0] >= self.window_s:
            self.polls.popleft()
        completed = delivered - self.polls[0][2]
        if completed < _MIN_COMPLETIONS:
            return None
        polls = list(self.polls)
        busy_s = sum(a[1] * (b[0] - a[0]) for a, b in zip(polls, polls[1:]))
        return busy_s / completed if busy_s > 0 else None


def demand_from_stats(stats: Mapping[str, Any], timer: TaskTimer, now: float) -> Demand:
    """A :class:`Demand` from ``stats()`` gauges and counters: the queue depth and the task
    time, no deadlines (the gauges do not break the queue down by package)."""
    running = int(stats.get("running", 0))
    task_s = timer.update(now, running, int(stats.get("delivered", 0)))
    return Demand(tasks=int(stats.get("queued", 0)) + running, task_s=task_s)


def adapt_loop(
    pool: Any,
    poll: Callable[[], Demand],
    stop: threading.Event,
    *,
    minimum: int,
    maximum: int,
    interval_s: float,
    cooldown_s: float,
    rule: Dict[str, float],
) -> None:
    """Every ``interval_s`` until ``stop``: up to the wanted jobs at once; down once fewer than
    the jobs there are have been wanted for ``cooldown_s``, to the largest number wanted over
    the last ``cooldown_s`` (gracefully)."""
    low_since: float | None = None  # since when fewer jobs than there are have been wanted
    lows: Deque[Tuple[float, int]] = collections.deque()  # (time, want) of the last cooldown_s
    while not stop.wait(interval_s):
        try:
            want = want_jobs(poll(), pool.spec.procs, minimum, maximum, **rule)
            with pool.lock:
                have = len(pool.live())
            now = time.monotonic()
            if want >= have:
                low_since = None
                lows.clear()
                if want > have:
                    pool.scale(want)
                continue
            low_since = now if low_since is None else low_since
            lows.append((now, want))
            while lows[0][0] < now - cooldown_s:
                lows.popleft()
            target = max(w for _, w in lows)
            if now - low_since >= cooldown_s and target < have:
                pool.scale(target)
        except Exception as exc:  # a Slurm hiccup must not end adaptation
            print(f"rtpool SlurmCluster.adapt: {exc}", file=sys.stderr, flush=True)
