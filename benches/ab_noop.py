"""No-op latency, throughput and payload round trips of two or more builds of rtpool,
interleaved in one run: the no-regression check of every change to the hot path.

Each side is a ``python/`` directory holding ``rtpool`` with its native module (a checkout's
``python/`` after ``make install``, or one ``--compare`` builds). Every round runs, once per
side, ``rtpool bench latency --json``, ``rtpool bench throughput --json`` and ``rtpool bench
payload --json --sizes 64K,1M``, the order of the sides reversed every other round (A B, B A,
...), so that the machine's drift falls on both. Prints each round, then the medians over
rounds and their ratios to the first side (the base): latency p50/p99/p99.9/max, throughput
(the bench's median tasks/s), the p50 round trip of a ``bytes`` echo at each payload size (the
client's default transport), and the CPU seconds of the whole process tree of the throughput
run (``RUSAGE_CHILDREN``: less sensitive to a busy machine than tasks/s).

    python3 benches/ab_noop.py --rounds 4 base=/work/baseline/python head=python
    python3 benches/ab_noop.py --compare f5cd257          # make bench-check BASE=f5cd257

``--compare REV`` builds REV's ``python/`` and native module under ``.bench-base/<sha>/``
(reused on the next run; see ``benches/_base_build.py``) and compares this checkout's
``python/`` (as it is, uncommitted changes included: ``make install`` first) against it.
Every bench run is bounded (``--timeout``) and its process group killed past it; the build
too (``--build-timeout``). Nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _ab  # noqa: E402
import _base_build  # noqa: E402
from _bounded import run_json  # noqa: E402

CHECKOUT = Path(__file__).resolve().parent.parent


def _run(python: str, path: str, cmd: Sequence[str], timeout: float) -> tuple:
    """One bench run of side ``path``: its JSON and the CPU seconds of its process tree."""
    env = {**os.environ, "PYTHONPATH": path}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    shown = f"`rtpool bench {' '.join(cmd)}` on {path}"
    figures = run_json([python, "-m", "rtpool", "bench", *cmd, "--json"], shown, timeout, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return figures, cpu


def one_round(args, name: str, path: str) -> tuple:
    """Every bench once on one side: its figures and the throughput run's CPU seconds."""
    figures: _ab.Figures = {}
    lat_cmd = ["latency"] + (["--count", str(args.count)] if args.count else [])
    lat, _ = _run(args.python, path, lat_cmd, args.timeout)
    figures.update(_ab.latency_figures(lat))
    thr, cpu = _run(args.python, path, ["throughput", "--runs", str(args.runs)], args.timeout)
    figures.update(_ab.throughput_figures(thr))
    if args.sizes:
        cmd = ["payload", "--sizes", ",".join(_ab.size_label(s) for s in args.sizes)]
        cmd += ["--payload-seconds", str(args.payload_seconds)]
        pay, _ = _run(args.python, path, cmd, args.timeout)
        figures.update(_ab.payload_figures(pay, args.sizes))
    return figures, cpu


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sides", nargs="*", metavar="NAME=PYTHONPATH", help="the first is the base")
    ap.add_argument(
        "--compare",
        metavar="REV",
        help="build REV's python/ and native module (cached in --cache) and compare this "
        "checkout's python/ (--head) against it",
    )
    ap.add_argument("--head", default=str(CHECKOUT / "python"), help="head side of --compare")
    ap.add_argument("--cache", default=str(CHECKOUT / ".bench-base"), help="where bases build")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (default 4)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for every side")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per bench run at most")
    ap.add_argument("--build-timeout", type=float, default=3600.0, help="seconds of cargo build")
    ap.add_argument("--build-only", action="store_true", help="build --compare's base and stop")
    ap.add_argument("--count", type=int, default=0, help="latency round trips (bench default)")
    ap.add_argument("--runs", type=int, default=3, help="throughput runs per round (default 3)")
    ap.add_argument(
        "--sizes",
        default=_ab.DEFAULT_PAYLOAD_SIZES,
        help="payload sizes echoed, comma-separated (default 64K,1M; empty: no payload runs)",
    )
    ap.add_argument(
        "--payload-seconds", type=float, default=4.0, help="time budget per size (default 4)"
    )
    ap.add_argument("--json", metavar="PATH", help="also write every round and the medians here")
    return ap


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, checked; exits 2 with a message on bad input."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.compare and args.sides:
        ap.error("give either --compare REV or NAME=DIR sides, not both")
    if not args.compare and len(args.sides) < 2:
        ap.error("give --compare REV, or two or more NAME=DIR sides (the first is the base)")
    if min(args.rounds, args.runs) < 1 or args.count < 0:
        ap.error("--rounds and --runs must be at least 1, --count at least 0")
    if min(args.timeout, args.build_timeout, args.payload_seconds) <= 0:
        ap.error("--timeout, --build-timeout and --payload-seconds must be positive")
    try:
        args.sizes = [_ab.parse_size(s) for s in args.sizes.split(",") if s.strip()]
        args.sides = _ab.parse_sides(args.sides) if args.sides else {}
    except ValueError as e:
        ap.error(str(e))
    return args


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    sides: Dict[str, str] = args.sides
    if args.compare:
        try:
            base = _base_build.build(
                CHECKOUT,
                args.compare,
                Path(args.cache),
                args.python,
                args.build_timeout,
                seed_target=CHECKOUT / "target",
            )
        except _base_build.BuildError as e:
            print(f"bench-check: {e}", file=sys.stderr)
            return 1
        if args.build_only:
            print(base)
            return 0
        sides = _ab.parse_sides([f"base={base}", f"head={args.head}"])
    rounds: Dict[str, List[_ab.Figures]] = {k: [] for k in sides}
    cpus: Dict[str, List[float]] = {k: [] for k in sides}
    for r in range(args.rounds):
        for name in _ab.round_order(list(sides), r):
            figures, cpu = one_round(args, name, sides[name])
            rounds[name].append(figures)
            cpus[name].append(cpu)
            print(_ab.format_round(r, name, figures, cpu), flush=True)
    med = {k: _ab.medians(v) for k, v in rounds.items()}
    cpu_med = {k: _ab.medians([{"cpu": c} for c in v])["cpu"] for k, v in cpus.items()}
    base_name = next(iter(sides))
    print("\n".join(_ab.format_summary(med, cpu_med, args.rounds, base_name)))
    if args.json:
        out = {"sides": sides, "rounds": rounds, "cpu_s": cpus, "medians": med}
        out["ratios_to_base"] = {k: _ab.ratios(med[k], med[base_name]) for k in sides}
        Path(args.json).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
