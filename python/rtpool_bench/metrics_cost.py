"""What metrics cost the scheduler: ``python -m rtpool_bench.metrics_cost``.

Two embedded masters run side by side in one process, each with its own workers:

* **on**: metrics counted and the HTTP listener serving (``LocalCluster(http=...)``), with a
  reader on ``/api/events`` and ``/metrics`` scraped every second, as a dashboard and
  Prometheus would;
* **off**: ``master_options={"metrics": False}`` (``rtpool master --no-metrics``) and no HTTP.

The same measurements as ``rtpool bench latency`` (sequential no-op ``submit().result()``
round trips, HdrHistogram) and ``rtpool bench throughput`` (one package of no-op tasks,
tasks/s from submit to last result) alternate between the two in blocks, in one run, the
order flipping every round, so a noisy neighbour hits both alike. Every loop is bounded by a
count and a time budget. Prints p50/p99/p99.9/max and tasks/s per variant and the on/off
ratios (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from typing import Dict, List

from .stats import new_histogram, record_ns, summarize_histogram
from .tasks import noop


def _watch(base: str, stop: threading.Event) -> None:
    """A dashboard's and a Prometheus' load: one event stream read, /metrics every second."""

    def events() -> None:
        try:
            with urllib.request.urlopen(base + "api/events", timeout=30) as r:
                while not stop.is_set() and r.readline():
                    pass
        except OSError:
            pass

    threading.Thread(target=events, daemon=True).start()
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(base + "metrics", timeout=10) as r:
                r.read()
        except OSError:
            pass


def run(args: argparse.Namespace) -> Dict[str, object]:
    """Both variants, interleaved; returns the JSON-ready result."""
    import rtpool

    on = rtpool.LocalCluster(workers=args.workers, http="127.0.0.1:0")
    off = rtpool.LocalCluster(workers=args.workers, master_options={"metrics": False})
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(on.dashboard_url, stop), daemon=True)
    try:
        clusters = {"on": on, "off": off}
        clients = {}
        for name, cluster in clusters.items():
            cluster.wait_for_workers(args.workers, timeout=60)
            clients[name] = cluster.client()
            for _ in range(args.warmup):
                clients[name].submit(noop).result(30)
        watcher.start()
        hist = {name: new_histogram() for name in clusters}
        rates: Dict[str, List[float]] = {name: [] for name in clusters}
        deadline = time.monotonic() + args.seconds
        for r in range(args.rounds):
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
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
        stop.set()
        on.close()
        off.close()
    out: Dict[str, object] = {"workers": args.workers, "rounds": len(rates["on"])}
    for name in ("on", "off"):
        out[name] = {
            "latency": summarize_histogram(hist[name]),
            "throughput": {
                "median": round(statistics.median(rates[name]), 1),
                "best": round(max(rates[name]), 1),
                "runs": [round(x, 1) for x in rates[name]],
            },
        }
    lat = {k: out[k]["latency"] for k in ("on", "off")}  # type: ignore[index]
    thr = {k: out[k]["throughput"] for k in ("on", "off")}  # type: ignore[index]
    out["ratios_on_over_off"] = {
        **{p: round(lat["on"][p] / lat["off"][p], 3) for p in ("p50_us", "p99_us", "p99_9_us")},
        "throughput_median": round(thr["on"]["median"] / thr["off"]["median"], 3),
    }
    return out


def render(out: Dict[str, object]) -> str:
    """The result as a text table."""
    lines = [
        f"metrics on vs off, LocalCluster(workers={out['workers']}) each, "
        f"{out['rounds']} interleaved rounds",
        f"{'':5} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'max us':>8} "
        f"{'tasks/s med':>12} {'best':>9}",
    ]
    for name in ("on", "off"):
        v = out[name]
        lat, thr = v["latency"], v["throughput"]  # type: ignore[index]
        lines.append(
            f"{name:5} {lat['p50_us']:>8} {lat['p99_us']:>8} {lat['p99_9_us']:>9} "
            f"{lat['max_us']:>8} {thr['median']:>12,.0f} {thr['best']:>9,.0f}"
        )
    r = out["ratios_on_over_off"]
    lines.append(
        f"on/off: p50 {r['p50_us']:.3f}, p99 {r['p99_us']:.3f}, p99.9 {r['p99_9_us']:.3f}, "  # type: ignore[index]
        f"throughput {r['throughput_median']:.3f}"  # type: ignore[index]
    )
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtpool_bench.metrics_cost", description=__doc__)
    ap.add_argument("--workers", type=int, default=2, help="workers per master (default 2)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
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
