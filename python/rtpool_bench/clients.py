"""``rtpool bench clients``: the native clients (issue 27) next to the Python client, on one
``LocalCluster`` whose Python workers serve ``rtpool.lib.linalg``.

* ``latency``: call latency of a ``dmmul`` of n = 11 (two 968-byte arrays: about 1 KiB per
  argument) from C (``examples/c/latency``), Rust (``examples/rust/dmmul.rs --bench``) and
  Python (:mod:`rtpool_bench.clients_py`), each in its own process, in rounds whose order
  rotates (C, Rust, Python; then Rust, Python, C; ...), so that drift of a shared machine hits
  all three. p50/p99/p99.9/max of every call of every round, and each native p50 over Python's.
* ``async``: throughput of one C client with ``--async-calls`` calls in flight
  (``examples/c/async_calls``: ``grpc_call_async`` each, then ``grpc_wait_all``).
* ``multi``: the Ninf paper's multi-client table with C clients: 1, 2, 4, 8, 16 C processes
  released together, each calling ``dmmul`` back to back for ``--cell-calls`` calls or
  ``--cell-seconds``; calls/s in total and the per-call latency p50/p99 of the cell.

Every client checks each product against a local one; a wrong product or a failed call is a
problem (exit 1), a slow figure is not. The C and Rust programs are built from the source
checkout by make and cargo (which rebuild only what changed). Bounded: every loop by a count,
every process by a timeout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

from .stats import percentile, safe_ratio

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENTS = ("c", "rust", "python")
SECTIONS = ("latency", "async", "multi")
RUN_TIMEOUT_S = 600.0

DEFAULTS = {  # (normal, --quick)
    "rounds": (4, 2),
    "calls": (1000, 30),
    "async_calls": (1000, 50),
    "async_rounds": (3, 1),
    "clients": ((1, 2, 4, 8, 16), (1, 2)),
    "cell_calls": (2000, 20),
    "cell_seconds": (5.0, 2.0),
}


def programs() -> Dict[str, Path]:
    """Build the C examples and the Rust example (make and cargo: cached) and return their
    paths.

    Raises:
        RuntimeError: no source checkout next to this package, or a build failed.
    """
    c_dir = ROOT / "examples" / "c"
    if not (c_dir / "Makefile").exists() or not (ROOT / "Cargo.toml").exists():
        raise RuntimeError(
            f"rtpool bench clients builds the C and Rust clients from a source checkout; "
            f"none at {ROOT} (run it from a clone of rtpool, after `make install`)"
        )
    builds = (
        ["make", "-s", "-C", str(c_dir), "latency", "async_calls"],
        ["cargo", "build", "-q", "--release", "--locked", "-p", "rtpool-client"]
        + ["--example", "dmmul"],
    )
    for cmd in builds:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-2000:]}")
    return {
        "c": c_dir / "latency",
        "async": c_dir / "async_calls",
        "rust": ROOT / "target" / "release" / "examples" / "dmmul",
    }


def _run_json(cmd: List[str], env: Dict[str, str]) -> Dict:
    """Run one client program; its JSON line (a failed run raises with its stderr)."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode not in (0, 1) or not lines:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def summary(us: Sequence[float]) -> Dict[str, float | None]:
    """p50, p99, p99.9 and max (microseconds, nearest rank) and the count."""
    return {
        "count": len(us),
        "p50_us": percentile(us, 50),
        "p99_us": percentile(us, 99),
        "p99_9_us": percentile(us, 99.9),
        "max_us": max(us) if us else None,
    }


def bench_latency(args, exe: Dict[str, Path], env: Dict[str, str], say) -> Dict:
    """Section ``latency``: C, Rust and Python in rotating order, ``--rounds`` times."""
    commands = {
        "c": [str(exe["c"]), str(args.calls)],
        "rust": [str(exe["rust"]), env["RTPOOL_MASTER"], "--bench", str(args.calls)],
        "python": [sys.executable, "-m", "rtpool_bench.clients_py", str(args.calls)],
    }
    samples: Dict[str, List[float]] = {c: [] for c in CLIENTS}
    rounds, wrong = [], {c: 0 for c in CLIENTS}
    for r in range(args.rounds):
        order = CLIENTS[r % 3 :] + CLIENTS[: r % 3]
        row = {"order": list(order)}
        for client in order:
            say(f"latency: round {r + 1}/{args.rounds}, {client}")
            out = _run_json(commands[client], env)
            samples[client] += out["us"]
            wrong[client] += out["wrong"] + (args.calls - out["calls"])
            row[client] = {"p50_us": percentile(out["us"], 50), "calls": out["calls"]}
        rounds.append(row)
    result = {c: summary(samples[c]) for c in CLIENTS}
    for c in CLIENTS:
        result[c]["wrong"] = wrong[c]
    for c in ("c", "rust"):
        result[f"{c}_over_python_p50"] = safe_ratio(result[c]["p50_us"], result["python"]["p50_us"])
        result[f"{c}_over_python_p99"] = safe_ratio(result[c]["p99_us"], result["python"]["p99_us"])
    return {"n": 11, "calls_per_round": args.calls, "rounds": rounds, **result}


_ASYNC = re.compile(
    r"async calls=(\d+) n=(\d+) seconds=([\d.]+) calls_per_s=(\d+) max_abs_err=(\S+)"
)


def bench_async(args, exe: Dict[str, Path], env: Dict[str, str], say) -> Dict:
    """Section ``async``: one C client, ``--async-calls`` in flight, ``--async-rounds`` runs."""
    runs = []
    for r in range(args.async_rounds):
        say(f"async: run {r + 1}/{args.async_rounds}, {args.async_calls} calls in flight")
        cmd = [str(exe["async"]), str(args.async_calls), "11"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        m = _ASYNC.search(done.stdout)
        if m is None:
            raise RuntimeError(f"`{' '.join(cmd)}` exited {done.returncode}: {done.stderr[-2000:]}")
        runs.append(
            {
                "calls": int(m[1]),
                "seconds": float(m[3]),
                "calls_per_s": int(m[4]),
                "max_abs_err": float(m[5]),
                "right": done.returncode == 0,
            }
        )
    rates = [r["calls_per_s"] for r in runs]
    return {"n": 11, "runs": runs, "p50_calls_per_s": percentile(rates, 50)}


def bench_multi(args, exe: Dict[str, Path], env: Dict[str, str], say) -> Dict:
    """Section ``multi``: the Ninf paper's multi-client table with C client processes."""
    from .ninf.multi import ClientProcs

    def command(cfg: Dict) -> List[str]:
        return [str(exe["c"]), str(cfg["calls"]), "--go", "--seconds", str(cfg["seconds"])]

    cells = []
    for c in args.clients:
        say(f"multi: {c} C clients, {args.cell_calls} calls or {args.cell_seconds:g} s each")
        configs = [{"calls": args.cell_calls, "seconds": args.cell_seconds}] * c
        with ClientProcs(configs, ready_timeout=60 + 2 * c, command=command, env=env) as procs:
            procs.go()
            outs = procs.collect(args.cell_seconds + RUN_TIMEOUT_S)
        us = [u for out in outs for u in out["us"]]
        calls = sum(out["calls"] for out in outs)
        span = max(out["seconds"] for out in outs)
        cells.append(
            {
                "clients": c,
                "calls": calls,
                "wrong": sum(out["wrong"] for out in outs),
                "seconds": span,
                "calls_per_s": calls / span if span > 0 else None,
                "p50_us": percentile(us, 50),
                "p99_us": percentile(us, 99),
                "worst_client_p99_us": max(percentile(out["us"], 99) or 0 for out in outs),
            }
        )
    return {"n": 11, "cells": cells}


def problems(result: Dict) -> List[str]:
    """Wrong products and failed runs (a slow figure is not a problem)."""
    out = []
    for c in CLIENTS:
        wrong = result.get("latency", {}).get(c, {}).get("wrong")
        if wrong:
            out.append(f"latency: {wrong} wrong or missing {c} calls")
    for run in result.get("async", {}).get("runs", []):
        if not run["right"]:
            out.append(f"async: a wrong product (max_abs_err {run['max_abs_err']:g})")
    for cell in result.get("multi", {}).get("cells", []):
        if cell["wrong"]:
            out.append(f"multi: {cell['wrong']} wrong products with {cell['clients']} clients")
    return out
