"""``rtpool bench asyncio`` at a small size: it runs to the end, counts what it says, and the
figures it prints are those of the run (not asserted for speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_asyncio_small_run_reports_threads_and_both_latencies():
    pytest.importorskip("rich")
    cmd = [sys.executable, "-m", "rtpool", "bench", "asyncio", "--json"]
    cmd += ["--tasks", "300", "--count", "20", "--rounds", "2", "--warmup", "5", "--workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    many = out["many"]
    assert many["tasks"] == 300 and many["done"] == 300
    # 300 pending futures, no thread for any of them.
    assert many["threads_pending"]["python"] == many["threads_before"]["python"]
    for mode in ("await", "result"):
        summary = out["latency"][mode]
        assert summary["n"] == 40
        assert 0 < summary["p50_us"] <= summary["p99_us"] <= summary["max_us"]
    assert set(out["latency"]["ratio_await_to_result"]) == {
        "p50_us",
        "p99_us",
        "p99_9_us",
        "max_us",
    }


def test_bench_asyncio_refuses_bad_counts():
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "asyncio", "--tasks", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--tasks, --count, --rounds and --workers must be at least 1" in proc.stderr
