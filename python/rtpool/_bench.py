"""``rtpool bench``: end-to-end latency, throughput and payload benchmarks on a LocalCluster.

* ``latency``: sequential no-op round trips ``client.submit(noop).result()``, in an
  HdrHistogram (us, 3 significant digits), next to the one-hop floor: a raw Python TCP
  ping-pong between two processes on loopback (see :mod:`rtpool._bench_floor`), measured in
  the same run. The two are interleaved in blocks (``--block`` rtpool round trips, then as many
  floor round trips, and again) so that a noisy neighbour hits both alike.
* ``throughput``: ``--tasks`` no-op tasks in one package (``submit_many``), tasks/s from the
  submit to the last result, best and median of ``--runs`` runs.
* ``payload``: ``bytes`` of 1 KiB to 16 MiB echoed by a task, next to the floor echoing the
  same size; rtpool and floor repetitions alternate one by one.

Every loop is bounded by a count and by a time budget and stops by itself. Each section starts
its own ``LocalCluster`` and stops it (and the floor's echo process) in ``finally``.

``latency --rate R`` / ``--sweep`` (open loop), ``deadline`` and ``hedge`` share this parser
and run in :mod:`rtpool._bench_rt`. ``ninf`` (the Ninf paper's grid RPC benchmarks) has its own
parser and runs in :mod:`rtpool._bench_ninf`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence

from ._bench_floor import EchoPeer, make_frame
from ._bench_stats import (
    machine_info,
    new_histogram,
    percentile,
    record_ns,
    safe_ratio,
    summarize_histogram,
)
from ._bench_tasks import echo, noop

# The floor sends frames of about the size of rtpool's own no-op frames (a SUBMIT or a
# RESULTS of one no-op task is ~100-150 bytes with its 4-byte prefix).
FLOOR_MESSAGE_BYTES = 128

LATENCY_P50_BAR = 3.0  # rtpool p50 / floor p50
LATENCY_P99_9_BAR_US = 5000
THROUGHPUT_BAR = 20_000  # tasks/s

# Default repetitions per payload size (each also bounded by --payload-seconds).
PAYLOAD_REPS = {1 << 10: 500, 64 << 10: 300, 1 << 20: 60, 16 << 20: 12}
RESULT_TIMEOUT_S = 30.0


def _cluster(workers: int):
    import rtpool

    cluster = rtpool.LocalCluster(workers=workers)
    return cluster


# --- latency ---------------------------------------------------------------------------------


def bench_latency(
    workers: int, count: int, seconds: float, warmup: int, block: int, say: Callable
) -> Dict[str, object]:
    """Sequential no-op round trips on rtpool and on the raw TCP floor, interleaved in blocks.

    Args:
        workers: Worker processes of the LocalCluster.
        count: Round trips to record on each side (at most).
        seconds: Time budget for the recorded round trips of both sides together.
        warmup: Unrecorded round trips on each side first (bounded by a quarter of ``seconds``).
        block: Round trips per block before switching sides.
        say: Progress callback taking a string.

    Returns:
        The section's JSON-ready dict.
    """
    with _cluster(workers) as cluster, EchoPeer() as peer, EchoPeer(relay=True) as chain:
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            frame = make_frame(FLOOR_MESSAGE_BYTES)
            say(f"latency: warm-up ({warmup} round trips each)")
            stop = time.perf_counter() + max(1.0, seconds / 4)
            for _ in range(warmup):
                client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
                peer.roundtrip_ns(frame)
                chain.roundtrip_ns(frame)
                if time.perf_counter() > stop:
                    break
            gc.collect()
            h_rt, h_floor, h_chain = new_histogram(), new_histogram(), new_histogram()
            points: List[Dict[str, float]] = []
            say(f"latency: up to {count} round trips each, blocks of {block}")
            deadline = time.perf_counter() + seconds
            done, blocks, timed_out = 0, 0, False
            while done < count and not timed_out:
                in_block = 0
                for _ in range(min(block, count - done)):
                    t0 = time.perf_counter_ns()
                    fut = client.submit(noop)
                    fut.result(timeout=RESULT_TIMEOUT_S)
                    record_ns(h_rt, time.perf_counter_ns() - t0)
                    points.append(fut.timings)  # read after the clock stopped
                    in_block += 1
                    if time.perf_counter() > deadline:
                        timed_out = True
                        break
                for _ in range(in_block):
                    record_ns(h_floor, peer.roundtrip_ns(frame))
                for _ in range(in_block):
                    record_ns(h_chain, chain.roundtrip_ns(frame))
                done += in_block
                blocks += 1
    rt, floor = summarize_histogram(h_rt), summarize_histogram(h_floor)
    relay_chain = summarize_histogram(h_chain)
    p50_ratio = safe_ratio(rt["p50_us"], floor["p50_us"])
    return {
        "workers": workers,
        "count": done,
        "requested_count": count,
        "stopped_by_time": done < count,
        "warmup": warmup,
        "block": block,
        "blocks": blocks,
        "floor_message_bytes": FLOOR_MESSAGE_BYTES,
        "rtpool": rt,
        "floor": floor,
        "relay_chain": relay_chain,
        "p50_ratio": p50_ratio,
        "chain_p50_ratio": safe_ratio(relay_chain["p50_us"], floor["p50_us"]),
        "p50_ratio_to_chain": safe_ratio(rt["p50_us"], relay_chain["p50_us"]),
        "p99_9_ratio": safe_ratio(rt["p99_9_us"], floor["p50_us"]),
        "breakdown_us": breakdown(points),
        "bars": {
            "p50_ratio_max": LATENCY_P50_BAR,
            "p50_ok": p50_ratio is not None and p50_ratio <= LATENCY_P50_BAR,
            "p99_9_max_us": LATENCY_P99_9_BAR_US,
            "p99_9_ok": rt["p99_9_us"] <= LATENCY_P99_9_BAR_US,
        },
    }


def breakdown(timings: Sequence[Dict[str, float] | None]) -> Dict[str, Dict[str, float]]:
    """Median and p90 of each ``Future.timings`` key over single-task round trips, plus:

    * ``master_worker_hops_us`` = worker - exec - wait - flush: master->worker->master on the
      wire, including the worker's reading, decoding, encoding and sending;
    * ``client_side_us`` = total - serialize - queue - worker - deserialize: client->master,
      master->client, and the client's encoding, sending and waking the waiting thread.
    """
    from ._bench_stats import median_p90

    keys = ("serialize_us", "queue_us", "worker_us", "exec_us", "wait_us", "flush_us")
    keys += ("deserialize_us", "total_us")
    cols: Dict[str, List[float]] = {k: [] for k in keys}
    cols["master_worker_hops_us"], cols["client_side_us"] = [], []
    for t in timings:
        if not t or any(t.get(k) is None for k in keys):
            continue
        for k in keys:
            cols[k].append(float(t[k]))
        cols["master_worker_hops_us"].append(
            t["worker_us"] - t["exec_us"] - t["wait_us"] - t["flush_us"]
        )
        cols["client_side_us"].append(
            t["total_us"] - t["serialize_us"] - t["queue_us"] - t["worker_us"] - t["deserialize_us"]
        )
    out = {}
    for k, v in cols.items():
        s = median_p90(v)
        out[k] = {"p50": _round1(s["p50"]), "p90": _round1(s["p90"])}
    return out


def _round1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


# --- throughput ------------------------------------------------------------------------------


def bench_throughput(
    workers: int, tasks: int, runs: int, run_timeout_s: float, say: Callable
) -> Dict[str, object]:
    """``tasks`` no-op tasks in one package, ``runs`` times; tasks/s from submit to last result.

    Returns:
        The section's JSON-ready dict (``runs``: one dict per run; a run that did not finish in
        ``run_timeout_s`` is recorded with ``timed_out`` and ends the section).
    """
    results: List[Dict[str, object]] = []
    with _cluster(workers) as cluster:
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            say("throughput: warm-up (1000 tasks)")
            client.submit_many(noop, range(1000)).results()
            for run in range(runs):
                say(f"throughput: run {run + 1}/{runs}, {tasks} tasks in one package")
                gc.collect()
                t0 = time.perf_counter()
                pkg = client.submit_many(noop, range(tasks))
                t_submitted = time.perf_counter()
                deadline = t0 + run_timeout_s
                finished, fut = 0, None
                try:
                    for fut in pkg.futures:
                        fut.result(timeout=max(0.001, deadline - time.perf_counter()))
                        finished += 1
                except cf.TimeoutError:  # an alias of TimeoutError only from 3.11 on
                    pass
                elapsed = time.perf_counter() - t0
                results.append(
                    {
                        "seconds": round(elapsed, 4),
                        "submit_s": round(t_submitted - t0, 4),
                        "finished": finished,
                        "tasks_per_s": round(finished / elapsed, 1),
                        "timed_out": finished < tasks,
                    }
                )
                # Drop this run's 100k futures before the next run, so its submit_many and the
                # garbage collector do not also pay for them.
                del pkg, fut
                if finished < tasks:
                    break
    rates = [r["tasks_per_s"] for r in results if not r["timed_out"]]
    best = max(rates) if rates else None
    return {
        "workers": workers,
        "tasks": tasks,
        "runs": results,
        "best_tasks_per_s": best,
        "median_tasks_per_s": round(statistics.median(rates), 1) if rates else None,
        "bars": {
            "tasks_per_s_min": THROUGHPUT_BAR,
            "ok": best is not None and best >= THROUGHPUT_BAR,
        },
    }


# --- payload ---------------------------------------------------------------------------------


def _size_stats(samples_ns: Sequence[int], size: int) -> Dict[str, object]:
    us = [s / 1000 for s in samples_ns]
    p50 = percentile(us, 50)
    return {
        "count": len(us),
        "p50_us": round(p50, 1),
        "max_us": round(max(us), 1),
        # 2 x size: the bytes go out and come back. MB = 10^6 bytes.
        "mb_per_s": round(2 * size / p50, 1) if p50 else None,
    }


def bench_payload(
    workers: int, sizes: Sequence[int], max_reps: int, seconds_per_size: float, say: Callable
) -> Dict[str, object]:
    """Echo ``bytes`` of each size through a task and through the floor, alternating.

    Args:
        sizes: Payload sizes in bytes.
        max_reps: Repetitions per size on each side (0: the defaults of ``PAYLOAD_REPS``).
        seconds_per_size: Time budget per size for both sides together.

    Returns:
        The section's JSON-ready dict; ``sizes`` has one dict per size.
    """
    rows = []
    with _cluster(workers) as cluster, EchoPeer() as peer:
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            for size in sizes:
                reps = max_reps or PAYLOAD_REPS.get(size, 20)
                say(f"payload: {_fmt_size(size)}, up to {reps} round trips each")
                payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
                frame = make_frame(size)
                for _ in range(2):  # warm-up: first use of the size on both sides
                    client.submit(echo, payload).result(timeout=RESULT_TIMEOUT_S)
                    peer.roundtrip_ns(frame)
                gc.collect()
                rt_ns: List[int] = []
                floor_ns: List[int] = []
                wrong = 0
                deadline = time.perf_counter() + seconds_per_size
                while len(rt_ns) < reps and (len(rt_ns) < 3 or time.perf_counter() < deadline):
                    t0 = time.perf_counter_ns()
                    back = client.submit(echo, payload).result(timeout=RESULT_TIMEOUT_S)
                    rt_ns.append(time.perf_counter_ns() - t0)
                    wrong += back != payload
                    floor_ns.append(peer.roundtrip_ns(frame))
                rt, floor = _size_stats(rt_ns, size), _size_stats(floor_ns, size)
                rows.append(
                    {
                        "size_bytes": size,
                        "rtpool": rt,
                        "floor": floor,
                        "p50_ratio": safe_ratio(rt["p50_us"], floor["p50_us"]),
                        "wrong_echoes": wrong,
                    }
                )
    return {"workers": workers, "sizes": rows}


# --- output ----------------------------------------------------------------------------------


def _fmt_size(size: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div} {unit}"
    return f"{size} B"


def _parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def render(result: Dict[str, object], console) -> None:
    """Print each section present in ``result`` as a rich table."""
    m = result["machine"]
    console.print(
        f"[bold]rtpool bench[/] on {m['usable_cpus']} CPUs ({m['cpu_model']}), "
        f"Python {m['python']}, load average before {m['loadavg_before']}"
    )
    if "latency" in result:
        _render_latency(result["latency"], console)
    if "throughput" in result:
        _render_throughput(result["throughput"], console)
    if "payload" in result:
        _render_payload(result["payload"], console)


def _render_latency(s: Dict[str, object], console) -> None:
    from rich.table import Table

    from ._bench_stats import fmt_ratio, fmt_us, verdict

    t = Table(
        title=f"Latency: {s['count']} sequential no-op round trips each, "
        f"LocalCluster(workers={s['workers']})",
        title_justify="left",
    )
    t.add_column("")
    for col in ("p50", "p90", "p99", "p99.9", "max", "mean"):
        t.add_column(col, justify="right")
    for name, h in (
        ("rtpool", s["rtpool"]),
        ("TCP floor", s["floor"]),
        ("relay chain", s["relay_chain"]),
    ):
        t.add_row(
            name,
            *(fmt_us(h[k]) for k in ("p50_us", "p90_us", "p99_us", "p99_9_us", "max_us")),
            fmt_us(h["mean_us"]),
        )
    console.print(t)
    b = s["bars"]
    console.print(
        f"rtpool p50 / floor p50 = {fmt_ratio(s['p50_ratio'])} (bar <= {LATENCY_P50_BAR}x: "
        f"{verdict(b['p50_ok'])}); rtpool p99.9 = {fmt_us(s['rtpool']['p99_9_us'])} "
        f"= {fmt_ratio(s['p99_9_ratio'])} floor p50 (bar <= {fmt_us(LATENCY_P99_9_BAR_US)}: "
        f"{verdict(b['p99_9_ok'])})"
    )
    console.print(
        f"relay chain p50 / floor p50 = {fmt_ratio(s['chain_p50_ratio'])}: the same three "
        f"processes and four hops as rtpool with no work at all; rtpool p50 / relay chain p50 "
        f"= {fmt_ratio(s['p50_ratio_to_chain'])}"
    )
    _render_breakdown(s["breakdown_us"], console)
    console.print(
        f"[dim]HdrHistogram, us, 3 significant digits; blocks of {s['block']} rtpool round "
        f"trips, then as many floor and as many relay-chain round trips "
        f"({s['floor_message_bytes']}-byte frames, "
        f"TCP_NODELAY), alternating, after {s['warmup']} warm-up round trips each"
        f"{'; stopped by the time budget' if s['stopped_by_time'] else ''}.[/]"
    )


_BREAKDOWN_ROWS = (
    ("client: pickling", "serialize_us"),
    ("client side: encode, send, both client hops, wake-up", "client_side_us"),
    ("master: queue (receipt to assignment)", "queue_us"),
    ("master<->worker hops incl. worker I/O", "master_worker_hops_us"),
    ("worker: receipt to start", "wait_us"),
    ("worker: execution", "exec_us"),
    ("worker: end to send", "flush_us"),
    ("client: unpickling", "deserialize_us"),
    ("total (Future.timings)", "total_us"),
)


def _render_breakdown(b: Dict[str, Dict[str, float]], console) -> None:
    from rich.table import Table

    from ._bench_stats import fmt_us

    t = Table(title="Where a no-op round trip goes (Future.timings)", title_justify="left")
    t.add_column("part")
    t.add_column("p50", justify="right")
    t.add_column("p90", justify="right")
    for label, key in _BREAKDOWN_ROWS:
        t.add_row(label, fmt_us(b[key]["p50"]), fmt_us(b[key]["p90"]))
    console.print(t)


def _render_throughput(s: Dict[str, object], console) -> None:
    from rich.table import Table

    from ._bench_stats import verdict

    t = Table(
        title=f"Throughput: {s['tasks']} no-op tasks in one package, "
        f"LocalCluster(workers={s['workers']})",
        title_justify="left",
    )
    for col in ("run", "submit_many", "submit to last result", "tasks/s"):
        t.add_column(col, justify="right")
    for i, r in enumerate(s["runs"], 1):
        note = " [red](timed out)[/]" if r["timed_out"] else ""
        t.add_row(
            str(i),
            f"{r['submit_s']:.3f} s",
            f"{r['seconds']:.3f} s{note}",
            f"{r['tasks_per_s']:,.0f}",
        )
    console.print(t)
    best, med = s["best_tasks_per_s"], s["median_tasks_per_s"]
    console.print(
        f"best {best or 0:,.0f} tasks/s, median {med or 0:,.0f} tasks/s "
        f"(bar >= {THROUGHPUT_BAR:,}/s: {verdict(s['bars']['ok'])})"
    )


def _render_payload(s: Dict[str, object], console) -> None:
    from rich.table import Table

    from ._bench_stats import fmt_ratio, fmt_us

    t = Table(
        title=f"Payload: bytes echoed by a task, LocalCluster(workers={s['workers']})",
        title_justify="left",
    )
    t.add_column("size")
    t.add_column("n", justify="right")
    for col in ("p50", "max", "MB/s", "TCP p50", "TCP MB/s", "x TCP"):
        t.add_column(col, justify="right")
    for row in s["sizes"]:
        rt, fl = row["rtpool"], row["floor"]
        t.add_row(
            _fmt_size(row["size_bytes"]) + (" [red]wrong echo[/]" if row["wrong_echoes"] else ""),
            str(rt["count"]),
            fmt_us(rt["p50_us"]),
            fmt_us(rt["max_us"]),
            f"{rt['mb_per_s']:,.0f}",
            fmt_us(fl["p50_us"]),
            f"{fl['mb_per_s']:,.0f}",
            fmt_ratio(row["p50_ratio"]),
        )
    console.print(t)
    console.print(
        "[dim]p50/max/MB/s: rtpool; TCP: the floor, same size (its max is in --json); x TCP: "
        "rtpool p50 / floor p50. MB/s = 2 x size / p50 (out and back, MB = 10^6 bytes); exact "
        "percentiles of the samples; rtpool and floor round trips alternate one by one.[/]"
    )


# --- CLI -------------------------------------------------------------------------------------


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
        choices=("latency", "throughput", "payload", "all", "deadline", "hedge"),
        help="latency: no-op round trips (open loop with --rate or --sweep); throughput: one "
        "big package; payload: 1 KiB-16 MiB echoes; all: the three in sequence; deadline: "
        "10 ms tasks with a 50 ms deadline at 80%% of capacity; hedge: one slow worker, with "
        "and without hedging (and `rtpool bench ninf --help`: the Ninf paper's grid RPC "
        "benchmarks)",
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
        "--sizes", default="1K,64K,1M,16M", help="comma-separated sizes (default 1K,64K,1M,16M)"
    )
    g.add_argument(
        "--payload-reps",
        type=int,
        default=0,
        help="round trips per size each (default: 500, 300, 60, 12 for 1K, 64K, 1M, 16M)",
    )
    g.add_argument(
        "--payload-seconds", type=float, default=8.0, help="time budget per size (default 8)"
    )
    from . import _bench_rt

    _bench_rt.add_arguments(ap)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rtpool bench``; ``argv`` excludes the subcommand.

    Returns:
        0 when every section ran to the end, 1 when a run timed out or an echo came back
        wrong, 2 on bad arguments. Missing a speed bar is reported, not an error.
    """
    if argv and argv[0] == "ninf":
        from . import _bench_ninf

        return _bench_ninf.main(argv[1:])
    ap = build_parser()
    args = ap.parse_args(argv)
    from . import _bench_rt

    if args.which in ("deadline", "hedge") or (
        args.which == "latency" and _bench_rt.is_open_loop(args)
    ):
        return _bench_rt.run(args, ap)
    args.count = 5000 if args.count is None else args.count
    args.seconds = 20.0 if args.seconds is None else args.seconds
    args.warmup = 500 if args.warmup is None else args.warmup
    try:
        sizes = [_parse_size(s) for s in args.sizes.split(",") if s.strip()]
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
        result["payload"] = bench_payload(
            args.workers, sizes, args.payload_reps, args.payload_seconds, say
        )
    if args.json:
        print(json.dumps(result))
    else:
        from rich.console import Console

        render(result, Console())
    ok = all(not r["timed_out"] for r in result.get("throughput", {}).get("runs", []))
    ok = ok and all(not r["wrong_echoes"] for r in result.get("payload", {}).get("sizes", []))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
