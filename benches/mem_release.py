"""Does a master give memory back? Issue 29's scenario, with real processes: a raw-protocol
client submits 400 tasks of 512 KiB results (200 MiB, within the default 256 MiB
``--max-unacked-mb``), reads them all and never ACKs, then disconnects; the master's package
waits ``--result-ttl`` and is dropped. Prints the master's RSS (``VmRSS``) at start, at its
peak and after the release, with the bytes its status says results still hold.

    python3 benches/mem_release.py                         # the rtpool on this venv's path
    python3 benches/mem_release.py --python /work/main/python --rounds 2

``--python DIR`` puts DIR first on the master's and worker's ``PYTHONPATH`` (a tree with a
built ``rtpool/_native``), so two builds can be compared in one run.
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
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _master import listening_address  # noqa: E402

RESULT_BYTES = 512 * 1024


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid``, KiB, from ``/proc/PID/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def status(base: str) -> dict:
    with urllib.request.urlopen(base + "api/status", timeout=10) as r:
        return json.loads(r.read())


def run(python_dir: str | None, tasks: int, ttl_s: float, out: Path, trim_probe: bool) -> dict:
    """One round: start a master and a worker, run the scenario, return the RSS series."""
    env = dict(os.environ)
    if python_dir:
        env["PYTHONPATH"] = os.pathsep.join([python_dir, env.get("PYTHONPATH", "")])
    # The worker imports the task function from tests/tasks.py.
    tests_dir = str(Path(__file__).resolve().parent.parent / "tests")
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), tests_dir])
    data = out / "data"
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(data), "--http", "127.0.0.1:0", "--result-ttl", str(ttl_s)]
    master = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=open(out / "master.log", "wb")
    )
    worker = None
    try:
        address, printed = listening_address(master, 30)
        assert address, printed
        base = next(
            line.split()[-1]
            for line in printed.decode().splitlines()
            if line.startswith("dashboard on ")
        )
        env["RTPOOL_WORKER_TOKEN"] = (data / "worker.token").read_text().strip()
        worker = subprocess.Popen(
            [sys.executable, "-m", "rtpool", "worker", "--master", address, "--procs", "1"],
            env=env,
            stdout=open(out / "worker.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while status(base)["totals"].get("workers", 0) < 1:
            assert time.monotonic() < deadline, "no worker within 30 s"
            time.sleep(0.05)
        start = rss_kib(master.pid)
        peak = start
        sys.path[:0] = [python_dir or "", tests_dir]
        import tasks as test_tasks
        from rtpool import _protocol as P
        from rtpool._serialize import dumps_args, serialize_function

        token = (data / "client.token").read_text().strip()
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=60)
        sock.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "client", token, "no-ack", 0))
        reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
        fn_hash, code = serialize_function(test_tasks.apply)
        args = [dumps_args((bytes, RESULT_BYTES), None)] * tasks
        got = 0
        with sock:
            sock.sendall(P.encode_submit(1, fn_hash, code, {}, args))
            end = time.monotonic() + 120
            while got < tasks and time.monotonic() < end:
                data_in = sock.recv(1 << 20)
                if not data_in:
                    break
                for msg in reader.feed(data_in):
                    if msg[0] == P.RESULTS:
                        got += len(msg[2])
                peak = max(peak, rss_kib(master.pid))
            peak = max(peak, rss_kib(master.pid))
        # Disconnected without an ACK: the package waits the TTL, then is dropped.
        left = time.monotonic()
        end = left + ttl_s + 30
        while time.monotonic() < end:
            totals = status(base)["totals"]
            if totals.get("packages", 1) == 0 and time.monotonic() - left > ttl_s:
                break
            time.sleep(0.1)
        released_s = time.monotonic() - left
        # The master's next quiet moment (trim, decay) follows within a second or two.
        samples = []
        for _ in range(6):
            time.sleep(0.5)
            samples.append(rss_kib(master.pid))
        trimmed = None
        if trim_probe:
            # Diagnosis: what glibc's malloc_trim(0) gives back from the same process, i.e.
            # how much of what is left is free memory the allocator keeps, not live data.
            subprocess.run(
                ["gdb", "-p", str(master.pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
                capture_output=True,
                timeout=60,
            )
            trimmed = rss_kib(master.pid)
        totals = status(base)["totals"]
        return {
            "trimmed_kib": trimmed,
            "results": got,
            "start_kib": start,
            "peak_kib": peak,
            "released_s": released_s,
            "after_kib": samples,
            "result_bytes": totals.get("result_bytes"),
            "unacked_bytes": totals.get("unacked_bytes"),
        }
    finally:
        for proc in (worker, master):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=None, help="a tree with a built rtpool (PYTHONPATH)")
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--ttl", type=float, default=2.0, help="the master's --result-ttl, s")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--trim-probe",
        action="store_true",
        help="then call malloc_trim(0) in the master through gdb and print its RSS after",
    )
    opts = ap.parse_args()
    label = opts.python or "this venv's rtpool"
    for i in range(opts.rounds):
        with tempfile.TemporaryDirectory(prefix="rtpool-mem-") as tmp:
            r = run(opts.python, opts.tasks, opts.ttl, Path(tmp), opts.trim_probe)
        mb = lambda kib: f"{kib / 1024:.0f}"  # noqa: E731
        print(
            f"{label} round {i + 1}: {r['results']} results of {RESULT_BYTES // 1024} KiB; "
            f"RSS MB start {mb(r['start_kib'])}, peak {mb(r['peak_kib'])}, after release "
            f"({r['released_s']:.1f} s after the client left, then every 0.5 s) "
            f"{' '.join(mb(k) for k in r['after_kib'])}; status result_bytes "
            f"{r['result_bytes']} unacked_bytes {r['unacked_bytes']}"
            + (f"; after malloc_trim(0) {mb(r['trimmed_kib'])}" if r["trimmed_kib"] else "")
        )


if __name__ == "__main__":
    main()
