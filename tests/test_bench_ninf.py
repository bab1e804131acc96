"""``rtpool bench ninf``: its statistics, verdicts, argument parsing and tables on made-up
figures (in process), and one ``--quick`` run of every section end to end (a subprocess),
which checks the structure and consistency of the JSON. Speed is never asserted."""

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rtpool.lib.linalg import EP_VERIFY, linpack_flops
from rtpool_bench.cpu import CpuMeter
from rtpool_bench.ninf import cli as ncli
from rtpool_bench.ninf import common, linpack
from rtpool_bench.ninf.multi import ep_chunks, ep_verify, summarize_cell
from rtpool_bench.stats import safe_ratio

ROOT = Path(__file__).resolve().parent.parent


# --- statistics and verdicts -----------------------------------------------------------------


def test_max_min_mean_skips_unknown_values():
    s = common.max_min_mean([3.0, None, 1.0, float("nan"), 2.0])
    assert (s["max"], s["min"], s["mean"], s["p50"], s["count"]) == (3.0, 1.0, 2.0, 2.0, 3)
    assert common.max_min_mean([])["count"] == 0 and common.max_min_mean([])["mean"] is None


def test_time_stats_gives_mflops_of_the_median_and_the_best():
    s = common.time_stats([0.2, 0.1, 0.4], flops=1e8)
    assert s["reps"] == 3 and s["median_s"] == 0.2 and s["max_s"] == 0.4
    assert s["mflops"] == pytest.approx(500.0) and s["best_mflops"] == pytest.approx(1000.0)
    assert common.time_stats([], 1e8)["mflops"] is None


def _row(n, local_s, remote_s, unblocked_s=None):
    flops = linpack_flops(n)
    row = {"n": n, "flops": flops, "bytes": 8 * n * n + 16 * n}
    for key, t in (("local", local_s), ("remote", remote_s), ("unblocked", unblocked_s)):
        row[key] = common.time_stats([t] if t else [], flops)
    row["remote_over_local"] = safe_ratio(row["remote"]["mflops"], row["local"]["mflops"])
    row["remote_over_unblocked"] = safe_ratio(row["remote"]["mflops"], row["unblocked"]["mflops"])
    return row


def test_within_from_needs_every_larger_n_within_10_percent():
    rows = [_row(100, 1, 3), _row(200, 1, 1.05), _row(400, 1, 1.2), _row(800, 1, 1.08)]
    assert linpack.within_from(rows) == 800  # 400 is out, so 200 does not count
    rows.append(_row(1000, 1, 1.5))
    assert linpack.within_from(rows) is None


def test_the_bar_reads_the_median_of_the_pairs():
    # A size's ratio is the median of its pairs' ratios (each pair: a local and a remote solve
    # back to back), not the ratio of the medians, which pairs up solves run under other loads.
    row = _row(2000, 1, 1.05)  # medians: within 10 %
    row["pairs"] = linpack.pair_stats([1 / 1.5, 1 / 1.5, 1.0])  # most pairs: 1.5x slower
    assert linpack.row_ratio(row) == pytest.approx(1 / 1.5, abs=1e-3)
    assert linpack.within_from([row]) is None
    row["pairs"] = linpack.pair_stats([0.95, 0.2, 4.0])
    assert linpack.row_ratio(row) == pytest.approx(0.95) and linpack.within_from([row]) == 2000
    assert linpack.row_ratio(_row(2000, 1, 1.05)) == pytest.approx(1 / 1.05, abs=1e-3)  # no pairs


def test_blas_match_compares_the_libraries_loaded_on_both_sides():
    one = {"libs": {"libopenblas.so": 1, "libscipy_openblas.so": 1}}
    assert linpack.blas_match(one, {"libs": {"libopenblas.so": 1}})
    assert not linpack.blas_match(one, {"libs": {"libopenblas.so": 2}})
    assert not linpack.blas_match({"libs": {}}, one)  # nothing known: not shown fair


def test_unblocked_crossover_and_its_edge_cases():
    rows = [_row(100, 1, 2, 1), _row(200, 1, 1, 2), _row(400, 1, 1, 3), _row(800, 1, 1, None)]
    x = linpack.unblocked_crossover(rows)
    assert x == {"n": 200, "below_smallest": False, "measured_up_to": 400}
    x = linpack.unblocked_crossover([_row(100, 1, 1, 5), _row(200, 1, 1, 5)])
    assert x["n"] == 100 and x["below_smallest"]
    assert linpack.unblocked_crossover([_row(100, 1, 9, 1)])["n"] is None


def test_projection_finds_where_a_fixed_transfer_rate_falls_under_10_percent():
    rate = 1e9  # local flops/s
    rows = []
    for n in (200, 400, 800):
        local = linpack_flops(n) / rate
        rows.append(_row(n, local, local + 0.001 + (8 * n * n + 16 * n) / 1e8))  # 100 MB/s
    p = linpack.project_within(rows)
    assert p["overhead_s"] == pytest.approx(0.001, rel=1e-3)
    assert p["overhead_mb_per_s"] == pytest.approx(100, rel=1e-3)
    n = p["n"]
    t = linpack_flops(n) / rate
    assert t / (t + 0.001 + (8 * n * n + 16 * n) / 1e8) >= 0.9
    m = n - 100
    t = linpack_flops(m) / rate
    assert t / (t + 0.001 + (8 * m * m + 16 * m) / 1e8) < 0.9


def test_reps_and_unblocked_skip_rule():
    assert (
        linpack._reps_for(800, 5) == 5
        and linpack._reps_for(1000, 5) == 3
        and linpack._reps_for(1600, 2) == 2
    )
    done = {400: [0.1], 800: [0.9, 1.0, 1.1], 1000: []}
    assert linpack._unblocked_allowed(1600, done, 10.0)  # 8 s
    assert not linpack._unblocked_allowed(1800, done, 10.0)  # 11.4 s


def test_the_system_has_the_solution_one_and_the_residual_sees_a_wrong_one():
    A, b = common.linpack_system(50, seed=1)
    x = np.linalg.solve(A, b)
    assert np.allclose(x, 1.0) and common.normalized_residual(A, b, x) < 10
    assert common.normalized_residual(A, b, x + 1e-3) > 1e6


# --- multi and ep ----------------------------------------------------------------------------


def _client_out(records, errors=None):
    return {
        "records": records,
        "errors": errors or {},
        "ticks": 10,
        "skipped_ticks": 1,
        "max_abs_error": 1e-12,
    }


def test_a_multi_cell_follows_the_definitions():
    n = 100
    t1 = {
        "queue_us": 1000,
        "worker_us": 8000,
        "exec_us": 5000,
        "wait_us": 500,
        "flush_us": 10,
        "total_us": 10000,
    }
    t2 = dict(t1, queue_us=3000, total_us=12000)
    outs = [
        _client_out([{"t": 0.0, "call_s": 0.010, "timings": t1}]),
        _client_out([{"t": 0.1, "call_s": 0.012, "timings": t2}], {"TaskFailed": 1}),
    ]
    cell = summarize_cell(n, 2, outs, cpu_pct=55.5, load1=1.5, wall_s=1.0)
    flops = linpack_flops(n)
    assert cell["times"] == 2 and cell["errors"] == {"TaskFailed": 1}
    assert cell["performance_mflops"]["max"] == pytest.approx(flops / 0.010 / 1e6)
    assert cell["performance_mflops"]["min"] == pytest.approx(flops / 0.012 / 1e6)
    # response: total - queue - worker (no ACCEPTED time in these timings)
    assert cell["response_kind"] == "client_side"
    assert cell["response_s"]["max"] == pytest.approx(0.001)
    assert cell["wait_s"]["max"] == pytest.approx(0.0035) and cell["wait_s"]["min"] == 0.0015
    moved = 8 * n * n + 16 * n
    assert cell["throughput_mb_s"]["max"] == pytest.approx(moved / 0.005 / 1e6)
    assert (cell["cpu_pct"], cell["load1"], cell["ticks"], cell["skipped_ticks"]) == (
        55.5,
        1.5,
        20,
        2,
    )


def test_response_uses_the_accepted_time_when_there_is_one():
    assert bn_response({"accepted_us": 250.0, "total_us": 9e9}) == pytest.approx(0.00025)
    assert bn_response({"total_us": 100.0, "queue_us": 60.0, "worker_us": 80.0}) == 0.0


def bn_response(t):
    from rtpool_bench.ninf.multi import response_s

    return response_s(t)


def test_ep_chunks_cover_the_pairs_once():
    chunks = ep_chunks(10, 3)
    assert sum(p for _, p in chunks) == 1024
    assert [s for s, _ in chunks] == [0, 341, 682]
    assert all(a[0] + a[1] == b[0] for a, b in zip(chunks, chunks[1:]))


def test_ep_verify():
    sx, sy = EP_VERIFY[24]
    assert ep_verify(24, sx * (1 + 1e-10), sy)["verified"]
    assert not ep_verify(24, sx * (1 + 1e-6), sy)["verified"]
    local = {"sx": 1.0, "sy": 2.0}
    assert ep_verify(12, 1.0, 2.0, local) == {
        "verified": True,
        "source": "ep_local",
        "rel_err": 0.0,
        "ref": [1.0, 2.0],
    }
    assert ep_verify(12, 1.0, 2.0)["verified"] is None


def test_cpu_meter_sees_a_busy_process():
    import time

    meter = CpuMeter([__import__("os").getpid()])
    end = time.thread_time() + 0.2
    while time.thread_time() < end:
        pass
    assert meter.percent() > 0


def test_cpu_meter_counts_less_than_a_clock_tick():
    # /proc's utime + stime (psutil) count 10 ms ticks: 3 ms of CPU would read 0 or 10 ms,
    # which made the multi table's CPU column 0.0 in short cells.
    code = (
        "import sys, time\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "end = time.process_time() + 0.003\n"
        "while time.process_time() < end:\n"
        "    pass\n"
        "print('spun', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "ready\n"  # started up: its start-up CPU is done
        meter = CpuMeter([proc.pid])
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "spun\n"
        used = meter.seconds()
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert 0.003 <= used < 0.008, used


# --- arguments and tables --------------------------------------------------------------------


def parse(*argv):
    ap = ncli.build_parser()
    args = ncli._settings(ap.parse_args(list(argv)))
    ncli._check_args(ap, args)
    return args


def test_quick_and_normal_defaults_and_explicit_options():
    a = parse()
    assert a.sizes == (100, 200, 400, 800, 1000, 1200, 1600) and a.clients == (1, 2, 4, 8, 16)
    assert a.multi_sizes == (600, 1000) and a.ep_m == 24 and a.bar_calls == 2000
    q = parse("--quick", "--clients", "3")
    assert q.sizes == (100, 200) and q.clients == [3] and q.repeats == 2
    assert parse("ep", "bars").sections == ["ep", "bars"]


@pytest.mark.parametrize(
    "argv",
    [["nosuch"], ["--probability", "0"], ["--clients", "0"], ["--ep-m", "2", "--ep-chunks", "8"]],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2


def fake_result():
    from rtpool_bench.ninf.bars import _bar

    rows = [_row(100, 0.001, 0.002, 0.01), _row(1000, 0.05, 0.054, None)]
    for r in rows:
        for m in ("local", "unblocked", "remote"):
            r[m]["max_resid"] = 1.0 if r[m]["reps"] else None
    t = {
        "queue_us": 10,
        "worker_us": 9000,
        "exec_us": 8000,
        "wait_us": 5,
        "flush_us": 1,
        "total_us": 9500,
    }
    cells = [
        summarize_cell(
            600,
            c,
            [_client_out([{"t": 0, "call_s": 0.01, "timings": t}])] * c,
            20.0 * c,
            0.5 * c,
            6.0,
        )
        for c in (1, 2)
    ]
    hist = {"p50_us": 500, "p90_us": 600, "p99_us": 900, "p99_9_us": 2000, "max_us": 3000}
    mm = common.max_min_mean
    return {
        "machine": {"usable_cpus": 2, "cpu_model": "test CPU", "python": "3"},
        "loadavg": {"before": [0.1, 0.2, 0.3], "after": [0.4, 0.5, 0.6]},
        "seconds": 1.0,
        "linpack": {
            "blas_threads": 1,
            "client_blas": {"libs": {"libopenblas.so": 1}},
            "worker_blas": {"libs": {"libopenblas.so": 1}},
            "rows": rows,
            "within_10pct_from_n": linpack.within_from(rows),
            "unblocked_crossover": linpack.unblocked_crossover(rows),
            "projection": linpack.project_within(rows),
        },
        "multi": {
            "workers": 2,
            "interval_s": 0.1,
            "probability": 0.5,
            "cell_seconds": 6,
            "cells": cells,
        },
        "ep": {
            "m": 24,
            "chunks": 16,
            "workers": 2,
            "local": [],
            "runs": [
                dict(
                    c=1,
                    seconds=1.0,
                    mops=33.5,
                    call_s=mm([0.1]),
                    exec_s=mm([0.09]),
                    sx=EP_VERIFY[24][0],
                    sy=EP_VERIFY[24][1],
                    **ep_verify(24, *EP_VERIFY[24]),
                )
            ],
        },
        "bars": {
            "workers": 2,
            "round_trips": {
                "count": 10,
                "block": 5,
                "dmmul_arg_bytes": 1024,
                "kinds": {"noop_task": hist, "noop_call": hist, "dmmul": hist},
            },
            "linpack_1000": {
                "source": "linpack section",
                "n": 1000,
                "local_mflops": 13000.0,
                "remote_mflops": 12000.0,
                "remote_over_local": 0.92,
            },
            "diamond": {
                "reps": 3,
                "ms": 50,
                "work": "sleep",
                "rtt_s": 0.0005,
                "makespan_s": mm([0.16]),
                "critical_s": mm([0.151]),
                "ratio": mm([1.05]),
                "exec_from_timings": True,
                "wrong_results": 0,
            },
            "bars": {
                "dmmul_over_task": _bar(1.0, 1.5, "<="),
                "linpack_remote_over_local": _bar(0.92, 0.9, ">="),
                "diamond_makespan_over_bound": _bar(1.2, 1.1, "<="),
            },
        },
        "problems": [],
    }


def test_tables_in_the_papers_layout():
    from rich.console import Console

    from rtpool_bench.ninf.render import mmm, render

    assert mmm({"max": 72.71, "min": 69.9, "mean": 71.16, "count": 3}) == "72.71/69.90/71.16"
    out = io.StringIO()
    render(fake_result(), Console(file=out, width=250, color_system=None))
    text = out.getvalue()
    for col in (
        "Performance[Mflops]",
        "Response[sec]",
        "Wait[sec]",
        "Throughput[MB/s]",
        "CPU",
        "Load",
        "Times",
    ):
        assert col in text
    assert "remote within 10% of local optimized" in text and "from n = 1000" in text
    assert "already at the smallest n (100)" in text
    assert (
        text.count("MET") == 3 and text.count("MISSED") == 1
    )  # 2 bars and the sweep met, 1 bar missed
    assert "yes (EP_VERIFY" in text


# --- end to end ------------------------------------------------------------------------------


def test_quick_run_of_every_section(tmp_path):
    path = tmp_path / "ninf.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "ninf", "--quick", "--json", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    r = json.loads(path.read_text())
    assert r["problems"] == [] and r["sections"] == list(ncli.SECTIONS)
    assert "Performance[Mflops]" in proc.stdout and "The bars" in proc.stdout

    lp = r["linpack"]
    assert [row["n"] for row in lp["rows"]] == [100, 200] and lp["blas_threads"] == 1
    for row in lp["rows"]:
        for m in ("local", "unblocked", "remote"):
            assert row[m]["reps"] == 2 and row[m]["mflops"] > 0 and row[m]["max_resid"] < 100
        assert row["remote_over_local"] > 0
        # one pair per repetition: a local and a remote solve back to back
        pairs = row["pairs"]
        assert len(pairs["ratios"]) == 2 and pairs["min"] <= pairs["p50"] <= pairs["max"]
    assert set(lp["worker_blas"]["libs"].values()) <= {1, None}
    assert lp["blas_match"] is True  # the worker and this process run the same BLAS threads

    cells = r["multi"]["cells"]
    assert [(c["n"], c["c"]) for c in cells] == [(200, 1), (200, 2)]
    for c in cells:
        assert c["times"] > 0 and c["errors"] == {}
        for key in ("performance_mflops", "response_s", "wait_s", "throughput_mb_s"):
            s = c[key]
            assert s["count"] == c["times"] and s["min"] <= s["mean"] <= s["max"], (key, s)
        assert c["performance_mflops"]["min"] > 0 and c["cpu_pct"] > 0
        assert c["machine_busy_pct"] is None or 0 < c["machine_busy_pct"] <= 100
        assert c["load1"] is None or c["load1"] >= 0

    ep = r["ep"]
    assert [(x["c"], x["remote"]) for x in ep["local"] + ep["runs"]] == [
        (1, False),
        (2, False),
        (1, True),
        (2, True),
    ]
    for x in ep["local"] + ep["runs"]:
        assert x["verified"] is True and x["source"] == "EP_VERIFY" and x["calls"] == ep["chunks"]
        assert x["mops"] > 0 and x["seconds"] > 0
        assert math.isclose(x["mops"], 2 ** (ep["m"] + 1) / x["seconds"] / 1e6, rel_tol=1e-9)

    b = r["bars"]
    kinds = b["round_trips"]["kinds"]
    assert b["round_trips"]["dmmul_arg_bytes"] == 1024
    for k in ("noop_task", "noop_call", "dmmul"):
        assert kinds[k]["count"] == b["round_trips"]["count"] > 0
        assert 0 < kinds[k]["p50_us"] <= kinds[k]["p99_us"] <= kinds[k]["max_us"]
    d = b["diamond"]
    assert d["reps"] == 3 and d["wrong_results"] == 0 and d["exec_from_timings"]
    assert d["critical_s"]["min"] >= 3 * d["ms"] / 1000 * 0.99
    assert d["makespan_s"]["min"] >= d["critical_s"]["min"] * 0.99
    for bar in b["bars"].values():
        assert bar["measured"] > 0 and bar["ok"] in (True, False)
    assert b["bars"]["dmmul_over_task"]["measured"] == pytest.approx(
        kinds["dmmul"]["p50_us"] / kinds["noop_task"]["p50_us"], abs=1e-3
    )
