"""``rtpool bench deadline --background-load --quick``: the four configurations (normal and
real-time mode, idle and with CPU hogs) all measured, every task counted once, the hogs
gone. It never asserts on speed."""

import io
import os

import pytest
from rich.console import Console

from rtpool_bench.deadline_load import render
from test_bench_deadline import assert_distribution, run_json

CONFIGS = ("normal/idle", "normal/hogs", "realtime/idle", "realtime/hogs")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose; only the parent can reap it.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_deadline_background_load_quick_table():
    out = run_json(["deadline", "--background-load", "--quick"], timeout=170)["deadline_load"]
    cells = out["cells"]
    assert tuple(cells) == CONFIGS
    caps = out["capacity_idle"]
    # Each mode at 80 % of its own idle capacity (--rate-basis own, the default), and every
    # configuration of a mode offered that rate.
    assert out["rate_basis"] == "own"
    for mode in ("normal", "realtime"):
        rate = out["offered_per_s"][mode]
        assert rate == pytest.approx(0.8 * caps[mode]["tasks_per_s"], abs=0.1)
        for label in (f"{mode}/idle", f"{mode}/hogs"):
            assert cells[label]["rate_per_s"] == pytest.approx(rate, abs=0.1)
    assert out["realtime_capacity_cost"] == pytest.approx(
        caps["realtime"]["tasks_per_s"] / caps["normal"]["tasks_per_s"], abs=1e-3
    )
    hogs = out["hogs"]
    assert hogs >= 1
    for label, row in cells.items():
        assert row["sent"] > 0 and row["unsent"] == 0, (label, row)
        assert row["completed"] == row["sent"] and row["errors"] == {}, (label, row)
        assert_distribution(row["completion"], row["sent"])
        assert row["client_miss_ratio"] == pytest.approx(
            row["client_misses"] / row["sent"], abs=1e-5
        )
        assert row["loaded"] == label.endswith("/hogs")
        # One set of hogs per loaded block, none for an idle one.
        assert len(row["hog_pids"]) == (hogs * row["blocks"] if row["loaded"] else 0)
        for pid in row["hog_pids"]:
            assert not _alive(pid), f"hog {pid} of {label} still runs"
    # The histogram holds every task of every configuration once.
    for label, counts in out["histogram"]["counts"].items():
        assert sum(counts) == cells[label]["completed"]
    ratio = out["hogs_over_idle_p99_9"]["normal"]
    expected = (
        cells["normal/hogs"]["completion"]["p99_9_us"]
        / cells["normal/idle"]["completion"]["p99_9_us"]
    )
    assert ratio == pytest.approx(expected, abs=1e-3)
    # The throughput cost of real-time mode: A B B A, as many packages of each mode.
    cost = out["noop_throughput"]
    rates = cost["tasks_per_s"]
    assert len(rates["normal"]) == len(rates["realtime"]) == 2 and cost["order"] == "A B B A"
    assert all(r > 0 for m in rates.values() for r in m)
    med = cost["median_tasks_per_s"]
    assert cost["realtime_over_normal"] == pytest.approx(med["realtime"] / med["normal"], abs=1e-3)
    # The real-time cluster's client is real-time too, and the sender ran inside
    # realtime_thread() (the report's warnings say why if the OS refused).
    rt = out["realtime_report"]
    assert out["sender"] == "client.realtime_thread()"
    [client] = rt["clients"]
    assert client["threads"].keys() == {"reader", "heartbeat"}, client
    if os.geteuid() == 0:
        assert client["active"] is True and client["fifo_threads"] == 2, client

    # The text form: the four rows and the cyclictest-style histogram.
    text = io.StringIO()
    render(out, Console(file=text, width=200))
    for label in CONFIGS:
        assert label in text.getvalue()
    assert "# Histogram" in text.getvalue() and "# Total:" in text.getvalue()
    assert "Throughput cost of real-time mode" in text.getvalue()
