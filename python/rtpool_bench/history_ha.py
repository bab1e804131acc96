"""``rtpool bench ha``: failover of masters in high-availability mode (``--ha``), judged by the
history checker, and the cost of committing to PostgreSQL.

``failover`` starts two ``rtpool master --ha URL`` processes on one PostgreSQL database (a
fresh database per run), a :class:`~rtpool_bench.leader_proxy.LeaderProxy` in front of them
(clients and workers are given its one address, as behind a Kubernetes Service that probes
``/leader``), real ``rtpool worker`` processes and recording clients
(:mod:`rtpool_bench.history`). While they submit, it kills the leader with SIGKILL (by PID)
``--kills`` times, each once ``--results-between`` new results have come, and restarts the
killed master as a standby; with ``--fault stop`` it SIGSTOPs the leader instead, until the
other leads, then SIGCONTs it at once (it must fence itself, closing its connections with
``not_leader``, and stand by; the journal writes the database refused are counted from the
logs). The failover time is from the fault to the first
result any client received after the other master answered ``/leader`` 200 (so surely from
the new leader). Then the clients drain and the checker judges their histories.

``netns`` runs the faults across hosts (network namespaces: PostgreSQL, the masters, the
workers and the clients each on a host of its own; :mod:`rtpool_bench.ha_netns_faults`).

``throughput`` measures, in one run, packages of 100 no-op tasks through a master with the
journal in PostgreSQL and through one with its local journal (default ``--fsync``, and
``always``), alternating rounds.

Every wait is bounded; every process started here is stopped here, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

from .ha_cluster import (
    LEAD_TIMEOUT_S,
    fresh_database,
    is_leader,
    start_pair,
    wait_leader,
    wait_standby,
)
from .ha_netns_faults import add_netns_args, netns_main
from .history_check import check_dir, render
from .history_ha_throughput import add_throughput_args, throughput_main
from .history_kill import PROGRESS_TIMEOUT_S, _client, _Results, stop_clients
from .leader_proxy import LeaderProxy
from .recovery import _start_worker_at, _stop_group
from .stats import machine_info, percentile


def run_failover(directory: Path, args: argparse.Namespace, say=lambda s: None) -> Dict:
    """One run: two HA masters, workers, clients, ``args.kills`` leader SIGKILLs, the verdict.

    Returns:
        ``{"verdict": {...}, "failover_ms": [...], "dir": ...}``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    url = fresh_database(args.pg, f"rtpool_ha_{os.getpid()}_{int(time.time() * 1e3) % 10**9}")
    stop = directory / "stop"
    a, b = start_pair(directory, url, args.lease_ms)
    masters = [a, b]
    proxy = LeaderProxy([(m.address, m.http) for m in masters])
    token = (a.data / "client.token").read_text().strip()
    wtoken = (a.data / "worker.token").read_text().strip()
    procs: List[subprocess.Popen] = []
    failover_ms: List[float] = []
    try:
        for w in range(args.workers):
            log = directory / f"worker{w}.log"
            procs.append(_start_worker_at(proxy.address, wtoken, log, ["--procs", "2"]))
        front = argparse.Namespace(address=proxy.address, token=token)
        procs += [
            _client(directory, c, front, args, stop, proxy.address) for c in range(args.clients)
        ]
        results = _Results(directory, args.clients)
        results.wait(args.results_between, None, PROGRESS_TIMEOUT_S, "the first results")
        results.wait_every_client(PROGRESS_TIMEOUT_S)
        with open(directory / "faults.jsonl", "a") as flog:
            for k in range(args.kills):
                leader = next(m for m in masters if is_leader(m.http))
                other = next(m for m in masters if m is not leader)
                t_kill = time.monotonic()
                if args.fault == "stop":
                    os.kill(leader.pid, signal.SIGSTOP)  # frozen past its lease
                else:
                    leader.kill()  # SIGKILL, by PID
                flog.write(json.dumps({"t": t_kill, "type": args.fault, "n": k}) + "\n")
                t_lead = wait_leader(other.http, LEAD_TIMEOUT_S)
                if args.fault == "stop":
                    # Resumed at once: its peers, still connected to it (a frozen master's
                    # TCP connections stay up), learn only from it that it lost the lease.
                    os.kill(leader.pid, signal.SIGCONT)
                first = results.wait(
                    results.count + args.results_between,
                    t_lead,
                    PROGRESS_TIMEOUT_S,
                    f"results after failover {k + 1}",
                )
                failover_ms.append(round((first - t_kill) * 1e3, 1))
                if args.fault == "stop":
                    wait_standby(leader.http, LEAD_TIMEOUT_S)  # it fenced itself
                else:
                    leader.restart()  # back as a standby
                flog.write(json.dumps({"t": time.monotonic(), "type": "restarted", "n": k}) + "\n")
                flog.flush()
                say(
                    f"{args.fault} {k + 1}/{args.kills}: first result {failover_ms[-1]} ms after it"
                )
        stop_clients(stop, procs[args.workers :])
    finally:
        for p in procs:
            _stop_group(p)
        proxy.close()
        for m in masters:
            m.kill()
    verdict = check_dir(directory)
    refused = sum(
        (directory / f"master-{n}.log").read_text(errors="replace").count("journal write refused")
        for n in ("a", "b")
    )
    return {
        "dir": str(directory),
        "verdict": verdict.to_dict(),
        "failover_ms": failover_ms,
        "refused_writes": refused,
    }


def _failover_main(args: argparse.Namespace) -> int:
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rtpool-ha-"))
    runs = []
    for r in range(args.runs):
        say(f"run {r + 1}/{args.runs}: {args.kills} leader kills, histories in {base / f'run{r}'}")
        runs.append(run_failover(base / f"run{r}", args, say))
        print(render(check_dir(base / f"run{r}"), f"run {r + 1}"))
    every = [x for run in runs for x in run["failover_ms"]]
    valid = sum(bool(run["verdict"]["valid"]) for run in runs)
    lost = sum(run["verdict"]["lost"] for run in runs)
    dup = sum(run["verdict"]["duplicated"] for run in runs)
    wrong = sum(run["verdict"]["wrong"] for run in runs)
    owed = sum(run["verdict"]["owed"] for run in runs)
    refused = sum(run["refused_writes"] for run in runs)
    what = "SIGKILLs" if args.fault == "kill" else "SIGSTOPs past the lease (then SIGCONT)"
    print(
        f"{valid}/{len(runs)} runs valid; {len(every)} leader {what} (lease {args.lease_ms} "
        f"ms); journal writes of an old epoch refused (log lines): {refused}; "
        f"owed {owed}, lost {lost}, duplicated {dup}, wrong {wrong}; failover (fault -> "
        f"first result from the new leader) p50 {percentile(every, 50)} ms, max "
        f"{max(every) if every else None} ms"
    )
    print(json.dumps({"machine": machine_info(), "failover_ms": every}))
    return 0 if valid == len(runs) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``rtpool bench ha failover|netns|throughput ...``."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench ha",
        description=(__doc__ or "").replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="verb", required=True)
    fo = sub.add_parser("failover", help="leader SIGKILL runs, each checked")
    fo.add_argument("--pg", required=True, help="a PostgreSQL server URL (a database is made)")
    fo.add_argument("--runs", type=int, default=1, help="runs, each on a fresh database (1)")
    fo.add_argument("--kills", type=int, default=10, help="leader SIGKILLs per run (10)")
    fo.add_argument("--clients", type=int, default=4, help="recording client processes (4)")
    fo.add_argument("--workers", type=int, default=2, help="rtpool worker processes (2)")
    fo.add_argument("--tasks", type=int, default=10, help="tasks per package (10)")
    fo.add_argument("--inflight", type=int, default=4, help="unfinished packages per client (4)")
    fo.add_argument("--results-between", type=int, default=200, help="results between kills")
    fo.add_argument("--seconds", type=float, default=600.0, help="client budget (600 s)")
    fo.add_argument("--lease-ms", type=int, default=1000, help="the masters' --ha-lease-ms")
    fo.add_argument(
        "--fault",
        choices=("kill", "stop"),
        default="kill",
        help="kill: SIGKILL the leader (then restart it); stop: SIGSTOP it until the standby "
        "leads, then SIGCONT (it must fence itself)",
    )
    fo.add_argument("--dir", default=None, help="keep the histories here")
    add_throughput_args(sub.add_parser("throughput", help="HA vs local journal, same run"))
    add_netns_args(sub.add_parser("netns", help="faults across hosts (network namespaces)"))
    args = ap.parse_args(argv)
    if args.verb == "throughput":
        return throughput_main(args)
    if args.verb == "netns":
        return netns_main(args)
    return _failover_main(args)


if __name__ == "__main__":
    sys.exit(main())
