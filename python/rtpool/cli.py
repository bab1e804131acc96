"""The ``rtpool`` command: ``master``, ``worker``, ``token``, ``demo`` and ``bench``.

Heavy imports are deferred to the subcommand that needs them, so ``rtpool worker`` starts
quickly and ``rtpool --help`` works without the native module.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

__all__ = ["main"]

_DESCRIPTION = """\
rtpool: a real-time distributed task pool. Clients submit packages of Python tasks to a
master; pull-based workers run them; results come back as concurrent.futures futures.

typical session:
  rtpool master                     # first start: generates the tokens and prints them
  RTPOOL_WORKER_TOKEN=... rtpool worker --master 127.0.0.1:7070 --procs 4
  RTPOOL_TOKEN=... python app.py    # app.py: rtpool.Client("127.0.0.1:7070").map(f, xs)

or, all on this machine: rtpool.LocalCluster(workers=4).client()
"""

_MASTER_HELP = """\
Run the master in the foreground until SIGINT/SIGTERM. On first start it generates a client
and a worker token and writes them to the data dir (client.token, worker.token); it prints
"listening on HOST:PORT" once it accepts connections.

example:
  rtpool master --listen 0.0.0.0:7070 --data-dir /var/lib/rtpool
"""

_WORKER_HELP = """\
Start worker processes that pull tasks from a master and run them. The task functions'
modules must be importable here (functions defined in __main__ or as lambdas travel by value).
SIGTERM or Ctrl-C finishes the running tasks, hands queued ones back and exits; a second one
exits at once.

With --serve MODULE (repeatable), the workers also serve the functions MODULE marks with
@rtpool.remote, which clients call by name: client.call("dmmul", n, A, B) (docs/rpc.md).

examples:
  RTPOOL_WORKER_TOKEN=$(cat ~/.local/share/rtpool/worker.token) \\
      rtpool worker --master 127.0.0.1:7070 --procs 8
  rtpool worker --master 127.0.0.1:7070 --serve mypkg.linalg
"""

_DEMO_HELP = """\
Start a local cluster, run a few packages and print where the time goes (medians of the
measurement points). Pass --help after `demo` for its own options. Needs the bench extra:
pip install 'rtpool[bench]'.

example:
  rtpool demo
"""

_BENCH_HELP = """\
Measure latency (p50, p99, p99.9, max) and throughput end to end; open-loop latency under
load, deadline misses and straggler hedging; SCHED_FIFO realtime mode (`realtime`); worker
loss, master restart and journal policies (`recovery`, `journal`); the Ninf paper's grid RPC
benchmarks (`ninf`). Pass --help after `bench` (or `bench ninf`) for its own options. Needs
the bench extra: pip install 'rtpool[bench]' (`ninf` also 'rtpool[bench,linalg]').

examples:
  rtpool bench all
  rtpool bench latency --sweep --compare-load
  rtpool bench deadline
  rtpool bench hedge
  rtpool bench realtime
  rtpool bench ninf [linpack] [multi] [ep] [bars]
"""


def _default_data_dir() -> str:
    env = os.environ.get("RTPOOL_DATA_DIR")
    if env:
        return env
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return os.path.join(base, "rtpool")


def _parser() -> argparse.ArgumentParser:
    from . import worker

    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="rtpool", description=_DESCRIPTION, formatter_class=raw)
    parser.add_argument("--version", action="version", version=f"rtpool {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    master = sub.add_parser(
        "master",
        help="run the master: accepts packages from clients, hands tasks to workers",
        description=_MASTER_HELP,
        formatter_class=raw,
    )
    master.add_argument(
        "--listen",
        default="127.0.0.1:7070",
        metavar="HOST:PORT",
        help="address to listen on (default: 127.0.0.1:7070; port 0 picks a free one)",
    )
    master.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="where the tokens live (default: $RTPOOL_DATA_DIR or ~/.local/share/rtpool)",
    )
    master.add_argument(
        "--max-frame-mb",
        type=int,
        default=None,
        metavar="MB",
        help="largest frame accepted after the handshake, in MiB (default: 256)",
    )
    master.add_argument(
        "--heartbeat-ms",
        type=int,
        default=None,
        metavar="MS",
        help="how often idle workers send a heartbeat",
    )
    master.add_argument(
        "--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate chain"
    )
    master.add_argument("--tls-key", default=None, metavar="PEM", help="private key of --tls-cert")
    master.add_argument(
        "--tls-self-signed",
        action="store_true",
        help="serve TLS with a self-signed certificate generated into DIR/tls/ (its cert.pem "
        "is the clients' ca_file and the workers' --ca-file)",
    )
    master.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="connections served at once; more get ERROR busy (default: 4096)",
    )
    master.add_argument(
        "--max-buffered-mb",
        type=int,
        default=None,
        metavar="MB",
        help="frames that may wait for one peer to read them, in MiB; a peer that lets more "
        "pile up is closed as a slow consumer (default: 64)",
    )
    master.add_argument(
        "--lease-ms",
        type=int,
        default=None,
        metavar="MS",
        help="a worker silent this long loses its tasks, which run elsewhere (default: 3000)",
    )
    master.add_argument(
        "--result-ttl",
        type=float,
        default=None,
        metavar="S",
        help="a disconnected client's packages keep running and keep their results this long, "
        "waiting for it to reconnect; then they are dropped (default: 300)",
    )
    master.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        metavar="N",
        help="a task whose worker was lost on N attempts fails as a poison task (default: 3)",
    )
    master.add_argument(
        "--hedge-factor",
        type=float,
        default=None,
        metavar="F",
        help="a task submitted with hedge=True gets a backup copy on another worker once it has "
        "run F times its function's p95 execution time (above 1; default: 1.5)",
    )
    master.add_argument(
        "--service-grace",
        type=float,
        default=None,
        metavar="S",
        help="named functions: calls queued for a function whose last worker left wait this "
        "long for a worker serving it to return, then fail (default: 30)",
    )
    master.add_argument(
        "--max-task-seconds",
        type=float,
        default=None,
        metavar="S",
        help="longest any task may run; 0 = no limit (default: 86400)",
    )
    master.add_argument(
        "--fsync",
        default=None,
        metavar="POLICY",
        help="when the crash-recovery journal is synced to disk: always (a package is "
        "acknowledged only once on disk), batch[:MS] (at most MS ms later; default batch:10) "
        "or off (the OS decides)",
    )
    master.add_argument(
        "--no-journal",
        action="store_true",
        help="keep no journal: a master crash loses every package (default: journal in the "
        "data dir)",
    )
    master.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="user store for tokens and quotas: postgres://user@host:port/db or "
        "sqlite:///path (default: SQLite in the data dir)",
    )
    master.add_argument(
        "--client-timeout-ms",
        type=int,
        default=None,
        metavar="MS",
        help="a client silent this long is disconnected (default: 30000)",
    )
    master.add_argument(
        "--realtime",
        action="store_true",
        help="real-time mode: lock the master's memory (mlockall), run its threads under "
        "SCHED_FIFO and pin them with --cpus, each as far as the OS permits (a refused step is "
        "logged once and stays normal)",
    )
    master.add_argument(
        "--rt-priority",
        type=int,
        default=None,
        metavar="N",
        help="SCHED_FIFO priority with --realtime, 1-99 (default: 50)",
    )
    master.add_argument(
        "--cpus",
        default=None,
        metavar="LIST",
        help="with --realtime, pin the master's threads to these CPUs: 1, 0,1 or 0-3",
    )
    master.add_argument(
        "--log-level", default="info", help="error, warn, info, debug or trace (default: info)"
    )

    work = sub.add_parser(
        "worker",
        help="run worker processes that pull tasks from a master and run them",
        description=_WORKER_HELP,
        formatter_class=raw,
    )
    worker.add_arguments(work)
    from . import _token_cli

    token = sub.add_parser(
        "token",
        help="create, list and revoke per-user tokens; set users' compute-time quotas",
    )
    _token_cli.add_arguments(token, _default_data_dir)
    sub.add_parser(
        "demo",
        help="factorization benchmark on a LocalCluster: speed-up, efficiency, per-task times",
        description=_DEMO_HELP,
        formatter_class=raw,
    )
    sub.add_parser(
        "bench",
        help="latency, throughput and payload percentiles next to a raw TCP floor; open-loop "
        "latency, deadline and hedge benchmarks",
        description=_BENCH_HELP,
        formatter_class=raw,
    )
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def _master_options(args: argparse.Namespace) -> dict:
    """The reliability options of ``rtpool master`` that were given, for ``_native``."""
    options = {
        "lease_ms": args.lease_ms,
        "result_ttl_s": args.result_ttl,
        "max_attempts": args.max_attempts,
        "hedge_factor": args.hedge_factor,
        "service_grace_s": args.service_grace,
        "max_task_seconds": args.max_task_seconds,
        "store": args.store,
        "fsync": args.fsync,
        "journal": False if args.no_journal else None,
    }
    return {k: v for k, v in options.items() if v is not None}


def _run_master(args: argparse.Namespace) -> int:
    from . import _native
    from .errors import RtpoolError

    data_dir = args.data_dir or _default_data_dir()
    max_frame = None if args.max_frame_mb is None else args.max_frame_mb << 20
    rt_given = [f for f, v in (("--rt-priority", args.rt_priority), ("--cpus", args.cpus)) if v]
    if rt_given and not args.realtime:
        print(f"rtpool master: {', '.join(rt_given)} need --realtime", file=sys.stderr)
        return 2
    rt_priority = 50 if args.rt_priority is None else args.rt_priority
    if not 1 <= rt_priority <= 99:
        print("rtpool master: --rt-priority must be 1-99", file=sys.stderr)
        return 2
    try:
        _native.run_master(
            listen=args.listen,
            data_dir=data_dir,
            max_frame_bytes=max_frame,
            heartbeat_ms=args.heartbeat_ms,
            log_level=args.log_level,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_self_signed=args.tls_self_signed,
            max_connections=args.max_connections,
            max_buffered_bytes=None if args.max_buffered_mb is None else args.max_buffered_mb << 20,
            lease_ms=args.lease_ms,
            client_timeout_ms=args.client_timeout_ms,
            options=_master_options(args),
            realtime=args.realtime,
            rt_priority=rt_priority,
            cpus=args.cpus,
        )
    except RtpoolError as exc:
        print(f"rtpool master: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_bench(command: str, argv: List[str]) -> int:
    """Hand ``rtpool bench``/``rtpool demo`` over to the ``rtpool_bench`` package, or say what to
    install when it or its dependencies (the ``bench`` extra) are missing."""
    try:
        import rtpool_bench
    except ImportError:
        print(
            f"rtpool {command}: the benchmark package rtpool_bench is not installed; install "
            "rtpool with its bench extra (pip install 'rtpool[bench]', or from a checkout: "
            "make install)",
            file=sys.stderr,
        )
        return 2
    missing = (
        [] if {"-h", "--help"} & set(argv) else rtpool_bench.missing_requirements(command, argv)
    )
    if missing:
        extras = ",".join(missing)
        print(
            f"rtpool {command} needs the {' and '.join(missing)} extra of rtpool, which is not "
            f"installed: pip install 'rtpool[{extras}]' (from a checkout: "
            f"pip install -e '.[{extras}]', or make install)",
            file=sys.stderr,
        )
        return 2
    return rtpool_bench.main(command, argv)


def main(argv: List[str] | None = None) -> int:
    """Entry point of the ``rtpool`` command.

    Args:
        argv: Arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        The exit code.
    """
    if argv is None:
        argv = sys.argv[1:]
    # demo and bench live in the rtpool_bench package and parse their own options.
    if argv and argv[0] in ("demo", "bench"):
        return _run_bench(argv[0], argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "master":
        return _run_master(args)
    if args.command == "worker":
        from . import worker

        return worker.run(args)
    if args.command == "token":
        from . import _token_cli

        return _token_cli.run(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
