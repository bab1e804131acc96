"""Entry points of ``rtpool bench`` and ``rtpool demo``, which ``rtpool.cli`` hands over to.

``rtpool bench`` parses ``latency``, ``throughput``, ``payload``, ``all`` (the closed-loop round
trips of :mod:`rtpool_bench.roundtrip`) and ``latency --rate/--sweep``, ``deadline``, ``hedge``
(the open-loop benches of :mod:`rtpool_bench.openloop_cli`) here; ``ninf``, ``realtime``,
``recovery``, ``journal``, ``chain``, ``prefetch``, ``scale``, ``procs``, ``soak``,
``powerloss``, ``history``, ``handshake`` and ``asyncio`` have parsers of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, Sequence

from . import openloop_cli
from .roundtrip import bench_latency, bench_throughput, parse_size
from .stats import machine_info

#: Every benchmark ``rtpool bench`` runs: the round-trip ones this parser takes, then those
#: with parsers of their own.
ROUNDTRIP_BENCHES = ("latency", "throughput", "payload", "all", "deadline", "hedge")
BENCHES = ROUNDTRIP_BENCHES + (
    "realtime",
    "recovery",
    "journal",
    "ninf",
    "chain",
    "prefetch",
    "scale",
    "procs",
    "soak",
    "powerloss",
    "history",
    "ha",
    "handshake",
    "asyncio",
    "clients",
)


def bench_main(argv: Sequence[str]) -> int:
    """Entry point of ``rtpool bench``; ``argv`` excludes ``bench``.

    Returns:
        The exit code of the subcommand (0 when it ran to the end; see each one's ``--help``).
    """
    argv = list(argv)
    which = argv[0] if argv else None
    if which is not None and not which.startswith("-") and which not in BENCHES:
        print(
            f"rtpool bench: unknown benchmark {which!r}; choose from {', '.join(BENCHES)} "
            "(rtpool bench --help describes them)",
            file=sys.stderr,
        )
        return 2
    if which in ("recovery", "journal"):
        from . import recovery

        return recovery.main(argv)
    if which == "realtime":
        from . import realtime

        return realtime.main(argv[1:])
    if which == "ninf":
        from .ninf import cli as ninf_cli

        return ninf_cli.main(argv[1:])
    if which == "chain":
        from . import chain

        return chain.main(argv[1:])
    if which == "prefetch":
        from . import prefetch

        return prefetch.main(argv[1:])
    if which == "scale":
        from . import scale

        return scale.main(argv[1:])
    if which == "procs":
        from . import hostconn

        return hostconn.main(argv[1:])
    if which == "soak":
        from . import soak

        return soak.main(argv[1:])
    if which == "powerloss":
        from . import powerloss

        return powerloss.main(argv[1:])
    if which == "history":
        from . import history_kill

        return history_kill.main(argv[1:])
    if which == "ha":
        from . import history_ha

        return history_ha.main(argv[1:])
    if which == "handshake":
        from . import handshake

        return handshake.main(argv[1:])
    if which == "clients":
        from . import clients_cli

        return clients_cli.main(argv[1:])
    if which == "asyncio":
        from . import aio

        return aio.main(argv[1:])
    return roundtrip_main(argv)


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench",
        description=(
            "End-to-end benchmarks on a LocalCluster, each next to a raw TCP ping-pong floor "
            "measured in the same run. Prints percentiles (p50, p90, p99, p99.9, max), never a "
            "mean alone."
        ),
    )
    ap.add_argument(
        "which",
        metavar="BENCH",
        choices=ROUNDTRIP_BENCHES,
        help="latency: no-op round trips (open loop with --rate or --sweep); throughput: one "
        "big package; payload: 1 KiB-16 MiB echoes; all: the three in sequence; deadline: "
        "10 ms tasks with a 50 ms deadline at 80%% of capacity; hedge: one slow worker, with "
        "and without hedging; each of realtime, recovery, journal, ninf, chain, prefetch, "
        "procs, scale, soak, powerloss, history, handshake, asyncio and clients has its own --help "
        "(`rtpool bench ninf --help`: the Ninf paper's grid RPC benchmarks; `rtpool bench "
        "clients`: the C and Rust clients next to Python's)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object, a dict per section")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    g = ap.add_argument_group("latency")
    g.add_argument(
        "--count",
        type=int,
        default=None,
        help="round trips each (default 5000); open loop: tasks per configuration (20000; "
        "deadline 5000, hedge 1000)",
    )
    g.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="time budget of the round trips (default 20); open loop: of each configuration "
        "(20; deadline 40, hedge 15)",
    )
    g.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up round trips each (default 500; open loop: 2000 tasks)",
    )
    g.add_argument("--block", type=int, default=250, help="round trips per block (default 250)")
    g = ap.add_argument_group("throughput")
    g.add_argument("--tasks", type=int, default=100_000, help="tasks per package (default 100000)")
    g.add_argument("--runs", type=int, default=3, help="runs; best and median (default 3)")
    g.add_argument(
        "--run-timeout", type=float, default=120.0, help="seconds per run at most (default 120)"
    )
    g = ap.add_argument_group("payload")
    g.add_argument(
        "--sizes",
        default="1K,4K,16K,32K,64K,128K,256K,512K,1M,16M",
        help="comma-separated sizes (default 1K,4K,16K,32K,64K,128K,256K,512K,1M,16M; "
        "64M and 256M also run)",
    )
    g.add_argument(
        "--payload-reps",
        type=int,
        default=0,
        help="round trips per size and variant (default: 200 up to 256K, 100 up to 1M, 12 up "
        "to 16M, 5 up to 64M, 3 above)",
    )
    g.add_argument(
        "--payload-seconds", type=float, default=8.0, help="time budget per size (default 8)"
    )
    g.add_argument(
        "--ray-python",
        metavar="PYTHON",
        help="also echo through Ray, interleaved in the same run: the interpreter of a venv "
        "with ray and numpy (Ray is never a dependency of rtpool)",
    )
    openloop_cli.add_arguments(ap)
    return ap


def roundtrip_main(argv: Sequence[str] | None = None) -> int:
    """``rtpool bench latency|throughput|payload|all|deadline|hedge``; ``argv`` excludes
    ``bench``.

    Returns:
        0 when every section ran to the end, 1 when a run timed out or an echo came back
        wrong, 2 on bad arguments. Missing a speed bar is reported, not an error.
    """
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.which in ("deadline", "hedge") or (
        args.which == "latency" and openloop_cli.is_open_loop(args)
    ):
        return openloop_cli.run(args, ap)
    args.count = 5000 if args.count is None else args.count
    args.seconds = 20.0 if args.seconds is None else args.seconds
    args.warmup = 500 if args.warmup is None else args.warmup
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"cannot read --sizes {args.sizes!r}; use e.g. 1K,64K,1M,16M")
    if min(args.workers, args.count, args.block, args.tasks, args.runs, *sizes) < 1:
        ap.error("--workers, --count, --block, --tasks, --runs and sizes must be at least 1")

    status_console = None
    if not args.json:
        from rich.console import Console

        status_console = Console(stderr=True)

    def say(text: str) -> None:
        if status_console is not None:
            status_console.print(f"[dim]{text}[/]")

    result: Dict[str, object] = {"machine": machine_info()}
    which = ("latency", "throughput", "payload") if args.which == "all" else (args.which,)
    if "latency" in which:
        result["latency"] = bench_latency(
            args.workers, args.count, args.seconds, args.warmup, args.block, say
        )
    if "throughput" in which:
        result["throughput"] = bench_throughput(
            args.workers, args.tasks, args.runs, args.run_timeout, say
        )
    if "payload" in which:
        from . import payload

        result["payload"] = payload.bench_payload(
            args.workers, sizes, args.payload_reps, args.payload_seconds, say, args.ray_python
        )
    if args.json:
        print(json.dumps(result))
    else:
        from rich.console import Console

        from .roundtrip_render import render

        render(result, Console())
    ok = all(not r["timed_out"] for r in result.get("throughput", {}).get("runs", []))
    ok = ok and all(not r["wrong_echoes"] for r in result.get("payload", {}).get("sizes", []))
    return 0 if ok else 1


# --- demo ----------------------------------------------------------------------------------


def demo_parser() -> argparse.ArgumentParser:
    """The ``rtpool demo`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool demo",
        description=(
            "The factorization benchmark: seeded semiprimes (~10 ms of trial division each) run "
            "sequentially, on N plain processes (the parallel ceiling) and on a "
            "LocalCluster(workers=N); prints makespans, speed-up, efficiency, the per-task "
            "measurement points (p50/p90) and the LocalCluster start-up time. "
            "`rtpool demo chess --help`: the chess engine that must move in time."
        ),
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="N: worker processes and ceiling processes (default: os.cpu_count() = %(default)s)",
    )
    ap.add_argument("--tasks", type=int, default=500, help="number of semiprimes (default 500)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the semiprime list (default 1)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run sequential, ceiling and rtpool this many times; report the best (default 3)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="only measure this machine's trial-division speed and print the prime size that "
        "would give ~10 ms per task (the demo keeps its fixed range)",
    )
    return ap


def demo_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rtpool demo``; ``argv`` excludes ``demo``.

    Returns:
        0 when every result was verified, 1 when a result was wrong, 2 on bad arguments.
    """
    if list(argv or [])[:1] == ["chess"]:
        from . import chess_cli

        return chess_cli.main(list(argv)[1:])
    from . import demo

    args = demo_parser().parse_args(argv)
    if min(args.workers, args.tasks, args.rounds) < 1:
        print("rtpool demo: --workers, --tasks and --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.calibrate:
        print(json.dumps(demo.calibrate(), indent=None if args.json else 2))
        return 0
    console = None
    if not args.json:
        from rich.console import Console

        console = Console(stderr=True)
    result = demo.run_demo(args.workers, args.tasks, args.seed, args.rounds, console)
    if args.json:
        print(json.dumps(result))
    else:
        from rich.console import Console

        from .demo_render import render

        render(result, Console())
    return 0 if result["results_verified"] else 1
