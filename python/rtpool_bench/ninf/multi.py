"""Sections ``multi`` and ``ep`` of ``rtpool bench ninf``: client processes
(:mod:`rtpool_bench.ninf.client`) released together against one LocalCluster, the workers'
CPU, and the figures of the paper's multi-client tables and of NAS EP."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Sequence

from ..cpu import CpuMeter, cpu_snapshot
from .common import (
    CALL_TIMEOUT_S,
    linpack_system,
    loadavg,
    max_min_mean,
    start_cluster,
    wait_served,
)

# --- client processes ------------------------------------------------------------------------


def python_client(cfg: Dict) -> List[str]:
    """The command of one :mod:`rtpool_bench.ninf.client` process configured by ``cfg``."""
    return [sys.executable, "-m", "rtpool_bench.ninf.client", json.dumps(cfg)]


class ClientProcs:
    """Client processes, as a context manager: started on entry (each prints ``ready``),
    released together by :meth:`go` (a ``go`` line on their stdin), their JSON lines read by
    :meth:`collect`; any still running on exit is killed by PID.

    Args:
        configs: One per process, turned into its command by ``command``.
        ready_timeout: Seconds for every process to print ``ready``.
        command: ``cfg -> argv``; default :func:`python_client` (``rtpool bench clients``
            passes the C clients' command).
        env: Extra environment of every process.
    """

    def __init__(
        self,
        configs: Sequence[Dict],
        ready_timeout: float,
        command: Callable[[Dict], List[str]] = python_client,
        env: Dict[str, str] | None = None,
    ) -> None:
        self.configs = list(configs)
        self.ready_timeout = ready_timeout
        self.command = command
        self.extra_env = dict(env or {})
        self.procs: List[subprocess.Popen] = []
        self.errs: List = []
        self.lines: queue.Queue = queue.Queue()

    def __enter__(self) -> ClientProcs:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env.update(self.extra_env)
        try:
            for i, cfg in enumerate(self.configs):
                err = tempfile.TemporaryFile()
                self.errs.append(err)
                p = subprocess.Popen(
                    self.command(cfg),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=env,
                    text=True,
                )
                self.procs.append(p)
                threading.Thread(target=self._read, args=(i, p), daemon=True).start()
            self._wait_lines("ready", self.ready_timeout)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _read(self, i: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            self.lines.put((i, line.strip()))
        self.lines.put((i, None))

    def _wait_lines(self, what: str, timeout: float) -> Dict[int, str]:
        got: Dict[int, str] = {}
        end = time.monotonic() + timeout
        while len(got) < len(self.procs):
            try:
                i, line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(self._failure(f"no {what} within {timeout:g} s")) from None
            if line is None:
                if i in got:
                    continue  # exited after its line
                raise RuntimeError(self._failure(f"client {i} exited before its {what}", i))
            if what == "ready" and line != "ready":
                continue
            got[i] = line
        return got

    def _failure(self, what: str, i: int | None = None) -> str:
        tail = ""
        for j, err in enumerate(self.errs):
            if i is not None and j != i:
                continue
            err.seek(0)
            text = err.read().decode(errors="replace")[-1500:]
            if text:
                tail = f"; client {j} stderr: {text}"
                break
        return f"bench client processes: {what}{tail}"

    def go(self) -> None:
        """Release every client at once."""
        for p in self.procs:
            p.stdin.write("go\n")
            p.stdin.flush()

    def collect(self, timeout: float) -> List[Dict]:
        """Each client's JSON line, by client index, waiting at most ``timeout``."""
        got = self._wait_lines("result", timeout)
        return [json.loads(got[i]) for i in range(len(self.procs))]

    def __exit__(self, *exc_info: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.wait(2)
                except subprocess.TimeoutExpired:
                    p.kill()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        for err in self.errs:
            err.close()


def _client_config(cluster, mode: str, index: int, args, **extra) -> Dict[str, object]:
    cfg = {
        "mode": mode,
        "index": index,
        "address": cluster.address,
        "token": cluster.client_token,
        "blas_threads": args.blas_threads,
        "call_timeout": CALL_TIMEOUT_S,
    }
    cfg.update(extra)
    return cfg


# --- multi -----------------------------------------------------------------------------------


def bench_multi(args, say: Callable) -> Dict[str, object]:
    """Section ``multi``: the paper's multi-client Linpack table on ``--workers`` workers."""
    cells = []
    with start_cluster(args.workers, args.blas_threads) as cluster:
        cluster.wait_for_workers(args.workers, timeout=60)
        client = cluster.client()
        wait_served(client, ["linpack"])
        for n in args.multi_sizes:
            A, b = linpack_system(n, seed=n)
            warm = [client.call_async("linpack", n, A, b.copy()) for _ in range(2 * args.workers)]
            for f in warm:
                f.result(timeout=CALL_TIMEOUT_S)
            for c in args.clients:
                say(f"multi: n={n}, c={c}, {args.cell_seconds:g} s")
                cells.append(_multi_cell(cluster, n, c, args))
    return {
        "workers": args.workers,
        "blas_threads": args.blas_threads,
        "interval_s": args.interval,
        "probability": args.probability,
        "cell_seconds": args.cell_seconds,
        "cells": cells,
    }


def _multi_cell(cluster, n: int, c: int, args) -> Dict[str, object]:
    configs = [
        _client_config(
            cluster,
            "linpack",
            i,
            args,
            n=n,
            seed=1000 * n + 17 * c + i,
            interval_s=args.interval,
            probability=args.probability,
            seconds=args.cell_seconds,
            max_calls=args.max_calls,
        )
        for i in range(c)
    ]
    with ClientProcs(configs, ready_timeout=60 + 2 * c) as procs:
        meter = CpuMeter(cluster.worker_pids)
        machine0 = cpu_snapshot([])
        t0 = time.perf_counter()
        procs.go()
        outs = procs.collect(args.cell_seconds + CALL_TIMEOUT_S + 30)
        wall = time.perf_counter() - t0
        cpu = meter.percent()
        machine1 = cpu_snapshot([])
    load = loadavg()
    cell = summarize_cell(n, c, outs, cpu_pct=cpu, load1=load[0] if load else None, wall_s=wall)
    busy = None
    if machine0 and machine1 and machine1[1] > machine0[1]:
        busy = round(100.0 * (machine1[0] - machine0[0]) / (machine1[1] - machine0[1]), 1)
    cell["machine_busy_pct"] = busy  # every process on the machine, clients included
    return cell


def summarize_cell(
    n: int,
    c: int,
    outs: Sequence[Dict],
    cpu_pct: float | None,
    load1: float | None,
    wall_s: float,
) -> Dict[str, object]:
    """One row of the multi-client table from the clients' records (see docs/benchmarks.md
    for the definitions)."""
    from rtpool.lib.linalg import linpack_flops

    flops = linpack_flops(n)
    moved = 8 * n * n + 2 * 8 * n  # A and b out, b back
    perf, resp, wait, thru, thru_net = [], [], [], [], []
    errors: Dict[str, int] = {}
    response_kind = "client_side"
    for out in outs:
        for k, v in out["errors"].items():
            errors[k] = errors.get(k, 0) + v
        for rec in out["records"]:
            call_s, t = rec["call_s"], rec["timings"]
            perf.append(flops / call_s / 1e6)
            if not t:
                continue
            r = response_s(t)
            if "accepted_us" in t:
                response_kind = "accepted"
            resp.append(r)
            wait.append(((t.get("queue_us") or 0) + (t.get("wait_us") or 0)) / 1e6)
            exec_s = (t.get("exec_us") or 0) / 1e6
            if call_s - exec_s > 0:
                thru.append(moved / (call_s - exec_s) / 1e6)
            net_s = call_s - exec_s - wait[-1]
            if net_s > 0:
                thru_net.append(moved / net_s / 1e6)
    return {
        "n": n,
        "c": c,
        "performance_mflops": max_min_mean(perf),
        "response_s": max_min_mean(resp),
        "response_kind": response_kind,
        "wait_s": max_min_mean(wait),
        "throughput_mb_s": max_min_mean(thru),
        "throughput_net_mb_s": max_min_mean(thru_net),
        "cpu_pct": None if cpu_pct is None else round(cpu_pct, 3),
        "load1": load1,
        "times": len(perf),
        "errors": errors,
        "skipped_ticks": sum(o.get("skipped_ticks", 0) for o in outs),
        "ticks": sum(o.get("ticks", 0) for o in outs),
        "max_abs_error": max((o.get("max_abs_error", 0.0) for o in outs), default=0.0),
        "wall_s": round(wall_s, 3),
    }


def response_s(t: Dict[str, float]) -> float:
    """A call's Response: from sending its CALL to the master's ACCEPTED where the SDK records
    it; otherwise the client side of the call: its time minus the master's (queue) and the
    worker leg's (``worker_us``: the hops to and from the worker, its wait and execution),
    i.e. encoding, the client <-> master hops and decoding."""
    if t.get("accepted_us") is not None:
        return t["accepted_us"] / 1e6
    parts = (t.get("queue_us") or 0) + (t.get("worker_us") or 0)
    return max(0.0, ((t.get("total_us") or 0) - parts) / 1e6)


# --- ep --------------------------------------------------------------------------------------


def ep_chunks(m: int, chunks: int) -> List[List[int]]:
    """``[start, pairs]`` of ``chunks`` ranges covering the 2^m pairs."""
    total = 1 << m
    bounds = [total * i // chunks for i in range(chunks + 1)]
    return [[lo, hi - lo] for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def ep_verify(m: int, sx: float, sy: float, local: Dict | None = None) -> Dict[str, object]:
    """NAS's check: both sums within a relative 1e-8 of ``EP_VERIFY[m]`` (or, for an m it has
    no values for, of the local run of the same ranges)."""
    from rtpool.lib.linalg import EP_VERIFY

    if m in EP_VERIFY:
        ref, source = EP_VERIFY[m], "EP_VERIFY"
    elif local is not None:
        ref, source = (local["sx"], local["sy"]), "ep_local"
    else:
        return {"verified": None, "source": None}
    err = max(abs(sx - ref[0]) / abs(ref[0]), abs(sy - ref[1]) / abs(ref[1]))
    return {"verified": err <= 1e-8, "source": source, "rel_err": err, "ref": list(ref)}


def bench_ep(args, say: Callable) -> Dict[str, object]:
    """Section ``ep``: EP over 2^m pairs in ``--ep-chunks`` chunks: first computed by 1 and by
    ``--workers`` plain processes (no rtpool: the machine's parallel ceiling), then as remote
    ``ep`` calls by c client processes."""
    from rtpool.lib.linalg import EP_VERIFY, ep_local

    chunks = ep_chunks(args.ep_m, args.ep_chunks)
    reference = None
    if args.ep_m not in EP_VERIFY:
        say(f"ep: reference run of 2^{args.ep_m} pairs here")
        sx, sy, _ = ep_local(args.ep_m, args.ep_chunks)
        reference = {"sx": sx, "sy": sy}
    local = []
    for p in sorted({1, args.workers}):
        say(f"ep: m={args.ep_m}, {len(chunks)} chunks in {p} plain processes")
        local.append(_ep_run(None, p, chunks, args, reference))
    runs = []
    with start_cluster(args.workers, args.blas_threads) as cluster:
        cluster.wait_for_workers(args.workers, timeout=60)
        client = cluster.client()
        wait_served(client, ["ep"])
        for f in [client.call_async("ep", 0, 4096) for _ in range(2 * args.workers)]:
            f.result(timeout=CALL_TIMEOUT_S)  # warm-up: numpy and the interface on each worker
        for c in args.ep_clients:
            say(f"ep: m={args.ep_m}, {len(chunks)} chunks, c={c}")
            runs.append(_ep_run(cluster, c, chunks, args, reference))
    return {
        "m": args.ep_m,
        "pairs": 1 << args.ep_m,
        "chunks": len(chunks),
        "workers": args.workers,
        "local": local,
        "runs": runs,
    }


def _ep_run(cluster, c: int, chunks, args, reference) -> Dict[str, object]:
    """One EP run by c processes: remote calls through ``cluster``, or (None) computed in the
    processes themselves."""
    mode = "ep" if cluster is not None else "ep_local"
    configs = []
    for i in range(c):
        cfg = {"mode": mode, "index": i, "blas_threads": args.blas_threads}
        cfg.update(call_timeout=CALL_TIMEOUT_S, chunks=chunks[i::c], seconds=args.ep_seconds)
        if cluster is not None:
            cfg.update(address=cluster.address, token=cluster.client_token)
        configs.append(cfg)
    with ClientProcs(configs, ready_timeout=60 + 2 * c) as procs:
        t0 = time.perf_counter()
        procs.go()
        outs = procs.collect(args.ep_seconds + CALL_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
    sx = sum(o["sx"] for o in outs)
    sy = sum(o["sy"] for o in outs)
    counts = [sum(o["counts"][k] for o in outs) for k in range(10)]
    calls = [r for o in outs for r in o["records"]]
    errors: Dict[str, int] = {}
    for o in outs:
        for k, v in o["errors"].items():
            errors[k] = errors.get(k, 0) + v
    timed = [r["timings"] for r in calls if r["timings"]]
    return {
        "c": c,
        "remote": cluster is not None,
        "seconds": elapsed,
        "mops": 2 ** (args.ep_m + 1) / elapsed / 1e6,
        "calls": len(calls),
        "call_s": max_min_mean([r["call_s"] for r in calls]),
        "exec_s": max_min_mean([t["exec_us"] / 1e6 for t in timed]),
        "wait_s": max_min_mean([(t["queue_us"] + t["wait_us"]) / 1e6 for t in timed]),
        "sx": sx,
        "sy": sy,
        "counts": counts,
        "gaussian_pairs": sum(counts),
        "errors": errors,
        **ep_verify(args.ep_m, sx, sy, reference),
    }
