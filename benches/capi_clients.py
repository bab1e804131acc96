"""C client next to the Python client, same run (issue 27): call latency of a ~1 KiB-argument
dmmul (n = 11) from C (examples/c/latency) and from Python, and the async-call throughput of
one C client with CALLS calls in flight (examples/c/async_calls). Prints the figures.

    .venv/bin/python benches/capi_clients.py [--rounds 1000] [--calls 1000]

Needs the C examples built (`make -C examples/c`). Bounded: rounds and calls are counts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import numpy as np

import rtpool

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "c"


def python_latency(client, rounds: int) -> str:
    a, b = np.random.rand(11, 11), np.random.rand(11, 11)
    for _ in range(20):
        client.call("dmmul", 11, a, b)
    us = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        client.call("dmmul", 11, a, b)
        us.append((time.perf_counter() - t0) * 1e6)
    p = np.percentile(us, [50, 99, 99.9])
    figures = f"p50={p[0]:.0f} p99={p[1]:.0f} p99.9={p[2]:.0f} max={max(us):.0f}"
    return f"python latency_us {figures} rounds={rounds}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    with rtpool.LocalCluster(workers=2, serve=["rtpool.lib.linalg"]) as cluster:
        cluster.wait_for_workers()
        env = {**os.environ, "RTPOOL_MASTER": cluster.address, "RTPOOL_TOKEN": cluster.client_token}
        client = cluster.client()
        # Interleaved: C, Python, C, Python, so drift of a shared machine hits both.
        for _ in range(2):
            c = subprocess.run(
                [EXAMPLES / "latency", str(args.rounds)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            )
            print(c.stdout.strip())
            print(python_latency(client, args.rounds))
        t = subprocess.run(
            [EXAMPLES / "async_calls", str(args.calls), "8"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        print(t.stdout.strip())


if __name__ == "__main__":
    main()
