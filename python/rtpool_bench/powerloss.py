"""``rtpool bench powerloss``: what each ``--fsync`` mode loses when the power goes.

One cut: a real ``rtpool master`` runs with its data dir on :mod:`~rtpool_bench.powerfs` (a FUSE
layer that keeps what was not fsynced in a list it can throw away); a client submits packages
one after another at a steady pace, each acknowledged (``ACCEPTED``) before the next, for a
bounded time and count, with no worker connected so every package is still owed when the power
goes. Then the master is killed with ``kill -9`` and the layer drops every write and directory
change not fsynced: what a disk holds after a power loss. The master restarts on what is left
(same data dir and port), a worker connects, the client re-attaches, and each acknowledged
package either completes with its values or fails with ``ResultsLost`` (the restarted master
never heard of it): that one was lost.

Per cut it prints the acknowledged and lost counts, the age at the kill of the oldest lost
acknowledgement (for ``batch:MS``, docs/reliability.md bounds it by MS plus the write), and
whether the lost ones are the newest (a tail: nothing older than a kept package is lost). Every
loop is bounded by a count and a time budget; every process started here is stopped here, by
PID.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

import rtpool
from rtpool.errors import ResultsLost

from .powerfs import PowerFS, unavailable
from .recovery import _Master, _start_worker, _stop_group, _wait
from .stats import machine_info
from .tasks import echo

#: Longest wait for the results of the acknowledged packages after the restart.
RESULT_TIMEOUT_S = 60.0
#: The modes of a default run, in order.
DEFAULT_MODES = ("always", "batch", "batch:100", "off")


def window_ms(mode: str) -> float | None:
    """The sync window of a ``--fsync`` mode: 0 for ``always``, MS for ``batch:MS`` (10 for
    ``batch``), None for ``off`` (never synced by the master)."""
    if mode == "always":
        return 0.0
    if mode == "batch":
        return 10.0
    if mode.startswith("batch:"):
        return float(mode.split(":", 1)[1])
    if mode == "off":
        return None
    raise ValueError(f"unknown --fsync mode {mode!r}; use always, batch, batch:<ms> or off")


def _submit_paced(
    client: rtpool.Client,
    seconds: float,
    rate_per_s: float,
    max_packages: int,
    flag: Path | None = None,
) -> List[tuple]:
    """Submit one-task packages one after another, each acknowledged before the next, at
    ``rate_per_s`` (packages of one call of ``powerloss_wait`` when ``flag`` is given);
    returns ``(index, future, acknowledged_at)`` per package."""
    acked: List[tuple] = []
    start = time.monotonic()
    end = start + seconds
    for i in range(max_packages):
        now = time.monotonic()
        if now >= end:
            break
        due = start + i / rate_per_s
        if due > now:
            time.sleep(due - now)  # pacing, not a wait on a race
        if flag is None:
            pkg = client.submit_many(echo, [i])
            _ = pkg.id  # waits for ACCEPTED (raises if it never comes)
            fut = pkg.futures[0]
        else:  # a package of one call, running (or queued) until the flag file is removed
            fut = client.call_async("powerloss_wait", str(flag), i)
            client._conn.wait_accepted(fut._seg, 10.0)  # the package id: its ACCEPTED came
        acked.append((i, fut, time.monotonic()))
    return acked


def _outcome(acked: List[tuple], kill_at: float) -> Dict[str, object]:
    lost, wrong = [], 0
    end = time.monotonic() + RESULT_TIMEOUT_S
    for i, fut, acked_at in acked:
        try:
            value = fut.result(max(0.1, end - time.monotonic()))
        except ResultsLost:
            lost.append((i, acked_at))
            continue
        if value != i:
            wrong += 1
    kept = [i for i, _, _ in acked if i not in {j for j, _ in lost}]
    ages = [(kill_at - t) * 1000 for _, t in lost]
    return {
        "acknowledged": len(acked),
        "lost": len(lost),
        "wrong": wrong,
        "oldest_lost_age_ms": round(max(ages), 2) if ages else None,
        "newest_lost_age_ms": round(min(ages), 2) if ages else None,
        # Nothing older than a kept package was lost: the loss is the newest records only.
        "loss_is_a_tail": not lost or not kept or min(j for j, _ in lost) > max(kept),
    }


def run_cut(
    mode: str,
    workdir: Path,
    seconds: float = 1.5,
    rate_per_s: float = 400.0,
    max_packages: int = 2000,
    calls: bool = False,
) -> Dict[str, object]:
    """One power cut under ``--fsync mode`` in ``workdir`` (made, left for its logs); with
    ``calls``, the packages are grid-RPC calls still running on a worker at the cut (the
    worker serving them dies with the power) instead of tasks no worker has taken.

    Returns:
        ``mode``, ``window_ms``, ``acknowledged``, ``lost``, ``wrong`` (completed with another
        value), ``oldest_lost_age_ms`` / ``newest_lost_age_ms`` (kill time minus the lost
        packages' acknowledgement), ``loss_is_a_tail`` and the layer's ``powerfs`` counters.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    with PowerFS(workdir / "backing", workdir / "mnt", workdir / "powerfs.log") as fs:
        data = fs.mount / "data"
        data.mkdir(mode=0o700, exist_ok=True)
        fs.sync_dir(fs.mount)  # the data dir was made long ago: its entry is on disk
        args = ["--fsync", mode, "--http", "off"]
        master = _Master(data, workdir / "master.log", args)
        worker = client = None
        flag = workdir / "calls-wait" if calls else None
        serve = ["--serve", "rtpool_bench.soak_lib"] if calls else []
        try:
            client = rtpool.Client(master.address, master.token, name="powerloss")
            if flag is not None:
                flag.touch()
                worker = _start_worker(master, workdir / "worker0.log", serve)
                _wait(lambda: _serves(client), 60, "the worker serving powerloss_wait")
            acked = _submit_paced(client, seconds, rate_per_s, max_packages, flag)
            master.proc.kill()  # kill -9, and the power goes with it
            kill_at = time.monotonic()
            if worker is not None:  # the calls' worker goes down with it
                _stop_group(worker)
            master.kill()
            counters = fs.cut()
            if flag is not None:
                flag.unlink()  # the calls the restarted master runs again return at once
            master.start(master.address)
            worker = _start_worker(master, workdir / "worker.log", serve)
            result = _outcome(acked, kill_at)
        finally:
            if client is not None:
                client.close()
            if worker is not None:
                _stop_group(worker)
            master.kill()
    return {
        "mode": mode,
        "calls": calls,
        "window_ms": window_ms(mode),
        **result,
        "powerfs": counters,
    }


def _serves(client: rtpool.Client) -> bool:
    return any(f.name == "powerloss_wait" for f in client.functions())


def _line(cut: Dict[str, object]) -> str:
    return (
        f"{cut['mode']:>10}  lost {cut['lost']:>5} / {cut['acknowledged']:<5} acknowledged"
        f"  oldest lost {cut['oldest_lost_age_ms']} ms before the kill"
        f"  tail {cut['loss_is_a_tail']}  wrong {cut['wrong']}"
        f"  (dropped {cut['powerfs']['dropped_bytes']} bytes)"
    )


def main(argv: Sequence[str]) -> int:
    """``rtpool bench powerloss [--cuts N] [--modes always,batch,...] [--calls] [--json]``."""
    ap = argparse.ArgumentParser(prog="rtpool bench powerloss", description=__doc__.split("\n")[0])
    ap.add_argument("--cuts", type=int, default=3, help="power cuts per mode (default 3)")
    ap.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help=f"--fsync modes, comma-separated (default {','.join(DEFAULT_MODES)})",
    )
    ap.add_argument("--seconds", type=float, default=1.5, help="submission time per cut (1.5)")
    ap.add_argument("--rate", type=float, default=400.0, help="packages per second (400)")
    ap.add_argument(
        "--calls",
        action="store_true",
        help="packages of one grid-RPC call each, running on a worker at the cut",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end")
    opts = ap.parse_args(argv)
    if opts.cuts < 1 or opts.rate <= 0 or opts.seconds <= 0:
        ap.error("--cuts, --rate and --seconds must be positive")
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    for mode in modes:
        try:
            window_ms(mode)
        except ValueError as e:
            ap.error(str(e))
    why = unavailable()
    if why:
        print(f"rtpool bench powerloss: cannot run here: {why}", file=sys.stderr)
        return 2
    cuts: List[Dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="rtpool-powerloss-") as tmp:
        for n in range(opts.cuts):
            for mode in modes:
                workdir = Path(tmp) / f"{mode.replace(':', '-')}-{n}"
                cut = run_cut(mode, workdir, opts.seconds, opts.rate, calls=opts.calls)
                cuts.append(cut)
                if not opts.json:
                    print(_line(cut), flush=True)
    summary = _summary(modes, cuts)
    if opts.json:
        print(json.dumps({"machine": machine_info(), "cuts": cuts, "summary": summary}))
    else:
        for mode, s in summary.items():
            print(
                f"{mode:>10}  total lost {s['lost']} of {s['acknowledged']} acknowledged"
                f" over {s['cuts']} cuts; worst cut {s['worst_lost']}"
            )
    return 0


def _summary(modes: Sequence[str], cuts: List[Dict[str, object]]) -> Dict[str, Dict]:
    out = {}
    for mode in modes:
        mine = [c for c in cuts if c["mode"] == mode]
        out[mode] = {
            "cuts": len(mine),
            "acknowledged": sum(c["acknowledged"] for c in mine),
            "lost": sum(c["lost"] for c in mine),
            "worst_lost": max(c["lost"] for c in mine),
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
