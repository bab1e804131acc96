"""``rtpool bench history``: the history checker's real-fault runs against one master with a
journal, and the checker itself (``rtpool bench history check DIR``).

``run`` starts, per run, an ``rtpool master --data-dir`` (its default ``--fsync`` unless
``--fsync`` says otherwise), ``--workers`` real ``rtpool worker`` processes and ``--clients``
recording clients (:mod:`rtpool_bench.history`, separate processes that live across the
faults). While they submit, it kills the master with SIGKILL (by PID) ``--kills`` times, each
time once ``--results-between`` new results have come since the last restart, and restarts it
on the same data dir and port; workers and clients reconnect by themselves. Then the clients
stop submitting, drain, and the checker (:mod:`rtpool_bench.history_check`) judges the
histories. Per run it prints the verdict and the restart time of each kill: from the SIGKILL
to the first result any client received from the restarted master.

``--failover`` restarts the master on a second port instead, alternating (the same data dir):
workers and clients are given both addresses (``127.0.0.1:P1,127.0.0.1:P2``) and must find
the master on the other one, as they find the new leader after an HA takeover (the journal
carries over, the new master has a new ``instance``).

The fault driver writes its own events (``kill``, ``listening``) to ``DIR/faults.jsonl`` with
the same monotonic clock as the clients. Every wait is bounded in count and time; every
process started here is stopped here, by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

from .history import ACK_WAIT_S, DRAIN_S, history_path
from .history_check import check_dir, render
from .recovery import _Master, _start_worker_at, _stop_group
from .stats import machine_info, percentile

#: How long the driver waits for the next ``--results-between`` results (or the first result
#: after a restart) before it calls the run stuck.
PROGRESS_TIMEOUT_S = 60.0


class _Results:
    """Follows the clients' history files: how many results so far, and when they came."""

    def __init__(self, directory: Path, clients: int) -> None:
        self.paths = [history_path(directory, c) for c in range(clients)]
        self.offsets = [0] * clients
        self.count = 0
        self.per_client = [0] * clients
        self.times: List[float] = []  # of the results read by the last poll()

    def poll(self) -> int:
        self.times = []
        for k, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[k])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits for next time
            self.offsets[k] += len(whole)
            for line in whole.splitlines():
                ev = json.loads(line)
                if ev["type"] == "result":
                    self.count += 1
                    self.per_client[k] += 1
                    self.times.append(ev["t"])
        return self.count

    def wait_every_client(self, timeout: float) -> None:
        """Until every client has a result: one still starting when the first fault comes
        would meet it in its first connect (a new ``Client`` does not retry a refused one)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll()
            if all(self.per_client):
                return
            time.sleep(0.005)
        raise TimeoutError(f"timed out after {timeout:g} s waiting for a result from every client")

    def wait(self, at_least: int, after_t: float | None, timeout: float, what: str) -> float:
        """Until ``at_least`` results (and one stamped after ``after_t``); returns the first
        result time after ``after_t`` (or now)."""
        end, first = time.monotonic() + timeout, None
        while time.monotonic() < end:
            self.poll()
            if after_t is not None and first is None:
                later = [t for t in self.times if t > after_t]
                first = min(later) if later else None
            if self.count >= at_least and (after_t is None or first is not None):
                return first if first is not None else time.monotonic()
            time.sleep(0.005)
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def _free_port() -> int:
    """A port nothing listens on now (for the master's second address)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _client(
    directory: Path, c: int, m: _Master, args: argparse.Namespace, stop: Path, address: str
):
    cmd = [sys.executable, "-m", "rtpool_bench.history", "client", "--dir", str(directory)]
    cmd += ["--client", str(c), "--address", address, "--tasks", str(args.tasks)]
    cmd += ["--inflight", str(args.inflight), "--seconds", str(args.seconds)]
    cmd += ["--stop", str(stop)]
    env = {**os.environ, "RTPOOL_TOKEN": m.token}
    with open(directory / f"client-{c}.log", "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )


def stop_clients(stop: Path, clients: List[subprocess.Popen]) -> None:
    """Tells the recording clients to stop and waits for each (bounded): they drain
    (DRAIN_S) after waiting at most ACK_WAIT_S for a last ACCEPTED. One that does not end in
    time lacks the end event in its history, which the checker reports."""
    stop.touch()
    for p in clients:
        try:
            p.wait(ACK_WAIT_S + DRAIN_S + 30)
        except subprocess.TimeoutExpired:
            pass


def run_once(directory: Path, args: argparse.Namespace, say=lambda s: None) -> Dict[str, object]:
    """One run: master, workers, clients, ``args.kills`` SIGKILLs and restarts, the verdict.

    Returns:
        ``{"verdict": {...}, "restart_ms": [...], "dir": ...}``.

    Raises:
        TimeoutError: No progress within ``PROGRESS_TIMEOUT_S`` (the processes are stopped).
    """
    directory.mkdir(parents=True, exist_ok=True)
    faults = directory / "faults.jsonl"
    stop = directory / "stop"
    extra = [] if args.fsync is None else ["--fsync", args.fsync]
    m = _Master(directory / "data", directory / "master.log", extra)
    ports = [int(m.address.rsplit(":", 1)[1])]
    if getattr(args, "failover", False):
        ports.append(_free_port())
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs: List[subprocess.Popen] = []
    restart_ms: List[float] = []
    try:
        for w in range(args.workers):
            log = directory / f"worker{w}.log"
            procs.append(_start_worker_at(addresses, m.worker_token, log, ["--procs", "2"]))
        procs += [_client(directory, c, m, args, stop, addresses) for c in range(args.clients)]
        results = _Results(directory, args.clients)
        results.wait(args.results_between, None, PROGRESS_TIMEOUT_S, "the first results")
        results.wait_every_client(PROGRESS_TIMEOUT_S)
        with open(faults, "a") as flog:
            for k in range(args.kills):
                t_kill = time.monotonic()
                m.kill()  # SIGKILL, by PID (Popen.kill)
                flog.write(json.dumps({"t": t_kill, "type": "kill", "n": k}) + "\n")
                m.start(f"127.0.0.1:{ports[(k + 1) % len(ports)]}")
                t_up = time.monotonic()
                flog.write(json.dumps({"t": t_up, "type": "listening", "n": k}) + "\n")
                flog.flush()
                first = results.wait(
                    results.count + args.results_between,
                    t_up,
                    PROGRESS_TIMEOUT_S,
                    f"results after restart {k + 1}",
                )
                restart_ms.append(round((first - t_kill) * 1e3, 1))
                say(f"kill {k + 1}/{args.kills}: first result {restart_ms[-1]} ms after SIGKILL")
        stop_clients(stop, procs[args.workers :])
    finally:
        for p in procs:
            _stop_group(p)
        m.kill()
    verdict = check_dir(directory)
    return {
        "dir": str(directory),
        "verdict": verdict.to_dict(),
        "restart_ms": restart_ms,
        "lost_ack_to_kill_ms": lost_ack_to_kill_ms(directory, verdict.lost_packages),
    }


def lost_ack_to_kill_ms(directory: Path, lost_packages: List[list]) -> List[float]:
    """For each lost package, the time from its ``ack`` to the nearest kill (positive: the
    kill came after the ack), in ms: what the ``--fsync batch`` window explains."""
    with open(directory / "faults.jsonl", encoding="utf-8") as f:
        kills = [json.loads(x)["t"] for x in f if '"kill"' in x]
    acks: Dict[tuple, float] = {}
    for c in {c for c, _ in lost_packages}:
        with open(history_path(directory, c), encoding="utf-8") as f:
            for line in f:
                ev = json.loads(line)
                if ev["type"] == "ack":
                    acks[(c, ev["p"])] = ev["t"]
    out = []
    for c, p in lost_packages:
        t = acks[(c, p)]
        out.append(round(min((k - t for k in kills), key=abs) * 1e3, 2))
    return out


def summarize(runs: List[Dict[str, object]]) -> Dict[str, object]:
    """Totals over the runs and the restart time p50/max over every kill."""
    every = [x for r in runs for x in r["restart_ms"]]
    total = {k: sum(r["verdict"][k] for r in runs) for k in ("owed", "lost", "duplicated")}
    total.update({k: sum(r["verdict"][k] for r in runs) for k in ("wrong", "phantom")})
    return {
        "runs": len(runs),
        "kills": len(every),
        "valid_runs": sum(bool(r["verdict"]["valid"]) for r in runs),
        **total,
        "restart_p50_ms": percentile(every, 50),
        "restart_max_ms": max(every) if every else None,
    }


def _run_main(args: argparse.Namespace) -> int:
    say = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rtpool-history-"))
    runs = []
    for r in range(args.runs):
        say(f"run {r + 1}/{args.runs}: {args.kills} kills, histories in {base / f'run{r}'}")
        runs.append(run_once(base / f"run{r}", args, say))
        if not args.json:
            print(render(check_dir(base / f"run{r}"), f"run {r + 1}"))
            ms = runs[-1]["restart_ms"]
            print(
                f"  restart (SIGKILL -> first result) p50 {percentile(ms, 50)} ms, "
                f"max {max(ms)} ms: {ms}"
            )
            if runs[-1]["lost_ack_to_kill_ms"]:
                print(f"  lost packages, ack -> kill ms: {runs[-1]['lost_ack_to_kill_ms']}")
    out = {"machine": machine_info(), "fsync": args.fsync or "default", "runs": runs}
    out["summary"] = summarize(runs)
    if args.json:
        print(json.dumps(out))
    else:
        s = out["summary"]
        print(
            f"{s['valid_runs']}/{s['runs']} runs valid; {s['kills']} kills; owed {s['owed']}, "
            f"lost {s['lost']}, duplicated {s['duplicated']}, wrong {s['wrong']}, "
            f"phantom {s['phantom']}; restart p50 {s['restart_p50_ms']} ms, "
            f"max {s['restart_max_ms']} ms"
        )
    if not args.dir and out["summary"]["valid_runs"] == len(runs):
        shutil.rmtree(base, ignore_errors=True)  # kept when a run failed, to be read
    return 0 if out["summary"]["valid_runs"] == len(runs) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``rtpool bench history run|check ...``: 0 when every run (or the checked one) is valid."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench history",
        description=(__doc__ or "").replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="verb", required=True)
    ck = sub.add_parser("check", help="check the histories of a directory")
    ck.add_argument("dir", help="a directory of client-*.jsonl histories")
    ck.add_argument("--json", action="store_true", help="print the verdict as JSON")
    rn = sub.add_parser("run", help="kill -9 runs against one master, each checked")
    rn.add_argument("--runs", type=int, default=3, help="runs, each a fresh master (3)")
    rn.add_argument("--kills", type=int, default=5, help="SIGKILLs of the master per run (5)")
    rn.add_argument("--clients", type=int, default=4, help="recording client processes (4)")
    rn.add_argument("--workers", type=int, default=2, help="rtpool worker processes (2)")
    rn.add_argument("--tasks", type=int, default=10, help="tasks per package (10)")
    rn.add_argument("--inflight", type=int, default=4, help="unfinished packages per client (4)")
    rn.add_argument("--results-between", type=int, default=200, help="results between kills (200)")
    rn.add_argument("--seconds", type=float, default=300.0, help="client budget (300 s)")
    rn.add_argument("--fsync", default=None, help="the master's --fsync (default: its own)")
    rn.add_argument("--dir", default=None, help="keep the histories here (default: a temp dir)")
    rn.add_argument(
        "--failover",
        action="store_true",
        help="restart each time on the other of two ports (clients and workers get both)",
    )
    rn.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.verb == "check":
        from . import history_check

        return history_check.main([args.dir] + (["--json"] if args.json else []))
    for name in ("runs", "kills", "clients", "workers", "results_between"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return _run_main(args)


if __name__ == "__main__":
    sys.exit(main())
