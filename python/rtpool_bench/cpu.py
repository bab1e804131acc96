"""CPU use of the pool's processes and CPU hogs, for the benchmarks.

:class:`CpuHogs` are busy-loop processes, one per core, started and stopped by PID with a bounded
lifetime: the background load of the real-time Linux measurements (cyclictest under a CPU-bound
load), here for the pool.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Dict, List, Sequence

# --- CPU use -----------------------------------------------------------------------------------


def _proc_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> List[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def cpu_snapshot(pids: Sequence[int]) -> tuple | None:
    """``(machine busy ticks, machine total ticks, ticks of pids and their children, this
    process included)`` from /proc (None where there is no /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)  # idle + iowait
    ours = _proc_ticks(os.getpid())
    for pid in pids:
        ours += _proc_ticks(pid) + sum(_proc_ticks(c) for c in _children(pid))
    return (sum(cpu[:8]) - idle, sum(cpu[:8]), ours)


def cpu_use(before: tuple | None, after: tuple | None, wall_s: float) -> Dict[str, float | None]:
    """Between two :func:`cpu_snapshot`: ``machine_busy`` (the share of all CPUs busy, with
    whatever else runs on the machine) and ``pool_cores`` (CPUs used by the client, the embedded
    master and the workers)."""
    if before is None or after is None or wall_s <= 0:
        return {"machine_busy": None, "pool_cores": None}
    total = after[1] - before[1]
    hz = os.sysconf("SC_CLK_TCK")
    return {
        "machine_busy": round((after[0] - before[0]) / total, 3) if total else None,
        "pool_cores": round((after[2] - before[2]) / hz / wall_s, 2),
    }


# --- CPU hogs --------------------------------------------------------------------------------

# A hog leads its own session, so where the kernel groups processes by session for fair
# scheduling (autogroup) it is a background job of its own, as another user's would be, not
# part of the benchmark's group; its nice is set on that group too, or it would have no effect
# on how the pool and the hogs share the CPUs.
_HOG = (
    "import os, sys, time\n"
    "nice = int(sys.argv[2])\n"
    "try:\n"
    "    with open('/proc/self/autogroup', 'w') as f:\n"
    "        f.write(str(nice))\n"
    "except OSError:\n"
    "    pass\n"
    "os.nice(nice)\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "sys.stdout.write('r'); sys.stdout.flush()\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)


class CpuHogs:
    """``n`` busy-loop processes, as a context manager: started (and running) on entry, killed
    by PID on exit; each also ends by itself after ``lifetime_s``.

    Args:
        n: Processes (one per core for "background load").
        lifetime_s: Upper bound of their lives if the exit never comes.
        nice: Their nice value (0: the pool's priority; 19: they get what the pool leaves, as
            a real-time process at a higher priority would see them).
    """

    def __init__(self, n: int, lifetime_s: float, nice: int = 0) -> None:
        self.n, self.lifetime_s, self.nice = n, lifetime_s, nice
        self.procs: List[subprocess.Popen] = []

    @property
    def pids(self) -> List[int]:
        """The hogs' PIDs."""
        return [p.pid for p in self.procs]

    def __enter__(self) -> CpuHogs:
        try:
            for _ in range(self.n):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-I", "-S", "-c", _HOG, str(self.lifetime_s)]
                        + [str(self.nice)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        start_new_session=True,
                    )
                )
            end = time.monotonic() + 10
            for p in self.procs:  # each writes one byte once it is in its loop
                ready, _, _ = select.select([p.stdout], [], [], max(0.0, end - time.monotonic()))
                if not ready or not os.read(p.stdout.fileno(), 1):
                    raise RuntimeError(f"CPU hog {p.pid} did not start")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout is not None:
                p.stdout.close()
        self.procs = []


def _load_cpu_clock_id():
    """``pid -> clock id`` through the C library's ``clock_getcpuclockid``, or None where
    there is none."""
    try:
        import ctypes

        getter = ctypes.CDLL(None, use_errno=True).clock_getcpuclockid
    except (OSError, AttributeError):
        return None
    getter.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]

    def clock_id(pid: int) -> int | None:
        out = ctypes.c_int()
        return out.value if getter(pid, ctypes.byref(out)) == 0 else None

    return clock_id


_CPU_CLOCK_ID = _load_cpu_clock_id()


def process_cpu_s(pid: int) -> float | None:
    """CPU time (user + system) of a live process, all its threads (ended ones too), in
    seconds at nanosecond resolution: its POSIX CPU-time clock (``clock_getcpuclockid``).
    None where the platform has no such clock or the process is gone.

    utime + stime in /proc/PID/stat (what psutil reads) count whole clock ticks instead
    (10 ms at the usual USER_HZ of 100): a process that used 9 ms in a window shows 0 or 10.
    """
    clock_id = None if _CPU_CLOCK_ID is None else _CPU_CLOCK_ID(pid)
    if clock_id is None:
        return None
    try:
        return time.clock_gettime(clock_id)
    except OSError:  # the process ended in between
        return None


class CpuMeter:
    """CPU time of some processes (and their children) over an interval, as a percentage of
    the whole machine.

    Each process is read through its CPU-time clock (:func:`process_cpu_s`, nanoseconds);
    only where that clock is missing through psutil or /proc, which count 10 ms ticks. A
    process that appears during the interval counts from zero; one that ends counts nothing.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.t0 = time.perf_counter()
        self.cpu0 = self._cpu()

    def _tree(self) -> List[int]:
        """The processes and their descendants."""
        try:
            import psutil
        except ImportError:
            return [q for p in self.pids for q in [p, *_children(p)]]
        out = []
        for pid in self.pids:
            try:
                out += [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                pass
        return out

    def _cpu(self) -> Dict[int, float]:
        """CPU seconds of every process of the tree, by PID."""
        out = {}
        for pid in self._tree():
            cpu = process_cpu_s(pid)
            if cpu is None:
                cpu = _ticked_cpu_s(pid)
            if cpu is not None:
                out[pid] = cpu
        return out

    def seconds(self) -> float:
        """CPU seconds used since construction."""
        now = self._cpu()
        return sum(max(0.0, cpu - self.cpu0.get(pid, 0.0)) for pid, cpu in now.items())

    def percent(self) -> float:
        """Percent of all CPUs used since construction."""
        wall = time.perf_counter() - self.t0
        used = self.seconds()
        cpus = os.cpu_count() or 1
        return 100.0 * used / (wall * cpus) if wall > 0 else 0.0


def _ticked_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process from psutil or /proc, in whole clock ticks."""
    try:
        import psutil
    except ImportError:
        return _proc_ticks(pid) / os.sysconf("SC_CLK_TCK")
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system
