"""Real-time mode of a worker child (``rtpool worker --realtime``): its memory locked, its main
thread under ``SCHED_FIFO`` and, optionally, pinned to a set of CPUs; each step as far as the OS
permits. A refused step is logged once, with what failed, the errno and how to permit it, and
that aspect stays in normal mode.

What runs real-time, and why:

* The supervisor (the worker's parent process) stays normal: it only waits for its children.
* Each child locks its own memory (``mlockall`` is not inherited across ``fork``) and runs its
  main thread, which does the connection's I/O and runs the tasks without limits itself (the
  fast path), under ``SCHED_FIFO``. Splitting I/O from task execution would put a process hop
  on every task, the very latency real-time mode is for.
* What the child starts gets the normal policy (``SCHED_RESET_ON_FORK``): executor processes
  (tasks with a time limit or under ``--task-memory-mb``), subprocesses and threads a task
  starts, and the heartbeat thread. So the child that enforces a deadline reacts at once, and
  the task it kills cannot starve anything. Memory locks are not inherited either.
* A task on the fast path runs ``SCHED_FIFO``, so a runaway one would starve the normal
  processes on its CPU. A budget bounds that: ``RLIMIT_RTTIME`` is set to ``budget_ms`` of CPU
  time without blocking; past it the kernel sends ``SIGXCPU`` and the child drops to normal
  scheduling until that task ends: it returns to ``SCHED_FIFO`` with a fresh budget before
  its next task (:meth:`Realtime.between_tasks`) or when it next waits for work
  (:meth:`Realtime.before_wait`). Real-time is for reacting, not for holding a CPU: a runaway
  task gives the CPU back; a stream of short ones keeps SCHED_FIFO (a demoted worker with a
  queue would otherwise never wait, so never come back). While a task is stuck in C code the
  Python handler cannot
  run; the kernel's real-time throttling (``/proc/sys/kernel/sched_rt_runtime_us``, 95 % of
  each second by default) is the backstop there.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Sequence

__all__ = [
    "DEFAULT_BUDGET_MS",
    "DEFAULT_IO_PRIORITY",
    "DEFAULT_PRIORITY",
    "Realtime",
    "RealtimeReport",
    "parse_cpus",
]

DEFAULT_PRIORITY = 50
#: Priority of the threads that only move frames (a client's reader and heartbeat threads, a
#: LocalCluster's embedded master) unless told otherwise: one above the workers', so they
#: preempt a task a worker runs on their CPU instead of waiting up to its length behind it
#: (SCHED_FIFO does not time-slice between equal priorities). See ``_realtime_client.py``.
DEFAULT_IO_PRIORITY = DEFAULT_PRIORITY + 1
DEFAULT_BUDGET_MS = 100
#: A sleep this long (a real block: a 1 us one returns without blocking) restarts the kernel's
#: RLIMIT_RTTIME count, which runs from the thread's last wake-up under SCHED_FIFO.
RTTIME_RESET_S = 0.0001
#: CPUs a list may name (the size of Linux's cpu_set_t), as the master's ``--cpus``.
MAX_CPUS = 1024
_MCL_CURRENT = 1
_MCL_FUTURE = 2


def parse_cpus(text: str) -> List[int]:
    """Parse a CPU list as ``taskset -c`` writes it (``1``, ``0,1``, ``0-3,6``): sorted, unique.

    Raises:
        ValueError: naming the part that is not a CPU number or range.
    """

    def number(part: str) -> int:
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"bad CPU list {text!r}: {part!r} is not a CPU number")
        n = int(part)
        if n >= MAX_CPUS:
            raise ValueError(f"bad CPU list {text!r}: CPU {n} is beyond the {MAX_CPUS} Linux names")
        return n

    cpus = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if dash:
            lo, hi = number(first), number(last)
            if lo > hi:
                raise ValueError(f"bad CPU list {text!r}: the range {lo}-{hi} runs backwards")
            cpus.update(range(lo, hi + 1))
        else:
            cpus.add(number(part))
    return sorted(cpus)


def format_cpus(cpus: Sequence[int]) -> str:
    """``0-3,6`` for ``[0, 1, 2, 3, 6]``."""
    parts, ordered, i = [], sorted(cpus), 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(f"{ordered[i]}-{ordered[j]}" if j > i else str(ordered[i]))
        i = j + 1
    return ",".join(parts)


@dataclass
class RealtimeReport:
    """What real-time mode achieved in this process."""

    requested: bool = False
    memory_locked: bool = False
    priority: int = DEFAULT_PRIORITY
    #: The main thread runs SCHED_FIFO now (False while demoted past the budget).
    fifo: bool = False
    #: CPUs the process is pinned to ([]: not pinned).
    cpus: List[int] = field(default_factory=list)
    #: Times the budget ran out and the thread was demoted.
    demotions: int = 0
    warnings: List[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """Every step asked for took effect."""
        return self.requested and self.memory_locked and self.fifo and not self.warnings


def _errno_text(err: int) -> str:
    import errno

    return f"{errno.errorcode.get(err, err)}: {os.strerror(err)}"


def _lock_memory() -> str | None:
    """``mlockall(MCL_CURRENT | MCL_FUTURE)``; the warning when refused, else None."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) != 0
    except (OSError, AttributeError) as exc:
        return f"cannot lock the worker's memory (mlockall unavailable: {exc})"
    if not failed:
        return None
    return (
        f"cannot lock the worker's memory (mlockall: {_errno_text(ctypes.get_errno())}); its "
        "pages may be paged out or faulted in on the hot path. To permit it, raise "
        "RLIMIT_MEMLOCK above the process's virtual size (`ulimit -l unlimited`, `memlock` in "
        "/etc/security/limits.conf, LimitMEMLOCK=infinity in a systemd unit) or grant "
        "CAP_IPC_LOCK"
    )


def _fifo_warning(priority: int, exc: OSError, who: str = "the worker") -> str:
    why = _errno_text(exc.errno) if exc.errno else str(exc)
    return (
        f"cannot run {who} under SCHED_FIFO priority {priority} ({why}); it keeps normal "
        f"scheduling. The priority must be 1-99; to permit it, grant CAP_SYS_NICE (or run as "
        f"root) or raise RLIMIT_RTPRIO to at least {priority} (`ulimit -r {priority}`, `rtprio` "
        f"in /etc/security/limits.conf, LimitRTPRIO= in a systemd unit); in a container or "
        f"cgroup, real-time runtime must also be granted (cpu.rt_runtime_us)"
    )


class Realtime:
    """Real-time mode of the calling process's main thread; see the module's docstring.

    Args:
        priority: SCHED_FIFO priority, 1-99.
        cpus: CPUs to pin to (all of them: the process may run on any one), or None.
        budget_ms: CPU time the thread may use under SCHED_FIFO without blocking before it is
            demoted until its next wait; 0: no budget.
        log: Where warnings and the summary go (one line each).
    """

    def __init__(
        self,
        priority: int = DEFAULT_PRIORITY,
        cpus: Sequence[int] | None = None,
        budget_ms: int = DEFAULT_BUDGET_MS,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    ) -> None:
        self.report = RealtimeReport(requested=True, priority=priority)
        self._asked_cpus = list(cpus) if cpus is not None else None
        self.budget_ms = max(0, budget_ms)
        self._log = log
        self._demoted = False
        self._demotion_logged = False

    # -- the steps --------------------------------------------------------------------------

    def apply(self) -> RealtimeReport:
        """Lock memory, enter SCHED_FIFO, pin, install the budget; log each refusal and one
        summary line. Returns the report (also :attr:`report`)."""
        if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_FIFO"):
            self._warn("real-time mode (--realtime) is only supported on Linux; normal mode")
            return self.report
        why = _lock_memory()
        self.report.memory_locked = why is None
        if why:
            self._warn(why)
        if self._asked_cpus is not None:
            self._pin(self._asked_cpus)
        self.report.fifo = self._enter_fifo(warn=True)
        if self.report.fifo and self.budget_ms:
            self._install_budget()
        self._log(f"real-time mode: {self.summary()}")
        return self.report

    def _enter_fifo(self, warn: bool) -> bool:
        policy = os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0)
        try:
            os.sched_setscheduler(0, policy, os.sched_param(self.report.priority))
        except (OSError, OverflowError) as exc:
            if warn:
                err = exc if isinstance(exc, OSError) else OSError(0, str(exc))
                self._warn(_fifo_warning(self.report.priority, err))
            return False
        return True

    def _pin(self, asked: List[int]) -> None:
        try:
            allowed = os.sched_getaffinity(0)
        except OSError as exc:
            self._warn(f"cannot read the worker's CPU affinity ({exc}); not pinned")
            return
        usable = [c for c in asked if c in allowed]
        missing = [c for c in asked if c not in allowed]
        if missing:
            what = f"pinning to CPUs {format_cpus(usable)} only" if usable else "not pinned"
            self._warn(
                f"CPUs {format_cpus(missing)} are not available to the worker (it may use "
                f"{format_cpus(sorted(allowed))}); {what}. Name CPUs from that list (see `nproc`, "
                "`taskset -p $$`, the cgroup's cpuset)"
            )
        if not usable:
            return
        try:
            os.sched_setaffinity(0, usable)
        except OSError as exc:
            self._warn(f"cannot pin the worker to CPUs {format_cpus(usable)} ({exc}); not pinned")
            return
        self.report.cpus = usable

    # -- the budget -------------------------------------------------------------------------

    def _install_budget(self) -> None:
        import resource

        limit = getattr(resource, "RLIMIT_RTTIME", None)
        if limit is None:
            self._warn("RLIMIT_RTTIME is not available: a runaway task keeps SCHED_FIFO")
            return
        self._rttime = limit
        signal.signal(signal.SIGXCPU, self._on_budget_spent)
        self._reset_budget()

    def _reset_budget(self) -> None:
        import resource

        # The kernel raises the soft limit by 1 s each time it sends SIGXCPU: set it again.
        _, hard = resource.getrlimit(self._rttime)
        soft = self.budget_ms * 1000
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        try:
            resource.setrlimit(self._rttime, (soft, hard))
        except (OSError, ValueError) as exc:
            self._warn(f"cannot set RLIMIT_RTTIME ({exc}): a runaway task keeps SCHED_FIFO")

    def _on_budget_spent(self, signum: int, frame: object) -> None:
        # Runs in the main thread, the one that spent the budget: demote it.
        if self._demoted:
            return
        try:
            os.sched_setscheduler(
                0, os.SCHED_OTHER | getattr(os, "SCHED_RESET_ON_FORK", 0), os.sched_param(0)
            )
        except OSError:
            return
        self._demoted = True
        self.report.fifo = False
        self.report.demotions += 1

    def between_tasks(self) -> None:
        """The thread goes on to its next task without waiting for work: back to SCHED_FIFO,
        with a fresh budget, if the budget demoted it during the last one. Cheap when it did
        not (one attribute test).

        Without this a worker with a queue never waits, so once demoted it stayed normal for
        as long as work kept coming: on a busy machine it then ran its tasks behind every
        other process, its queue grew, and it never came back (the deadline bench measured
        62 % late at 80 % of capacity that way). The kernel counts RLIMIT_RTTIME from the
        thread's last wake-up, so it sleeps ``RTTIME_RESET_S`` under SCHED_FIFO to start the
        count again; a task that overruns the budget alone is still demoted for its rest."""
        if not self._demoted:
            return
        self.before_wait()
        if self.report.fifo:
            time.sleep(RTTIME_RESET_S)

    def before_wait(self) -> None:
        """The thread is about to block for work: back to SCHED_FIFO if the budget demoted it.
        Cheap when it did not (one attribute test)."""
        if not self._demoted:
            return
        self._demoted = False
        if self.report.demotions == 1 and not self._demotion_logged:
            # Logged here, not in the signal handler: a print there could re-enter one
            # the task was making.
            self._demotion_logged = True
            self._log(
                f"real-time mode: the {self.budget_ms} ms budget ran out without a wait (a long "
                "task or a stream of short ones); normal scheduling until the task ends, each "
                "time it happens (logged once)"
            )
        self.report.fifo = self._enter_fifo(warn=False)
        if self.report.fifo:
            self._reset_budget()

    # -- reporting --------------------------------------------------------------------------

    def summary(self) -> str:
        r = self.report
        memory = "memory locked" if r.memory_locked else "memory NOT locked"
        if r.fifo:
            budget = f"budget {self.budget_ms} ms" if self.budget_ms else "no budget"
            fifo = f"SCHED_FIFO {r.priority} (tasks without limits too; {budget})"
        else:
            fifo = "SCHED_FIFO refused (normal scheduling)"
        if r.cpus:
            pin = f"pinned to CPUs {format_cpus(r.cpus)}"
        else:
            pin = "not pinned" if self._asked_cpus is None else "not pinned (no usable CPU)"
        return f"{memory}, {fifo}, {pin}"

    def _warn(self, text: str) -> None:
        self.report.warnings.append(text)
        self._log(f"real-time mode: {text}")
