"""``rtpool bench clients``: its argument checks and summaries in process, and one ``--quick``
run end to end (a subprocess: real master, Python workers, the C, Rust and Python clients),
which checks the structure of the JSON and that every call was answered right. Speed is
never asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rtpool_bench import clients, clients_cli


def test_bad_arguments_are_refused_with_the_option_named(capsys):
    for argv, what in (
        (["--calls", "0"], "--calls must be at least 1"),
        (["--cell-seconds", "-1"], "--cell-seconds must be positive"),
        (["nosuch"], "unknown section 'nosuch'"),
        (["--clients", "1,0"], "expected positive integers"),
    ):
        with pytest.raises(SystemExit) as e:
            clients_cli.parse(argv)
        assert e.value.code == 2
        assert what in capsys.readouterr().err


def test_quick_defaults_and_summary():
    args = clients_cli.parse(["--quick"])
    assert (args.rounds, args.calls, args.clients) == (2, 30, (1, 2))
    s = clients.summary([float(v) for v in range(10, 0, -1)])
    assert (s["count"], s["p50_us"], s["p99_us"], s["p99_9_us"], s["max_us"]) == (10, 5, 10, 10, 10)


def test_problems_name_wrong_products():
    result = {
        "latency": {"c": {"wrong": 2}, "rust": {"wrong": 0}, "python": {"wrong": 0}},
        "async": {"runs": [{"right": False, "max_abs_err": 0.5}]},
        "multi": {"cells": [{"clients": 4, "wrong": 1}]},
    }
    assert clients.problems(result) == [
        "latency: 2 wrong or missing c calls",
        "async: a wrong product (max_abs_err 0.5)",
        "multi: 1 wrong products with 4 clients",
    ]


@pytest.fixture(scope="module")
def built():
    try:
        return clients.programs()  # make and cargo: cached after the first build
    except (RuntimeError, FileNotFoundError) as e:
        pytest.skip(f"the native clients cannot be built here: {e}")


@pytest.mark.timeout(1200)
def test_quick_run_answers_every_call_right(built):
    cmd = [sys.executable, "-m", "rtpool", "bench", "clients", "--quick", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["sections"] == ["latency", "async", "multi"] and r["problems"] == []
    lat = r["latency"]
    assert [row["order"] for row in lat["rounds"]] == [
        ["c", "rust", "python"],
        ["rust", "python", "c"],
    ]
    for c in ("c", "rust", "python"):
        assert lat[c]["count"] == 2 * 30 and lat[c]["wrong"] == 0
        assert lat[c]["p50_us"] <= lat[c]["p99_us"] <= lat[c]["p99_9_us"] <= lat[c]["max_us"]
    assert lat["c_over_python_p50"] > 0 and lat["rust_over_python_p50"] > 0
    (run,) = r["async"]["runs"]
    assert run["calls"] == 50 and run["right"] and run["calls_per_s"] > 0
    cells = r["multi"]["cells"]
    assert [cell["clients"] for cell in cells] == [1, 2]
    for cell in cells:
        # Each client stops at 20 calls or after 2 s: at least one call each, none wrong.
        assert cell["clients"] <= cell["calls"] <= 20 * cell["clients"] and cell["wrong"] == 0
        assert cell["calls_per_s"] > 0 and cell["p50_us"] <= cell["p99_us"]
