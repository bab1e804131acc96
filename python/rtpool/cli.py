"""The ``rtpool`` command: ``master``, ``worker``, ``token``, ``slurm``, ``status``, ``demo`` and
``bench``.

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
benchmarks (`ninf`); thousands of simulated workers against one master (`scale`). Pass --help
after `bench` (or `bench ninf`) for its own options. Needs
the bench extra: pip install 'rtpool[bench]' (`ninf` also 'rtpool[bench,linalg]').

examples:
  rtpool bench all
  rtpool bench latency --sweep --compare-load
  rtpool bench deadline
  rtpool bench hedge
  rtpool bench realtime
  rtpool bench ninf [linpack] [multi] [ep] [bars]
  rtpool bench scale --workers 1000,5000,10000
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

    # Listed here for `rtpool --help` only: `main` hands `rtpool master ...` to the master's own
    # command line (crates/rtpool-master/src/config/args.rs), the one `rtpool-master` parses.
    sub.add_parser(
        "master",
        help="run the master: accepts packages from clients, hands tasks to workers",
        add_help=False,
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
    from . import _slurm_cli

    slurm = sub.add_parser("slurm", help="run workers as Slurm jobs for a master: up, down")
    _slurm_cli.add_arguments(slurm, _default_data_dir)
    from . import _status_cli

    status = sub.add_parser(
        "status", help="a master's workers, queues, rates, latencies, deadlines and users"
    )
    _status_cli.add_arguments(status, _default_data_dir)
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


def _run_master(argv: List[str]) -> int:
    """``rtpool master ARGS``: the master's command line, parsed and run by ``_native``.

    The master handles SIGINT (Ctrl-C) itself, like SIGTERM: it shuts down gracefully and
    returns 0. Python's own SIGINT handler is set aside meanwhile, else it would raise
    KeyboardInterrupt (a traceback, rc 130) as soon as the master returns.
    """
    import signal

    from . import _native

    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        return _native.master_main(argv)
    finally:
        signal.signal(signal.SIGINT, previous)


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
    if argv and argv[0] == "master":
        return _run_master(argv[1:])
    # demo and bench live in the rtpool_bench package and parse their own options.
    if argv and argv[0] in ("demo", "bench"):
        return _run_bench(argv[0], argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "worker":
        from . import worker

        return worker.run(args)
    if args.command == "token":
        from . import _token_cli

        return _token_cli.run(args)
    if args.command == "slurm":
        from . import _slurm_cli

        return _slurm_cli.run(args)
    if args.command == "status":
        from . import _status_cli

        return _status_cli.run(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
