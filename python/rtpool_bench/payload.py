"""``rtpool bench payload``: echo payloads of 1 KiB to 256 MiB through a task, over TCP and
over shared memory, with the raw floors measured in the same run (issue 16).

For each size, the bench alternates one round trip of each variant: a task echoing ``bytes``
and a numpy array, with shared memory off (segmented TCP frames, out-of-band pickle buffers)
and on (``/dev/shm`` segments, only an envelope over TCP), a task returning a new copy of the
array over shared memory (``numpy-new/shm``: an echo's result is its argument's bytes and
travels as offsets into the argument's segment, a new array is copied once more), then the
comparators and floors (issue 25 item 2): the ``bytes`` echoed through a minimal asyncio
pickle pool and a raw 2-hop relay (:mod:`rtpool_bench.minpool`: client -> asyncio master ->
worker and back, the bar rtpool must meet at every size), a raw Python TCP echo
(:class:`~rtpool_bench.floor.EchoPeer`: one hop, no master, no pickling) and two ``memcpy``
(numpy copies) of the payload, the least any echo that copies once each way pays.
MB/s = 2 x size / p50 round trip (MB = 10^6 bytes), as issue 16 measured Ray. Each size's row
names rtpool's best default variant (``bytes`` or numpy over the transport the client picks)
and its speed against the pool and the relay (their p50 / its p50: 1.00x or more meets the bar).

With ``--ray-python PYTHON`` (a venv with ``ray`` and ``numpy``), Ray's
``ray.get(echo.remote(x))`` of the same ``bytes`` and array joins the rotation
(:mod:`rtpool_bench.ray_echo`, a process of that interpreter, one request per round trip), so
rtpool and Ray are compared within one run.
"""

from __future__ import annotations

import gc
import os
import subprocess
import time
from typing import Callable, Dict, List, Sequence

from .floor import EchoPeer, make_frame
from .minpool import MinimalPool
from .stats import percentile
from .tasks import echo, echo_copy

#: Round trips per size and variant at most (the time budget may stop earlier): sizes up to
#: a key take its count.
PAYLOAD_REPS = (
    (256 << 10, 200),
    (1 << 20, 100),
    (16 << 20, 12),
    (64 << 20, 5),
)
DEFAULT_SIZES = "1K,4K,16K,32K,64K,128K,256K,512K,1M,16M"
VARIANTS = (
    ("bytes", "tcp"),
    ("numpy", "tcp"),
    ("bytes", "shm"),
    ("numpy", "shm"),
    ("numpy-new", "shm"),
)
RESULT_TIMEOUT_S = 120.0
#: The master's frame limit and outbound buffer for the bench: a 256 MiB payload over TCP
#: needs a frame above 256 MiB, and a queue that holds it while a heartbeat waits behind it.
MAX_FRAME_MB = 1024


def _stats(samples_ns: Sequence[int], size: int) -> Dict[str, object]:
    us = [s / 1000 for s in samples_ns]
    p50 = percentile(us, 50)
    return {
        "count": len(us),
        "p50_us": round(p50, 1),
        "p99_us": round(percentile(us, 99), 1),
        "max_us": round(max(us), 1),
        "mb_per_s": round(2 * size / p50, 1) if p50 else None,
    }


def reps_for(size: int) -> int:
    """The default count of round trips per variant at ``size`` bytes."""
    return next((n for top, n in PAYLOAD_REPS if size <= top), 3)


def best_default(row: Dict[str, object], shared_memory: bool) -> tuple:
    """(name, stats) of rtpool's fastest default path at one size: ``bytes`` or a numpy array
    echoed over the transport the client picks by itself (shared memory when it has it)."""
    transport = "shm" if shared_memory else "tcp"
    found = [(k, row["variants"][k]) for k in (f"bytes/{transport}", f"numpy/{transport}")]
    found = [(k, st) for k, st in found if st and st.get("p50_us")]
    return min(found, key=lambda kv: kv[1]["p50_us"]) if found else ("-", {})


def speed_ratio(ours: Dict[str, object], theirs: Dict[str, object]) -> float | None:
    """How many times faster rtpool's p50 is than ``theirs`` (>= 1: rtpool as fast or faster)."""
    if not ours or not theirs or not ours.get("p50_us") or not theirs.get("p50_us"):
        return None
    return round(theirs["p50_us"] / ours["p50_us"], 3)


def _payload(kind: str, size: int):
    import numpy as np

    arr = (np.arange(size, dtype=np.uint32) % 251).astype(np.uint8)
    return arr.tobytes() if kind == "bytes" else arr  # numpy and numpy-new: an array


def _same(kind: str, a, b) -> bool:
    if kind == "bytes":
        return a == b
    import numpy as np

    return bool(np.array_equal(a, b))


def _roundtrip(client, payload, kind: str):
    """One echo: (nanoseconds, whether it came back equal)."""
    task = echo_copy if kind == "numpy-new" else echo
    t0 = time.perf_counter_ns()
    back = client.submit(task, payload).result(timeout=RESULT_TIMEOUT_S)
    elapsed = time.perf_counter_ns() - t0
    return elapsed, _same(kind, back, payload)


class RayEcho:
    """Ray's echo in a process of another interpreter (:mod:`rtpool_bench.ray_echo`)."""

    def __init__(self, python: str, cpus: int) -> None:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_echo.py")
        self._proc = subprocess.Popen(
            [python, script, str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            self.close()
            raise RuntimeError(f"{python} could not start Ray (is ray installed in it?)")
        #: Ray's version, for the report.
        self.version = ready[1] if len(ready) > 1 else "?"

    def roundtrip(self, size: int, kind: str):
        """One echo: (nanoseconds, whether it came back equal)."""
        self._proc.stdin.write(f"{size} {kind}\n")
        self._proc.stdin.flush()
        ns, ok = self._proc.stdout.readline().split()
        return int(ns), ok == "1"

    def close(self) -> None:
        proc = self._proc
        try:
            proc.stdin.close()
            proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        proc.stdout.close()


def bench_payload(
    workers: int,
    sizes: Sequence[int],
    max_reps: int,
    seconds_per_size: float,
    say: Callable,
    ray_python: str | None = None,
) -> Dict[str, object]:
    """Run the bench; returns the JSON-ready section (``sizes``: one dict per size)."""
    ray = None
    if ray_python:
        say(f"starting Ray under {ray_python}")
        ray = RayEcho(ray_python, workers)
    try:
        out = _bench(workers, sizes, max_reps, seconds_per_size, say, ray)
    finally:
        if ray is not None:
            ray.close()
    if ray is not None:
        out["ray_version"] = ray.version
    return out


def _bench(workers, sizes, max_reps, seconds_per_size, say, ray) -> Dict[str, object]:
    import numpy as np

    import rtpool

    rows: List[Dict[str, object]] = []
    with (
        rtpool.LocalCluster(
            workers=workers,
            master_options={"max_frame_mb": MAX_FRAME_MB, "max_buffered_mb": MAX_FRAME_MB},
        ) as cluster,
        EchoPeer() as peer,
        MinimalPool("pool", workers) as pool,
        MinimalPool("relay", workers) as relay,
    ):
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            conn = client._conn
            owner = conn.shm_owner
            for size in sizes:
                reps = max_reps or reps_for(size)
                say(f"payload: {size} bytes, up to {reps} round trips per variant")
                payloads = {kind: _payload(kind, size) for kind in ("bytes", "numpy")}
                payloads["numpy-new"] = payloads["numpy"]
                frame = make_frame(size)
                src = payloads["numpy"]
                dst = np.empty_like(src)
                variants = [v for v in VARIANTS if v[1] == "tcp" or owner]
                samples: Dict[str, List[int]] = {f"{k}/{t}": [] for k, t in variants}
                floors: Dict[str, List[int]] = {"pool": [], "relay": [], "tcp": [], "memcpy": []}
                body = frame[4:]
                wrong = 0

                if ray is not None:
                    samples.update({"ray/bytes": [], "ray/numpy": []})
                for kind, transport in variants:  # warm-up: first use of the size
                    conn.shm_owner = owner if transport == "shm" else None
                    _roundtrip(client, payloads[kind], kind)
                if ray is not None:
                    ray.roundtrip(size, "bytes")
                    ray.roundtrip(size, "numpy")
                pool.roundtrip(payloads["bytes"])
                relay.roundtrip_frame(body)
                gc.collect()
                deadline = time.perf_counter() + seconds_per_size
                n = 0
                while n < reps and (n < 3 or time.perf_counter() < deadline):
                    for kind, transport in variants:
                        conn.shm_owner = owner if transport == "shm" else None
                        elapsed, ok = _roundtrip(client, payloads[kind], kind)
                        samples[f"{kind}/{transport}"].append(elapsed)
                        wrong += not ok
                    for kind in ("bytes", "numpy") if ray is not None else ():
                        elapsed, ok = ray.roundtrip(size, kind)
                        samples[f"ray/{kind}"].append(elapsed)
                        wrong += not ok
                    elapsed, back = pool.roundtrip(payloads["bytes"])
                    floors["pool"].append(elapsed)
                    wrong += back != payloads["bytes"]
                    elapsed, ok = relay.roundtrip_frame(body)
                    floors["relay"].append(elapsed)
                    wrong += not ok
                    floors["tcp"].append(peer.roundtrip_ns(frame))
                    t0 = time.perf_counter_ns()
                    np.copyto(dst, src)
                    np.copyto(src, dst)
                    floors["memcpy"].append(time.perf_counter_ns() - t0)
                    n += 1
                conn.shm_owner = owner
                row = {
                    "size_bytes": size,
                    "variants": {k: _stats(v, size) for k, v in samples.items()},
                    "floors": {k: _stats(v, size) for k, v in floors.items()},
                    "wrong_echoes": wrong,
                }
                name, ours = best_default(row, bool(owner))
                row["best_default"] = name
                row["vs_pool"] = speed_ratio(ours, row["floors"]["pool"])
                row["vs_relay"] = speed_ratio(ours, row["floors"]["relay"])
                rows.append(row)
    return {"workers": workers, "shared_memory": bool(owner), "sizes": rows}
