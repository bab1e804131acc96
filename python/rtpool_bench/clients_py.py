"""The Python side of ``rtpool bench clients``: the call latency of a ``dmmul`` of n = 11 (two
968-byte arrays, about 1 KiB per argument) from ``rtpool.Client``, in its own process as the C
(``examples/c/latency.c``) and Rust (``examples/rust/dmmul.rs --bench``) clients are, printing
the same JSON line: ``{"client": "python", "calls", "wrong", "seconds", "us": [...]}``.

    RTPOOL_MASTER=HOST:PORT RTPOOL_TOKEN=... python -m rtpool_bench.clients_py ROUNDS
"""

from __future__ import annotations

import json
import os
import sys
import time

N = 11
WARM_UP = 20


def main(argv: list) -> int:
    """Run ``argv[0]`` timed calls after the warm-up; 0 when every product was right."""
    import numpy as np

    import rtpool

    rounds = max(1, int(argv[0])) if argv else 1000
    rng = np.random.default_rng(11)
    a, b = rng.random((N, N)), rng.random((N, N))
    want = a @ b
    client = rtpool.Client(os.environ["RTPOOL_MASTER"], os.environ["RTPOOL_TOKEN"])
    try:
        for _ in range(WARM_UP):
            client.call("dmmul", N, a, b)
        us, wrong = [], 0
        start = time.perf_counter()
        for _ in range(rounds):
            t0 = time.perf_counter()
            c = client.call("dmmul", N, a, b)
            us.append(round((time.perf_counter() - t0) * 1e6, 1))
            wrong += not np.allclose(c, want, rtol=1e-9, atol=0)
        seconds = time.perf_counter() - start
    finally:
        client.close()
    line = {"client": "python", "calls": rounds, "wrong": wrong, "seconds": seconds, "us": us}
    print(json.dumps(line), flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
