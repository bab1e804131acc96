"""``rtpool bench scale``: thousands of simulated workers against a real ``rtpool master`` at its
default settings, and a real client submitting no-op packages.

For each worker count (default 1,000, 5,000 and 10,000) the benchmark starts an ``rtpool
master`` subprocess with nothing but ``--listen`` and ``--data-dir``, opens that many simulated
worker connections (``rtpool._native.ScaleSim``: Rust, ``--sim-threads`` threads, the real
protocol; each answers its tasks at once, so the master is the bottleneck, and connects again
after a lost lease), then connects an ``rtpool.Client`` and measures:

* connections: accepted, answered ``busy`` (retried), refused, given up, seconds to connect
  them all; whether the client got in at its first attempt (the client reserve);
* master RSS before and after the workers connected, per connection;
* an idle phase of ``--idle-seconds`` with every worker connected and no task: the master's
  CPU (utime + stime from /proc) and the simulator's (its threads) as % of one core, the
  master's per idle worker, and the ``HEARTBEAT`` frames each way per worker and second;
* tasks/s of one package of ``--tasks`` no-op tasks, and the master's CPU per task (utime +
  stime from /proc over that package), tasks per ``ASSIGN`` frame;
* closed-loop no-op round trips of single-task packages: p50, p99, p99.9, max;
* lease losses and connections lost over the whole level, and whether the simulator itself
  was silent past the lease (its threads starved of CPU on a loaded machine): those leases are
  the simulator's loss, not the master's, and the report says so.

Every phase is bounded in count and time. The machine may be shared: CPU-bound figures (tasks/s,
CPU per task, latency) then move from run to run; compare levels of one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from .stats import machine_info, new_histogram, record_ns, summarize_histogram
from .tasks import noop

DEFAULT_LEVELS = "1000,5000,10000"
RESULT_TIMEOUT_S = 30.0


def _rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 when unreadable)."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def raise_nofile(need: int) -> int:
    """Raise this process's soft open-file limit to its hard limit (the simulator holds one
    descriptor per worker); return the soft limit now.

    Raises:
        SystemExit: The hard limit is below ``need``: the message says what to run.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        raise SystemExit(
            f"rtpool bench scale: {need} descriptors needed for the simulated workers, but the "
            f"hard open-file limit is {hard}; raise it (ulimit -Hn, or LimitNOFILE= in systemd) "
            "or ask for fewer --workers"
        )
    if soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _wait_connected(sim, workers: int, timeout_s: float) -> Dict[str, object]:
    """Poll ``sim`` until every worker connected or gave up, or ``timeout_s`` passed."""
    t0 = time.perf_counter()
    while True:
        s = sim.stats()
        settled = s["connected"] + s["gave_up"] + s["refused"]
        if settled >= workers or time.perf_counter() - t0 > timeout_s:
            s["connect_s"] = round(time.perf_counter() - t0, 3)
            s["settled"] = settled >= workers
            return s
        time.sleep(0.05)


def _sim_cpu_s() -> float:
    """utime + stime of this process's simulator threads (``rtpool-sim-*``), seconds."""
    import os

    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        if comm.startswith("rtpool-sim"):
            fields = text.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _idle(master_pid: int, sim, workers: int, seconds: float) -> Dict[str, object]:
    """Every worker connected, no task: CPU of the master and of the simulator over
    ``seconds``, and the heartbeats each way."""
    time.sleep(min(2.0, seconds))  # let the connection burst settle (its last PULLs, logs)
    before, cpu0, sim0 = sim.stats(), _cpu_s(master_pid), _sim_cpu_s()
    t0 = time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - t0
    after, cpu, sim_cpu = sim.stats(), _cpu_s(master_pid) - cpu0, _sim_cpu_s() - sim0
    per_s = workers * elapsed
    return {
        "seconds": round(elapsed, 2),
        # /proc counts whole clock ticks (10 ms): over 10 s, 0.1 % of a core.
        "master_cpu_pct": round(100 * cpu / elapsed, 2),
        "master_cpu_us_per_worker_s": round(cpu * 1e6 / per_s, 3) if per_s else None,
        "sim_cpu_pct": round(100 * sim_cpu / elapsed, 2),
        # (None: a simulator that does not count them, an older build's)
        "heartbeats_sent_per_worker_s": round(
            (after.get("heartbeats_sent", 0) - before.get("heartbeats_sent", 0)) / per_s, 3
        )
        if per_s and "heartbeats_sent" in after
        else None,
        "heartbeats_received_per_worker_s": round(
            (after.get("heartbeats_received", 0) - before.get("heartbeats_received", 0)) / per_s,
            3,
        )
        if per_s and "heartbeats_received" in after
        else None,
        "tasks": after["tasks"] - before["tasks"],
    }


def _probe_client(address: str, token: str) -> str:
    """One client handshake with no retry: ``"welcome"``, ``"busy"`` or the error's text."""
    from rtpool import _dial
    from rtpool.errors import MasterBusy

    try:
        sock, *_ = _dial.connect(
            address,
            role="client",
            token=token,
            name="scale-probe",
            slots=0,
            timeout=10.0,
            busy_timeout=0,
        )
    except MasterBusy:
        return "busy"
    except Exception as exc:  # noqa: BLE001 - reported as text in the result
        return f"{type(exc).__name__}: {exc}"
    sock.close()
    return "welcome"


def _throughput(client, master_pid: int, sim, tasks: int, timeout_s: float) -> Dict[str, object]:
    """One package of ``tasks`` no-ops: tasks/s from submit to last result, master CPU/task."""
    client.submit_many(noop, range(min(1000, tasks))).results()  # warm-up: code cache, pools
    before, cpu0 = sim.stats(), _cpu_s(master_pid)
    t0 = time.perf_counter()
    pkg = client.submit_many(noop, range(tasks))
    finished, deadline = 0, t0 + timeout_s
    try:
        for fut in pkg.futures:
            fut.result(timeout=max(0.001, deadline - time.perf_counter()))
            finished += 1
    except TimeoutError:
        pass
    except Exception as exc:  # concurrent.futures.TimeoutError before 3.11
        if type(exc).__name__ != "TimeoutError":
            raise
    elapsed = time.perf_counter() - t0
    cpu, after = _cpu_s(master_pid) - cpu0, sim.stats()
    frames = after["assign_frames"] - before["assign_frames"]
    return {
        "tasks": tasks,
        "finished": finished,
        "timed_out": finished < tasks,
        "seconds": round(elapsed, 3),
        "tasks_per_s": round(finished / elapsed, 1) if elapsed > 0 else None,
        "master_cpu_s": round(cpu, 2),
        # /proc counts whole clock ticks (10 ms): below ~10 of them the figure means nothing.
        "master_cpu_us_per_task": round(cpu * 1e6 / finished, 2)
        if finished and cpu >= 0.1
        else None,
        "tasks_per_assign_frame": round((after["tasks"] - before["tasks"]) / frames, 2)
        if frames
        else None,
    }


def _latency(client, count: int, seconds: float) -> Dict[str, object]:
    """Closed-loop single-task no-op packages: up to ``count`` or ``seconds``."""
    for _ in range(min(100, count)):
        client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
    h, done, deadline = new_histogram(), 0, time.perf_counter() + seconds
    while done < count and time.perf_counter() < deadline:
        t0 = time.perf_counter_ns()
        client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
        record_ns(h, time.perf_counter_ns() - t0)
        done += 1
    return {"requested": count, "stopped_by_time": done < count, **summarize_histogram(h)}


def run_level(
    workers: int, args, say: Callable[[str], None], slots: int = 0, prefetch: int = -1
) -> Dict[str, object]:
    """One worker count: a fresh master, ``workers`` simulated workers, a client.

    Args:
        slots: Slots per connection (0: ``args.slots``).
        prefetch: Credits beyond the slots (-1: ``args.prefetch``).
    """
    slots = slots or args.slots
    prefetch = args.prefetch if prefetch < 0 else prefetch
    import rtpool
    from rtpool import _native

    from .recovery import _Master

    out: Dict[str, object] = {"workers": workers, "slots": slots}
    with tempfile.TemporaryDirectory(prefix="rtpool-scale-") as tmp:
        log = Path(tmp) / "master.log"
        master = _Master(Path(tmp) / "data", log, list(args.master_arg or []))
        pid = master.proc.pid
        sim = None
        try:
            out["master_rss_idle_kb"] = _rss_kb(pid)
            say(f"scale: {workers} workers x {slots} slot(s) connecting to {master.address}")
            sim = _native.ScaleSim(
                master.address,
                master.worker_token,
                workers,
                slots=slots,
                prefetch=prefetch,
                max_attempts=args.max_attempts,
                handshake_concurrency=args.handshake_concurrency,
                threads=args.sim_threads,
            )
            conn = _wait_connected(sim, workers, args.connect_timeout)
            out["connections"] = conn
            rss = _rss_kb(pid)
            out["master_rss_kb"] = rss
            accepted = conn["connected"]
            out["master_rss_per_connection_kb"] = (
                round((rss - out["master_rss_idle_kb"]) / accepted, 1) if accepted else None
            )
            if args.idle_seconds > 0:
                say(f"scale: {workers} workers: idle for {args.idle_seconds:g} s")
                out["idle"] = _idle(pid, sim, accepted, args.idle_seconds)
            out["client_first_attempt"] = _probe_client(master.address, master.token)
            t0 = time.perf_counter()
            with rtpool.Client(master.address, master.token) as client:
                out["client_connect_s"] = round(time.perf_counter() - t0, 3)
                say(f"scale: {workers} workers: one package of {args.tasks} no-ops")
                out["throughput"] = _throughput(client, pid, sim, args.tasks, args.seconds)
                if sim.stats()["open"]:
                    say(f"scale: {workers} workers: up to {args.latency_count} no-op round trips")
                    out["latency"] = _latency(client, args.latency_count, args.seconds)
                else:  # every worker gone: each round trip would only time out
                    out["latency"] = _latency(client, 0, 0)
            final = sim.stop()
            out["lease_lost"] = final["lease_lost"]
            out["lost_connections"] = final["disconnected"] + final["closed_by_master"]
            # A session silent for its lease was late on the simulator's side: the master was
            # right to end it. Only the other lost leases are the master's.
            out["simulator_late"] = final["silent_past_lease"] > 0
            out["master_lease_lost"] = final["lease_lost"] - final["lease_lost_late"]
            out["sim_final"] = final
        finally:
            if sim is not None:
                sim.stop()
            if master.proc.poll() is None:
                master.proc.send_signal(signal.SIGTERM)
                try:
                    master.proc.wait(15)
                except Exception:  # noqa: BLE001 - a master that ignores SIGTERM is killed
                    pass
            master.kill()
            out["master_log_lines"] = sum(1 for _ in open(log, "rb")) if log.exists() else 0
    return out


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench scale`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench scale",
        description=(
            "Simulated workers (the real protocol, answered at once) against a real `rtpool "
            "master` at its default settings, plus a real client: connections accepted and "
            "refused, master RSS per connection, tasks/s, master CPU per task, lease losses, "
            "no-op round trip p50/p99/p99.9/max. Needs a hard open-file limit above the "
            "largest --workers."
        ),
    )
    ap.add_argument(
        "--workers",
        default=DEFAULT_LEVELS,
        help=f"comma-separated worker counts, one master each (default {DEFAULT_LEVELS})",
    )
    ap.add_argument(
        "--slots", type=int, default=1, help="slots per simulated worker connection (default 1)"
    )
    ap.add_argument(
        "--prefetch",
        type=int,
        default=1,
        help="credits asked beyond the slots (default 1, as a one-slot worker)",
    )
    ap.add_argument(
        "--batched-slots",
        type=int,
        default=0,
        metavar="S",
        help="after the levels, one more with the largest level's slots on connections of S "
        "slots each (prefetch S): the cost of one connection per slot against one per host, "
        "measured in the same run (default 0: off)",
    )
    ap.add_argument(
        "--tasks",
        type=int,
        default=100_000,
        help="no-op tasks of the throughput package (default 100000)",
    )
    ap.add_argument(
        "--latency-count", type=int, default=2000, help="no-op round trips to record (default 2000)"
    )
    ap.add_argument(
        "--seconds", type=float, default=60.0, help="time bound of each phase, seconds (default 60)"
    )
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="length of the idle phase (every worker connected, no task) that measures the "
        "master's and the simulator's CPU; 0: none (default 10)",
    )
    ap.add_argument(
        "--connect-timeout",
        type=float,
        default=120.0,
        help="seconds allowed for every worker to connect (default 120)",
    )
    ap.add_argument(
        "--handshake-concurrency",
        type=int,
        default=64,
        help="simulated handshakes in flight at once (default 64; as many as --workers: a "
        "burst, as after a master restart)",
    )
    ap.add_argument(
        "--max-attempts",
        type=int,
        default=20,
        help="connection attempts per worker before it gives up; each `busy` answer costs one, "
        "and the pause between two doubles from 0.1 s to 5 s (default 20)",
    )
    ap.add_argument(
        "--sim-threads",
        type=int,
        default=2,
        help="threads running the simulated workers (default 2: one thread could be starved "
        "past the lease on a loaded 2-vCPU machine, and the master would rightly end leases "
        "the simulator failed to keep)",
    )
    ap.add_argument(
        "--master-arg",
        action="append",
        metavar="ARG",
        help="extra `rtpool master` argument (repeatable; default: none, so the "
        "master runs at its default settings)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def _levels(text: str, ap: argparse.ArgumentParser) -> List[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        ap.error(f"cannot read --workers {text!r}; use positive counts such as 1000,5000,10000")
    return levels


def render(result: Dict[str, object], write: Callable[[str], None]) -> None:
    """Print the levels as one table, then what went wrong, if anything."""
    head = (
        f"{'workers':>8} {'slots':>5} {'accepted':>8} {'busy':>6} {'gave up':>7} "
        f"{'conn s':>7} {'client':>8} {'RSS MB':>7} {'KB/conn':>7} {'tasks/s':>9} "
        f"{'us CPU/task':>11} {'tasks/ASSIGN':>12} {'p50 us':>7} {'p99 us':>7} "
        f"{'p99.9 us':>8} {'max us':>7} {'leases lost':>11}"
    )
    write(head)
    for lv in result["levels"]:
        c, t, lat = lv["connections"], lv["throughput"], lv["latency"]
        write(
            f"{lv['workers']:>8} {lv['slots']:>5} {c['connected']:>8} {c['busy']:>6} "
            f"{c['gave_up']:>7} {c['connect_s']:>7} {lv['client_first_attempt']:>8} "
            f"{lv['master_rss_kb'] / 1024:>7.1f} {lv['master_rss_per_connection_kb'] or 0:>7} "
            f"{t['tasks_per_s'] or 0:>9} {t['master_cpu_us_per_task'] or '-':>11} "
            f"{t['tasks_per_assign_frame'] or 0:>12} {lat['p50_us']:>7} {lat['p99_us']:>7} "
            f"{lat['p99_9_us']:>8} {lat['max_us']:>7} {lv['lease_lost']:>11}"
        )
    for lv in result["levels"]:
        idle = lv.get("idle")
        if idle:
            hb_in = idle["heartbeats_received_per_worker_s"]
            write(
                f"{lv['workers']} workers idle {idle['seconds']} s: master CPU "
                f"{idle['master_cpu_pct']} % of a core ({idle['master_cpu_us_per_worker_s']} us "
                f"per idle worker connection per s), simulator {idle['sim_cpu_pct']} %; "
                f"HEARTBEAT per worker per s: {idle['heartbeats_sent_per_worker_s']} to the "
                f"master, {'-' if hb_in is None else hb_in} from it"
            )
    for lv in result["levels"]:
        problems = []
        final = lv["sim_final"]
        if lv["simulator_late"]:
            problems.append(
                f"the simulator itself was silent past the lease on {final['silent_past_lease']} "
                f"sessions (longest silence {final['max_silence_ms']} ms, heartbeat timers up to "
                f"{final['max_heartbeat_lag_ms']} ms late: its threads were starved of CPU); "
                f"{final['lease_lost_late']} of the {lv['lease_lost']} leases lost are the "
                "simulator's, not the master's: measure again on a quieter machine or with more "
                "--sim-threads"
            )
        if lv["master_lease_lost"]:
            problems.append(
                f"{lv['master_lease_lost']} leases lost while the simulator was not that late "
                f"(longest silence {final['max_silence_ms']} ms): the master's"
            )
        if not lv["connections"]["settled"]:
            problems.append("not every worker connected in time")
        if lv["throughput"]["timed_out"]:
            problems.append("the package did not finish in time")
        if lv["lost_connections"]:
            problems.append(f"{lv['lost_connections']} connections lost")
        err = final.get("first_error")
        if problems or err:
            write(
                f"{lv['workers']} workers: {'; '.join(problems) or 'ok'}"
                + (f" (first error: {err})" if err else "")
            )
    write(
        "(tasks/s, CPU per task and latency are CPU-bound: on a shared machine compare levels "
        "of one run)"
    )


def main(argv: Sequence[str]) -> int:
    """Entry point of ``rtpool bench scale``; ``argv`` excludes ``scale``.

    Returns:
        0 when every level connected all its workers, let the client in at its first attempt,
        finished its package and lost no lease; 1 otherwise.
    """
    ap = build_parser()
    args = ap.parse_args(argv)
    levels = _levels(args.workers, ap)
    if (
        min(
            args.slots,
            args.tasks,
            args.latency_count,
            args.max_attempts,
            args.handshake_concurrency,
            args.sim_threads,
        )
        < 1
        or args.prefetch < 0
        or args.idle_seconds < 0
        or args.batched_slots < 0
    ):
        ap.error(
            "--slots, --tasks, --latency-count, --max-attempts, --handshake-concurrency and "
            "--sim-threads must be at least 1, --prefetch, --batched-slots and --idle-seconds at "
            "least 0"
        )
    raise_nofile(max(levels) + 256)

    def say(text: str) -> None:  # progress, on stderr also with --json
        print(text, file=sys.stderr, flush=True)

    result: Dict[str, object] = {"machine": machine_info(), "levels": []}
    for workers in levels:
        result["levels"].append(run_level(workers, args, say))
    if args.batched_slots:
        # The same slots as the largest level on few connections, in the same run: the ratio
        # of master CPU per task is what one connection per worker host would save.
        slots = args.batched_slots
        conns = -(-max(levels) * args.slots // slots)
        result["levels"].append(run_level(conns, args, say, slots=slots, prefetch=slots))
    if args.json:
        print(json.dumps(result))
    else:
        render(result, print)
    ok = all(
        lv["connections"]["settled"]
        and lv["connections"]["gave_up"] == 0
        and lv["client_first_attempt"] == "welcome"
        and not lv["throughput"]["timed_out"]
        and lv["lease_lost"] == 0
        for lv in result["levels"]
    )
    return 0 if ok else 1
