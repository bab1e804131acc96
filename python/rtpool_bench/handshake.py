"""``rtpool bench handshake``: a new client's time to connect under a handshake flood.

A master runs on a host of its own (a network namespace, :mod:`rtpool_bench.netns`), at its
default limits and with ``--handshake-timeout-ms`` from ``--timeouts``. A flooding host holds
``--flood`` connections that open and never send a byte (slowloris): each one the master
closes (handshake timeout, ``busy``) is opened again at once, paced at about ``--reopen-rate``
a second (the rate it reached is reported). Meanwhile new clients connect, one after the
other, from the flooding host and from another host: the time from ``rtpool.Client(...)`` to
its return (TCP, ``HELLO``, ``WELCOME``; a ``busy`` answer retried as the client does) is the
figure, with p50/p99/max; an attempt still refused after ``--give-up`` seconds counts as that
long and is counted apart. A round without the flood, from the other host, is the floor.

Needs root (network namespaces). Every process is stopped by PID, every namespace removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

from .netns import Network, skip_reason
from .stats import machine_info, percentile

#: The flooder, run on the flooding host: holds N silent connections, reopening closed ones.
_FLOOD = r"""
import os, selectors, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
n, rate, seconds = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
sel = selectors.DefaultSelector()
opened = closed = 0
def open_one():
    global opened
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((host, int(port)))
    sel.register(s, selectors.EVENT_READ)
    opened += 1
for _ in range(n):
    open_one()
end, tick, budget = time.monotonic() + seconds, time.monotonic(), 0.0
next_print = tick
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.05):
        sel.unregister(key.fileobj)
        key.fileobj.close()
        closed += 1
    now = time.monotonic()
    budget = min(budget + (now - tick) * rate, n)
    tick = now
    while len(sel.get_map()) < n and budget >= 1:
        open_one()
        budget -= 1
    if now >= next_print:
        next_print = now + 0.5
        print(f"held {len(sel.get_map())} opened {opened} closed {closed}", flush=True)
"""

#: The probe, run on a client host: connects ``count`` new clients one after the other.
_PROBE = r"""
import json, sys, time, rtpool, rtpool._dial as dial
from rtpool.errors import RtpoolError
addr, count = sys.argv[1], int(sys.argv[2])
seconds, give_up = float(sys.argv[3]), float(sys.argv[4])
dial.BUSY_TIMEOUT_S = give_up  # an attempt refused past this is counted as given up
out, end = {"ms": [], "gave_up": 0, "errors": []}, time.monotonic() + seconds
while len(out["ms"]) < count and time.monotonic() < end:
    t0 = time.perf_counter()
    try:
        rtpool.Client(addr, connect_timeout=give_up, reconnect_timeout=0).close()
    except RtpoolError as exc:
        out["gave_up"] += 1
        out["errors"].append(f"{type(exc).__name__}: {str(exc)[:120]}")
    out["ms"].append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
"""


def default_per_host_cap() -> int:
    """The master's default ``--max-unauthenticated-per-host`` on this machine (the master
    raises its open-file limit to the hard limit and derives its limits from it)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    max_conn = max(16, min(65536, (hard - 128) * 7 // 8))
    unauth = min(1024, max(16, max_conn // 8))
    return max(4, unauth // 4)


def _summary(ms: List[float]) -> Dict[str, Any]:
    return {
        "n": len(ms),
        **{k: percentile(ms, p) for k, p in (("p50_ms", 50), ("p99_ms", 99))},
        "max_ms": max(ms) if ms else None,
    }


class _Run:
    """One master on the network's ``master`` host, with its flood and probes."""

    def __init__(self, net: Network, base: Path, timeout_ms: int) -> None:
        self.net, self.base = net, base
        data = base / f"data-{timeout_ms}"
        cmd = [
            sys.executable,
            "-m",
            "rtpool",
            "master",
            "--listen",
            f"{net.ip['master']}:0",
            "--data-dir",
            str(data),
            "--http",
            "off",
            "--no-journal",
            "--handshake-timeout-ms",
            str(timeout_ms),
        ]
        self.log = base / f"master-{timeout_ms}.log"
        with open(self.log, "ab") as log:
            self.master = subprocess.Popen(
                net.run("master", cmd), stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL
            )
        out, end = b"", time.monotonic() + 60
        while time.monotonic() < end and not re.search(rb"listening on (\S+)", out):
            ready, _, _ = select.select([self.master.stdout], [], [], 1.0)
            out += os.read(self.master.stdout.fileno(), 4096) if ready else b""
        m = re.search(rb"listening on (\S+)", out)
        if not m:
            self.stop()
            raise RuntimeError(f"master did not start: {self.log.read_text()[-1500:]}")
        self.address = m.group(1).decode()
        self.token = (data / "client.token").read_text().strip()
        self.flood: subprocess.Popen | None = None
        self.flood_line = ""

    def start_flood(self, conns: int, rate: float, seconds: float) -> None:
        cmd = [sys.executable, "-c", _FLOOD, self.address, str(conns), str(rate), str(seconds)]
        self.flood = subprocess.Popen(
            self.net.run("flood", cmd), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        # Wait until the flood holds every connection it opened at first (bounded), then
        # keep reading its lines (a full pipe would stall it) and keep the last one.
        end = time.monotonic() + 30
        while time.monotonic() < end:
            line = self.flood.stdout.readline()
            if not line or int(line.split()[1]) >= conns:
                break
        threading.Thread(target=self._read_flood, daemon=True).start()

    def _read_flood(self) -> None:
        for line in self.flood.stdout:
            self.flood_line = line.strip()

    def flood_stats(self) -> Dict[str, int]:
        """The flood's last report: connections held, opened and closed so far."""
        words = self.flood_line.split()
        return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}

    def probe(self, hosts: List[str], count: int, seconds: float, give_up: float) -> Dict:
        env = {**os.environ, "RTPOOL_TOKEN": self.token}
        procs = {
            h: subprocess.Popen(
                self.net.run(
                    h,
                    [
                        sys.executable,
                        "-c",
                        _PROBE,
                        self.address,
                        str(count),
                        str(seconds),
                        str(give_up),
                    ],
                ),
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
            )
            for h in hosts
        }
        out = {}
        for h, p in procs.items():
            text, _ = p.communicate(timeout=seconds + give_up + 60)
            raw = json.loads(text.strip().splitlines()[-1])
            out[h] = {**_summary(raw["ms"]), "gave_up": raw["gave_up"], "errors": raw["errors"][:3]}
        return out

    def stop(self) -> None:
        for p in (self.flood, self.master):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


def bench(
    timeouts: List[int], flood: int, rate: float, count: int, seconds: float, give_up: float, say
) -> Dict[str, Any]:
    """Every configuration: the floor, then clients from both hosts under the flood."""
    net = Network(["flood", "other"])
    out: Dict[str, Any] = {
        "per_host_cap": default_per_host_cap(),
        "flood": flood,
        "reopen_rate": rate,
        "give_up_s": give_up,
        "configs": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="rtpool-handshake-") as tmp:
            for timeout_ms in timeouts:
                run = _Run(net, Path(tmp), timeout_ms)
                try:
                    say(f"handshake timeout {timeout_ms} ms: floor (no flood)")
                    floor = run.probe(["other"], count, seconds, give_up)["other"]
                    say(f"handshake timeout {timeout_ms} ms: {flood} silent connections")
                    run.start_flood(flood, rate, seconds + give_up + 30)
                    started = time.monotonic()
                    flooded = run.probe(["flood", "other"], count, seconds, give_up)
                    stats = run.flood_stats()
                    stats["reopened_per_s"] = round(
                        (stats.get("opened", 0) - flood) / (time.monotonic() - started)
                    )
                    say(f"flood: {stats}")
                finally:
                    run.stop()
                out["configs"].append(
                    {
                        "handshake_timeout_ms": timeout_ms,
                        "floor": floor,
                        "same_host": flooded["flood"],
                        "other_host": flooded["other"],
                        "flood": stats,
                    }
                )
    finally:
        net.close()
    return out


def render(out: Dict[str, Any]) -> str:
    lines = [
        f"flood: {out['flood']} silent connections from one host (per-host cap "
        f"{out['per_host_cap']}), paced at {out['reopen_rate']:g} reopens/s; "
        f"an attempt is given up after {out['give_up_s']:g} s"
    ]
    lines.append(
        f"{'handshake timeout':>18} {'client from':>16} {'n':>4} {'p50 ms':>9} "
        f"{'p99 ms':>9} {'max ms':>9} {'gave up':>8}"
    )
    for c in out["configs"]:
        for label, key in (
            ("(no flood)", "floor"),
            ("flooding host", "same_host"),
            ("other host", "other_host"),
        ):
            r = c[key]
            cells = [
                f"{r[k]:9.1f}" if r[k] is not None else f"{'-':>9}"
                for k in ("p50_ms", "p99_ms", "max_ms")
            ]
            lines.append(
                f"{c['handshake_timeout_ms']:>15} ms {label:>16} {r['n']:>4} "
                f"{' '.join(cells)} {r.get('gave_up', 0):>8}"
            )
        lines.append(f"{'':>18} flood: {c.get('flood')}")
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    """``rtpool bench handshake``. Returns 0 when it ran, 2 on bad arguments or no netns."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench handshake", description=__doc__.split("\n\n")[1]
    )
    ap.add_argument(
        "--timeouts",
        default="3000,1000",
        help="--handshake-timeout-ms values, comma-separated (default 3000,1000)",
    )
    ap.add_argument(
        "--flood",
        type=int,
        default=0,
        help="silent connections of the flood (default: 4 x the per-host cap)",
    )
    ap.add_argument(
        "--reopen-rate",
        type=float,
        default=2000.0,
        help="pace of the flood's reconnections, a second (default 2000; the rate "
        "reached is reported)",
    )
    ap.add_argument("--count", type=int, default=20, help="clients per host (default 20)")
    ap.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="time budget of each host's clients (default 60)",
    )
    ap.add_argument(
        "--give-up",
        type=float,
        default=30.0,
        help="seconds one connect may take before it is given up (default 30)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        timeouts = [int(t) for t in args.timeouts.split(",") if t.strip()]
    except ValueError:
        ap.error(f"cannot read --timeouts {args.timeouts!r}; use e.g. 3000,1000")
    if not timeouts or min(timeouts) < 1 or min(args.count, args.seconds, args.give_up) <= 0:
        ap.error("--timeouts, --count, --seconds and --give-up must be positive")
    why = skip_reason()
    if why:
        print(f"rtpool bench handshake: {why}", file=sys.stderr)
        return 2
    flood = args.flood or 4 * default_per_host_cap()

    def say(text: str) -> None:
        print(f"handshake: {text}", file=sys.stderr, flush=True)

    out = bench(timeouts, flood, args.reopen_rate, args.count, args.seconds, args.give_up, say)
    out["machine"] = machine_info()
    print(json.dumps(out) if args.json else render(out))
    return 0
