"""The pure parts of `make bench-check` (benches/ab_noop.py, benches/_ab.py,
benches/_base_build.py): arguments, round order, the figures read from each bench's JSON,
medians and ratios, and how a base commit's layout is read. The build itself and the benches
are run by hand (docs/benchmarks.md, "Regression check")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parent.parent / "benches"
sys.path.insert(0, str(BENCHES))

import _ab  # noqa: E402
import _base_build  # noqa: E402
import ab_noop  # noqa: E402


def _side(tmp_path: Path, name: str) -> str:
    (tmp_path / name / "rtpool").mkdir(parents=True)
    return str(tmp_path / name)


def test_rounds_alternate_the_order_of_the_sides():
    orders = [_ab.round_order(["base", "head"], r) for r in range(4)]
    assert orders == [["base", "head"], ["head", "base"], ["base", "head"], ["head", "base"]]
    assert _ab.round_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_sides_are_checked(tmp_path):
    a, b = _side(tmp_path, "a"), _side(tmp_path, "b")
    assert _ab.parse_sides([f"base={a}", f"head={b}"]) == {"base": a, "head": b}
    with pytest.raises(ValueError, match="NAME=DIR"):
        _ab.parse_sides([a])
    with pytest.raises(ValueError, match="twice"):
        _ab.parse_sides([f"x={a}", f"x={b}"])
    with pytest.raises(ValueError, match="no rtpool/"):
        _ab.parse_sides([f"x={tmp_path}"])


def test_command_line(tmp_path, capsys):
    args = ab_noop.parse_args(["--compare", "HEAD~1", "--rounds", "3", "--sizes", "64K,1M"])
    assert (args.compare, args.rounds, args.sizes, args.sides) == (
        "HEAD~1",
        3,
        [65536, 1 << 20],
        {},
    )
    assert ab_noop.parse_args(["--compare", "x", "--sizes", ""]).sizes == []
    a, b = _side(tmp_path, "a"), _side(tmp_path, "b")
    assert list(ab_noop.parse_args([f"old={a}", f"new={b}"]).sides) == ["old", "new"]
    for bad, said in (
        ([], "give --compare REV"),
        ([f"old={a}"], "two or more"),
        (["--compare", "x", f"old={a}"], "not both"),
        (["--compare", "x", "--rounds", "0"], "at least 1"),
        (["--compare", "x", "--sizes", "64Q"], "cannot read the size"),
        (["--compare", "x", "--timeout", "0"], "positive"),
    ):
        with pytest.raises(SystemExit) as e:
            ab_noop.parse_args(bad)
        assert e.value.code == 2
        assert said in capsys.readouterr().err


def test_sizes():
    assert [_ab.parse_size(s) for s in ("64K", "1M", "1MiB", "16mb", "4096")] == [
        65536,
        1 << 20,
        1 << 20,
        16 << 20,
        4096,
    ]
    assert [_ab.size_label(s) for s in (65536, 1 << 20, 1536)] == ["64K", "1M", "1536"]
    for bad in ("", "K", "0", "-1K", "1.5M"):
        with pytest.raises(ValueError):
            _ab.parse_size(bad)


def test_figures_from_the_json_of_each_bench():
    lat = {"latency": {"rtpool": {"p50_us": 210, "p99_us": 300, "p99_9_us": 900, "max_us": 4000}}}
    assert _ab.latency_figures(lat) == {
        "latency p50": 210,
        "latency p99": 300,
        "latency p99.9": 900,
        "latency max": 4000,
    }
    assert _ab.throughput_figures({"throughput": {"median_tasks_per_s": 1.5e5}}) == {
        "throughput": 1.5e5
    }
    new = {  # issue 16's layout: a variant per transport; the client's default is shm
        "payload": {
            "shared_memory": True,
            "sizes": [
                {
                    "size_bytes": 65536,
                    "variants": {"bytes/tcp": {"p50_us": 390}, "bytes/shm": {"p50_us": 350}},
                },
                {"size_bytes": 1 << 20, "variants": {"bytes/tcp": {"p50_us": 700}}},
            ],
        }
    }
    assert _ab.payload_figures(new, [65536, 1 << 20, 16 << 20]) == {
        "payload 64K p50": 350,
        "payload 1M p50": 700,
        "payload 16M p50": None,
    }
    new["payload"]["shared_memory"] = False
    assert _ab.payload_figures(new, [65536])["payload 64K p50"] == 390
    old = {"payload": {"sizes": [{"size_bytes": 65536, "rtpool": {"p50_us": 531.4}}]}}
    assert _ab.payload_figures(old, [65536]) == {"payload 64K p50": 531.4}


def test_medians_over_rounds_and_ratios_to_the_base():
    rounds = [
        {"latency p50": 200.0, "throughput": 100.0},
        {"latency p50": 400.0, "throughput": None},
        {"latency p50": 300.0, "throughput": 300.0},
    ]
    assert _ab.medians(rounds) == {"latency p50": 300.0, "throughput": 200.0}
    assert _ab.medians([{"x": None}]) == {"x": None}
    r = _ab.ratios(
        {"latency p50": 150.0, "throughput": 300.0, "y": 1.0},
        {"latency p50": 300.0, "throughput": 200.0, "y": 0.0},
    )
    assert r == {"latency p50": 0.5, "throughput": 1.5, "y": None}


def test_summary_table_prints_every_figure_and_its_ratio():
    med = {
        "base": {"latency p50": 200.0, "throughput": 100_000.0},
        "head": {"latency p50": 100.0, "throughput": None},
    }
    lines = _ab.format_summary(med, {"base": 2.0, "head": 3.0}, 4, "base")
    assert lines[1] == "| figure | base | head | head / base |"
    assert "| latency p50 | 200.0 us | 100.0 us | 0.500 |" in lines
    assert "| throughput | 100,000/s | - | - |" in lines
    assert lines[-1] == "| throughput run CPU | 2.00 s | 3.00 s | 1.500 |"


def test_a_base_layout_is_read_from_its_pyproject_and_cargo_toml(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.maturin]\nmanifest-path = "crates/py/Cargo.toml"\n'
        'python-source = "python"\nmodule-name = "rtpool._native"\n[tool.ruff]\n'
        'module-name = "not this"\n'
    )
    assert _base_build.maturin_layout(tmp_path) == {
        "manifest-path": "crates/py/Cargo.toml",
        "python-source": "python",
        "module-name": "rtpool._native",
    }
    manifest = tmp_path / "Cargo.toml"
    manifest.write_text(
        '[package]\nname = "rtpool-py"\n[lib]\ncrate-type = ["cdylib"]\n'
        'name = "_native"\n[dependencies]\nname = "no"\n'
    )
    assert _base_build.lib_name(manifest) == "_native"
    manifest.write_text('[package]\nname = "rtpool-py"\n')
    assert _base_build.lib_name(manifest) == "rtpool_py"
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    with pytest.raises(_base_build.BuildError, match="tool.maturin"):
        _base_build.maturin_layout(tmp_path)


def test_a_rev_that_is_no_commit_is_a_clear_error():
    repo = BENCHES.parent
    assert len(_base_build.resolve(repo, "HEAD")) == 40
    with pytest.raises(_base_build.BuildError, match="not a commit"):
        _base_build.resolve(repo, "no-such-rev-xyz")
