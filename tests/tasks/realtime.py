"""Task functions of the real-time (SCHED_FIFO mode) tests, importable by workers as
``tasks.realtime``."""

from __future__ import annotations

import os
import time


def policy() -> dict:
    """This process's scheduling facts: pid, policy (without SCHED_RESET_ON_FORK), whether
    that flag is set, locked memory in kB, CPUs it may run on."""
    raw = os.sched_getscheduler(0)
    flag = getattr(os, "SCHED_RESET_ON_FORK", 0)
    locked = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                locked = int(line.split()[1])
    return {
        "pid": os.getpid(),
        "policy": raw & ~flag,
        "reset_on_fork": bool(raw & flag),
        "vmlck_kb": locked,
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def spin_then_policy(seconds: float) -> dict:
    """Spin in Python for ``seconds`` (a runaway task, bounded), then :func:`policy`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return policy()


def policy_at_start_and_end(seconds: float) -> dict:
    """This thread's scheduling policy when the task starts, then after spinning ``seconds``
    (a runaway task, bounded)."""
    start = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    end = spin_then_policy(seconds)["policy"]
    return {"start": start, "end": end}
