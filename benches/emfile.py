"""The EMFILE case of issue 13: a master with an open-file limit of 1,024 and idle sockets past it.

Starts ``rtpool master`` (default settings unless arguments follow ``--``) with
``RLIMIT_NOFILE`` set as ``ulimit -n 1024`` does (soft and hard; ``--soft-only`` leaves the hard
limit as it is, which the master then raises its soft limit to), opens ``--idle`` TCP
connections that never send a byte, from ``--idle-per-address`` sockets per loopback address
(127.0.1.1 and on, so the per-address handshake budget is not what stops them), and holds them for
``--seconds``, reopening each one the master closes after ``--reopen-after`` s (0: never). A real
``rtpool.Client`` connects every ``--probe-every`` s meanwhile. Prints (JSON with ``--json``):
the master's open-file limits, its CPU over the window (% of one core), its log lines in the
window (all; ``accept failed``; ``refused a connection``; lines held back as the log says),
the idle connections opened and closed by the master, and each client probe's connect time or
error.

    python benches/emfile.py                      # ulimit -n 1024, default settings
    python benches/emfile.py --soft-only          # ulimit -Sn 1024 (hard limit above)
    python benches/emfile.py -- --max-connections 4096 --max-unauthenticated 2048 \\
        --max-unauthenticated-per-host 2048                  # limits past the descriptors: EMFILE

Needs an open-file limit above ``--idle`` for itself (it raises its own soft limit). Every loop
is bounded by ``--seconds``; the master is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

import rtpool
from _master import listening_address


def _start_master(
    data_dir: Path, log: Path, limits: tuple[int, int], extra: list[str]
) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(data_dir), *extra]

    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    with open(log, "wb") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
            preexec_fn=set_limit,
        )  # fmt: skip
    address, out = listening_address(proc, 30)
    if address is not None:
        return proc, address
    proc.kill()
    raise SystemExit(f"master did not start: {out!r} {log.read_text()[-2000:]}")


def _nofile(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return f"{soft}/{hard}"
    return "?"


class IdleSockets:
    """``count`` idle connections to ``addr``, reopened ``reopen_after`` s after the master
    closes one (0: never)."""

    def __init__(self, addr: tuple[str, int], count: int, per_address: int, reopen_after: float):
        self.addr, self.reopen_after = addr, reopen_after
        hosts = [i // per_address for i in range(count)]
        self.sources = [f"127.0.{1 + h // 250}.{1 + h % 250}" for h in hosts]
        self.socks: dict[int, socket.socket] = {}  # slot -> socket
        self.closed_at: dict[int, float] = {}
        self.opened = self.closed = self.failed = 0
        for slot in range(count):
            self._open(slot)

    def _open(self, slot: int) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.bind((self.sources[slot], 0))
        try:
            s.connect(self.addr)
        except BlockingIOError:
            pass
        except OSError:
            self.failed += 1
            s.close()
            self.closed_at[slot] = time.monotonic()
            return
        self.socks[slot] = s
        self.opened += 1

    def poll(self, timeout: float) -> None:
        """Notice the sockets the master closed; reopen the ones due."""
        by_fd = {s.fileno(): slot for slot, s in self.socks.items()}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        for fd, _ in poller.poll(timeout * 1000):
            slot = by_fd[fd]
            s = self.socks[slot]
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # closed by the master (or reset); an answer ("busy") is read past
                s.close()
                del self.socks[slot]
                self.closed += 1
                self.closed_at[slot] = time.monotonic()
        if self.reopen_after > 0:
            now = time.monotonic()
            for slot, at in list(self.closed_at.items()):
                if now - at >= self.reopen_after:
                    del self.closed_at[slot]
                    self._open(slot)

    def close(self) -> None:
        for s in self.socks.values():
            s.close()


def _probe(address: str, token: str, results: list, stop: threading.Event, every: float) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            rtpool.Client(address, token, connect_timeout=5, reconnect_timeout=0).close()
            results.append({"connect_s": round(time.monotonic() - started, 3)})
        except Exception as exc:  # what a user would see: recorded, the loop goes on
            results.append({"error": f"{type(exc).__name__}: {exc}"[:200]})
        stop.wait(every)


def _log_counts(text: str) -> dict:
    lines = text.splitlines()
    held = sum(int(n) for n in re.findall(r"\((\d+) more lines? like it held back", text))
    return {
        "lines": len(lines),
        "bytes": len(text.encode()),
        "accept_failed": sum("accept failed" in line for line in lines),
        "refused": sum("refused a connection" in line for line in lines),
        "evicted": sum("silent in its handshake" in line for line in lines),
        "held_back": held,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=1024, help="the master's open-file limit")
    ap.add_argument("--soft-only", action="store_true", help="set only the soft limit")
    ap.add_argument("--idle", type=int, default=1100, help="idle connections to hold")
    ap.add_argument("--idle-per-address", type=int, default=4)
    ap.add_argument("--reopen-after", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--probe-every", type=float, default=2.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("master_args", nargs="*", help="after --: arguments of rtpool master")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < args.idle + 256:
        raise SystemExit(f"this process's hard open-file limit ({hard}) is below --idle + 256")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limits = (args.limit, hard if args.soft_only else args.limit)

    with tempfile.TemporaryDirectory(prefix="rtpool-emfile-") as tmp:
        data, log = Path(tmp) / "data", Path(tmp) / "master.log"
        proc, address = _start_master(data, log, limits, args.master_args)
        try:
            token = (data / "client.token").read_text().strip()
            host, _, port = address.rpartition(":")
            master = psutil.Process(proc.pid)
            log_start = log.stat().st_size
            cpu0, t0 = sum(master.cpu_times()[:2]), time.monotonic()
            idle = IdleSockets((host, int(port)), args.idle, args.idle_per_address,
                               args.reopen_after)  # fmt: skip
            probes: list = []
            stop = threading.Event()
            prober = threading.Thread(
                target=_probe, args=(address, token, probes, stop, args.probe_every)
            )
            prober.start()
            end = t0 + args.seconds
            while time.monotonic() < end:
                idle.poll(min(0.1, max(0.0, end - time.monotonic())))
            cpu = sum(master.cpu_times()[:2]) - cpu0
            window = time.monotonic() - t0
            stop.set()
            prober.join(30)
            idle.close()
            with open(log, "rb") as f:
                f.seek(log_start)
                text = f.read().decode(errors="replace")
            out = {
                "limits_asked": f"{limits[0]}/{limits[1]}",
                "master_nofile": _nofile(proc.pid),
                "master_args": args.master_args,
                "window_s": round(window, 2),
                "master_cpu_s": round(cpu, 3),
                "master_cpu_pct": round(100 * cpu / window, 2),
                "log": _log_counts(text),
                "idle_opened": idle.opened,
                "idle_closed_by_master": idle.closed,
                "idle_connect_failed": idle.failed,
                "probes": probes,
                "master_log_sample": [ln for ln in text.splitlines() if "held back" in ln][:3],
            }
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    if args.json:
        print(json.dumps(out))
        return
    for key, value in out.items():
        print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
