"""What metrics cost the scheduler: ``python -m rtpool_bench.metrics_cost``.

Three embedded masters run side by side in one process, each with its own workers:

* **off**: ``master_options={"metrics": False}`` (``rtpool master --no-metrics``), no HTTP;
* **metrics**: metrics counted (the default), no HTTP listener;
* **http**: metrics counted and the HTTP listener serving (``LocalCluster(http=...)``), with
  a dashboard's and a Prometheus' load from another process: ``/api/events`` read and
  ``/metrics`` scraped every second.

The same measurements as ``rtpool bench latency`` (sequential no-op ``submit().result()``
round trips, HdrHistogram) and ``rtpool bench throughput`` (one package of no-op tasks,
tasks/s from submit to last result) alternate between the three in blocks, in one run, the
order rotating every round, so a noisy neighbour hits all alike. Every loop is bounded by a
count and a time budget. Prints p50/p99/p99.9/max and tasks/s per variant and the ratios to
``off`` (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Dict, List

from .stats import new_histogram, record_ns, summarize_histogram
from .tasks import noop

# The watcher runs in a process of its own, so its reads cost the measuring client no GIL.
WATCHER = """
import sys, threading, time, urllib.request
base = sys.argv[1]
def events():
    try:
        with urllib.request.urlopen(base + "api/events", timeout=30) as r:
            while r.readline():
                pass
    except OSError:
        pass
threading.Thread(target=events, daemon=True).start()
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    time.sleep(1.0)
    try:
        with urllib.request.urlopen(base + "metrics", timeout=10) as r:
            r.read()
    except OSError:
        pass
"""

VARIANTS = ("off", "metrics", "http")


def run(args: argparse.Namespace) -> Dict[str, object]:
    """The three variants, interleaved; returns the JSON-ready result."""
    import rtpool

    clusters = {
        "off": rtpool.LocalCluster(workers=args.workers, master_options={"metrics": False}),
        "metrics": rtpool.LocalCluster(workers=args.workers),
        "http": rtpool.LocalCluster(workers=args.workers, http="127.0.0.1:0"),
    }
    watcher = None
    try:
        clients = {}
        for name, cluster in clusters.items():
            cluster.wait_for_workers(args.workers, timeout=60)
            clients[name] = cluster.client()
            for _ in range(args.warmup):
                clients[name].submit(noop).result(30)
        base = clusters["http"].dashboard_url
        watcher = subprocess.Popen([sys.executable, "-c", WATCHER, base, str(args.seconds)])
        hist = {name: new_histogram() for name in VARIANTS}
        rates: Dict[str, List[float]] = {name: [] for name in VARIANTS}
        deadline = time.monotonic() + args.seconds
        for r in range(args.rounds):
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
            for name in order:
                c = clients[name]
                for _ in range(args.block):
                    t0 = time.perf_counter_ns()
                    c.submit(noop).result(30)
                    record_ns(hist[name], time.perf_counter_ns() - t0)
            for name in order:
                t0 = time.perf_counter()
                clients[name].submit_many(noop, range(args.tasks)).results(args.run_timeout)
                rates[name].append(args.tasks / (time.perf_counter() - t0))
            if time.monotonic() > deadline:
                break
    finally:
        if watcher is not None:
            watcher.kill()
            watcher.wait()
        for cluster in clusters.values():
            cluster.close()
    out: Dict[str, object] = {"workers": args.workers, "rounds": len(rates["off"])}
    for name in VARIANTS:
        out[name] = {
            "latency": summarize_histogram(hist[name]),
            "throughput": {
                "median": round(statistics.median(rates[name]), 1),
                "best": round(max(rates[name]), 1),
                "runs": [round(x, 1) for x in rates[name]],
            },
        }
    ratios = {}
    for name in ("metrics", "http"):
        lat, base_lat = out[name]["latency"], out["off"]["latency"]  # type: ignore[index]
        thr, base_thr = out[name]["throughput"], out["off"]["throughput"]  # type: ignore[index]
        ratios[name] = {
            **{p: round(lat[p] / base_lat[p], 3) for p in ("p50_us", "p99_us", "p99_9_us")},
            "throughput_median": round(thr["median"] / base_thr["median"], 3),
        }
    out["ratios_to_off"] = ratios
    return out


def render(out: Dict[str, object]) -> str:
    """The result as a text table."""
    lines = [
        f"metrics off / on / on with HTTP, LocalCluster(workers={out['workers']}) each, "
        f"{out['rounds']} interleaved rounds",
        f"{'':8} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'max us':>8} "
        f"{'tasks/s med':>12} {'best':>9}",
    ]
    for name in VARIANTS:
        v = out[name]
        lat, thr = v["latency"], v["throughput"]  # type: ignore[index]
        lines.append(
            f"{name:8} {lat['p50_us']:>8} {lat['p99_us']:>8} {lat['p99_9_us']:>9} "
            f"{lat['max_us']:>8} {thr['median']:>12,.0f} {thr['best']:>9,.0f}"
        )
    for name, r in out["ratios_to_off"].items():  # type: ignore[union-attr]
        lines.append(
            f"{name}/off: p50 {r['p50_us']:.3f}, p99 {r['p99_us']:.3f}, "
            f"p99.9 {r['p99_9_us']:.3f}, throughput {r['throughput_median']:.3f}"
        )
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtpool_bench.metrics_cost", description=__doc__)
    ap.add_argument("--workers", type=int, default=2, help="workers per master (default 2)")
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default 12)")
    ap.add_argument("--block", type=int, default=1000, help="round trips per block (default 1000)")
    ap.add_argument("--tasks", type=int, default=20_000, help="tasks per package (default 20000)")
    ap.add_argument("--warmup", type=int, default=500, help="warm-up round trips (default 500)")
    ap.add_argument("--seconds", type=float, default=600, help="time budget (default 600)")
    ap.add_argument("--run-timeout", type=float, default=120, help="per package (default 120)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out = run(args)
    print(json.dumps(out) if args.json else render(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
