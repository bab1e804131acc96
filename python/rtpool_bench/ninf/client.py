"""One client process of ``rtpool bench ninf`` (``multi`` and ``ep``): ``python -m
rtpool_bench.ninf.client CONFIG_JSON``.

Each process has its own :class:`rtpool.Client`, as the Ninf paper's clients were separate
programs. The protocol with the driver is three lines:

1. the client prepares (BLAS threads, imports, its data, the connection, the interface) and
   prints ``ready``;
2. it waits for ``go`` on stdin (the driver sends it to every client at once);
3. it runs and prints one JSON line of its records, then exits.

``linpack`` mode follows the paper's model client: at ticks ``s`` seconds apart (the first one
at a random phase within ``s``), with probability ``p``, it calls ``linpack(n, A, b)`` and
waits for the answer; ticks that pass during a call are skipped (a blocking client cannot
call then). It stops calling after ``seconds`` or ``max_calls`` calls. ``ep`` mode calls
``ep(start, pairs)`` for each of its chunks in turn; ``ep_local`` computes the same chunks
in this process with no rtpool at all (the parallel ceiling of the machine).

Every wait is bounded: ``call_timeout`` per call; the driver kills a client that overruns.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Dict, List

TIMING_KEYS = ("queue_us", "worker_us", "exec_us", "wait_us", "flush_us", "total_us")


def _timings(fut) -> Dict[str, float] | None:
    """The parts of the future's ``timings`` the driver uses (None if the SDK gives none)."""
    t = getattr(fut, "timings", None)
    if not t:
        return None
    out = {k: t.get(k) for k in TIMING_KEYS}
    # The master's ACCEPTED as seen by the client, where the SDK records it.
    for key in ("accepted_us", "accept_us"):
        if t.get(key) is not None:
            out["accepted_us"] = t[key]
    return out


def _linpack_system(n: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    A = rng.random((n, n)) - 0.5
    return A, A.sum(axis=1)  # the solution is all ones


def _run_linpack(client, cfg: dict, t_go: float) -> Dict[str, object]:
    import numpy as np

    n, s, p = cfg["n"], cfg["interval_s"], cfg["probability"]
    A, b = cfg["_system"]
    rng = random.Random(cfg["seed"])
    records: List[dict] = []
    errors: Dict[str, int] = {}
    skipped = ticks = 0
    tick = t_go + rng.uniform(0, s)
    stop = t_go + cfg["seconds"]
    max_err = 0.0
    while tick < stop and len(records) < cfg["max_calls"]:
        now = time.perf_counter()
        if now < tick:
            time.sleep(tick - now)
        ticks += 1
        if rng.random() < p:
            rhs = b.copy()  # b is InOut: the answer may land in the array passed
            t0 = time.perf_counter()
            try:
                fut = client.call_async("linpack", n, A, rhs)
                x = fut.result(timeout=cfg["call_timeout"])
            except Exception as exc:  # counted, the client goes on
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                x = fut = None
            call_s = time.perf_counter() - t0
            if x is not None:
                if not records:  # check one answer per client (the check costs CPU)
                    max_err = float(np.max(np.abs(np.asarray(x) - 1.0)))
                records.append({"t": t0 - t_go, "call_s": call_s, "timings": _timings(fut)})
        tick += s
        late = time.perf_counter()
        while tick < late:  # ticks that passed during the call
            tick += s
            skipped += 1
    return {
        "records": records,
        "errors": errors,
        "ticks": ticks,
        "skipped_ticks": skipped,
        "max_abs_error": max_err,
    }


def _local_ep(start: int, pairs: int):
    """``ep`` run here (mode ``ep_local``): the parallel ceiling without rtpool."""
    import numpy as np

    from rtpool.lib.linalg import ep

    sums, counts = np.zeros(2), np.zeros(10)
    ep(start, pairs, sums, counts)
    return sums, counts


def _run_ep(client, cfg: dict, t_go: float) -> Dict[str, object]:
    import numpy as np

    records = []
    sx = sy = 0.0
    counts = np.zeros(10)
    errors: Dict[str, int] = {}
    deadline = t_go + cfg["seconds"]
    for start, pairs in cfg["chunks"]:
        if time.perf_counter() > deadline:
            errors["time budget"] = errors.get("time budget", 0) + 1
            break
        t0 = time.perf_counter()
        fut = None
        try:
            if client is None:
                sums, q = _local_ep(start, pairs)
            else:
                fut = client.call_async("ep", start, pairs)
                sums, q = fut.result(timeout=cfg["call_timeout"])
        except Exception as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            continue
        records.append(
            {
                "start": start,
                "pairs": pairs,
                "call_s": time.perf_counter() - t0,
                "timings": _timings(fut),
            }
        )
        sx, sy = sx + float(sums[0]), sy + float(sums[1])
        counts += np.asarray(q)
    return {
        "records": records,
        "errors": errors,
        "sx": sx,
        "sy": sy,
        "counts": [float(c) for c in counts],
        "end_s": time.perf_counter() - t_go,
    }


def main(argv: List[str]) -> int:
    """Run one client as configured by the JSON in ``argv[0]``; the exit code."""
    cfg = json.loads(argv[0])
    from .funcs import set_blas_threads

    set_blas_threads(cfg["blas_threads"])  # before numpy loads its BLAS
    import rtpool

    if cfg["mode"] == "linpack":
        cfg["_system"] = _linpack_system(cfg["n"], cfg["seed"])
    if cfg["mode"] == "ep_local":
        _local_ep(0, 1024)  # imports and first use, before the clock starts
        client = None
    else:
        client = rtpool.Client(cfg["address"], cfg["token"])
    try:
        if client is not None:
            client.describe(cfg["mode"])  # the interface, fetched before the clock starts
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 1
        t_go = time.perf_counter()
        run = _run_linpack if cfg["mode"] == "linpack" else _run_ep
        out = run(client, cfg, t_go)
        out["index"] = cfg["index"]
        print(json.dumps(out), flush=True)
    finally:
        if client is not None:
            client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
