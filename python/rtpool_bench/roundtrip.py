"""``rtpool bench latency|throughput|payload|all``: end-to-end latency, throughput and payload
benchmarks on a LocalCluster.

* ``latency``: sequential no-op round trips ``client.submit(noop).result()``, in an
  HdrHistogram (us, 3 significant digits), next to the one-hop floor: a raw Python TCP
  ping-pong between two processes on loopback (see :mod:`rtpool_bench.floor`), measured in
  the same run. The two are interleaved in blocks (``--block`` rtpool round trips, then as many
  floor round trips, and again) so that a noisy neighbour hits both alike.
* ``throughput``: ``--tasks`` no-op tasks in one package (``submit_many``), tasks/s from the
  submit to the last result, best and median of ``--runs`` runs.
* ``payload``: in :mod:`rtpool_bench.payload` (1 KiB to 256 MiB, TCP and shared memory, with
  the raw TCP and memcpy floors).

Every loop is bounded by a count and by a time budget and stops by itself. Each section starts
its own ``LocalCluster`` and stops it (and the floor's echo process) in ``finally``.

The parser is in :mod:`rtpool_bench.cli`, the tables in :mod:`rtpool_bench.roundtrip_render`;
``latency --rate R`` / ``--sweep`` (open loop), ``deadline`` and ``hedge`` share the parser and
run in :mod:`rtpool_bench.openloop_cli`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gc
import statistics
import time
from typing import Callable, Dict, List, Sequence

from .floor import EchoPeer, make_frame
from .floor_aio import AioRelayChain
from .stats import (
    new_histogram,
    percentile,
    record_ns,
    safe_ratio,
    summarize_histogram,
)
from .tasks import noop

# The floor sends frames of about the size of rtpool's own no-op frames (a SUBMIT or a
# RESULTS of one no-op task is ~100-150 bytes with its 4-byte prefix).
FLOOR_MESSAGE_BYTES = 128

LATENCY_P50_BAR = 3.0  # rtpool p50 / floor p50
AIO_RELAY_P50_BAR = 1.2  # rtpool p50 / asyncio relay p50 (issue 25)
LATENCY_P99_9_BAR_US = 5000
THROUGHPUT_BAR = 20_000  # tasks/s

# Default repetitions per payload size (each also bounded by --payload-seconds).
RESULT_TIMEOUT_S = 30.0


def _cluster(workers: int):
    import rtpool

    cluster = rtpool.LocalCluster(workers=workers)
    return cluster


# --- latency ---------------------------------------------------------------------------------


def bench_latency(
    workers: int, count: int, seconds: float, warmup: int, block: int, say: Callable
) -> Dict[str, object]:
    """Sequential no-op round trips on rtpool and on three floors, interleaved in blocks: the
    one-hop TCP ping-pong, the blocking relay chain and the asyncio relay chain (issue 25's
    2-hop floor: client -> asyncio relay -> echo worker and back).

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
    # Floors: 1-hop ping-pong, the blocking relay chain, the asyncio relay (2 hops).
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(_cluster(workers))
        peer = stack.enter_context(EchoPeer())
        chain = stack.enter_context(EchoPeer(relay=True))
        aio_chain = stack.enter_context(AioRelayChain())
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            frame = make_frame(FLOOR_MESSAGE_BYTES)
            say(f"latency: warm-up ({warmup} round trips each)")
            stop = time.perf_counter() + max(1.0, seconds / 4)
            for _ in range(warmup):
                client.submit(noop).result(timeout=RESULT_TIMEOUT_S)
                peer.roundtrip_ns(frame)
                chain.roundtrip_ns(frame)
                aio_chain.roundtrip_ns(frame)
                if time.perf_counter() > stop:
                    break
            gc.collect()
            h_rt, h_floor, h_chain = new_histogram(), new_histogram(), new_histogram()
            h_aio = new_histogram()
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
                for _ in range(in_block):
                    record_ns(h_aio, aio_chain.roundtrip_ns(frame))
                done += in_block
                blocks += 1
    rt, floor = summarize_histogram(h_rt), summarize_histogram(h_floor)
    relay_chain, aio_relay = summarize_histogram(h_chain), summarize_histogram(h_aio)
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
        "aio_relay": aio_relay,
        "p50_ratio": p50_ratio,
        "chain_p50_ratio": safe_ratio(relay_chain["p50_us"], floor["p50_us"]),
        "p50_ratio_to_chain": safe_ratio(rt["p50_us"], relay_chain["p50_us"]),
        "p50_ratio_to_aio_relay": safe_ratio(rt["p50_us"], aio_relay["p50_us"]),
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
    from .stats import median_p90

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


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def fmt_size(size: int) -> str:
    """``size`` bytes as ``1 KiB``, ``16 MiB`` or ``100 B``."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div} {unit}"
    return f"{size} B"
