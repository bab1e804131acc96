"""``rtpool bench payload``: echo payloads of 1 KiB to 256 MiB through a task, over TCP and
over shared memory, with the raw floors measured in the same run (issue 16).

For each size, the bench alternates one round trip of each variant: a task echoing ``bytes``
and a numpy array, with shared memory off (segmented TCP frames, out-of-band pickle buffers)
and on (``/dev/shm`` segments, only an envelope over TCP), a task returning a new copy of the
array over shared memory (``numpy-new/shm``: an echo's result is its argument's bytes and
travels as offsets into the argument's segment, a new array is copied once more), then the
floors: a raw Python TCP
echo (:class:`~rtpool_bench.floor.EchoPeer`: one hop, no master, no pickling) and two
``memcpy`` (numpy copies) of the payload, the least any echo that copies once each way pays.
MB/s = 2 x size / p50 round trip (MB = 10^6 bytes), as issue 16 measured Ray.

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
from .stats import percentile
from .tasks import echo, echo_copy

#: Round trips per size and variant at most (the time budget may stop earlier).
PAYLOAD_REPS = {
    1 << 10: 300,
    64 << 10: 200,
    1 << 20: 60,
    16 << 20: 12,
    64 << 20: 5,
    256 << 20: 3,
}
DEFAULT_SIZES = "1K,64K,1M,16M,64M,256M"
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
    ):
        cluster.wait_for_workers(workers, timeout=30)
        with cluster.client() as client:
            conn = client._conn
            owner = conn.shm_owner
            for size in sizes:
                reps = max_reps or PAYLOAD_REPS.get(size, 5)
                say(f"payload: {size} bytes, up to {reps} round trips per variant")
                payloads = {kind: _payload(kind, size) for kind in ("bytes", "numpy")}
                payloads["numpy-new"] = payloads["numpy"]
                frame = make_frame(size)
                src = payloads["numpy"]
                dst = np.empty_like(src)
                variants = [v for v in VARIANTS if v[1] == "tcp" or owner]
                samples: Dict[str, List[int]] = {f"{k}/{t}": [] for k, t in variants}
                floors: Dict[str, List[int]] = {"tcp": [], "memcpy": []}
                wrong = 0

                if ray is not None:
                    samples.update({"ray/bytes": [], "ray/numpy": []})
                for kind, transport in variants:  # warm-up: first use of the size
                    conn.shm_owner = owner if transport == "shm" else None
                    _roundtrip(client, payloads[kind], kind)
                if ray is not None:
                    ray.roundtrip(size, "bytes")
                    ray.roundtrip(size, "numpy")
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
                    floors["tcp"].append(peer.roundtrip_ns(frame))
                    t0 = time.perf_counter_ns()
                    np.copyto(dst, src)
                    np.copyto(src, dst)
                    floors["memcpy"].append(time.perf_counter_ns() - t0)
                    n += 1
                conn.shm_owner = owner
                rows.append(
                    {
                        "size_bytes": size,
                        "variants": {k: _stats(v, size) for k, v in samples.items()},
                        "floors": {k: _stats(v, size) for k, v in floors.items()},
                        "wrong_echoes": wrong,
                    }
                )
    return {"workers": workers, "shared_memory": bool(owner), "sizes": rows}


def render(s: Dict[str, object], console) -> None:
    """The section as a rich table: one row per size and variant, floors last."""
    from rich.table import Table

    from .roundtrip import fmt_size
    from .stats import fmt_us

    t = Table(
        title=f"Payload echo through a task, LocalCluster(workers={s['workers']}); "
        "floors in the same run",
        title_justify="left",
    )
    for col in ("size", "variant", "n", "p50", "p99", "max", "MB/s"):
        t.add_column(col, justify="left" if col in ("size", "variant") else "right")
    for row in s["sizes"]:
        size = fmt_size(row["size_bytes"]) + (" [red]wrong echo[/]" if row["wrong_echoes"] else "")
        entries = list(row["variants"].items()) + [
            (f"floor: {k}", v) for k, v in row["floors"].items()
        ]
        for i, (name, st) in enumerate(entries):
            t.add_row(
                size if i == 0 else "",
                name,
                str(st["count"]),
                fmt_us(st["p50_us"]),
                fmt_us(st["p99_us"]),
                fmt_us(st["max_us"]),
                f"{st['mb_per_s']:,.0f}" if st["mb_per_s"] else "-",
            )
    console.print(t)
    if s.get("ray_version"):
        for row in s["sizes"]:
            v = row["variants"]
            ours, ray = v.get("numpy/shm") or v["numpy/tcp"], v.get("ray/numpy")
            if ray and ours["mb_per_s"] and ray["mb_per_s"]:
                console.print(
                    f"{fmt_size(row['size_bytes'])}: rtpool numpy "
                    f"{ours['mb_per_s'] / ray['mb_per_s']:.2f}x Ray {s['ray_version']}'s MB/s"
                )
    console.print(
        "[dim]variant: what the task echoes / how it travels (tcp: segmented frames; shm: "
        "/dev/shm segments). floor tcp: raw Python TCP echo, one hop; floor memcpy: two numpy "
        "copies. MB/s = 2 x size / p50 (MB = 10^6 bytes). Variants and floors alternate one "
        "round trip each. The VM is shared: compare rows of one run only.[/]"
    )
