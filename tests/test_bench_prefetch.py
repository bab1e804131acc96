"""Smoke test of ``rtpool bench prefetch`` (issue 13) and of its delay relay: the command runs
its interleaved rounds and prints complete, consistent figures. It never asserts on speed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rtpool_bench.prefetch_relay import DelayRelay

ROOT = Path(__file__).resolve().parent.parent


def test_bench_prefetch_prints_a_row_per_round_trip():
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "prefetch", "--rtt-ms", "0,40"]
        + ["--tasks", "5", "--rounds", "2", "--task-ms", "5", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ideal_tasks_per_s"] == 200
    assert [(r["rtt_ms"], r["worker"]) for r in result["rows"]] == [(0, "this"), (40, "this")]
    for r in result["rows"]:
        assert 0 < r["of_ideal_min"] <= r["of_ideal_median"] <= r["of_ideal_max"]
        assert abs(r["tasks_per_s_median"] / 200 - r["of_ideal_median"]) < 1e-6
    # Interleaved rounds: 0, 40, then 40, 0.
    assert proc.stderr.index(" 0 ms added") < proc.stderr.index("40 ms added")


def test_delay_relay_delays_each_way_and_keeps_the_bytes_in_order():
    server = socket.create_server(("127.0.0.1", 0))
    relay = DelayRelay(server.getsockname(), rtt_ms=100)

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    host, port = relay.address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as c:
            payload = bytes(range(256)) * 400
            t0 = time.monotonic()
            c.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += c.recv(65536)
            elapsed = time.monotonic() - t0
        assert got == payload
        assert elapsed >= 0.1  # both ways delayed: at least the round trip added
    finally:
        relay.close()
        server.close()
