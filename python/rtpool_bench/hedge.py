"""``rtpool bench hedge``: one of the workers 10x slower; all-fast, one-slow and one-slow with
``options(hedge=True)`` blocks interleaved at the same rate (see
:mod:`rtpool_bench.openloop_cli`); with ``--one-at-a-time N``, the same three one task at a
time instead (:mod:`rtpool_bench.hedge_sequential`)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Dict

from .interleave import (
    Config,
    defaults,
    probe,
    round2,
    run_interleaved,
    write_plot,
)
from .openloop import (
    histogram_of,
    measure_capacity,
    run_open_loop,
    set_timer_slack_ns,
)
from .stats import percentile, safe_ratio
from .tasks import spin, spin_maybe_slow, spin_maybe_slow_hedged

HEDGE_P99_RATIO_BAR = 2.0


# --- hedge -----------------------------------------------------------------------------------


def _start_worker(cluster, env_extra: Dict[str, str]) -> subprocess.Popen:
    """One more ``rtpool worker`` for ``cluster``, as LocalCluster starts them, with extra
    environment (LocalCluster gives all its workers the same one)."""
    paths = [p or os.getcwd() for p in sys.path]
    env = dict(os.environ)
    env.update(env_extra)
    env["RTPOOL_WORKER_TOKEN"] = cluster.worker_token
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", cluster.address]
    cmd += ["--procs", "1", "--parent-pid", str(os.getpid())]
    return subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )


def _hedge_keep(fut) -> tuple | None:
    """``(exec ms, ms spun)`` of a task that succeeded, else None."""
    if fut.exception() is not None or fut.timings is None:
        return None
    return fut.timings["exec_us"] / 1000, fut.result()


def bench_hedge(args, say: Callable) -> Dict[str, object]:
    """``rtpool bench hedge`` (see the module's docstring)."""
    import rtpool
    from rtpool.cluster import _stop_workers

    if args.workers < 2:
        raise ValueError("rtpool bench hedge needs --workers 2 or more (one of them is slow)")
    d = defaults("hedge", args)
    task_ms = d["task_ms"]
    one_at_a_time = getattr(args, "one_at_a_time", 0)
    if one_at_a_time < 0:
        raise ValueError(f"--one-at-a-time must be 0 or more, not {one_at_a_time}")
    if one_at_a_time:
        task_ms = args.task_ms if args.task_ms is not None else 20.0
    load = args.load if args.load is not None else 0.3
    window = 4 * args.workers
    set_timer_slack_ns(1000)
    with rtpool.LocalCluster(workers=args.workers - 1) as cluster:
        slow = _start_worker(cluster, {"RTPOOL_BENCH_SLOWDOWN": f"{args.slowdown:g}"})
        try:
            cluster.wait_for_workers(args.workers, timeout=30)
            client = cluster.client()
            if one_at_a_time:
                from .hedge_sequential import run_one_at_a_time

                warm = 12 if args.quick else 20
                out = run_one_at_a_time(
                    client, cluster.stats, one_at_a_time, task_ms, say, warm=warm
                )
                out.update(workers=args.workers, slowdown=args.slowdown)
                return out
            say("hedge: warm-up (the master learns each function's execution time)")
            view, note = probe(client, spin_maybe_slow_hedged, (task_ms, False), hedge=True)
            warm = [0] * (10 if args.quick else 40)
            for sub, fn, fn_args in (
                (client, spin, (task_ms,)),
                (client, spin_maybe_slow, (task_ms, False)),
                (view, spin_maybe_slow_hedged, (task_ms, False)),
            ):
                for _ in range(2 if sub is not None else 0):
                    run_open_loop(lambda s=sub, f=fn, a=fn_args: s.submit(f, *a), warm, 30)
            cap_n = 60 if args.quick else 400
            say(f"hedge: all-fast capacity, {cap_n} tasks, {window} in flight")
            cap = measure_capacity(lambda: client.submit(spin, task_ms), cap_n, window, 60)
            if not cap["tasks_per_s"]:
                raise RuntimeError(f"the capacity run finished too few tasks: {cap}")
            rate = load * cap["tasks_per_s"]
            configs = [
                Config("all fast", rate, lambda: client.submit(spin, task_ms), keep=_hedge_keep),
                Config(
                    "one slow",
                    rate,
                    lambda: client.submit(spin_maybe_slow, task_ms, True),
                    keep=_hedge_keep,
                ),
            ]
            if view is not None:
                configs.append(
                    Config(
                        "one slow + hedge",
                        rate,
                        lambda: view.submit(spin_maybe_slow_hedged, task_ms, True),
                        keep=_hedge_keep,
                    )
                )
            run_interleaved(
                configs,
                d["count"],
                d["seconds"],
                d["block_seconds"],
                args.arrivals,
                0,
                cluster.stats,
                say,
                lambda: [*cluster.worker_pids, slow.pid],
            )
        finally:
            _stop_workers([slow], graceful=True, timeout=5)
    rows = {c.label: c.result() for c in configs}
    for c in configs:
        done = [o.extra for o in c.outcomes if o.extra is not None]
        execs = [exec_ms for exec_ms, _ in done]
        rows[c.label]["exec_ms"] = {
            "p50": round2(percentile(execs, 50)),
            "max": round2(max(execs, default=None)),
        }
        # The tasks return the ms they spun: more than task_ms means the slow worker ran it.
        rows[c.label]["slow_tasks"] = sum(spun > task_ms for _, spun in done)
    fast = rows["all fast"]["latency"]
    p99 = {k: r["latency"]["p99_us"] for k, r in rows.items()}
    hedged = safe_ratio(p99.get("one slow + hedge"), fast["p99_us"])
    out = {
        "workers": args.workers,
        "slow_workers": 1,
        "slowdown": args.slowdown,
        "task_ms": task_ms,
        "load": load,
        "arrivals": args.arrivals,
        "capacity": cap,
        "rate_per_s": round(rate, 1),
        "configs": rows,
        "sdk": {"hedge_option": view is not None, "note": note},
        "slow_p99_ratio": safe_ratio(p99["one slow"], fast["p99_us"]),
        "hedge_p99_ratio": hedged,
        "bar": {
            "hedge_p99_ratio_max": HEDGE_P99_RATIO_BAR,
            "ok": None if hedged is None else hedged <= HEDGE_P99_RATIO_BAR,
        },
    }
    if args.plot:
        series = {c.label: histogram_of([o.latency_ns for o in c.outcomes]) for c in configs}
        out.update(write_plot(series, args.plot, "rtpool hedge: completion time"))
    return out
