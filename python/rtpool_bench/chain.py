"""``rtpool bench chain``: a chain ``f -> g -> h`` of large intermediate results
(``docs/data.md``).

``f(n)`` makes an array of ``--size-mb`` MiB (float64), ``g(x)`` scales it (a new array of the
same size), ``h(x)`` sums it. Three ways, interleaved (rotating order in every repetition):

* ``local``: ``h(g(f(n)))`` in a process of its own, started once (as a worker process is),
  timed inside it: the floor, in the same conditions as a worker process. The row
  ``local_here`` runs it in the bench's own process (which embeds the master and receives
  ``relayed``'s 64 MiB results), outside the bar: its p50 was 0.8 to 2.4 times that of
  ``local`` over four runs, not a steady cost;
* ``kept``: ``client.options(keep=True)``: ``f`` and ``g`` keep their results on their
  workers, ``g`` and ``h`` take the futures as arguments (``submit(g, fut)``): the master
  places each where its input is when that worker is free, the values move worker to worker;
* ``relayed``: today's road, each intermediate result comes back to the client and goes out
  again as the next task's argument.

For each: the makespan (submit of ``f`` to ``h``'s result; min, p50, max over the repetitions),
its ratio to ``local`` (the bar: within 1.2x), and the bytes the client's connection received
(the kernel's count, ``TCP_INFO``; the bar for ``kept``: none of the intermediates).

Why ``local`` varies so much on a shared VM (46 to 2,300 ms in one session): its time is the
first touch of two fresh 64 MiB arrays. numpy asks for transparent huge pages
(``madvise``): about 1,100 page faults and 30-50 ms when the kernel has free huge pages, and a
stall in direct compaction when it must make them (a VM whose memory is page cache and whose
neighbours allocate: ``compact_stall`` in ``/proc/vmstat``); without huge pages, 32,770 faults
and 100-200 ms; and a process waiting for one of two busy CPUs, the largest part in our runs
(``local``'s CPU time was 15-16 ms p50 with 1,088 faults and no compaction stall, its wall
time 15 to 490 ms). So the bench reports, beside
each way's makespans, the CPU time and page faults per run of the process it runs in (for
``local``, its child: the work itself; for the others, the client's share) and the system's
compaction stalls during the way's runs: a slow ``local`` with few faults and low CPU waited
for a CPU; one with compaction stalls waited for memory. The bench turns shared memory off
(``RTPOOL_SHM=0``, for this process and the cluster it starts): with it, ``relayed`` values
would reach the client through ``/dev/shm`` and the count would miss
them. Every loop is bounded by ``--repeat`` and ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import sys
import time
from typing import Any, Callable, Dict, List, Sequence

from .stats import machine_info

BAR_RATIO = 1.2
_TCPI_BYTES_RECEIVED = 128  # struct tcp_info (Linux 4.1+)


def make(n_bytes: int) -> Any:
    """``f``: an array of ``n_bytes`` bytes."""
    import numpy as np

    return np.arange(n_bytes // 8, dtype=np.float64)


def scale(x: Any) -> Any:
    """``g``: a new array, ``2 x``."""
    return x * 2.0


def total(x: Any) -> float:
    """``h``: the sum."""
    return float(x.sum())


def _compact_stalls() -> int:
    """The system's direct-compaction stalls so far (``/proc/vmstat``; 0 where unknown)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("compact_stall "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _received(client: Any) -> int:
    info = client._conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, _TCPI_BYTES_RECEIVED)[0]


def _local(n: int) -> float:
    return total(scale(make(n)))


def timed_local(n: int) -> tuple:
    """``local`` in the child process: ``(seconds, value, cpu ms, page faults)``, timed there."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    value = _local(n)
    elapsed = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000
    return elapsed, value, cpu, r1.ru_minflt - r0.ru_minflt


def _kept(client: Any, n: int) -> float:
    kept = client.options(keep=True)
    return client.submit(total, kept.submit(scale, kept.submit(make, n))).result(timeout=600)


def _relayed(client: Any, n: int) -> float:
    x = client.submit(make, n).result(timeout=600)
    y = client.submit(scale, x).result(timeout=600)
    return client.submit(total, y).result(timeout=600)


def run(args: argparse.Namespace, say: Callable[[str], None]) -> Dict[str, Any]:
    """Run the bench; the figures as a dict."""
    import rtpool

    # Every byte that reaches the client crosses its TCP connection, where TCP_INFO counts it
    # (see the module docstring); the workers inherit it.
    os.environ["RTPOOL_SHM"] = "0"
    n = int(args.size_mb * (1 << 20))
    ways = ("local", "kept", "relayed", "local_here")
    times: Dict[str, List[float]] = {w: [] for w in ways}
    received: Dict[str, List[int]] = {w: [] for w in ways}
    cpu_ms: Dict[str, List[float]] = {w: [] for w in ways}
    faults: Dict[str, List[int]] = {w: [] for w in ways}
    stalls: Dict[str, int] = {w: 0 for w in ways}
    failed: Dict[str, str] = {}
    import multiprocessing

    child = multiprocessing.get_context("spawn").Pool(1)
    child.apply(timed_local, (8 * 1024,))  # started and imported before the first timing
    with child, rtpool.LocalCluster(workers=args.workers) as cluster:
        cluster.wait_for_workers(args.workers, timeout=60)
        client = cluster.client()
        run_way = {
            "local": lambda: child.apply(timed_local, (n,)),
            "local_here": lambda: _local(n),
            "kept": lambda: _kept(client, n),
            "relayed": lambda: _relayed(client, n),
        }
        client.submit(total, client.submit(scale, client.submit(make, 8 * 1024))).result(60)
        expected = _local(n)
        end = time.monotonic() + args.seconds
        for rep in range(args.repeat):
            if time.monotonic() > end:
                say(f"chain: time budget of {args.seconds:g} s spent after {rep} repetitions")
                break
            order = ways[rep % 4 :] + ways[: rep % 4]
            for way in order:
                if way in failed:
                    continue
                before = _received(client)
                r0, c0 = resource.getrusage(resource.RUSAGE_SELF), _compact_stalls()
                t0 = time.perf_counter()
                try:
                    value = run_way[way]()
                except Exception as exc:  # noqa: BLE001 - reported, the other ways go on
                    failed[way] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    say(f"chain {way} failed: {failed[way]}")
                    continue
                elapsed = time.perf_counter() - t0
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                if way == "local":  # timed in the child: its own figures
                    elapsed, value, cpu, flt = value
                    cpu_ms[way].append(cpu)
                    faults[way].append(flt)
                else:
                    cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000
                    cpu_ms[way].append(cpu)
                    faults[way].append(r1.ru_minflt - r0.ru_minflt)
                stalls[way] += _compact_stalls() - c0
                if value != expected:
                    raise RuntimeError(f"chain {way}: got {value}, expected {expected}")
                times[way].append(elapsed)
                received[way].append(_received(client) - before)
            say(
                f"chain rep {rep + 1}: "
                + ", ".join(f"{w} {times[w][-1] * 1000:.1f} ms" for w in ways if times[w])
            )
    base = statistics.median(times["local"])
    out: Dict[str, Any] = {
        "bench": "chain",
        "size_mb": args.size_mb,
        "workers": args.workers,
        "repetitions": len(times["local"]),
        "machine": machine_info(),
        "ways": {},
    }
    for way in ways:
        if not times[way]:
            out["ways"][way] = {"failed": failed.get(way, "no run")}
            continue
        ts = sorted(times[way])
        out["ways"][way] = {
            "min_ms": round(ts[0] * 1000, 2),
            "p50_ms": round(statistics.median(ts) * 1000, 2),
            "max_ms": round(ts[-1] * 1000, 2),
            "ratio_to_local": round(statistics.median(ts) / base, 3),
            "client_rx_bytes_max": max(received[way]),
            "client_rx_bytes_p50": int(statistics.median(received[way])),
            "process_cpu_ms_p50": round(statistics.median(cpu_ms[way]), 1),
            "process_faults_p50": int(statistics.median(faults[way])),
            "compact_stalls": stalls[way],
        }
    kept = out["ways"]["kept"]
    out["bar"] = {
        "ratio": BAR_RATIO,
        "met": "failed" not in kept
        and kept["ratio_to_local"] <= BAR_RATIO
        and kept["client_rx_bytes_max"] < n // 100,
    }
    return out


def render(out: Dict[str, Any]) -> str:
    """The figures as a table."""
    lines = [
        f"chain f -> g -> h, {out['size_mb']:g} MiB intermediates, {out['workers']} workers, "
        f"{out['repetitions']} repetitions (interleaved; shared VM: noisy); cpu ms and faults: "
        "of the way's process per run (p50), stalls: the system's compaction stalls",
        f"{'way':<10} {'min ms':>9} {'p50 ms':>9} {'max ms':>9} {'x local':>8} "
        f"{'client rx bytes':>16} {'cpu ms':>7} {'faults':>7} {'stalls':>6}",
    ]
    for way, w in out["ways"].items():
        if "failed" in w:
            lines.append(f"{way:<10} failed: {w['failed']}")
            continue
        lines.append(
            f"{way:<10} {w['min_ms']:>9.1f} {w['p50_ms']:>9.1f} {w['max_ms']:>9.1f} "
            f"{w['ratio_to_local']:>8.2f} {w['client_rx_bytes_max']:>16,} "
            f"{w['process_cpu_ms_p50']:>7.1f} {w['process_faults_p50']:>7} "
            f"{w['compact_stalls']:>6}"
        )
    met = "met" if out["bar"]["met"] else "NOT met"
    lines.append(
        f"bar (kept within {out['bar']['ratio']}x of local, no intermediate through the "
        f"client): {met}"
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``rtpool bench chain`` argument parser."""
    ap = argparse.ArgumentParser(
        prog="rtpool bench chain",
        description="A chain f -> g -> h of large intermediate results: local, kept on the "
        "workers (futures as arguments), and relayed through the client.",
    )
    ap.add_argument("--size-mb", type=float, default=64.0, help="intermediate size (64 MiB)")
    ap.add_argument("--workers", type=int, default=2, help="workers (2)")
    ap.add_argument("--repeat", type=int, default=7, help="repetitions of each way (7)")
    ap.add_argument("--seconds", type=float, default=120.0, help="time budget (120 s)")
    ap.add_argument("--quick", action="store_true", help="1 MiB, 2 repetitions (tests)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    return ap


def main(argv: Sequence[str]) -> int:
    """Entry point of ``rtpool bench chain``; ``argv`` excludes ``chain``."""
    args = build_parser().parse_args(list(argv))
    if args.quick:
        args.size_mb, args.repeat = 1.0, 2
    if args.size_mb <= 0 or args.repeat < 1 or args.workers < 1:
        print(
            "rtpool bench chain: --size-mb, --repeat and --workers must be positive",
            file=sys.stderr,
        )
        return 2

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out = run(args, say)
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0
