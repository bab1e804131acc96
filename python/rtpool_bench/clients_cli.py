"""``rtpool bench clients``: arguments, the run on one ``LocalCluster`` and the tables (the
measurements are in :mod:`rtpool_bench.clients`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Dict, Sequence

from . import clients as bc
from .ninf.cli import positive_ints
from .stats import machine_info


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench clients`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench clients",
        description="C, Rust and Python clients calling dmmul (n = 11, ~1 KiB per argument) on "
        "Python workers serving rtpool.lib.linalg: latency interleaved in one run, the async "
        "throughput of one C client, the Ninf multi-client table with C clients.",
    )
    ap.add_argument("sections", nargs="*", metavar="SECTION", help="latency, async, multi (all)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument("--quick", action="store_true", help="tiny counts (the test suite)")
    ap.add_argument("--workers", type=int, default=2, help="Python worker processes (2)")
    ap.add_argument("--rounds", type=int, help="latency rounds, each C, Rust, Python (4)")
    ap.add_argument("--calls", type=int, help="timed calls per client per round (1000)")
    ap.add_argument("--async-calls", type=int, help="C calls in flight at once (1000)")
    ap.add_argument("--async-rounds", type=int, help="runs of the async section (3)")
    ap.add_argument(
        "--clients", type=positive_ints, help="C client processes per cell (1,2,4,8,16)"
    )
    ap.add_argument("--cell-calls", type=int, help="calls per client per cell, at most (2000)")
    ap.add_argument("--cell-seconds", type=float, help="seconds per cell, at most (5)")
    return ap


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check ``argv``; unset options get the normal or the ``--quick`` default."""
    ap = build_parser()
    args = ap.parse_args(list(argv))
    for key, (normal, quick) in bc.DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else normal)
    bad = [s for s in args.sections if s not in bc.SECTIONS]
    if bad:
        ap.error(f"unknown section {bad[0]!r}; choose from {', '.join(bc.SECTIONS)}")
    for key in ("workers", "rounds", "calls", "async_calls", "async_rounds", "cell_calls"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.cell_seconds <= 0:
        ap.error("--cell-seconds must be positive")
    return args


def run(args: argparse.Namespace, say: Callable[[str], None]) -> Dict[str, object]:
    """Build the programs, start the cluster, run the sections; the JSON-ready result."""
    import rtpool

    from .ninf.common import wait_served

    exe = bc.programs()
    sections = args.sections or list(bc.SECTIONS)
    result: Dict[str, object] = {"machine": machine_info(), "sections": sections}
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "sections")}
    t0 = time.perf_counter()
    with rtpool.LocalCluster(workers=args.workers, serve=["rtpool.lib.linalg"]) as cluster:
        cluster.wait_for_workers(args.workers, timeout=60)
        wait_served(cluster.client(), ["dmmul"])
        env = {k: v for k, v in os.environ.items() if not k.startswith("RTPOOL_")}
        env |= {"RTPOOL_MASTER": cluster.address, "RTPOOL_TOKEN": cluster.client_token}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        for name, section in (
            ("latency", bc.bench_latency),
            ("async", bc.bench_async),
            ("multi", bc.bench_multi),
        ):
            if name in sections:
                result[name] = section(args, exe, env, say)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["problems"] = bc.problems(result)
    return result


def _us(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def render(result: Dict, out=sys.stdout) -> None:
    """The tables, as plain text."""
    lat = result.get("latency")
    if lat:
        print(
            f"call latency, dmmul n={lat['n']} (two 968-byte arrays), "
            f"{len(lat['rounds'])} rounds x {lat['calls_per_round']} calls, order rotating (us)",
            file=out,
        )
        print(f"{'client':8} {'calls':>7} {'p50':>7} {'p99':>7} {'p99.9':>7} {'max':>8}", file=out)
        for c in bc.CLIENTS:
            s = lat[c]
            print(
                f"{c:8} {s['count']:>7} {_us(s['p50_us']):>7} {_us(s['p99_us']):>7} "
                f"{_us(s['p99_9_us']):>7} {_us(s['max_us']):>8}",
                file=out,
            )
        for c in ("c", "rust"):
            p50, p99 = lat[f"{c}_over_python_p50"], lat[f"{c}_over_python_p99"]
            print(f"{c} / python: p50 {_ratio(p50)}, p99 {_ratio(p99)}", file=out)
        per_round = "; ".join(
            " ".join(f"{c}={_us(r[c]['p50_us'])}" for c in r["order"]) for r in lat["rounds"]
        )
        print(f"p50 per round: {per_round}\n", file=out)
    asy = result.get("async")
    if asy:
        rates = ", ".join(f"{r['calls_per_s']:,}" for r in asy["runs"])
        calls = asy["runs"][0]["calls"]
        print(f"async, one C client, {calls} calls in flight: calls/s {rates}\n", file=out)
    multi = result.get("multi")
    if multi:
        print(f"multi-client table (C clients, dmmul n={multi['n']}, back to back)", file=out)
        print(f"{'clients':>7} {'calls':>7} {'calls/s':>9} {'p50 us':>8} {'p99 us':>8}", file=out)
        for cell in multi["cells"]:
            print(
                f"{cell['clients']:>7} {cell['calls']:>7} {_us(cell['calls_per_s']):>9} "
                f"{_us(cell['p50_us']):>8} {_us(cell['p99_us']):>8}",
                file=out,
            )
    for p in result["problems"]:
        print(f"PROBLEM: {p}", file=out)


def main(argv: Sequence[str]) -> int:
    """Entry point of ``rtpool bench clients``.

    Returns:
        0 when every call was answered right, 1 otherwise, 2 on bad arguments.
    """
    args = parse(argv)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        result = run(args, say)
    except RuntimeError as e:
        print(f"rtpool bench clients: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        render(result)
    return 1 if result["problems"] else 0
