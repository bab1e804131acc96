"""No-op latency and throughput of two or more builds of rtpool, interleaved in one run.

Each side is a ``python/`` directory holding ``rtpool`` with its native module (a checkout's
``python/`` after ``make install``, or ``git archive REV python`` plus a copied
``_native.abi3.so``). Every round runs ``rtpool bench latency --json`` and ``rtpool bench
throughput --json`` once per side, the order reversed every other round (A B, B A, ...), so that
the machine's drift falls on both. Prints each round and the medians over rounds: latency
p50/p99/p99.9/max, throughput (the bench's median tasks/s) and the CPU seconds of the whole
process tree of the throughput run (``RUSAGE_CHILDREN``: less sensitive to a busy machine
than tasks/s).

    python3 benches/ab_noop.py --rounds 4 base=/work/baseline/python head=python

Every run is bounded (``--timeout``); nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from typing import Dict, List


def _run(python: str, path: str, bench: str, timeout: float) -> tuple:
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [python, "-m", "rtpool", "bench", bench, "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout
        ).stdout
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{bench} on {path} ran past {timeout:g} s") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The CPU time of the run's whole process tree (its children are reaped within it).
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return json.loads(out), cpu


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sides", nargs="+", metavar="NAME=PYTHONPATH")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--python", default=sys.executable, help="interpreter for every side")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per bench run")
    args = ap.parse_args(argv)
    sides: Dict[str, str] = {}
    for text in args.sides:
        name, sep, path = text.partition("=")
        if not sep or not os.path.isdir(os.path.join(path, "rtpool")):
            ap.error(f"{text!r}: give NAME=DIR, DIR holding the rtpool package")
        sides[name] = path
    lat: Dict[str, list] = {k: [] for k in sides}
    thr: Dict[str, list] = {k: [] for k in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            lr, _ = _run(args.python, sides[name], "latency", args.timeout)
            tr, cpu = _run(args.python, sides[name], "throughput", args.timeout)
            lat[name].append(lr["latency"]["rtpool"])
            thr[name].append((tr["throughput"]["median_tasks_per_s"], cpu))
            x = lat[name][-1]
            print(
                f"round {r + 1} {name}: latency p50 {x['p50_us']} p99 {x['p99_us']} p99.9 "
                f"{x['p99_9_us']} max {x['max_us']} us; throughput {thr[name][-1][0]:,.0f}/s",
                flush=True,
            )
    for name in sides:
        med = {k: statistics.median(x[k] for x in lat[name]) for k in lat[name][0] if "_us" in k}
        cpu = f", CPU {statistics.median(c for _, c in thr[name]):.2f} s"
        print(
            f"{name}: medians over {args.rounds} rounds: latency p50 {med.get('p50_us')} p99 "
            f"{med.get('p99_us')} p99.9 {med.get('p99_9_us')} max {med.get('max_us')} us; "
            f"throughput {statistics.median(t for t, _ in thr[name]):,.0f}/s{cpu}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
