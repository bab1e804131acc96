"""``rtpool bench realtime``: what real-time mode changes under background load, and its cost.

Two stacks run side by side for the whole run, each an ``rtpool master`` subprocess (no
journal) with two ``rtpool worker`` processes: one in normal mode, one with ``--realtime`` on
the master and the workers. Each is measured idle and under load, where load is one CPU hog per
usable CPU (child processes that spin at normal priority, started before a block and stopped by
PID after it; each also ends by itself after ``--hog-limit`` seconds). Per block:

* **latency**: ``--block`` closed-loop round trips of a no-op task (submit, wait for the result,
  repeat), recorded in an HdrHistogram: p50, p99, p99.9, max;
* **throughput**: one package of ``--tasks`` no-op tasks, submitted at once and waited for:
  tasks/s;
* under load, **the hogs' rate** (loop iterations/s), during each of the two parts (a fresh set
  of hogs for each): what the stack took from the rest of the machine while it answered one
  request at a time, and while it ran a package as fast as it could.

The four configurations (normal/realtime x idle/load) are interleaved in blocks, in a shuffled
order each round, so a noisy neighbour hits all alike. In the realtime configurations the
benchmark's own client (this process) runs under SCHED_FIFO too, as a real-time application
would (``--client-normal`` keeps it normal): otherwise the client's wake-ups behind the hogs
would hide what the master and the workers gain.

Every loop is bounded by a count and the ``--seconds`` budget; every process started here is
stopped here, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from .recovery import _Master, _start_worker_at, _stop_group
from .stats import (
    fmt_us,
    machine_info,
    new_histogram,
    record_ns,
    safe_ratio,
    summarize_histogram,
    usable_cpus,
)
from .tasks import noop

RESULT_TIMEOUT_S = 60.0
MODES = ("normal", "realtime")
LOADS = ("idle", "load")

# A CPU hog: spins until SIGTERM or its time limit, then prints its iterations and seconds.
_HOG = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
limit = time.monotonic() + float(sys.argv[1])
print("ready", flush=True)
n, t0 = 0, time.perf_counter()
while not stop:
    for _ in range(10000):
        pass
    n += 1
    if time.monotonic() > limit:
        break
print(n * 10000, time.perf_counter() - t0, flush=True)
"""


class _Hogs:
    """One CPU hog per usable CPU while in use; ``stop()`` returns their loop iterations/s."""

    def __init__(self, count: int, limit_s: float) -> None:
        self.procs: List[subprocess.Popen] = []
        try:
            for _ in range(count):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _HOG, str(limit_s)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for p in self.procs:  # each spins once it said so
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError("a CPU hog did not start")
        except BaseException:
            self.kill()
            raise

    def stop(self) -> float:
        """SIGTERM every hog, collect their rates; the sum of iterations/s."""
        total = 0.0
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                out, _ = p.communicate(timeout=10)
                n, secs = out.split()[:2]
                total += int(n) / max(float(secs), 1e-9)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()
        return total

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout is not None:
                p.stdout.close()


class _Stack:
    """A master subprocess and two worker processes, in normal or real-time mode."""

    def __init__(self, base: Path, mode: str, priority: int, cpus: str | None) -> None:
        self.mode = mode
        rt: List[str] = []
        if mode == "realtime":
            rt = ["--realtime", "--rt-priority", str(priority)]
            rt += ["--cpus", cpus] if cpus else []
        self.master_log = base / f"{mode}-master.log"
        self.master = _Master(base / f"{mode}-data", self.master_log, ["--no-journal", *rt])
        self.workers: List[subprocess.Popen] = []
        try:
            for i in range(2):
                log = base / f"{mode}-worker{i}.log"
                self.workers.append(
                    _start_worker_at(self.master.address, self.master.worker_token, log, rt)
                )
        except BaseException:
            self.close()
            raise
        self.client = None
        self.worker_pids: List[int] = []

    def connect(self) -> None:
        import rtpool

        self.client = rtpool.Client(self.master.address, self.master.token)

    def wait_for_workers(self, timeout: float = 60.0) -> None:
        """Run tasks until both worker processes have answered (their pids), bounded."""
        seen = set()
        end = time.monotonic() + timeout
        while len(seen) < 2:
            if time.monotonic() > end:
                raise TimeoutError(f"{self.mode}: only {len(seen)} of 2 workers answered")
            pkg = self.client.submit_many(os.getpid, [()] * 8, star=True)
            seen.update(pkg.results(timeout=RESULT_TIMEOUT_S))
        self.worker_pids = sorted(seen)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for w in self.workers:
            _stop_group(w)
        self.master.kill()


def _proc_facts(pid: int) -> Dict[str, object]:
    """Locked and resident memory, and threads under SCHED_FIFO, of one process (Linux)."""
    facts: Dict[str, object] = {"pid": pid}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmLck", "VmRSS"):
                    facts[key.lower() + "_kb"] = int(value.split()[0])
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        fifo = 0
        flag = getattr(os, "SCHED_RESET_ON_FORK", 0)
        for tid in tids:
            try:
                fifo += os.sched_getscheduler(tid) & ~flag == os.SCHED_FIFO
            except OSError:
                pass
        facts["threads"] = len(tids)
        facts["fifo_threads"] = fifo
    except (OSError, AttributeError, ValueError):
        pass
    return facts


def _set_client_policy(fifo: bool, priority: int) -> bool:
    """This (the client's) thread under SCHED_FIFO or back to normal; whether it took."""
    try:
        if fifo:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        return False
    return True


class _Cell:
    """What one configuration (mode x load) measured over its blocks."""

    def __init__(self) -> None:
        self.hist = new_histogram()
        self.tasks = 0
        self.task_seconds = 0.0
        self.block_rates: List[float] = []
        self.hog_rates_latency: List[float] = []
        self.hog_rates_throughput: List[float] = []

    def summary(self) -> Dict[str, object]:
        out: Dict[str, object] = dict(summarize_histogram(self.hist))
        out["tasks_per_s"] = round(self.tasks / self.task_seconds, 1) if self.task_seconds else None
        rates = sorted(self.block_rates)
        out["tasks_per_s_median_block"] = round(rates[len(rates) // 2], 1) if rates else None
        for part in ("latency", "throughput"):
            hogs = sorted(getattr(self, f"hog_rates_{part}"))
            out[f"hog_iterations_per_s_{part}"] = round(hogs[len(hogs) // 2]) if hogs else None
        return out


def _block(
    stack: _Stack, cell: _Cell, block: int, tasks: int, hogs: Callable[[], _Hogs | None]
) -> None:
    """A latency part and a throughput part, each under its own hogs when ``hogs()`` gives."""
    client = stack.client
    running = hogs()
    try:
        for _ in range(block):
            t0 = time.perf_counter_ns()
            client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
            record_ns(cell.hist, time.perf_counter_ns() - t0)
    finally:
        if running is not None:
            cell.hog_rates_latency.append(running.stop())
    running = hogs()
    try:
        t0 = time.perf_counter()
        client.submit_many(noop, range(tasks)).results(timeout=RESULT_TIMEOUT_S)
        secs = time.perf_counter() - t0
    finally:
        if running is not None:
            cell.hog_rates_throughput.append(running.stop())
    cell.tasks += tasks
    cell.task_seconds += secs
    cell.block_rates.append(tasks / secs)


def bench_realtime(opts: argparse.Namespace, say: Callable[[str], None]) -> Dict[str, object]:
    """Run the interleaved blocks; the figures, ratios and facts as one dict."""
    hog_count = usable_cpus()
    cells = {(m, load): _Cell() for m in MODES for load in LOADS}
    client_fifo = not opts.client_normal
    rounds_done = 0
    with tempfile.TemporaryDirectory(prefix="rtpool-bench-rt-") as tmp:
        base = Path(tmp)
        stacks: Dict[str, _Stack] = {}
        try:
            for mode in MODES:
                say(f"starting the {mode} stack (master + 2 workers)")
                stacks[mode] = _Stack(base, mode, opts.priority, opts.cpus)
            for mode in MODES:
                # Threads inherit the policy of the thread that creates them: the realtime
                # client's reader thread is created under SCHED_FIFO, the normal one's is not.
                _set_client_policy(client_fifo and mode == "realtime", opts.priority)
                stacks[mode].connect()
                stacks[mode].wait_for_workers()
                say(f"{mode}: warm-up")
                _block(stacks[mode], _Cell(), opts.block, opts.tasks, lambda: None)
            client_fifo_ok = client_fifo and _set_client_policy(True, opts.priority)
            _set_client_policy(False, 0)
            facts = {
                mode: {
                    "master": _proc_facts(stacks[mode].master.proc.pid),
                    "workers": [_proc_facts(p) for p in stacks[mode].worker_pids],
                }
                for mode in MODES
            }
            rng = random.Random(11)
            deadline = time.monotonic() + opts.seconds
            say(
                f"{opts.rounds} rounds of {opts.block} round trips + {opts.tasks} tasks per "
                f"configuration, {hog_count} hogs under load, budget {opts.seconds:g} s"
            )
            for r in range(opts.rounds):
                if time.monotonic() > deadline:
                    say(f"time budget spent after {r} rounds")
                    break
                order = [(m, load) for load in LOADS for m in MODES]
                rng.shuffle(order)
                for mode, load in order:
                    # The hogs start while the client is still normal, like any other load.
                    hogs = (lambda: _Hogs(hog_count, opts.hog_limit)) if load == "load" else None
                    fifo = client_fifo and mode == "realtime"

                    def start_hogs(hogs=hogs, fifo=fifo) -> _Hogs | None:
                        _set_client_policy(False, 0)
                        running = hogs() if hogs is not None else None
                        _set_client_policy(fifo, opts.priority)
                        return running

                    try:
                        _block(
                            stacks[mode], cells[(mode, load)], opts.block, opts.tasks, start_hogs
                        )
                    finally:
                        _set_client_policy(False, 0)
                rounds_done = r + 1
                say(f"round {rounds_done}/{opts.rounds} done")
        finally:
            _set_client_policy(False, 0)
            for s in stacks.values():
                s.close()
            logs = {p.name: p.read_text(errors="replace")[-4000:] for p in base.glob("*.log")}
    summaries = {f"{m}/{load}": cells[(m, load)].summary() for m in MODES for load in LOADS}
    return {
        "settings": {
            "rounds": rounds_done,
            "block": opts.block,
            "tasks": opts.tasks,
            "hogs": hog_count,
            "priority": opts.priority,
            "cpus": opts.cpus,
            "client_fifo": bool(client_fifo_ok),
        },
        "facts": facts,
        "cells": summaries,
        "ratios": _ratios(summaries),
        "realtime_log_lines": _realtime_lines(logs),
    }


def _realtime_lines(logs: Dict[str, str]) -> List[str]:
    """The real-time mode lines the stacks logged (summaries and warnings)."""
    import re

    out = []
    for name, text in sorted(logs.items()):
        for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
            if "real-time mode" in line:
                out.append(f"{name}: {line.strip()[-300:]}")
    return out


def _ratios(s: Dict[str, Dict[str, object]]) -> Dict[str, Dict[str, float | None]]:
    keys = ("p50_us", "p99_us", "p99_9_us", "max_us", "tasks_per_s")
    out: Dict[str, Dict[str, float | None]] = {}
    for load in LOADS:
        a, b = s[f"realtime/{load}"], s[f"normal/{load}"]
        out[f"realtime/normal {load}"] = {k: safe_ratio(a[k], b[k]) for k in keys}
    for part in ("latency", "throughput"):
        key = f"hog_iterations_per_s_{part}"
        out["realtime/normal load"][key] = safe_ratio(
            s["realtime/load"][key], s["normal/load"][key]
        )
    for mode in MODES:
        a, b = s[f"{mode}/load"], s[f"{mode}/idle"]
        out[f"{mode} load/idle"] = {k: safe_ratio(a[k], b[k]) for k in keys}
    return out


# --- CLI -------------------------------------------------------------------------------------


def _render(result: Dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    st = result["settings"]
    t = Table(
        title=f"No-op round trips and throughput, normal vs --realtime ({st['rounds']} rounds "
        f"of {st['block']} round trips + {st['tasks']} tasks; load = {st['hogs']} CPU hogs; "
        f"client FIFO in realtime: {st['client_fifo']})"
    )
    cols = ("config", "n", "p50", "p99", "p99.9", "max", "tasks/s", "hogs lat.", "hogs thr.")
    for col in cols:
        t.add_column(col, justify="right" if col != "config" else "left")
    for name, c in result["cells"].items():
        hl, ht = c["hog_iterations_per_s_latency"], c["hog_iterations_per_s_throughput"]
        t.add_row(
            name,
            str(c["count"]),
            fmt_us(c["p50_us"]),
            fmt_us(c["p99_us"]),
            fmt_us(c["p99_9_us"]),
            fmt_us(c["max_us"]),
            "-" if c["tasks_per_s"] is None else f"{c['tasks_per_s']:.0f}",
            "-" if hl is None else f"{hl / 1e6:.1f} M/s",
            "-" if ht is None else f"{ht / 1e6:.1f} M/s",
        )
    console.print(t)
    r = Table(title="Ratios (below 1: lower latency / fewer tasks per second)")
    for col in ("ratio", "p50", "p99", "p99.9", "max", "tasks/s", "hogs lat.", "hogs thr."):
        r.add_column(col, justify="right" if col != "ratio" else "left")

    def f(v: object) -> str:
        return "-" if v is None else f"{v:.2f}"

    for name, x in result["ratios"].items():
        r.add_row(
            name,
            f(x["p50_us"]),
            f(x["p99_us"]),
            f(x["p99_9_us"]),
            f(x["max_us"]),
            f(x["tasks_per_s"]),
            f(x.get("hog_iterations_per_s_latency")),
            f(x.get("hog_iterations_per_s_throughput")),
        )
    console.print(r)
    for mode, fx in result["facts"].items():
        m = fx["master"]
        ws = ", ".join(
            f"pid {w.get('pid')}: {w.get('fifo_threads', '?')}/{w.get('threads', '?')} FIFO, "
            f"VmLck {w.get('vmlck_kb', '?')} kB, RSS {w.get('vmrss_kb', '?')} kB"
            for w in fx["workers"]
        )
        console.print(
            f"{mode}: master {m.get('fifo_threads', '?')}/{m.get('threads', '?')} threads FIFO, "
            f"VmLck {m.get('vmlck_kb', '?')} kB, RSS {m.get('vmrss_kb', '?')} kB; workers {ws}"
        )
    for line in result["realtime_log_lines"]:
        console.print(f"  {line}", markup=False)


def main(argv: Sequence[str] | None = None) -> int:
    """``rtpool bench realtime [options]``; returns 0 when the run completed."""
    ap = argparse.ArgumentParser(prog="rtpool bench realtime", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of 4 blocks (20)")
    ap.add_argument("--block", type=int, default=300, help="round trips per block (300)")
    ap.add_argument("--tasks", type=int, default=3000, help="tasks per throughput block (3000)")
    ap.add_argument("--seconds", type=float, default=120, help="time budget of the rounds (120)")
    ap.add_argument("--priority", type=int, default=50, help="SCHED_FIFO priority (50)")
    ap.add_argument("--cpus", default=None, help="--cpus of the realtime stack (none)")
    ap.add_argument(
        "--hog-limit", type=float, default=60, help="a hog ends by itself after this (60 s)"
    )
    ap.add_argument(
        "--client-normal",
        action="store_true",
        help="keep this benchmark's client normal in the realtime configurations",
    )
    opts = ap.parse_args(argv)
    if opts.quick:
        opts.rounds, opts.block, opts.tasks = 1, 20, 200
        opts.seconds, opts.hog_limit = min(opts.seconds, 20), min(opts.hog_limit, 20)
    say = (lambda s: None) if opts.json else (lambda s: print(s, file=sys.stderr, flush=True))
    result: Dict[str, object] = {"machine": machine_info()}
    result.update(bench_realtime(opts, say))
    if opts.json:
        print(json.dumps(result))
    else:
        _render(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
