"""Master memory under one user's flood of empty tasks while another user's tasks run.

User "flood" sends ``--packages`` raw ``SUBMIT`` frames of ``--tasks`` empty tasks each (the
arguments of ``noop()``, a few bytes per task) over the wire protocol, as a hostile client
would: no futures, no client-side cost. User "bob" runs ``--bob-tasks`` short tasks through
the Python client on one worker at the same time. Prints (JSON with ``--json``) the master's
RSS before and after the flood, what was accepted and refused (with the master's message),
the RSS per accepted task, and whether bob's tasks all completed.

    PYTHONPATH=python python benches/user_bounds.py                      # 3 x 2,000,000
    PYTHONPATH=python python benches/user_bounds.py --tasks 500000 --packages 4
    PYTHONPATH=python python benches/user_bounds.py -- --max-queued-tasks-per-user 0

Arguments after ``--`` go to ``rtpool master``. Every wait is bounded (``--timeout``); the
master and worker it starts are stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import rtpool
from _master import listening_address
from rtpool import _native
from rtpool import _protocol as P
from rtpool._serialize import dumps_args, serialize_function


def noop() -> None:
    """An empty task."""


def sleep_ms(ms: float) -> float:
    """A short task of the other user."""
    time.sleep(ms / 1000)
    return ms


def _start_master(data_dir: Path, extra: list[str], timeout: float) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(data_dir), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    address, out = listening_address(proc, timeout)
    if address is not None:
        return proc, address
    proc.kill()
    raise SystemExit(f"master did not start: {out!r}")


def _flood(address: str, token: str, tasks: int, packages: int, timeout: float) -> tuple:
    """Sends the packages; returns one ``(req_id, "accepted" | code, message)`` per package,
    and the socket (kept open: closing it would start the packages' result TTL)."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(P.encode(P.HELLO, 1, "client", token, "flood", 0))
    reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
    fn_hash, code = serialize_function(noop)
    payloads = [dumps_args((), None)] * tasks
    answers = []
    for req in range(1, packages + 1):
        sock.sendall(P.encode_submit(req, fn_hash, code, {}, payloads))
    end = time.monotonic() + timeout
    while len(answers) < packages and time.monotonic() < end:
        msgs = reader.feed(sock.recv(1 << 16))
        for m in msgs:
            if m[0] == P.ACCEPTED:
                answers.append((m[1], "accepted", f"package {m[2]}"))
            elif m[0] == P.ERROR:
                answers.append((m[3], m[1], m[2]))
    return answers, sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2_000_000, help="tasks per flood package")
    parser.add_argument("--packages", type=int, default=3, help="flood packages")
    parser.add_argument("--bob-tasks", type=int, default=200, help="the other user's tasks")
    parser.add_argument("--timeout", type=float, default=600.0, help="budget of each wait, s")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("master_args", nargs="*", help="after --: options of rtpool master")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtpool-bounds-") as tmp:
        data_dir = Path(tmp) / "data"
        master, address = _start_master(data_dir, args.master_args, args.timeout)
        worker = None
        try:
            rss = lambda: psutil.Process(master.pid).memory_info().rss  # noqa: E731
            client_token = (data_dir / "client.token").read_text().strip()
            worker_token = (data_dir / "worker.token").read_text().strip()
            bob_token, _ = _native.token_create(str(data_dir), "bob", "client")
            env = {**os.environ, "RTPOOL_WORKER_TOKEN": worker_token}
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(__file__).parent), env.get("PYTHONPATH")) if p
            )
            worker = subprocess.Popen(
                [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", "1"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            with rtpool.Client(address, bob_token) as bob:
                assert bob.submit(sleep_ms, 0).result(args.timeout) == 0  # worker up
                rss_before = rss()
                theirs = bob.submit_many(sleep_ms, [5.0] * args.bob_tasks)
                t0 = time.monotonic()
                answers, flood = _flood(
                    address, client_token, args.tasks, args.packages, args.timeout
                )
                flood_s = time.monotonic() - t0
                rss_after = rss()
                values = theirs.results(timeout=args.timeout)
                bob_s = time.monotonic() - t0
                flood.close()
        finally:
            for proc in (worker, master):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    accepted = sum(1 for a in answers if a[1] == "accepted")
    result = {
        "tasks_per_package": args.tasks,
        "packages": args.packages,
        "accepted_packages": accepted,
        "answers": [{"req_id": r, "answer": a, "message": m} for r, a, m in answers],
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_after_mb": round(rss_after / 2**20, 1),
        "rss_growth_mb": round((rss_after - rss_before) / 2**20, 1),
        "bytes_per_accepted_task": round((rss_after - rss_before) / (accepted * args.tasks))
        if accepted
        else None,
        "flood_s": round(flood_s, 2),
        "other_user_completed": len(values) == args.bob_tasks,
        "other_user_s": round(bob_s, 2),
        "master_args": args.master_args,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.packages} SUBMITs of {args.tasks:,} empty tasks: {accepted} accepted; master RSS "
        f"{result['rss_before_mb']} -> {result['rss_after_mb']} MiB "
        f"(+{result['rss_growth_mb']} MiB, {result['bytes_per_accepted_task']} B per accepted "
        f"task); the other user's {args.bob_tasks} tasks completed: "
        f"{result['other_user_completed']} in {result['other_user_s']} s"
    )
    for r, a, m in answers:
        print(f"  SUBMIT {r}: {a}: {m}")


if __name__ == "__main__":
    main()
