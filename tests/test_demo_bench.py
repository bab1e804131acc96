"""Smoke tests of `rtpool demo`, `rtpool bench` and the examples.

They run the real commands in subprocesses on small sizes and check that the printed figures
are complete, consistent and correct (every factor right, percentiles in order). They never
assert on speed: the bars are read off the printed figures (docs/benchmarks.md).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rtpool_bench.demo import is_prime, semiprimes, smallest_factor
from rtpool_bench.floor import EchoPeer, make_frame

ROOT = Path(__file__).resolve().parent.parent


def run(args, timeout=100):
    """Run ``python <args>`` from the repository root; return the completed process."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_json(args, timeout=100):
    """Run ``python -m rtpool <args> --json`` and return the parsed JSON object."""
    proc = run(["-m", "rtpool", *args, "--json"], timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def assert_ordered_percentiles(h):
    assert h["count"] > 0
    assert 0 < h["min_us"] <= h["p50_us"] <= h["p90_us"] <= h["p99_us"], h
    assert h["p99_us"] <= h["p99_9_us"] <= h["max_us"], h


def test_semiprimes_are_seeded_and_smallest_factor_is_p():
    pairs = semiprimes(30, seed=7)
    assert pairs == semiprimes(30, seed=7)
    assert pairs != semiprimes(30, seed=8)
    for p, q in pairs:
        assert p < q and is_prime(p) and is_prime(q)
    p, q = pairs[0]
    assert smallest_factor(p * q) == p
    assert [smallest_factor(n) for n in (2, 9, 91, 97)] == [2, 3, 7, 97]
    assert [n for n in range(60) if is_prime(n)] == [
        2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59,
    ]  # fmt: skip
    assert not is_prime(3215031751)  # a strong pseudoprime to bases 2, 3, 5, 7


def test_floor_echoes_and_stops_its_child():
    with EchoPeer() as peer:
        pid = peer.pid
        for size in (1, 128, 70_000):
            assert peer.roundtrip_ns(make_frame(size)) > 0
    assert peer.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_demo_json_has_every_field_and_correct_results():
    out = run_json(["demo", "--tasks", "20", "--workers", "2", "--seed", "3", "--rounds", "2"])
    for key in (
        "machine",
        "sequential_s",
        "ceiling_s",
        "rtpool_makespan_s",
        "ceiling_speedup",
        "speedup",
        "efficiency",
        "makespan_over_ceiling",
        "makespan_over_ceiling_best",
        "mean_task_ms",
        "start_to_first_result_s",
        "shutdown_s",
        "results_verified",
        "timings_us",
        "local_exec_us",
        "bars",
    ):
        assert key in out, key
    assert out["workers"] == 2 and out["tasks"] == 20 and out["seed"] == 3
    assert len(out["per_round"]) == 2
    ratios = sorted(r["makespan_over_ceiling"] for r in out["per_round"])
    assert out["makespan_over_ceiling"] == ratios[0]  # the lower median of two rounds
    for key in ("sequential_s", "ceiling_s", "rtpool_makespan_s"):
        assert out[key] == min(r[key] for r in out["per_round"]), key
    assert out["results_verified"] is True and out["mismatches"] == 0
    assert out["semiprimes"] == [p * q for p, q in semiprimes(20, seed=3)]
    for n, f in zip(out["semiprimes"], out["rtpool_factors"]):
        assert smallest_factor(n) == f and 1 < f < n
    for key in ("sequential_s", "ceiling_s", "rtpool_makespan_s", "start_to_first_result_s"):
        assert out[key] > 0, key
    assert out["speedup"] == pytest.approx(out["sequential_s"] / out["rtpool_makespan_s"], 0.01)
    assert out["missing_timing_keys"] == []
    assert 0 < out["package_serialize_us"] <= out["submit_many_us"]
    assert out["client_master_cpu_s"] > 0
    for name in ("serialize_us", "queue_us", "exec_us", "total_us", "transfer_to_worker_us"):
        s = out["timings_us"][name]
        assert s["p50"] is not None and 0 <= s["p50"] <= s["p90"] <= s["max"], (name, s)
    # A task cannot take less time end to end than it ran.
    assert out["timings_us"]["total_us"]["max"] >= out["timings_us"]["exec_us"]["max"]
    assert set(out["bars"]) >= {"makespan_ok", "startup_ok"}


def test_bench_latency_json_percentiles_in_order():
    out = run_json(["bench", "latency", "--count", "200", "--warmup", "20", "--block", "50"])
    lat = out["latency"]
    assert lat["count"] == 200 and lat["blocks"] == 4
    assert lat["rtpool"]["count"] == 200 and lat["floor"]["count"] == 200
    assert_ordered_percentiles(lat["rtpool"])
    assert_ordered_percentiles(lat["floor"])
    # Issue 25's 2-hop floor (client -> asyncio relay -> echo worker), interleaved alike.
    assert lat["aio_relay"]["count"] == 200 and lat["relay_chain"]["count"] == 200
    assert_ordered_percentiles(lat["aio_relay"])
    assert lat["p50_ratio_to_aio_relay"] == pytest.approx(
        lat["rtpool"]["p50_us"] / lat["aio_relay"]["p50_us"], abs=0.001
    )
    assert lat["p50_ratio"] == pytest.approx(
        lat["rtpool"]["p50_us"] / lat["floor"]["p50_us"], abs=0.001
    )
    b = lat["breakdown_us"]
    assert b["total_us"]["p50"] > 0 and b["worker_us"]["p50"] >= b["exec_us"]["p50"]
    assert b["master_worker_hops_us"]["p50"] > 0
    assert "throughput" not in out and "payload" not in out


def test_bench_throughput_json_counts_every_task():
    out = run_json(["bench", "throughput", "--tasks", "2000", "--runs", "2"])
    tp = out["throughput"]
    assert len(tp["runs"]) == 2
    for r in tp["runs"]:
        assert r["finished"] == 2000 and not r["timed_out"]
        assert r["tasks_per_s"] == pytest.approx(2000 / r["seconds"], rel=0.01)
    assert tp["best_tasks_per_s"] >= tp["median_tasks_per_s"] > 0


def test_bench_payload_json_echoes_are_correct():
    out = run_json(["bench", "payload", "--sizes", "1K,64K", "--payload-reps", "5"])
    rows = out["payload"]["sizes"]
    assert [r["size_bytes"] for r in rows] == [1024, 65536]
    for r in rows:
        assert r["wrong_echoes"] == 0
        sides = [*r["variants"].values(), *r["floors"].values()]
        if "numpy/shm" in r["variants"]:  # a task making a new array, beside the echo
            assert "numpy-new/shm" in r["variants"]
        assert {"bytes/tcp", "numpy/tcp"} <= set(r["variants"]) and set(r["floors"]) == {
            "pool",
            "relay",
            "tcp",
            "memcpy",
        }
        for s in sides:
            assert s["count"] == 5 and 0 < s["p50_us"] <= s["p99_us"] <= s["max_us"], s
        # The bar: rtpool's best default path against the minimal pool and the relay, as the
        # ratio of their p50s (consistency only, never a speed assertion).
        best = r["variants"][r["best_default"]]
        assert r["best_default"].split("/")[0] in ("bytes", "numpy")
        for peer, key in (("pool", "vs_pool"), ("relay", "vs_relay")):
            expected = r["floors"][peer]["p50_us"] / best["p50_us"]
            assert abs(r[key] - expected) <= 0.001 * expected + 0.001, (peer, r)


def test_bench_payload_table_prints_the_comparators():
    # A wide console: rich would wrap the headers at the default 80 columns.
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "bench", "payload", "--sizes", "4K,128K"]
        + ["--payload-reps", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for text in ("floor: pool", "floor: relay", "rtpool best default", "/ pool", "/ relay"):
        assert text in out, out
    assert "4 KiB" in out and "128 KiB" in out, out


@pytest.mark.parametrize("cmd", ["demo", "bench"])
def test_help(cmd):
    proc = run(["-m", "rtpool", cmd, "--help"], timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert f"rtpool {cmd}" in proc.stdout and "--json" in proc.stdout


def test_import_rtpool_loads_no_benchmark_dependency():
    # In a fresh interpreter: rich and hdrhistogram are the bench extra, rtpool_bench is only
    # for `rtpool bench`/`rtpool demo`; the SDK, the worker and the CLI's parsers need none.
    code = (
        "import sys, contextlib, io\n"
        "import rtpool, rtpool.cli, rtpool.worker\n"
        "for argv in (['master', '--help'], ['worker', '--help'], ['token', '--help']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        rtpool.cli.main(argv)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'hdrh', 'rtpool_bench'}))\n"
    )
    proc = run(["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # `master --help` is printed by the Rust side straight to fd 1, past redirect_stdout.
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-2000:]


@pytest.mark.parametrize(
    "args, extra",
    [(["bench", "all"], "bench"), (["demo"], "bench"), (["bench", "ninf"], "linalg")],
)
def test_bench_and_demo_say_what_to_install_without_their_extras(args, extra):
    # A None entry in sys.modules makes a module look absent (find_spec None, import fails).
    hide = ["rich", "hdrh"] if extra == "bench" else ["numpy", "scipy"]
    code = (
        "import sys\n"
        f"for name in {hide!r}:\n"
        "    sys.modules[name] = None\n"
        "from rtpool.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = run(["-c", code, *args], timeout=30)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"pip install 'rtpool[{extra}]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_quickstart_prints_the_factors():
    proc = run([str(ROOT / "examples" / "quickstart.py")], timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "smallest_factor(1000003 * 1000033) = 1000003",
        "map: [7, 97, 7]",
    ]


def test_grid_rpc_example_runs_its_three_checks():
    pytest.importorskip("scipy")
    proc = run([str(ROOT / "examples" / "grid_rpc.py")], timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-3:] == [
        "dmmul matches numpy: True",
        "transaction solves A x = b: True",
        "Ninf-style out buffer filled: True",
    ], proc.stdout
    assert any(line.startswith("dgesl(") for line in lines), proc.stdout
