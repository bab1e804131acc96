"""``rtpool bench ha netns``: HA failover under real faults across hosts (issue 28 item 5), each
run judged by the history checker. The cluster is :mod:`rtpool_bench.ha_netns` (PostgreSQL,
two masters, two worker hosts and a client host, each a network namespace).

Faults (``--fault``), one per run, once ``--results-between`` results have come:

* ``kill``: the leader SIGKILLed; restarted as a standby after the failover;
* ``partition``: the leader's cable pulled (``cut``) while it runs: the standby takes over
  after the lease; the old leader fences itself by its own clock (its log says so); the
  cable is plugged back and it must stand by, naming the new leader;
* ``stop``: the leader SIGSTOPped until the standby leads, then SIGCONTed: it fences itself;
* ``pgrestart``: PostgreSQL stopped (fast) on host ``db`` under load; the leader refuses new
  packages while it is down and fences itself after the lease; PostgreSQL is started again on
  the same data dir and a master takes the lease again;
* ``standby``: the standby SIGKILLed; the clients must not notice; restarted as a standby.

Per run: the checker's verdict; the failover time (fault -> first result after a master was
seen leading again; for ``standby``: fault -> next result); journal rows of the old epoch the
database accepted after a newer epoch wrote (must be 0: then no package was acknowledged by
the old leader after the takeover either, since acknowledgement waits for the commit); the
journal writes the database refused (``journal write refused`` log lines); how the old
leader fenced itself (its log line). Every wait is bounded; every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Sequence

from .ha_cluster import LEAD_TIMEOUT_S
from .ha_netns import NetCluster, NetMaster, NetRun, freeze, status, thaw, wait_for, wait_leader
from .history import ACK_WAIT_S, DRAIN_S, history_path
from .history_check import check_dir, render
from .history_kill import PROGRESS_TIMEOUT_S, _Results
from .stats import machine_info, percentile

FAULTS = ("kill", "partition", "stop", "pgrestart", "standby")
#: The line of a self-fencing (the writer's "journal write refused ... no longer leads" is not one).
_FENCE = "high availability: this master no longer leads ("


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def _fence_lines(m: NetMaster) -> list:
    return [line for line in m.log_text().splitlines() if _FENCE in line]


def _wait_fenced(m: NetMaster, before: int) -> str:
    """Waits until ``m`` logged one more self-fencing than ``before``; returns why it fenced."""
    lines = wait_for(
        lambda: (ls := _fence_lines(m)) and len(ls) > before and ls,
        LEAD_TIMEOUT_S,
        f"master {m.host} to fence itself",
    )
    found = re.search(r"no longer leads \((.*?)\);", lines[before])
    return found.group(1) if found else lines[before]


def _wait_standby_naming(m: NetMaster, leader: NetMaster) -> Dict:
    return wait_for(
        lambda: (
            (s := status(m.http)).get("role") == "standby"
            and s.get("leader") == leader.address
            and s
        ),
        LEAD_TIMEOUT_S,
        f"master {m.host} to stand by naming {leader.host}",
    )


def _after(results: _Results, n: int, t: float, what: str) -> float:
    return results.wait(results.count + n, t, PROGRESS_TIMEOUT_S, what)


def _kill(run: NetRun, leader: NetMaster, other: NetMaster, results: _Results, n: int) -> Dict:
    t0 = time.monotonic()
    leader.kill()
    t_lead = wait_leader(other.http, LEAD_TIMEOUT_S)
    first = _after(results, n, t_lead, "results after the kill")
    leader.start()
    return {"t0": t0, "t_lead": t_lead, "first": first, "old": _wait_standby_naming(leader, other)}


def _partition(run: NetRun, leader: NetMaster, other: NetMaster, results, n: int) -> Dict:
    before = len(_fence_lines(leader))
    t0 = time.monotonic()
    run.cluster.net.cut(leader.host)
    try:
        t_lead = wait_leader(other.http, LEAD_TIMEOUT_S)
        first = _after(results, n, t_lead, "results after the partition")
        # Cut off, it cannot learn of the takeover from anyone: its own clock fences it.
        why = _wait_fenced(leader, before)
    finally:
        run.cluster.net.restore(leader.host)
    old = _wait_standby_naming(leader, other)
    return {"t0": t0, "t_lead": t_lead, "first": first, "fenced": why, "old": old}


def _stop(run: NetRun, leader: NetMaster, other: NetMaster, results: _Results, n: int) -> Dict:
    before = len(_fence_lines(leader))
    t0 = time.monotonic()
    freeze(leader)
    try:
        t_lead = wait_leader(other.http, LEAD_TIMEOUT_S)
    finally:
        thaw(leader)
    first = _after(results, n, t_lead, "results after the freeze")
    why = _wait_fenced(leader, before)
    old = _wait_standby_naming(leader, other)
    return {"t0": t0, "t_lead": t_lead, "first": first, "fenced": why, "old": old}


def _pgrestart(run: NetRun, leader: NetMaster, other: NetMaster, results, n: int) -> Dict:
    before = len(_fence_lines(leader))
    t0 = time.monotonic()
    run.cluster.pg_stop()
    try:
        # Renewing nothing, the leader fences itself after 4/5 of the lease by its own clock.
        why = _wait_fenced(leader, before)
    finally:
        run.cluster.pg_resume()
    t_back = time.monotonic()
    now = run.leader()
    t_lead = time.monotonic()
    first = _after(results, n, t_back, "results after PostgreSQL came back")
    return {
        "t0": t0,
        "t_lead": t_lead,
        "first": first,
        "fenced": why,
        "pg_down_ms": _ms(t_back - t0),
        "new_leader": now.host,
        "old": _wait_standby_naming(run.other(now), now),
    }


def _standby(run: NetRun, leader: NetMaster, other: NetMaster, results, n: int) -> Dict:
    epoch = status(leader.http).get("epoch")
    t0 = time.monotonic()
    other.kill()
    first = _after(results, n, t0, "results after the standby's kill")
    other.start()
    back = _wait_standby_naming(other, leader)
    still = status(leader.http)
    kept = still.get("role") == "leader" and still.get("epoch") == epoch
    return {"t0": t0, "first": first, "old": back, "leader_kept_epoch": kept}


_RUN: Dict[str, Callable[..., Dict]] = {
    "kill": _kill,
    "partition": _partition,
    "stop": _stop,
    "pgrestart": _pgrestart,
    "standby": _standby,
}


def _has_result(path: Path) -> bool:
    try:
        return '"type": "result"' in path.read_text()
    except FileNotFoundError:
        return False


def _rejections(run: NetRun) -> int:
    """Submissions refused because the journal database was unreachable (``submit_error``
    events: not acknowledged, so not owed)."""
    n = 0
    for c in range(run.opts.clients):
        path = history_path(run.dir, c)
        for line in path.read_text().splitlines() if path.exists() else []:
            ev = json.loads(line)
            if ev["type"] == "submit_error" and "unreachable" in ev.get("error", ""):
                n += 1
    return n


def run_fault(cluster: NetCluster, directory: Path, opts: argparse.Namespace) -> Dict:
    """One run of ``opts.fault`` on a fresh database; returns the verdict and the facts."""
    run = cluster.start_run(directory, opts)
    try:
        results = _Results(directory, opts.clients)
        results.wait(opts.results_between, None, PROGRESS_TIMEOUT_S, "the first results")
        # Every client under way first: one still starting (its first connect) when the fault
        # comes would only meet it in its handshake, or find the stop file before it began.
        wait_for(
            lambda: all(_has_result(history_path(run.dir, c)) for c in range(opts.clients)),
            PROGRESS_TIMEOUT_S,
            "a result for every client",
        )
        leader = run.leader()
        other = run.other(leader)
        epoch = int(status(leader.http)["epoch"])
        facts = _RUN[opts.fault](run, leader, other, results, opts.results_between)
        run.finish(ACK_WAIT_S + DRAIN_S + 30)
    finally:
        run.close()
    logs = [m.log_text() for m in run.masters]
    t0, first, t_lead = facts.pop("t0"), facts.pop("first"), facts.pop("t_lead", None)
    return {
        "dir": str(directory),
        "fault": opts.fault,
        "old_leader": leader.host,
        "old_address": leader.address,
        "other_address": other.address,
        "old_epoch": epoch,
        "verdict": check_dir(directory).to_dict(),
        "failover_ms": _ms(first - t0),
        # Fault -> the other master seen leading (polled every 10 ms; None: no takeover).
        "takeover_ms": None if t_lead is None else _ms(t_lead - t0),
        "old_epoch_writes_accepted": run.old_epoch_writes_after(epoch),
        "refused_writes": sum(t.count("journal write refused") for t in logs),
        "rejected_submissions": _rejections(run),
        "journal_epochs": run.journal_epochs(),
        **facts,
    }


def _summary(runs: list, opts: argparse.Namespace) -> str:
    every = [r["failover_ms"] for r in runs]
    took = [r["takeover_ms"] for r in runs if r["takeover_ms"] is not None]
    v = [r["verdict"] for r in runs]
    what = "fault -> next result" if opts.fault == "standby" else "failover (fault -> first "
    what += "" if opts.fault == "standby" else "result from the new leader)"
    return (
        f"{sum(bool(x['valid']) for x in v)}/{len(runs)} runs valid ({opts.fault}, lease "
        f"{opts.lease_ms} ms); owed {sum(x['owed'] for x in v)}, lost "
        f"{sum(x['lost'] for x in v)}, duplicated {sum(x['duplicated'] for x in v)}, wrong "
        f"{sum(x['wrong'] for x in v)}, phantom {sum(x['phantom'] for x in v)}; journal rows "
        f"of an old epoch accepted after a newer one: "
        f"{sum(r['old_epoch_writes_accepted'] for r in runs)}; old-epoch writes refused (log "
        f"lines): {sum(r['refused_writes'] for r in runs)}; submissions refused (database "
        f"unreachable): {sum(r['rejected_submissions'] for r in runs)}; {what} p50 "
        f"{percentile(every, 50)} ms, p99 {percentile(every, 99)} ms, max {max(every)} ms"
        + (
            f"; takeover (fault -> {'a' if opts.fault == 'pgrestart' else 'the other'} master "
            f"leads) p50 {percentile(took, 50)} ms, "
            f"max {max(took)} ms"
            if took
            else ""
        )
    )


def add_netns_args(ap: argparse.ArgumentParser) -> None:
    """The options of ``rtpool bench ha netns``."""
    ap.add_argument("--fault", choices=FAULTS, required=True, help="the fault of every run")
    ap.add_argument("--runs", type=int, default=1, help="runs, each on a fresh database (1)")
    ap.add_argument("--clients", type=int, default=4, help="recording client processes (4)")
    ap.add_argument("--tasks", type=int, default=10, help="tasks per package (10)")
    ap.add_argument("--inflight", type=int, default=4, help="unfinished packages per client (4)")
    ap.add_argument("--results-between", type=int, default=200, help="results before/after (200)")
    ap.add_argument("--seconds", type=float, default=600.0, help="client budget (600 s)")
    ap.add_argument("--lease-ms", type=int, default=1000, help="the masters' --ha-lease-ms")
    ap.add_argument(
        "--peer-lease-ms",
        type=int,
        default=3000,
        help="the masters' --lease-ms (3000, the default): peers behind a cut cable find the "
        "silence after 3 of these plus a heartbeat, which sets a partition's failover time",
    )
    ap.add_argument("--dir", default=None, help="keep the histories and logs here")


def netns_main(args: argparse.Namespace) -> int:
    """Runs ``args.runs`` runs of ``args.fault``; prints each verdict and the summary."""
    from .netns import skip_reason

    for name in ("runs", "clients", "tasks", "inflight", "results_between"):
        if getattr(args, name) < 1:
            sys.exit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    why = skip_reason()
    if why is not None:
        sys.exit(f"rtpool bench ha netns: {why}")
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rtpool-ha-netns-"))
    runs = []
    cluster = NetCluster()
    try:
        for r in range(args.runs):
            out = run_fault(cluster, base / f"run{r}", args)
            runs.append(out)
            print(render(check_dir(base / f"run{r}"), f"run {r + 1} ({args.fault})"))
            facts = {k: v for k, v in out.items() if k not in ("verdict", "journal_epochs")}
            print(json.dumps(facts), flush=True)
    finally:
        cluster.close()
    print(_summary(runs, args))
    print(json.dumps({"machine": machine_info(), "failover_ms": [r["failover_ms"] for r in runs]}))
    ok = all(r["verdict"]["valid"] and r["old_epoch_writes_accepted"] == 0 for r in runs)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rtpool bench ha netns", description=__doc__)
    add_netns_args(ap)
    return netns_main(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
