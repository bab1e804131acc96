"""Smoke tests of the open-loop benchmarks: ``rtpool bench latency --rate/--sweep``,
``rtpool bench deadline`` and ``rtpool bench hedge``, each with ``--quick``.

They run the real commands in subprocesses and check that the printed figures are complete and
consistent (every task sent counted once, percentiles in order, ratios matching their parts,
the plot written, the CPU hogs gone). They never assert on speed.
"""

import concurrent.futures
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rtpool_bench.openloop import (
    bucket_counts,
    format_text_histogram,
    histogram_of,
    log_edges_us,
    run_open_loop,
    schedule_ns,
    summarize,
    text_histogram,
)

ROOT = Path(__file__).resolve().parent.parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
ORDER = ("min_us", "p50_us", "p90_us", "p99_us", "p99_9_us", "p99_99_us", "max_us")


def run_json(args, timeout=110):
    """Run ``python -m rtpool bench <args> --json`` from the repository root; the JSON."""
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def assert_distribution(h, count):
    assert h["count"] == count, h
    values = [h[k] for k in ORDER]
    assert values == sorted(values) and values[0] >= 1, h


def assert_config_complete(row):
    assert row["sent"] > 0 and row["unsent"] == 0, row
    assert row["completed"] == row["sent"] and row["errors"] == {}, row
    assert_distribution(row["latency"], row["sent"])
    assert row["sender_lag"]["count"] == row["sent"]


def assert_plot(out, path):
    if HAS_MATPLOTLIB:
        assert out["plot"] == str(path) and out["plot_error"] is None
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    else:
        assert out["plot"] is None and "matplotlib" in out["plot_error"]
        assert not path.exists()


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- pieces, in process ----------------------------------------------------------------------


def test_schedules_are_open_loop_and_seeded():
    import random

    assert schedule_ns(4, 1000.0, "fixed", random.Random(1)) == [0, 1_000_000, 2_000_000, 3_000_000]
    a = schedule_ns(2000, 500.0, "poisson", random.Random(3))
    assert a == schedule_ns(2000, 500.0, "poisson", random.Random(3))
    assert a[0] == 0 and all(x <= y for x, y in zip(a, a[1:]))
    assert a[-1] / 1e9 == pytest.approx(2000 / 500, rel=0.15)  # mean gap 1 / rate


class FakeFuture(concurrent.futures.Future):
    """A future with ``timings``, as rtpool's: done ones took ``total_us`` from submit."""

    timings = None


def test_run_open_loop_measures_from_the_intended_time_and_counts_the_unanswered():
    futures = []

    def submit():
        fut = FakeFuture()
        futures.append(fut)
        if len(futures) % 3 == 0:  # every third never answers
            return fut
        fut.timings = {"total_us": 250.0}
        if len(futures) % 3 == 1:
            fut.set_result(len(futures))  # answered before its callback is added
        else:
            threading.Timer(0.01, fut.set_result, (len(futures),)).start()  # later
        return fut

    run = run_open_loop(
        submit,
        [0, 0, 0, 1_000_000, 1_000_000, 2_000_000],
        10,
        keep=lambda f: f.result(),
        timeout_s=2,
    )
    assert run.sent == 6 and len(run.outcomes) == 6
    answered = sorted((o for o in run.outcomes if o.error is None), key=lambda o: o.extra)
    assert [o.extra for o in answered] == [1, 2, 4, 5]
    for o in answered:
        assert o.latency_ns >= o.lag_ns + 250_000 and o.done_ns is not None
    lost = [o for o in run.outcomes if o.error is not None]
    assert [o.error for o in lost] == ["TimeoutError"] * 2
    assert all(o.latency_ns is None and o.done_ns is None for o in lost)
    assert run.last_send_ns >= run.first_send_ns


def test_text_histogram_counts_every_value_in_its_log_bucket():
    assert log_edges_us(120) == [10, 20, 50, 100, 200]
    h = histogram_of([15_000, 15_000, 120_000, 950_000, 3_000_000])  # ns: 15, 15, 120, 950, 3000 us
    assert bucket_counts(h, [10, 20, 50, 100, 200, 500, 1000, 2000, 5000]) == [
        0, 2, 0, 0, 1, 0, 1, 0, 1,
    ]  # fmt: skip
    s = summarize(h)
    assert s["count"] == 5 and s["min_us"] == 15 and 2990 <= s["max_us"] <= 3010
    hist = text_histogram({"a": h, "b": histogram_of([40_000])})
    assert hist["from_us"] == 10 and hist["edges_us"][0] == 20 and hist["edges_us"][-1] == 5000
    assert sum(hist["counts"]["a"]) == 5 and sum(hist["counts"]["b"]) == 1
    text = format_text_histogram(hist)
    assert text.splitlines()[-1].split()[-2:] == ["5", "1"]  # the totals row


# --- open-loop latency -----------------------------------------------------------------------


def test_latency_rate_quick_counts_every_task_and_plots(tmp_path):
    png = tmp_path / "lat.png"
    out = run_json(["latency", "--rate", "200", "--quick", "--plot", str(png)])["open_loop"]
    (row,) = out["configs"]
    # --quick: 1 s of schedule in blocks of 0.5 s, 100 tasks each at 200/s.
    assert row["label"] == "200/s" and row["blocks"] == 2 and row["sent"] == 200
    assert_config_complete(row)
    assert not row["loaded"] and row["hog_pids"] == [] and out["hogs"] == 0
    assert sum(out["histogram"]["counts"]["200/s"]) == 200
    assert "saturation" not in out and "bar" not in out
    assert_plot(out, png)


def test_latency_rate_background_load_quick(tmp_path):
    args = ["latency", "--rate", "200", "--quick", "--background-load", "--hogs", "3"]
    out = run_json([*args, "--hog-nice", "19", "--plot", str(tmp_path / "x.png")])["open_loop"]
    (row,) = out["configs"]
    assert row["label"] == "200/s loaded" and row["loaded"] and row["sent"] == 200
    assert_config_complete(row)
    assert out["hogs"] == 3 and out["hog_nice"] == 19 and out["mode"] == "loaded"
    assert len(row["hog_pids"]) == 3 * row["blocks"] == 6
    assert all(gone(pid) for pid in row["hog_pids"])


def test_latency_sweep_compare_load_quick(tmp_path):
    png = tmp_path / "sweep.png"
    args = ["latency", "--sweep", "--compare-load", "--levels", "10,50", "--quick"]
    args += ["--saturation-tasks", "600", "--hogs", "2", "--plot", str(png)]
    out = run_json(args, timeout=200)["open_loop"]
    sat = out["saturation"]
    assert len(sat["runs"]) == 3 and sat["tasks_per_s"] > 0
    assert sat["tasks_per_s"] == sorted(r["tasks_per_s"] for r in sat["runs"])[1]  # the median
    for s in (*sat["runs"], *out["saturation_after"]["runs"], *out["saturation_loaded"]["runs"]):
        assert s["tasks"] == 600 and s["errors"] == 0, s
    rows = {r["label"]: r for r in out["configs"]}
    assert list(rows) == ["10%", "10% loaded", "50%", "50% loaded"]
    for label, row in rows.items():
        assert_config_complete(row)
        pct = 10 if label.startswith("10") else 50
        assert row["rate_per_s"] == pytest.approx(sat["tasks_per_s"] * pct / 100, abs=0.1)
        assert row["loaded"] == label.endswith("loaded")
        assert len(row["hog_pids"]) == (2 * row["blocks"] if row["loaded"] else 0)
        assert all(gone(pid) for pid in row["hog_pids"])
        assert sum(out["histogram"]["counts"][label]) == row["sent"]
    assert set(out["ratios_to_lowest_level"]) == {"10%", "50%"}
    assert set(out["ratios_to_lowest_level"]["10%"].values()) == {1.0}
    for level in ("10%", "50%"):
        ratio = out["loaded_to_idle"][level]
        idle, loaded = rows[level]["latency"], rows[f"{level} loaded"]["latency"]
        assert ratio["p99_9"] == pytest.approx(loaded["p99_9_us"] / idle["p99_9_us"], abs=1e-3)
    bar = out["bar"]
    assert bar["idle_p99_9_us"] == rows["50%"]["latency"]["p99_9_us"]
    assert bar["loaded_p99_9_us"] == rows["50% loaded"]["latency"]["p99_9_us"]
    assert bar["ok"] == (bar["idle_p99_9_us"] <= 3000)
    assert_plot(out, png)


def test_latency_open_loop_needs_a_rate():
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "latency", "--compare-load"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "--rate R or --sweep" in proc.stderr


# --- deadline and hedge ----------------------------------------------------------------------


def test_deadline_quick_client_side_figures():
    out = run_json(["deadline", "--quick"])["deadline"]
    cap = out["capacity"]["tasks_per_s"]
    assert cap > 0 and out["offered_per_s"] == pytest.approx(0.8 * cap, abs=0.1)
    # --quick: at most 150 tasks and 2 s of schedule (offered_per_s is rounded: +-1 task).
    assert abs(out["requested"] - min(150, math.ceil(out["offered_per_s"] * 2.0))) <= 1
    assert out["sent"] == out["requested"] == out["completed"] and out["unsent"] == 0
    assert out["errors"] == {}
    assert_distribution(out["completion"], out["sent"])
    assert out["client_miss_ratio"] == pytest.approx(out["client_misses"] / out["sent"], abs=1e-5)
    # A task that ran over the budget by the client's clock is counted; none is if max is under.
    if out["completion"]["max_us"] <= 50_000 * 0.999:
        assert out["client_misses"] == 0
    # 10 ms of CPU time cannot take less than 10 ms of wall time.
    assert out["exec_ms"]["p50"] >= 9.9
    assert out["bar"]["client_ok"] == (out["client_miss_ratio"] <= 0.001)
    if not out["sdk"]["deadline_option"]:
        assert out["sdk_miss_ratio"] is None and out["bar"]["sdk_ok"] is None


def test_deadline_quick_uses_the_sdk_lateness():
    out = run_json(["deadline", "--quick"])["deadline"]
    assert out["sdk"]["deadline_option"], out["sdk"]
    assert 0 <= out["sdk_misses"] <= out["sent"]
    assert out["sdk_miss_ratio"] == pytest.approx(out["sdk_misses"] / out["sent"], abs=1e-5)
    stats = out["master_stats"]
    if "deadlines_met" in stats and "deadlines_missed" in stats:
        assert stats["deadlines_met"] + stats["deadlines_missed"] == out["sent"]
        assert stats["deadlines_missed"] == out["sdk_misses"]


def test_hedge_quick_one_worker_is_slow():
    out = run_json(["hedge", "--quick"], timeout=150)["hedge"]
    rows = out["configs"]
    assert {"all fast", "one slow"} <= set(rows)
    for row in rows.values():
        assert_config_complete(row)
        assert row["sent"] == rows["all fast"]["sent"]
    # Only the slow worker's environment slows tasks down, and only when asked to.
    assert rows["all fast"]["slow_tasks"] == 0
    assert 0 < rows["one slow"]["slow_tasks"] < rows["one slow"]["sent"]
    assert rows["one slow"]["exec_ms"]["max"] >= 10 * 5 * 0.99
    fast_p99 = rows["all fast"]["latency"]["p99_us"]
    assert out["slow_p99_ratio"] == pytest.approx(
        rows["one slow"]["latency"]["p99_us"] / fast_p99, abs=1e-3
    )
    if not out["sdk"]["hedge_option"]:
        assert "one slow + hedge" not in rows and out["hedge_p99_ratio"] is None


def test_hedge_quick_hedges_the_slow_worker():
    out = run_json(["hedge", "--quick"], timeout=150)["hedge"]
    assert out["sdk"]["hedge_option"], out["sdk"]
    row = out["configs"]["one slow + hedge"]
    assert_config_complete(row)
    fast_p99 = out["configs"]["all fast"]["latency"]["p99_us"]
    assert out["hedge_p99_ratio"] == pytest.approx(row["latency"]["p99_us"] / fast_p99, abs=1e-3)
    if "hedges" in row["master_stats"]:
        assert row["master_stats"]["hedges"] >= 1
    assert out["bar"]["ok"] == (out["hedge_p99_ratio"] <= 2.0)


def test_hedge_one_at_a_time_quick():
    out = run_json(["hedge", "--one-at-a-time", "4", "--quick"], timeout=150)["hedge"]
    assert out["tasks_per_config"] == 4 and out["task_ms"] == 20.0
    rows = out["configs"]
    assert list(rows) == ["all fast", "one slow", "one slow + hedge"]
    for row in rows.values():
        assert row["sent"] == row["completed"] == 4 and row["errors"] == {}
        assert_distribution(row["latency"], 4)
    fast_p99 = rows["all fast"]["latency"]["p99_us"]
    assert out["hedge_p99_ratio"] == pytest.approx(
        rows["one slow + hedge"]["latency"]["p99_us"] / fast_p99, abs=1e-3
    )
    assert out["bar"]["ok"] == (out["hedge_p99_ratio"] <= 2.0)
