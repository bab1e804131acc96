"""``rtpool bench chain``: one ``--quick`` run end to end (a subprocess), checking the JSON's
structure and the byte counts; speed is never asserted."""

import json
import subprocess
import sys


def test_quick_chain_runs_three_ways_and_keeps_intermediates_off_the_client():
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "chain", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["bench"] == "chain" and out["repetitions"] == 2
    ways = out["ways"]
    assert set(ways) == {"local", "kept", "relayed", "local_here"}
    # 1 MiB intermediates: relayed brings two of them to the client, kept none.
    assert ways["relayed"]["client_rx_bytes_max"] >= 2 << 20
    assert ways["kept"]["client_rx_bytes_max"] < 16 * 1024
    for way in ways.values():
        assert way["min_ms"] <= way["p50_ms"] <= way["max_ms"]


def test_bad_arguments_are_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "chain", "--size-mb", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--size-mb" in proc.stderr
