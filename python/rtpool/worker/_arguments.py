"""The ``rtpool worker`` command-line options: :func:`add_arguments` declares them,
:func:`check_arguments` checks what argparse cannot (ranges, combinations) and fills the
real-time defaults."""

from __future__ import annotations

import argparse
import os
from typing import List

from .._masters import parse_addresses
from ._common import DEFAULT_PREFETCH
from ._heap import DEFAULT_HEAP_KEEP_MB
from ._logging import LOG_FORMATS
from ._output import DEFAULT_OUTPUT_KB, DEFAULT_RATE_KB, MAX_OUTPUT_KB

#: ``--connection auto`` holds one connection per host from this many processes up: below,
#: the relay's extra hop costs more latency than the master saves (``docs/workers.md``).
HOST_CONNECTION_MIN_PROCS = 8
CONNECTION_MODES = ("auto", "host", "process")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``rtpool worker`` options to a parser."""
    parser.add_argument(
        "--master",
        default=os.environ.get("RTPOOL_MASTER") or None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="master address; several (a leader and its standbys, docs/ha.md) separated by "
        "commas, or a DNS name with one record per master: the worker follows the leader "
        "(default: $RTPOOL_MASTER)",
    )
    parser.add_argument(
        "--token", default=None, help="worker token (default: $RTPOOL_WORKER_TOKEN)"
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="read the worker token from PATH (keeps it out of `ps` and job scripts)",
    )
    parser.add_argument(
        "--procs", type=int, default=1, metavar="N", help="worker processes (default: 1)"
    )
    parser.add_argument(
        "--connection",
        default=os.environ.get("RTPOOL_WORKER_CONNECTION", "auto"),
        metavar="{auto,host,process}",
        help="host: the parent process holds one master connection for all --procs processes "
        "and relays their tasks and results (the master sends one frame per round for the "
        "host, not one per process); process: each process holds its own; auto: host from "
        f"{HOST_CONNECTION_MIN_PROCS} processes up, unless --realtime, and from 2 up when the "
        "host has a resource other than cpu and mem_gb (a GPU, a declared licence: one "
        "connection holds them) (default: $RTPOOL_WORKER_CONNECTION, else auto)",
    )
    parser.add_argument(
        "--resources",
        action="append",
        default=[],
        metavar="NAME=N,...",
        help="what this host offers tasks that ask for it (options(resources=...)), e.g. "
        "gpu=2,mem_gb=64,license_x=1; names [a-z][a-z0-9_]*, whole numbers; repeatable. "
        "Detected unless given: cpu (= --procs), mem_gb (MemTotal in GiB), gpu (nvidia-smi -L, "
        "else /proc/driver/nvidia/gpus, within $CUDA_VISIBLE_DEVICES); gpu=0 turns detected "
        "GPUs off. A task asking gpu=K runs with CUDA_VISIBLE_DEVICES set to K devices of its "
        "own (default: $RTPOOL_WORKER_RESOURCES, else detected only; docs/resources.md)",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label tasks may ask for (options(labels={'zone': 'a'})), e.g. zone=a; "
        "repeatable (default: $RTPOOL_WORKER_LABELS, comma-separated KEY=VALUE, else none)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=DEFAULT_PREFETCH,
        metavar="MAX",
        help=f"most tasks a process queues ahead; adaptive below that: about 2 ms of tasks plus "
        f"2 measured round trips to the master (default: {DEFAULT_PREFETCH})",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="connect with TLS (the master checked against the system trust store or --ca-file)",
    )
    parser.add_argument(
        "--ca-file",
        default=None,
        metavar="PEM",
        help="certificate(s) to trust, e.g. a --tls-self-signed master's cert.pem (implies --tls)",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="name in the master's log (default: hostname:pid); with --procs N > 1, each "
        "process adds -SLOT; tasks see it as $RTPOOL_WORKER_NAME",
    )
    parser.add_argument(
        "--task-memory-mb",
        type=int,
        default=None,
        metavar="N",
        help="run every task in a killable executor process whose address space (RLIMIT_AS, "
        "the interpreter's own ~100 MiB included) is limited to N MiB; a task past it gets "
        "MemoryError (default: no limit, tasks without a time limit run in the worker process)",
    )
    parser.add_argument(
        "--task-output-kb",
        type=int,
        default=DEFAULT_OUTPUT_KB,
        metavar="N",
        help="capture each task's prints and logging records, at most N KiB per task (the rest "
        "is counted as dropped), and send them to the client with its result; 0: no capture, "
        f"tasks print to the worker's stdout (default: {DEFAULT_OUTPUT_KB})",
    )
    parser.add_argument(
        "--task-output-rate-kb",
        type=int,
        default=DEFAULT_RATE_KB,
        metavar="N",
        help="at most N KiB of captured task output per second per worker process, over its "
        f"tasks (default: {DEFAULT_RATE_KB})",
    )
    parser.add_argument(
        "--reconnect-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="when the master is not up yet at start, or after losing it, keep (re)connecting "
        "(backoff 0.1 s doubling to 5 s) for S seconds, then exit with code 3; 0 = forever "
        "(default: 0)",
    )
    parser.add_argument(
        "--keep-mb",
        type=int,
        default=None,
        metavar="MB",
        help="most MiB of kept task results (options(keep=True), docs/data.md) each worker "
        "process holds; past it the least recently read go, and their readers re-run the task "
        "that made them (default: $RTPOOL_KEEP_MB, else 1024)",
    )
    parser.add_argument(
        "--heap-keep-mb",
        type=int,
        default=DEFAULT_HEAP_KEEP_MB,
        metavar="MB",
        help="MiB of freed C heap each worker process keeps for its next tasks rather than "
        "return to the OS, so large arguments and results reuse mapped memory instead of "
        "faulting in fresh pages every task (blocks up to half of it, at most 32 MiB, come from "
        f"that heap); 0 = the C library's own policy (default: {DEFAULT_HEAP_KEEP_MB})",
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="real-time mode: each worker process locks its memory (mlockall) and runs its I/O "
        "and the tasks it runs itself under SCHED_FIFO, within --rt-budget-ms; executor "
        "processes and whatever tasks start run normal. A step the OS refuses is logged once "
        "and stays normal",
    )
    parser.add_argument(
        "--rt-priority",
        type=int,
        default=None,
        metavar="N",
        help="SCHED_FIFO priority with --realtime, 1-99 (default: 50)",
    )
    parser.add_argument(
        "--cpus",
        type=_cpu_list,
        default=None,
        metavar="LIST",
        help="with --realtime, pin the worker processes to these CPUs: 1, 0,1 or 0-3",
    )
    parser.add_argument(
        "--rt-budget-ms",
        type=int,
        default=None,
        metavar="MS",
        help="with --realtime, CPU time a worker process may spend under SCHED_FIFO without "
        "waiting before it drops to normal scheduling until it next waits for work, so a "
        "runaway task cannot starve the machine; 0 = no budget (default: 100)",
    )
    parser.add_argument(
        "--serve",
        action="append",
        default=[],
        metavar="MODULE",
        help="serve the functions MODULE marks with @rtpool.remote as named functions (grid "
        "RPC, see docs/rpc.md); MODULE must be importable here; repeatable",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        metavar="LEVEL",
        help="the worker's own log lines at LEVEL and above: error, warn, info, debug, off "
        "(default: info); task output is not affected",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="log line format, as the master's: text (time, level, process id, message) or "
        "json (one object per line: timestamp, level, target, fields) (default: text)",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        metavar="PID",
        help="exit when process PID exits (used by LocalCluster)",
    )


def _cpu_list(text: str) -> List[int]:
    from .._realtime import parse_cpus

    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; write CPUs as taskset -c does") from None


def _check_realtime(args: argparse.Namespace) -> str | None:
    """Fill the real-time defaults; the error message for a bad combination, else None."""
    from .._realtime import DEFAULT_BUDGET_MS, DEFAULT_PRIORITY

    given = [
        f
        for f, v in (
            ("--rt-priority", args.rt_priority),
            ("--cpus", args.cpus),
            ("--rt-budget-ms", args.rt_budget_ms),
        )
        if v is not None
    ]
    if given and not args.realtime:
        return f"{', '.join(given)} need --realtime"
    if args.rt_priority is None:
        args.rt_priority = DEFAULT_PRIORITY
    if args.rt_budget_ms is None:
        args.rt_budget_ms = DEFAULT_BUDGET_MS
    if not 1 <= args.rt_priority <= 99:
        return "--rt-priority must be 1-99"
    if args.rt_budget_ms < 0:
        return "--rt-budget-ms must be 0 (no budget) or more"
    return None


def check_resources(args: argparse.Namespace, detect: bool = True) -> str | None:
    """Parse ``--resources``/``--label`` (or their environment variables), detect the rest and
    set ``args.inventory`` (``_inventory.Inventory``); apply the connection rule: a host
    resource (anything but cpu and mem_gb) with ``--procs`` > 1 needs one host connection.
    The error message for a bad value or combination, else None."""
    from .._resources import parse_labels, parse_resources
    from ._inventory import inventory

    texts = list(getattr(args, "resources", None) or ())
    labels = list(getattr(args, "label", None) or ())
    if not texts and os.environ.get("RTPOOL_WORKER_RESOURCES"):
        texts = [os.environ["RTPOOL_WORKER_RESOURCES"]]
    if not labels and os.environ.get("RTPOOL_WORKER_LABELS"):
        labels = [t for t in os.environ["RTPOOL_WORKER_LABELS"].split(",") if t.strip()]
    try:
        declared = parse_resources(texts)
        args.inventory = inv = inventory(args.procs, declared, parse_labels(labels), detect)
    except (TypeError, ValueError) as exc:
        return str(exc)
    if args.procs > 1 and inv.has_host_resources():
        host = sorted(n for n in inv.resources if n not in ("cpu", "mem_gb"))
        if args.connection == "process":
            return (
                f"--connection process with --procs {args.procs} cannot share this host's "
                f"{', '.join(host)} between the processes (each would claim all of it): use "
                "--connection host or auto, or --procs 1"
            )
        if args.connection == "auto":
            args.connection = "host"
    return None


def check_arguments(args: argparse.Namespace) -> str | None:
    """Check what argparse cannot and fill the real-time defaults: the error message for a bad
    value or combination, else None. The token is :func:`run`'s to check (it may come from
    the environment)."""
    if not args.master:
        return (
            "--master is required (HOST:PORT, several separated by commas), or set $RTPOOL_MASTER"
        )
    try:
        parse_addresses(args.master)
    except ValueError as exc:
        return f"--master: {exc}"
    if args.procs < 1:
        return "--procs must be at least 1"
    if args.connection not in CONNECTION_MODES:
        return f"--connection must be one of {', '.join(CONNECTION_MODES)}, not {args.connection!r}"
    if args.task_memory_mb is not None and args.task_memory_mb < 1:
        return "--task-memory-mb must be at least 1"
    if args.reconnect_timeout < 0:
        return "--reconnect-timeout must be 0 (forever) or more"
    if not 0 <= getattr(args, "task_output_kb", 0) <= MAX_OUTPUT_KB:
        return f"--task-output-kb must be from 0 (no capture) to {MAX_OUTPUT_KB}"
    if getattr(args, "task_output_rate_kb", 1) < 1:
        return "--task-output-rate-kb must be at least 1"
    if getattr(args, "keep_mb", None) is not None and args.keep_mb < 1:
        return "--keep-mb must be at least 1"
    if getattr(args, "heap_keep_mb", 0) < 0:
        return "--heap-keep-mb must be 0 (the C library's policy) or more"
    return _check_realtime(args)
