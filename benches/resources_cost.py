"""The cost of a one-class resource request on the hot path: no-op throughput (submit_many) and
sequential round trips with and without ``options(resources={"tok": 1})``, interleaved in one
LocalCluster whose workers announce ``tok=1000000`` (``RTPOOL_WORKER_RESOURCES``), so the
request never limits how many tasks a worker holds: what is measured is the class path itself.

    python benches/resources_cost.py [TASKS=50000] [ROUNDS=4]
"""

import gc
import os
import statistics
import sys
import time

# Before the cluster starts: its worker processes inherit it.
os.environ["RTPOOL_WORKER_RESOURCES"] = "tok=1000000"

import rtpool  # noqa: E402
from rtpool_bench.tasks import noop  # noqa: E402

TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
SEQ = 2000


def throughput(client) -> float:
    gc.collect()
    t0 = time.perf_counter()
    client.submit_many(noop, range(TASKS)).results(120)
    return TASKS / (time.perf_counter() - t0)


def round_trips(client) -> tuple:
    xs = []
    for _ in range(SEQ):
        t0 = time.perf_counter_ns()
        client.submit(noop).result(timeout=30)
        xs.append((time.perf_counter_ns() - t0) / 1000)
    xs.sort()
    return xs[len(xs) // 2], xs[int(len(xs) * 0.99)]


def main() -> None:
    with rtpool.LocalCluster(workers=2) as cluster:
        cluster.wait_for_workers(2, timeout=30)
        with cluster.client() as plain:
            sides = {"plain": plain, "tok=1": plain.options(resources={"tok": 1})}
            for c in sides.values():
                c.submit_many(noop, range(2000)).results(60)
            rates = {n: [] for n in sides}
            trips = {n: [] for n in sides}
            for r in range(ROUNDS):
                order = list(sides.items())
                if r % 2:
                    order.reverse()
                for name, c in order:
                    rates[name].append(throughput(c))
                    trips[name].append(round_trips(c))
                line = ", ".join(
                    f"{n} {rates[n][-1]:,.0f}/s p50 {trips[n][-1][0]:.0f} us" for n in sides
                )
                print(f"round {r + 1}: {line}", flush=True)
            for n in sides:
                p50 = statistics.median(x[0] for x in trips[n])
                p99 = statistics.median(x[1] for x in trips[n])
                print(
                    f"{n}: throughput median {statistics.median(rates[n]):,.0f}/s; "
                    f"round trip p50 median {p50:.0f} us, p99 median {p99:.0f} us"
                )
            a, b = statistics.median(rates["plain"]), statistics.median(rates["tok=1"])
            print(f"tok=1 / plain throughput: {b / a:.3f}; per task: {1e6 / b - 1e6 / a:+.2f} us")


if __name__ == "__main__":
    main()
