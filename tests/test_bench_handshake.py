"""``rtpool bench handshake``: new clients under a slowloris flood, on network namespaces
(root; CI runs it). A short run: every client from another host gets in (the per-host cap
keeps the flood to its own share), and the figures have the shape the docs quote. Times are
printed, never asserted; the figures are in docs/security.md."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rtpool_bench.netns import skip_reason

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.mark.timeout(300)
def test_handshake_bench_connects_every_client_from_another_host_during_the_flood():
    args = ["--timeouts", "1000", "--count", "5", "--seconds", "20", "--give-up", "10", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "handshake", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["flood"] == 4 * out["per_host_cap"]
    (config,) = out["configs"]
    assert config["handshake_timeout_ms"] == 1000
    print(f"handshake bench: {json.dumps(config)}")
    for key in ("floor", "other_host"):
        r = config[key]
        assert r["n"] == 5 and r["gave_up"] == 0, (key, r)
        assert r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    # The flooding host's clients were measured too (they may wait, or give up).
    assert config["same_host"]["n"] >= 1


def test_handshake_bench_refuses_bad_timeouts():
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "handshake", "--timeouts", "3000,x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2 and "cannot read --timeouts" in proc.stderr
