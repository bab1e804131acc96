"""``rtpool bench ninf``: the Ninf paper's benchmarks on rtpool's grid RPC (``docs/rpc.md``).

Every section starts its own ``LocalCluster`` whose workers serve ``rtpool.lib.linalg`` and
:mod:`rtpool_bench.ninf.funcs`, and stops it (and every client process it started, by PID).

* ``linpack``: Linpack Mflops against n for the local optimized solver (scipy's LAPACK in this
  process), the unblocked LINPACK baseline (also here; skipped from the size where it would
  take more than ``--unblocked-max-seconds``) and ``client.call("linpack", n, A, b)`` through
  one worker. The three are interleaved (a rotating order in every repetition), with the same
  BLAS thread count here and in the worker. Reports remote / local per n, the smallest n from
  which remote stays within 10 % of local, and the crossover with the unblocked baseline.
* ``multi``: the paper's multi-client tables (Tables 3-6): ``c`` client processes, each
  calling ``linpack`` at ticks ``--interval`` seconds apart with probability
  ``--probability``, for ``--cell-seconds``, on ``--workers`` workers; per call Performance,
  Response, Wait and Throughput (max/min/mean), the workers' CPU, the load average and the
  number of calls.
* ``ep``: NAS EP (2^m pairs, class S: m = 24) split into ``--ep-chunks`` remote ``ep`` calls
  shared by c client processes; Mops, time, verification of the sums against ``EP_VERIFY``.
* ``bars``: the issue's three bars. (a) round trips of ``dmmul`` with 1 KiB of arguments,
  a no-op shipped-code task and a no-op remote call, interleaved in blocks; (b) linpack n=1000
  remote vs local; (c) a diamond transaction A -> (B, C) -> D against its critical path plus
  two round trips.

Every loop is bounded by a count and by a time budget. ``--quick`` runs tiny sizes for tests.
The tables are in :mod:`rtpool_bench.ninf.render`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Dict, List, Sequence

from ..stats import machine_info
from .common import RESID_MAX, loadavg
from .linpack import bench_linpack

SECTIONS = ("linpack", "multi", "ep", "bars")

DEFAULTS = {
    "sizes": ((100, 200, 400, 800, 1000, 1200, 1600), (100, 200)),
    "repeats": (5, 2),
    "size_seconds": (60.0, 5.0),
    "multi_sizes": ((600, 1000), (200,)),
    "clients": ((1, 2, 4, 8, 16), (1, 2)),
    "cell_seconds": (6.0, 1.5),
    "ep_m": (24, 24),
    "ep_chunks": (16, 8),
    "ep_clients": ((1, 2, 4), (1, 2)),
    "bar_calls": (2000, 100),
    "bar_block": (100, 50),
    "bar_seconds": (60.0, 10.0),
    "diamond_reps": (20, 3),
    "diamond_ms": (50.0, 20.0),
}


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset with the normal or the ``--quick`` default."""
    for key, (normal, quick) in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, quick if args.quick else normal)
    return args


def positive_ints(text: str) -> List[int]:
    """An argparse type: ``"1,2,4"`` -> ``[1, 2, 4]``, every value at least 1."""
    vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench ninf`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench ninf",
        description="The Ninf paper's Linpack and EP benchmarks on rtpool's grid RPC, and the "
        "issue's three bars. Each section starts its own LocalCluster serving "
        "rtpool.lib.linalg.",
    )
    ap.add_argument(
        "sections",
        nargs="*",
        metavar="SECTION",
        help="linpack, multi, ep, bars (default: all four, in this order)",
    )
    # --json is a flag, as in every other bench; --json PATH (its old form) still works.
    ap.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="",
        help="print the figures as one JSON object on stdout instead of tables",
    )
    ap.add_argument(
        "--json-file",
        metavar="PATH",
        default=None,
        help="also write the figures as JSON to PATH (the tables are printed too)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions (tests)")
    ap.add_argument("--workers", type=int, default=2, help="workers of multi, ep, bars (2)")
    ap.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of this process and of every worker and client (default 1)",
    )
    g = ap.add_argument_group("linpack")
    g.add_argument("--sizes", type=positive_ints, help="orders n (100,200,400,800,1000,1200,1600)")
    g.add_argument("--repeats", type=int, help="repetitions per n (5; 3 from n=1000 on)")
    g.add_argument("--size-seconds", type=float, help="time budget per n (60)")
    g.add_argument(
        "--unblocked-max-seconds",
        type=float,
        default=10.0,
        help="skip the unblocked baseline from the n where one solve would take longer (10)",
    )
    g = ap.add_argument_group("multi")
    g.add_argument("--multi-sizes", type=positive_ints, help="orders n (600,1000)")
    g.add_argument("--clients", type=positive_ints, help="client processes per cell (1,2,4,8,16)")
    g.add_argument("--cell-seconds", type=float, help="seconds each cell's clients call (6)")
    g.add_argument("--interval", type=float, default=0.1, help="s: seconds between ticks (0.1)")
    g.add_argument("--probability", type=float, default=0.5, help="p: call at a tick (0.5)")
    g.add_argument("--max-calls", type=int, default=1000, help="calls per client at most (1000)")
    g = ap.add_argument_group("ep")
    g.add_argument("--ep-m", type=int, help="2^m pairs (24: class S)")
    g.add_argument("--ep-chunks", type=int, help="remote calls per run (16)")
    g.add_argument("--ep-clients", type=positive_ints, help="client processes (1,2,4)")
    g.add_argument("--ep-seconds", type=float, default=120.0, help="time budget per run (120)")
    g = ap.add_argument_group("bars")
    g.add_argument("--bar-calls", type=int, help="round trips of each kind (2000)")
    g.add_argument("--bar-block", type=int, help="round trips per block (100)")
    g.add_argument("--bar-seconds", type=float, help="time budget of the round trips (60)")
    g.add_argument("--diamond-reps", type=int, help="diamond transactions (20)")
    g.add_argument("--diamond-ms", type=float, help="milliseconds of each diamond call (50)")
    g.add_argument(
        "--diamond-work",
        choices=("sleep", "spin"),
        default="sleep",
        help="how a diamond call takes its time (sleep: B and C never compete for the 2 "
        "CPUs with the master and the client; spin: CPU time)",
    )
    return ap


def _json_compat(args: argparse.Namespace) -> None:
    """``--json`` took a path before it became a flag: ``--json linpack`` is the flag and a
    section, ``--json PATH`` still writes PATH (with a note to use ``--json-file``)."""
    value = args.json
    if value is None or value == "-":
        return
    if value in SECTIONS:
        args.sections.insert(0, value)
        args.json = "-"
        return
    print(
        f"rtpool bench ninf: --json {value} is deprecated (--json is now a flag, as in the other "
        f"benches); writing {value} as --json-file {value} would",
        file=sys.stderr,
    )
    args.json, args.json_file = None, value


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section {bad[0]!r}; choose from {', '.join(SECTIONS)}")
    positive = ("workers", "blas_threads", "repeats", "ep_m", "ep_chunks", "bar_calls")
    positive += ("bar_block", "diamond_reps", "max_calls")
    for key in positive:
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1")
    for key in ("interval", "cell_seconds", "size_seconds", "bar_seconds", "diamond_ms"):
        if getattr(args, key) <= 0:
            ap.error(f"--{key.replace('_', '-')} must be positive")
    if not 0 < args.probability <= 1:
        ap.error("--probability must be in (0, 1]")
    if args.ep_chunks > 1 << args.ep_m:
        ap.error("--ep-chunks must not exceed 2^m")


def run(args: argparse.Namespace, say: Callable) -> Dict[str, object]:
    """Run the selected sections; the JSON-ready result."""
    from .funcs import set_blas_threads

    set_blas_threads(args.blas_threads)  # here, and inherited by the workers and clients
    result: Dict[str, object] = {"machine": machine_info()}
    skip = ("json", "json_file", "sections")
    result["settings"] = {k: v for k, v in vars(args).items() if k not in skip}
    sections = args.sections or list(SECTIONS)
    result["sections"] = sections
    result["loadavg"] = {"before": loadavg()}
    t0 = time.perf_counter()
    if "linpack" in sections:
        result["linpack"] = bench_linpack(args, say)
        result["loadavg"]["after_linpack"] = loadavg()
    if "multi" in sections:
        from .multi import bench_multi

        result["multi"] = bench_multi(args, say)
        result["loadavg"]["after_multi"] = loadavg()
    if "ep" in sections:
        from .multi import bench_ep

        result["ep"] = bench_ep(args, say)
        result["loadavg"]["after_ep"] = loadavg()
    if "bars" in sections:
        from .bars import bench_bars

        result["bars"] = bench_bars(args, result.get("linpack"), say)
    result["loadavg"]["after"] = loadavg()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def problems(result: Dict[str, object]) -> List[str]:
    """What went wrong (wrong answers, failed calls); missing a speed bar is not a problem."""
    out = []
    for row in result.get("linpack", {}).get("rows", []):
        for m in ("local", "unblocked", "remote"):
            r = row[m]["max_resid"]
            if r is not None and not r <= RESID_MAX:
                out.append(f"linpack n={row['n']} {m}: residual {r:.3g}")
    for cell in result.get("multi", {}).get("cells", []):
        if cell["errors"] or cell["max_abs_error"] > 1e-6:
            out.append(f"multi n={cell['n']} c={cell['c']}: {cell['errors'] or 'wrong answer'}")
    ep = result.get("ep", {})
    for r in ep.get("local", []) + ep.get("runs", []):
        if not r["verified"] or r["errors"]:
            where = "clients" if r["remote"] else "plain processes"
            out.append(f"ep, {r['c']} {where}: not verified {r['errors'] or ''}")
    if result.get("bars", {}).get("diamond", {}).get("wrong_results"):
        out.append("bars: a diamond transaction returned a wrong result")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rtpool bench ninf``.

    Returns:
        0 when every section ran and every answer was right, 1 when an answer was wrong or a
        call failed, 2 on bad arguments. Missing a speed bar is reported, not an error.
    """
    ap = build_parser()
    args = _settings(ap.parse_args(argv))
    _json_compat(args)
    _check_args(ap, args)
    to_stdout = args.json == "-"
    console = None
    if not to_stdout:
        from rich.console import Console

        console = Console(stderr=True)

    def say(text: str) -> None:
        if console is not None:
            console.print(f"[dim]{text}[/]")

    result = run(args, say)
    result["problems"] = problems(result)
    if to_stdout or args.json_file:
        text = json.dumps(result)
        if to_stdout:
            print(text)
        if args.json_file:
            with open(args.json_file, "w") as f:
                f.write(text)
    if not to_stdout:
        from rich.console import Console

        from .render import render

        out = Console()
        if not out.is_terminal:  # a file or a pipe: wide enough for the tables
            out = Console(width=max(out.width, 180))
        render(result, out)
    return 1 if result["problems"] else 0
