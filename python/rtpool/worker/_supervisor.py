"""The parent process of ``rtpool worker``: checks the options, loads the served modules,
forks ``--procs`` children and supervises them.

It forwards SIGTERM/SIGINT to the children and restarts a child that crashes, with a bounded
backoff (at most 5 restarts of one slot a minute); a child that exits with ``EXIT_CONFIG`` or
``EXIT_LOST`` is not restarted (restarting would not help). Each child runs :func:`run_child`:
one ``WorkerConnection`` until it stops. Not to be confused with the executor process
(``_executor_process.py``), which a child forks to run the tasks it must be able to kill.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, List

from .._dial import default_name
from .._text import plural
from ..errors import RtpoolError, ServeError
from ._arguments import add_arguments, check_arguments
from ._common import (
    EXIT_CONFIG,
    EXIT_LOST,
    EXIT_OK,
    describe_exit,
    log,
    set_parent_death_signal,
)
from ._loop import WorkerConnection
from ._services import services_of

#: The first line of ``rtpool worker --help``.
DESCRIPTION = "``rtpool worker``: processes that pull tasks from the master and run them."

# Restarting crashed children: at most this many restarts of one slot within the window.
_RESTART_MAX = 5
_RESTART_WINDOW_S = 60.0
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0


def run_child(args: argparse.Namespace, token: str, name: str) -> int:
    """Body of one child process: connect, serve, return the exit code."""
    realtime = None
    if args.realtime:
        from .._realtime import Realtime

        realtime = Realtime(args.rt_priority, args.cpus, args.rt_budget_ms, log=log)
        realtime.apply()
    try:
        conn = WorkerConnection(
            args.master,
            token,
            name,
            args.prefetch,
            tls=args.tls,
            ca_file=args.ca_file,
            task_memory_mb=args.task_memory_mb,
            reconnect_timeout=args.reconnect_timeout,
            services=services_of(args),
            connect=False,
        )
    except RtpoolError as exc:
        log(str(exc))
        return EXIT_CONFIG
    except ValueError as exc:
        log(str(exc))
        return EXIT_CONFIG
    conn.realtime = realtime
    conn.install_signal_handlers()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    code = conn.connect_first()  # waits for a master that is not up yet
    if code is not None:
        return code
    return conn.serve()


class Supervisor:
    """The parent: forks the children, forwards signals, restarts crashed children."""

    def __init__(self, args: argparse.Namespace, token: str) -> None:
        self.args = args
        self.token = token
        self.children: Dict[int, int] = {}  # pid -> slot
        self.restarts: Dict[int, List[float]] = {}
        self.stopping = False
        self.exit_code = EXIT_OK

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _spawn(self, slot: int) -> None:
        mask = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, mask)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(slot)  # never returns
            self.children[pid] = slot
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, mask)

    def _child(self, slot: int) -> None:
        code = 1
        try:
            # Signals stay blocked until the child's own handlers are in place.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            parent = os.getppid()
            set_parent_death_signal(signal.SIGTERM)
            if os.getppid() != parent:
                os._exit(EXIT_OK)
            name = self.args.name or default_name()
            if self.args.name and self.args.procs > 1:
                name = f"{name}-{slot}"
            # Tasks may report where they ran (SlurmCluster's tests check the job id in it).
            os.environ["RTPOOL_WORKER_NAME"] = name
            code = run_child(self.args, self.token, name)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def _may_restart(self, slot: int) -> float | None:
        now = time.monotonic()
        recent = [t for t in self.restarts.get(slot, []) if now - t < _RESTART_WINDOW_S]
        if len(recent) >= _RESTART_MAX:
            return None
        recent.append(now)
        self.restarts[slot] = recent
        return min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (len(recent) - 1))

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for slot in range(self.args.procs):
            self._spawn(slot)
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            slot = self.children.pop(pid, None)
            if slot is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if self.stopping or code == EXIT_OK:
                continue
            if code in (EXIT_CONFIG, EXIT_LOST):
                self.exit_code = max(self.exit_code, code)
                continue
            delay = self._may_restart(slot)
            if delay is None:
                log(
                    f"child {pid} died ({describe_exit(status)}) {_RESTART_MAX} times within "
                    f"{_RESTART_WINDOW_S:g} s; not restarting it"
                )
                self.exit_code = max(self.exit_code, 1)
                continue
            log(f"child {pid} died ({describe_exit(status)}); restarting it in {delay:g} s")
            self._sleep(delay)
            if not self.stopping:
                self._spawn(slot)
        return self.exit_code


def run(args: argparse.Namespace) -> int:
    """Run ``rtpool worker`` with parsed arguments; return the exit code."""
    token = args.token
    if token is None and args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            log(f"cannot read the worker token from --token-file {args.token_file}: {exc}")
            return EXIT_CONFIG
    token = token or os.environ.get("RTPOOL_WORKER_TOKEN")
    if not token:
        log(
            "no worker token: pass --token or --token-file or set RTPOOL_WORKER_TOKEN (the "
            "master keeps it in its data dir as worker.token)"
        )
        return EXIT_CONFIG
    problem = check_arguments(args)
    if problem:
        log(problem)
        return EXIT_CONFIG
    try:
        # Once, before forking: a module that does not load stops the worker here with its
        # name, rather than each child in a restart loop.
        services = services_of(args)
    except ServeError as exc:
        log(str(exc))
        return EXIT_CONFIG
    if services:
        names = ", ".join(f"{s.name} (version {s.version})" for s in services)
        log(f"serving {plural(len(services), 'function')}: {names}")
    if args.parent_pid is not None:
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != args.parent_pid:
            return EXIT_OK
    return Supervisor(args, token).run()


def main(argv: List[str] | None = None) -> int:
    """Entry point of ``rtpool worker`` (also ``python -m rtpool.worker``)."""
    parser = argparse.ArgumentParser(prog="rtpool worker", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
