"""benches/figures.py: the published tables written from a small saved run, the markers'
content replaced and nothing else in the file changed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parent.parent / "benches"
sys.path.insert(0, str(BENCHES))

import _figures  # noqa: E402
import figures  # noqa: E402

MACHINE = {"cpu_model": "Test CPU", "usable_cpus": 2, "cpu_count": 2, "python": "3.11.7"}
MACHINE |= {"platform": "Linux-test", "loadavg_before": [0.5, 0.4, 0.3]}
PCT = {"count": 5000, "p50_us": 210, "p90_us": 250, "p99_us": 400, "p99_9_us": 900}
RUN = {
    "commit": "abc123def456",
    "date": "2026-12-06 18:00 UTC",
    "machine": MACHINE,
    "commands": {"latency": "python -m rtpool bench latency --json"},
    "latency": {
        "rtpool": {**PCT, "max_us": 4000},
        "floor": {"count": 5000, "p50_us": 70, "p90_us": 80, "p99_us": 90, "p99_9_us": 100},
        "relay_chain": {"count": 5000, "p50_us": 168, "p99_us": 300, "max_us": 700},
    },
    "throughput": {
        "tasks": 100000,
        "runs": [{"tasks_per_s": 140000.0}, {"tasks_per_s": 150000.0}],
        "best_tasks_per_s": 150000.0,
        "median_tasks_per_s": 145000.0,
    },
    "payload": {
        "shared_memory": True,
        "sizes": [
            {
                "size_bytes": 65536,
                "variants": {
                    "bytes/tcp": {"p50_us": 400.0, "mb_per_s": 327.7},
                    "bytes/shm": {"p50_us": 390.0, "mb_per_s": 336.1},
                },
                "floors": {"tcp": {"p50_us": 250, "mb_per_s": 524.3}, "memcpy": {"mb_per_s": 9e3}},
            }
        ],
    },
    "scale": {
        "levels": [
            {
                "workers": 10000,
                "connections": {"connected": 10000},
                "master_rss_per_connection_kb": 30.5,
                "throughput": {"tasks_per_s": 90000.0, "master_cpu_us_per_task": 4.2},
                "latency": {"p50_us": 300, "p99_us": 500, "p99_9_us": 900, "max_us": 1000},
                "master_lease_lost": 0,
                "idle": {"master_cpu_pct": 4.5},
            }
        ]
    },
}


def test_readme_table_from_given_figures():
    text = _figures.readme_table(RUN)
    assert text.splitlines()[1] == (
        "Measured in one run: Test CPU, 2 CPUs, load average 0.5 before; Python 3.11.7, "
        "Linux-test; 2026-12-06 18:00 UTC, commit `abc123def456`; `LocalCluster(workers=2)`."
    )
    rows = text.splitlines()[3:]
    assert rows[0] == "|  | rtpool | reference measured in the same run |"
    assert rows[2] == (
        "| no-op round trip p50 / p99 / p99.9 | 210 us / 400 us / 900 us | raw TCP ping-pong "
        "70 us (3.00x); 3-process relay chain 168 us (1.25x) |"
    )
    assert rows[3] == (
        "| 100,000 no-op tasks in one package | 145,000 tasks/s (median of 2; best 150,000) |  |"
    )
    assert rows[4] == (
        "| 64 KiB `bytes` echoed by a task | 390 us, 336 MB/s | raw TCP echo 250 us, 524 MB/s |"
    )
    assert rows[5] == (
        "| 10,000 simulated workers (`rtpool bench scale`) | 90,000 tasks/s; round trip p50 "
        "300 us; idle master 4.5 % of a core | 10,000 connected; master 30.5 KiB per connection |"
    )
    assert len(rows) == 6  # no demo in this run: no demo row


def test_docs_summary_from_given_figures():
    text = _figures.docs_summary(RUN)
    assert "```\npython -m rtpool bench latency --json\n```" in text
    assert (
        "| rtpool | 5000 | 210 us | 250 us | 400 us | 900 us | 4.00 ms | 1.00x |"
        in text.splitlines()
    )
    assert "| raw TCP ping-pong | 5000 | 70 us | 80 us | 90 us | 100 us | - | 3.00x |" in text
    assert "median **145,000** tasks/s, best 150,000 (each run: 140,000, 150,000)" in text
    assert "| 64 KiB | 390 us | bytes/shm | 328 | 336 | 524 | 9,000 |" in text
    assert "| 10,000 | 10,000 | 4.5 % | 90,000 | 4.2 | 300 us / 500 us / 900 us / 1.00 ms |" in text
    assert "**Factorization demo**" not in text


def _doc(body: str) -> str:
    return f"# Title\n\nBefore, kept.\n\n{_figures.BEGIN}\n{body}\n{_figures.END}\n\nAfter.\n"


def test_only_the_text_between_the_markers_changes():
    old = _doc("| stale | table |")
    new = _figures.replace_between(old, "| new | table |\n")
    assert new == _doc("| new | table |")
    assert _figures.replace_between(new, "| new | table |") == new  # idempotent
    for bad in ("no markers", _doc("x") + _figures.BEGIN, f"{_figures.END}\n{_figures.BEGIN}\n"):
        with pytest.raises(ValueError, match="figures:"):
            _figures.replace_between(bad, "x", "README.md")


def test_from_saved_json_writes_both_files_and_nothing_else(tmp_path, capsys):
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(RUN))
    readme, docs = tmp_path / "README.md", tmp_path / "benchmarks.md"
    readme.write_text(_doc("old readme table"))
    docs.write_text(_doc("old summary"))
    argv = ["--from-json", str(saved), "--readme", str(readme), "--docs", str(docs)]
    assert figures.main(argv) == 0
    assert readme.read_text() == _doc(_figures.readme_table(RUN))
    assert docs.read_text() == _doc(_figures.docs_summary(RUN))
    assert figures.main(argv) == 0
    assert "unchanged" in capsys.readouterr().err


def test_saved_outputs_of_the_benches_themselves_are_merged(tmp_path):
    parts = {
        "bench.json": {"machine": MACHINE, "latency": RUN["latency"], "payload": RUN["payload"]},
        "scale.json": {"machine": MACHINE, "levels": RUN["scale"]["levels"]},
    }
    for name, data in parts.items():
        (tmp_path / name).write_text(json.dumps(data))
    run = _figures.merge([json.loads((tmp_path / n).read_text()) for n in parts])
    assert sorted(run) == ["latency", "machine", "payload", "scale"]
    with pytest.raises(ValueError, match="two of the files"):
        _figures.merge([parts["bench.json"], parts["bench.json"]])
    with pytest.raises(ValueError, match="no figures"):
        _figures.merge([{"machine": MACHINE}])


def test_bad_arguments_are_refused(tmp_path, capsys):
    for argv, said in (
        (["--skip", "nope"], "no such section"),
        (["--from-json", str(tmp_path / "missing.json")], "--from-json"),
        (["--from-json", "x.json", "--quick"], "runs nothing"),
    ):
        with pytest.raises(SystemExit) as e:
            figures.main(argv)
        assert e.value.code == 2
        assert said in capsys.readouterr().err
