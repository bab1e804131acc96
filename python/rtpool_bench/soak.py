"""``rtpool bench soak --minutes N``: a long mixed life with churn and faults.

A real ``rtpool master`` with its journal (own data dir, short result TTL), worker hosts
serving a named function, and clients: one that stays for the whole run (it re-attaches across
master restarts), others that connect, run a few rounds and leave, and some that leave without
acknowledging their results (their packages expire after the TTL). A round is a mix of
no-ops, 10 ms tasks (half with a deadline), 1 MiB results, a kept result read by another task,
a grid-RPC call and, now and then, a poison task. Meanwhile worker processes are SIGKILLed
(their worker restarts them), whole worker hosts are SIGKILLed and restarted, and the master
is killed and restarted on the same data dir and port every few minutes.

The master runs with ``--fsync always`` by default: the mode that promises that a master crash
loses nothing acknowledged (docs/reliability.md). Under ``batch`` (``--fsync batch``), a kill -9
may lose a package acknowledged in the instant before the journal's writer thread wrote its
record, as documented; its tasks then fail with ``ResultsLost`` and the check counts them wrong.

Every submitted task is in a :class:`~rtpool_bench.soak_verdict.Ledger`; at the end each owed
result must have come back once with its value. The master's RSS, descriptors and threads, the
journal's size, the master's table sizes and the workers' RSS are sampled (each minute, at
least 12 times a run); the series is printed with the flatness verdict of
:func:`~rtpool_bench.soak_verdict.verdict`. Every loop is bounded by the run's end; every
process started here is stopped here, by PID.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from . import soak_lib as lib
from .recovery import _Master
from .soak_procs import WorkerHosts, abandon, journal_bytes, open_fds, proc_status
from .soak_verdict import Ledger, verdict
from .stats import machine_info

#: The sampled series, in table order.
SERIES = (
    "master_rss_mb",
    "master_fds",
    "master_threads",
    "journal_mb",
    "packages",
    "tasks",
    "functions",
    "retained",
    "workers_rss_mb",
)
#: Longest wait for one round's results (a master restart and re-attachment fit well within).
RESULT_TIMEOUT_S = 120.0
BLOB_BYTES = 1 << 20


def plan(minutes: float, restart_every_s: float | None = None) -> Dict[str, float]:
    """The run's timing: sample period, and how often each fault comes, scaled to the run
    (``restart_every_s``: the master's restart period instead of the run's third within
    30..180 s; 0: never)."""
    total = minutes * 60
    if restart_every_s is None:
        restart_every_s = min(180.0, max(30.0, total / 3))
    return {
        "total_s": total,
        "sample_s": min(60.0, total / 12),
        "master_restart_s": restart_every_s,  # 0: never
        "worker_kill_s": min(30.0, max(8.0, total / 10)),
        "host_restart_s": min(90.0, max(20.0, total / 5)),
        "abandon_s": min(60.0, max(10.0, total / 8)),
        "poison_s": min(60.0, max(10.0, total / 10)),
        "round_pause_s": 0.1,
        # Short, so abandoned packages expire within the run, yet longer than a client's
        # reconnection to a restarted master (its backoff reaches 5 s; the master's start and
        # journal replay under load take a few more): 5 s lost a package now and then.
        "result_ttl_s": 15.0,
    }


def _normal(value: Any) -> Any:
    """A result in the ledger's terms: a blob as (tag, length), an error as ``!ErrorName``."""
    if isinstance(value, bytes):
        return ("blob", int.from_bytes(value[:8], "little"), len(value))
    return value


class Soak:
    """One run: its processes, clients, ledger and samples."""

    def __init__(
        self,
        minutes: float,
        workers: int,
        procs: int,
        seed: int,
        say: Callable,
        restart_every_s,
        fsync: str = "always",
    ):
        self.plan, self.say, self.fsync = plan(minutes, restart_every_s), say, fsync
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.samples: List[Dict[str, float]] = []
        self.events: Dict[str, int] = {
            "master_restarts": 0,
            "worker_kills": 0,
            "host_restarts": 0,
            "abandoned_clients": 0,
            "client_sessions": 0,
            "rounds": 0,
        }
        self._tag = 0
        self._tag_lock = threading.Lock()
        self._stop = threading.Event()
        self._tmp = tempfile.TemporaryDirectory(prefix="rtpool-soak-")
        base = Path(self._tmp.name)
        self.base, self.data_dir = base, base / "data"
        args = [
            "--result-ttl",
            str(self.plan["result_ttl_s"]),
            "--max-attempts",
            "4",
            "--http",
            "off",
            "--fsync",
            fsync,
        ]
        self.master = _Master(self.data_dir, base / "master.log", args)
        self.address = self.master.address
        self.hosts = WorkerHosts(self.address, self.master.worker_token, base, workers, procs)
        self._abandoners: List[Any] = []
        self._status_client = None

    def _tags(self, n: int) -> List[int]:
        with self._tag_lock:
            first, self._tag = self._tag, self._tag + n
        return list(range(first, first + n))

    # --- clients --------------------------------------------------------------------------

    def _connect(self, name: str):
        import rtpool

        while not self._stop.is_set():
            try:
                return rtpool.Client(
                    self.address, self.master.token, name=name, reconnect_timeout=RESULT_TIMEOUT_S
                )
            except Exception:  # noqa: BLE001 - the master may be restarting: try again
                time.sleep(0.2)
        return None

    def _round(self, client, with_poison: bool) -> None:
        """Submit one mixed round and wait for every owed result."""
        from rtpool.errors import UnknownFunctionError

        owed: List[tuple] = []

        def submit(kind: str, tag: int, expected: Any, make: Callable) -> None:
            try:
                fut = make()
            except Exception as exc:  # noqa: BLE001 - refused at once: nothing owed
                self.ledger.refused(f"{kind}: {type(exc).__name__}")
                return
            self.ledger.submitted(tag, kind, expected)
            owed.append((tag, fut))

        tags = self._tags(50)
        try:
            pkg = client.submit_many(lib.tagged, tags)
            for tag, fut in zip(tags, pkg):
                self.ledger.submitted(tag, "noop", tag)
                owed.append((tag, fut))
        except Exception as exc:  # noqa: BLE001
            self.ledger.refused(f"noop: {type(exc).__name__}")
        timed = client.options(deadline=2.0)
        for i, tag in enumerate(self._tags(10)):
            view = timed if i % 2 else client
            submit("sleep10ms", tag, tag, lambda t=tag, v=view: v.submit(lib.tagged_sleep, t, 10))
        for tag in self._tags(2):
            submit(
                "blob1MiB",
                tag,
                ("blob", tag, BLOB_BYTES),
                lambda t=tag: client.submit(lib.tagged_blob, t, BLOB_BYTES),
            )
        kept = client.options(keep=True)
        for tag in self._tags(2):
            submit(
                "kept",
                tag,
                1000 * tag,
                lambda t=tag: client.submit(lib.kept_sum, kept.submit(lib.kept_value, t)),
            )
        for tag in self._tags(3):
            submit("rpc", tag, tag + 1, lambda t=tag: client.call_async("soak_add", t, 1))
        if with_poison:
            (tag,) = self._tags(1)
            submit("poison", tag, "!PoisonTaskError", lambda t=tag: client.submit(lib.poison, t))
        end = time.monotonic() + RESULT_TIMEOUT_S
        for tag, fut in owed:
            try:
                value = _normal(fut.result(timeout=max(0.1, end - time.monotonic())))
            except TimeoutError:
                continue  # missing: the ledger reports it
            except UnknownFunctionError:
                self.ledger.refused_later(tag, "UnknownFunctionError")
                continue
            except Exception as exc:  # noqa: BLE001 - an error is a result too
                value = f"!{type(exc).__name__}"
            self.ledger.delivered(tag, value)
        self.events["rounds"] += 1

    def _steady(self) -> None:
        """The client that stays: a round, a short pause, again; a poison task now and then."""
        client = self._connect("soak-steady")
        self._status_client = client
        next_poison = time.monotonic() + self.plan["poison_s"]
        while client is not None and not self._stop.is_set():
            poison = time.monotonic() >= next_poison
            if poison:
                next_poison += self.plan["poison_s"]
            self._round(client, with_poison=poison)
            self._stop.wait(self.plan["round_pause_s"])

    def _churn(self, name: str) -> None:
        """Clients that come and go: connect, 1-3 rounds, leave."""
        rng = random.Random(name)
        while not self._stop.is_set():
            client = self._connect(name)
            if client is None:
                return
            self.events["client_sessions"] += 1
            for _ in range(rng.randint(1, 3)):
                if self._stop.is_set():
                    break
                self._round(client, with_poison=False)
                self._stop.wait(self.plan["round_pause_s"])
            client.close()

    # --- faults ---------------------------------------------------------------------------

    def _faults(self, start: float) -> None:
        p = self.plan
        due = {
            k: start + p[k] if p[k] else float("inf")
            for k in ("master_restart_s", "worker_kill_s", "host_restart_s", "abandon_s")
        }
        while not self._stop.wait(0.2):
            now = time.monotonic()
            if now >= due["worker_kill_s"]:
                due["worker_kill_s"] += p["worker_kill_s"]
                if self.hosts.kill_one_process(self.rng):
                    self.events["worker_kills"] += 1
            if now >= due["host_restart_s"]:
                due["host_restart_s"] += p["host_restart_s"]
                self.hosts.kill_and_restart_host(self.rng)
                self.events["host_restarts"] += 1
            if now >= due["abandon_s"]:
                due["abandon_s"] += p["abandon_s"]
                log = self.base / "abandon.log"
                self._abandoners.append(abandon(self.address, self.master.token, log, 8))
                self.events["abandoned_clients"] += 1
            if now >= due["master_restart_s"]:
                due["master_restart_s"] += p["master_restart_s"]
                self.master.kill()
                self.master.start(self.address)
                self.events["master_restarts"] += 1
                self.say(f"master restarted (pid {self.master.proc.pid})")
            for a in [a for a in self._abandoners if a.poll() is not None]:
                self._abandoners.remove(a)

    # --- samples --------------------------------------------------------------------------

    def sample(self, t: float) -> Dict[str, float]:
        pid = self.master.proc.pid
        st = proc_status(pid)
        row: Dict[str, Any] = {
            "t_s": round(t, 1),
            "master_pid": pid,
            "master_rss_mb": st.get("rss_mb"),
            "master_fds": open_fds(pid),
            "master_threads": st.get("threads"),
            "journal_mb": journal_bytes(self.data_dir) / 2**20,
            "workers_rss_mb": self.hosts.rss_mb(),
        }
        try:
            totals = self._status_client.status(timeout=5)["totals"]
            for k in (
                "packages",
                "tasks",
                "functions",
                "retained",
                "clients",
                "workers",
                "packages_expired",
                "poisoned",
            ):
                row[k] = totals.get(k)
        except Exception:  # noqa: BLE001 - restarting or not yet connected: a gap
            pass
        self.samples.append(row)
        return row

    def run(self) -> Dict[str, Any]:
        start = time.monotonic()
        threads = [threading.Thread(target=self._steady, name="soak-steady", daemon=True)]
        threads += [
            threading.Thread(target=self._churn, args=(f"soak-churn{i}",), daemon=True)
            for i in range(2)
        ]
        threads.append(threading.Thread(target=self._faults, args=(start,), daemon=True))
        for th in threads:
            th.start()
        end = start + self.plan["total_s"]
        next_sample = start + self.plan["sample_s"]
        while time.monotonic() < end:
            time.sleep(max(0.0, min(next_sample, end) - time.monotonic()))
            if time.monotonic() >= next_sample:
                next_sample += self.plan["sample_s"]
                row = self.sample(time.monotonic() - start)
                c = self.ledger.check()
                self.say(
                    f"{row['t_s']:6.0f} s: master {_fmt(row.get('master_rss_mb'))} MB, "
                    f"{row.get('master_fds')} fds, {row.get('master_threads')} threads, "
                    f"journal {_fmt(row['journal_mb'])} MB, tasks {row.get('tasks')}; "
                    f"{c['delivered']}/{c['owed']} results, {self.events}"
                )
        self._stop.set()
        for th in threads:  # each finishes its round: bounded by RESULT_TIMEOUT_S
            th.join(RESULT_TIMEOUT_S + 30)
        return {
            "plan": self.plan,
            "fsync": self.fsync,
            "events": self.events,
            "samples": self.samples,
            "ledger": self.ledger.check(),
            "verdict": verdict(self.samples, SERIES),
            "master_log_tail": self.master.log.read_text(errors="replace")[-1500:],
        }

    def close(self) -> None:
        from .recovery import _stop_group

        self._stop.set()
        for a in self._abandoners:
            _stop_group(a)
        self.hosts.stop()
        self.master.kill()
        self._tmp.cleanup()


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def run_soak(
    minutes: float,
    workers: int = 2,
    procs: int = 2,
    seed: int = 1,
    say: Callable = lambda s: None,
    restart_every_s: float | None = None,
    fsync: str = "always",
) -> Dict[str, Any]:
    """One soak run; returns the plan, events, samples, ledger check and verdict."""
    soak = Soak(minutes, workers, procs, seed, say, restart_every_s, fsync)
    try:
        out = soak.run()
    finally:
        soak.close()
    out["machine"] = machine_info()
    return out


def render(out: Dict[str, Any]) -> str:
    """The series as a table, then the ledger and the verdict, as text."""
    cols = ("t_s",) + SERIES
    lines = ["  ".join(f"{c:>14}" for c in cols)]
    for row in out["samples"]:
        lines.append("  ".join(f"{_fmt(row.get(c)):>14}" for c in cols))
    c = out["ledger"]
    lines.append(
        f"results: {c['owed']} owed ({c['per_kind']}), {c['delivered']} delivered; "
        f"missing {c['missing']}, wrong {c['wrong']}, twice {c['twice']}, "
        f"unknown {c['unknown']}; not owed (refused at submit): {c['not_owed']}"
    )
    lines.append(f"events: {out['events']} (master --fsync {out.get('fsync')})")
    lives: Dict[int, List[float]] = {}
    for row in out["samples"]:
        if row.get("master_rss_mb") is not None:
            lives.setdefault(row["master_pid"], []).append(row["master_rss_mb"])
    lines.append(
        "master RSS over each master's life (first -> last sample, MB): "
        + ", ".join(f"{v[0]:.1f} -> {v[-1]:.1f} ({len(v)})" for v in lives.values())
    )
    v = out["verdict"]
    lines.append(f"rule: {v['rule']}")
    for r in v["series"]:
        mark = {True: "flat", False: "GROWS", None: "n/a"}[r["flat"]]
        lines.append(f"  {r['series']:>16}: {mark:5}  {r['why']}")
    ok = c["ok"] and v["flat"] is not False
    series = {True: "flat", False: "not flat", None: "n/a"}[v["flat"]]
    results = "ok" if c["ok"] else "NOT ok"
    lines.append(f"verdict: {'PASS' if ok else 'FAIL'} (results {results}, series {series})")
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    """``rtpool bench soak``. Returns 0 when every owed result came once and right and every
    series is flat, 1 otherwise, 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="rtpool bench soak", description=__doc__.split("\n\n")[1])
    ap.add_argument("--minutes", type=float, default=15.0, help="length of the run (default 15)")
    ap.add_argument("--workers", type=int, default=2, help="worker hosts (default 2)")
    ap.add_argument("--procs", type=int, default=2, help="processes per worker host (default 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    ap.add_argument(
        "--restart-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="kill and restart the master this often (default: a third of the run, within "
        "30..180 s; 0: never, to see one master's whole life)",
    )
    ap.add_argument(
        "--fsync",
        default="always",
        metavar="POLICY",
        help="the master's --fsync policy (default always: nothing acknowledged may be lost; "
        "under batch a kill -9 may lose a package acknowledged just before it, as documented)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not 0.5 <= args.minutes <= 24 * 60 or min(args.workers, args.procs) < 1:
        ap.error("--minutes must be within 0.5..1440, --workers and --procs at least 1")
    if args.restart_every is not None and not args.restart_every >= 0:
        ap.error("--restart-every must be 0 (never) or a number of seconds")

    def say(text: str) -> None:
        print(f"soak: {text}", file=sys.stderr, flush=True)

    out = run_soak(
        args.minutes, args.workers, args.procs, args.seed, say, args.restart_every, args.fsync
    )
    print(json.dumps(out) if args.json else render(out))
    return 0 if out["ledger"]["ok"] and out["verdict"]["flat"] is not False else 1
