"""rtpool's benchmarks and demo: ``rtpool bench ...`` and ``rtpool demo``.

A package of its own next to :mod:`rtpool`, so that ``import rtpool`` never loads it, nor its
dependencies (``rich``, ``hdrhistogram``, ``matplotlib``, ``chess``: the ``bench`` extra,
``pip install 'rtpool[bench]'``; the Ninf benchmarks also need ``numpy`` and ``scipy``, the
``linalg`` extra). ``rtpool.cli`` hands ``bench`` and ``demo`` over to :func:`main`.

Modules by concern: :mod:`~rtpool_bench.cli` (parsers and dispatch), ``roundtrip`` (closed-loop
latency, throughput, payload) and ``floor`` (the raw TCP floor), ``openloop`` (open-loop
sending), ``interleave`` (interleaved blocks), ``openlatency``, ``deadline`` and ``hedge`` (the
open-loop benches), ``realtime`` (SCHED_FIFO mode), ``recovery`` (worker loss, master restart,
journal), ``deadline_load`` (``deadline --background-load``), ``ninf/`` (the Ninf paper's grid
RPC benchmarks), ``demo`` (the factorization demo), ``chess_engine``/``chess_game``/``chess_cli``
(``rtpool demo chess``), ``cpu`` (CPU use and hogs), ``stats`` (percentiles, machine facts),
``tasks`` (task functions the workers import), ``*_render`` (the tables).
"""

from __future__ import annotations

import importlib.util
from typing import List, Sequence

__all__ = ["main", "missing_requirements"]

# Import name -> the extra that installs it.
_NEEDS = {"rich": "bench", "hdrh": "bench"}
_NEEDS_LINALG = {"numpy": "linalg", "scipy": "linalg"}


def missing_requirements(command: str, argv: Sequence[str]) -> List[str]:
    """The extras (``bench``, ``linalg``) that ``rtpool COMMAND ARGV`` needs and that are not
    installed; empty when it can run. Looks the modules up without importing them."""
    needs = dict(_NEEDS)
    if command == "bench" and argv[:1] == ["ninf"]:
        needs.update(_NEEDS_LINALG)
    if command == "demo" and argv[:1] == ["chess"]:
        needs["chess"] = "bench"
    missing = {extra for name, extra in needs.items() if importlib.util.find_spec(name) is None}
    return sorted(missing)


def main(command: str, argv: Sequence[str]) -> int:
    """Run ``rtpool bench ARGV`` (``command="bench"``) or ``rtpool demo ARGV``; the exit code."""
    from . import cli

    if command == "demo":
        return cli.demo_main(argv)
    return cli.bench_main(argv)
