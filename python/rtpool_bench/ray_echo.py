"""Ray's echo round trip, for ``rtpool bench payload --ray-python PYTHON`` (issue 16's bar).

Ray is never a dependency of rtpool: this file runs as a script under another interpreter
(a scratch venv with ``ray`` and ``numpy``) and imports nothing of rtpool. It starts a local
Ray (``num_cpus`` from its argument), then answers one request per line on stdin,
``<size> <bytes|numpy>``, with one line on stdout, ``<nanoseconds> <1 if the echo was equal>``:
one ``ray.get(echo.remote(x))`` round trip, so the parent can interleave it with rtpool's.
An empty line or EOF ends it.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import numpy as np
    import ray

    ray.init(
        num_cpus=int(sys.argv[1]) if len(sys.argv) > 1 else 2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
    )

    @ray.remote
    def echo(x):
        return x

    ray.get(echo.remote(b"warm-up"))
    print(f"ready {ray.__version__}", flush=True)
    payloads = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            break
        size_text, kind = line.split()
        size = int(size_text)
        key = (size, kind)
        if key not in payloads:
            arr = (np.arange(size, dtype=np.uint32) % 251).astype(np.uint8)
            payloads[key] = arr.tobytes() if kind == "bytes" else arr
        x = payloads[key]
        t0 = time.perf_counter_ns()
        back = ray.get(echo.remote(x))
        elapsed = time.perf_counter_ns() - t0
        same = back == x if kind == "bytes" else bool(np.array_equal(back, x))
        del back
        print(f"{elapsed} {int(same)}", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
