"""The processes of ``rtpool bench soak`` and what is sampled from them.

Owns the worker hosts (``rtpool worker`` process groups: SIGKILL of one process, which the
worker restarts, or of the whole group, which the harness restarts), the clients that leave
without acknowledging their results (a subprocess killed after its first result), and the
readings from ``/proc`` (RSS, descriptors, threads) and from the data dir (journal size). The
master process itself is :class:`rtpool_bench.recovery._Master`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from .recovery import _start_worker_at, _stop_group


def proc_status(pid: int) -> Dict[str, float]:
    """RSS (MiB) and thread count of ``pid`` from ``/proc/PID/status`` (empty when gone)."""
    out: Dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = int(line.split()[1]) / 1024
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
    except OSError:
        pass
    return out


def open_fds(pid: int) -> int | None:
    """Descriptors open in ``pid`` (None when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _parents() -> Dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(pid: int) -> List[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    parents = _parents()
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        frontier += kids
    return out


def journal_bytes(data_dir: Path) -> int:
    """Bytes on disk of the master's journal files (``journal*`` anywhere in the data dir)."""
    total = 0
    for p in data_dir.rglob("*journal*"):
        try:
            if p.is_file():
                total += p.stat().st_size
            elif p.is_dir():
                total += sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
        except OSError:
            continue
    return total


class WorkerHosts:
    """``count`` ``rtpool worker --procs PROCS`` process groups serving the soak's library."""

    def __init__(self, address: str, token: str, log_dir: Path, count: int, procs: int) -> None:
        self.address, self.token, self.log_dir, self.procs = address, token, log_dir, procs
        self.groups: List[subprocess.Popen] = [self._start(i) for i in range(count)]
        self.started = count

    def _start(self, i: int) -> subprocess.Popen:
        extra = ["--procs", str(self.procs), "--serve", "rtpool_bench.soak_lib"]
        return _start_worker_at(self.address, self.token, self.log_dir / f"worker{i}.log", extra)

    def kill_one_process(self, rng: random.Random) -> int | None:
        """SIGKILL one worker process (not a parent): its parent starts another."""
        group = rng.choice(self.groups)
        kids = descendants(group.pid)
        if not kids:
            return None
        pid = rng.choice(kids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return pid

    def kill_and_restart_host(self, rng: random.Random) -> int:
        """SIGKILL a whole worker group (parent and processes) and start a new one."""
        i = rng.randrange(len(self.groups))
        old = self.groups[i]
        try:
            os.killpg(old.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        old.wait(10)
        self.groups[i] = self._start(self.started)
        self.started += 1
        return old.pid

    def rss_mb(self) -> float:
        """RSS of every worker process (parents and children), summed, in MiB."""
        total = 0.0
        for g in self.groups:
            for pid in [g.pid, *descendants(g.pid)]:
                total += proc_status(pid).get("rss_mb", 0.0)
        return total

    def stop(self) -> None:
        for g in self.groups:
            _stop_group(g)


#: The client that leaves: submits a package of 1 MiB results, takes the first one and dies
#: without acknowledging the others (its package waits for the result TTL, then expires).
_ABANDON = """
import os, sys, rtpool
from rtpool_bench.soak_lib import tagged_blob
c = rtpool.Client(sys.argv[1], reconnect_timeout=0, name="soak-abandoner")
futs = [c.submit(tagged_blob, i, 1 << 20) for i in range(int(sys.argv[2]))]
futs[0].result(timeout=60)
os._exit(0)
"""


def abandon(address: str, token: str, log: Path, results: int) -> subprocess.Popen:
    """Start a client that leaves without acknowledging ``results - 1`` results."""
    env = {**os.environ, "RTPOOL_TOKEN": token}
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-c", _ABANDON, address, str(results)],
            stdout=f,
            stderr=f,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
