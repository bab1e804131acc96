"""The parent process of ``rtpool worker``: checks the options, loads the served modules,
forks ``--procs`` children and supervises them.

It forwards SIGTERM/SIGINT to the children and keeps every slot alive: a child that dies is
restarted, after a backoff that doubles with the slot's recent deaths (0.1 s up to
``_BACKOFF_MAX_S``; a child that completed tasks before dying starts the count again), for as
long as the master is reachable. Only a child that exits with
``EXIT_CONFIG`` (bad token) or ``EXIT_LOST`` (master unreachable for ``--reconnect-timeout``)
while running no task is not restarted: restarting would not help. A child that retires itself
(``EXIT_RETIRED``: a task it cannot interrupt outlived the master's patience) is replaced at
once.

The slot board (``_board.py``) tells the parent which task a child ran when it died: the death
is logged with that task and the signal, and the replacement child reports it to the master
(a ``RESULT`` with status ``LOST``), which blames the task rather than the pool. The parent also
kills a child whose task holds the GIL past the lease (the heartbeat thread cannot run).

Each child runs :func:`run_child`: one ``WorkerConnection`` until it stops. Not to be confused
with the executor process (``_executor_process.py``), which a child forks to run the tasks it
must be able to kill.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import time
import traceback
from functools import partial
from typing import Any, Dict, List, Tuple

from .. import _shm
from .._dial import default_name, worker_identity
from .._text import plural
from ..errors import RtpoolError, ServeError
from . import _kept, _logging
from ._arguments import (
    HOST_CONNECTION_MIN_PROCS,
    add_arguments,
    check_arguments,
    check_resources,
)
from ._board import Slot, SlotBoard, SlotState
from ._common import (
    EXIT_CONFIG,
    EXIT_LOST,
    EXIT_OK,
    EXIT_RETIRED,
    describe_exit,
    log,
    set_parent_death_signal,
)
from ._heap import keep_freed_heap
from ._loop import WorkerConnection
from ._output import board_of, capture_of
from ._relay import Relay
from ._relayed import RelayedConnection
from ._services import serve_frame, services_of

#: The first line of ``rtpool worker --help``.
DESCRIPTION = "``rtpool worker``: processes that pull tasks from the master and run them."

# Restarting children that died: the backoff doubles with the slot's deaths in the window.
_RESTART_WINDOW_S = 60.0
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 2.0
# How often the parent looks at its children (deaths, heartbeat stamps).
_POLL_S = 0.05
# A task that holds the GIL this share of the lease is killed (before the lease expires).
_GIL_SHARE = 0.7


def run_child(
    args: argparse.Namespace,
    token: str,
    name: str,
    board: Slot | None = None,
    reports: List[tuple] | None = None,
    identity: str | None = None,
    link: socket.socket | None = None,
    output: Tuple[Any, int, int] | None = None,
) -> int:
    """Body of one child process: connect, serve, return the exit code.

    ``board`` is the child's record on the parent's slot board; ``reports`` the deaths of its
    predecessor to report to the master, ``(instance, result entry)`` each; ``identity`` the
    slot's stable identity in ``HELLO`` (the same for every child of the slot); ``link`` its end
    of the socket pair to the parent's host connection (``--connection host``), else None: it
    connects to the master itself; ``output`` its area on the parent's output board (else
    it makes its own).
    """
    realtime = None
    if args.realtime:
        from .._realtime import Realtime

        realtime = Realtime(args.rt_priority, args.cpus, args.rt_budget_ms, log=log)
        realtime.apply()
    capture = capture_of(args, output)
    if capture is not None:
        capture.install()  # before the executor forks: it inherits the streams
    try:
        conn = (WorkerConnection if link is None else partial(RelayedConnection, link))(
            args.master,
            token,
            name,
            args.prefetch,
            tls=args.tls,
            ca_file=args.ca_file,
            task_memory_mb=args.task_memory_mb,
            reconnect_timeout=args.reconnect_timeout,
            services=services_of(args),
            board=board,
            connect=False,
            identity=identity,
            capture=capture,
        )
    except RtpoolError as exc:
        log(str(exc), logging.ERROR)
        return EXIT_CONFIG
    except ValueError as exc:
        log(str(exc), logging.ERROR)
        return EXIT_CONFIG
    conn.realtime = realtime
    inv = getattr(args, "inventory", None)
    if inv is not None and link is None:  # its own connection: it declares its share
        conn.resources = dict(inv.resources) if args.procs == 1 else inv.per_process(args.procs)
        conn.labels = dict(inv.labels)
        if args.procs == 1 and inv.gpu_ids:
            from ._devices import DevicePool

            conn.devices = DevicePool(inv.gpu_ids)
    conn.install_signal_handlers()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    code = conn.connect_first()  # waits for a master that is not up yet
    if code is not None:
        return code
    for instance, entry in reports or ():
        if instance == conn.instance:  # another master does not know the task
            conn.unsent.append(entry)
    # What this process holds from its start on (modules, code, the connection) lives as long
    # as it does: out of the cyclic GC's sight, so that a full collection between two tasks
    # walks only what the tasks made (issue 25).
    gc.collect()
    gc.freeze()
    return conn.serve()


def host_connection(args: argparse.Namespace) -> bool:
    """Whether the parent holds one master connection for all its children (``--connection
    host``; ``auto``: from ``HOST_CONNECTION_MIN_PROCS`` processes, not in real-time mode,
    where the relay's extra hop would run at normal priority)."""
    mode = getattr(args, "connection", "auto")  # (a Namespace built by hand may lack it)
    if mode == "auto":
        return args.procs >= HOST_CONNECTION_MIN_PROCS and not getattr(args, "realtime", False)
    return mode == "host"


def _is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, traced): Linux's /proc state ``T`` or ``t``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


class Supervisor:
    """The parent: forks the children, forwards signals, restarts children that die."""

    def __init__(self, args: argparse.Namespace, token: str) -> None:
        self.args = args
        self.token = token
        self.children: Dict[int, int] = {}  # pid -> slot
        self.deaths: Dict[int, List[float]] = {}  # slot -> times of its recent deaths
        self.due: Dict[int, float] = {}  # slot -> when to restart it
        self.reports: Dict[int, List[tuple]] = {}  # slot -> deaths its next child reports
        self.killed: Dict[int, str] = {}  # pid -> why the parent killed it
        # pid -> when (board clock) the child was last seen stopped: its silence counts from
        # then, so a child just resumed (SIGCONT) has time to beat before it is judged.
        self.stopped_ns: Dict[int, int] = {}
        self.board = SlotBoard(args.procs)
        #: What each child's running task printed (sent with its LOST report if it crashes).
        self.outputs = board_of(args)
        self.stopping = False
        self.exit_code = EXIT_OK
        #: The host's one master connection (``--connection host``), else None.
        self.relay: Relay | None = None
        if host_connection(args):
            services = services_of(args)
            serve = serve_frame(services) if services else b""
            self.relay = Relay(args, token, args.name or default_name(), serve)
            if getattr(args, "realtime", False):
                log(
                    "--connection host with --realtime: the parent process relays "
                    "every task and result at normal priority (--connection process does not)",
                    logging.WARNING,
                )

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        self.due.clear()
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _spawn(self, slot: int) -> None:
        mask = {signal.SIGTERM, signal.SIGINT}
        self.board.clear(slot)
        reports = self.reports.pop(slot, [])
        link = self.relay.attach(slot) if self.relay is not None else None
        signal.pthread_sigmask(signal.SIG_BLOCK, mask)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(slot, reports, link)  # never returns
            self.children[pid] = slot
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, mask)
            if link is not None:
                link.close()  # the child's end

    def _child(self, slot: int, reports: List[tuple], link: socket.socket | None) -> None:
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
            if self.relay is not None:
                self.relay.close_in_child()
            # The slot's identity outlives this child: its replacement is the same worker to
            # the master, which keeps the slot's pace (hedging knows a straggler at once).
            identity = worker_identity(slot, parent)
            board = self.board.slot(slot)
            area = self.outputs.area(slot) if self.outputs is not None else None
            code = run_child(self.args, self.token, name, board, reports, identity, link, area)
        except BaseException:
            # One record (one write), so it cannot run into a sibling's lines.
            log(f"worker process (slot {slot}) failed:\n{traceback.format_exc()}", logging.ERROR)
        finally:
            try:
                _shm.at_exit()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def _backoff(self, slot: int, state: SlotState) -> float:
        """Seconds before restarting ``slot``, doubling with its deaths in the last minute
        that came before the child completed any task (a crash loop). A child that did useful
        work before dying starts the count again: each poison task costs one short pause."""
        now = time.monotonic()
        if state.completed:
            self.deaths.pop(slot, None)
        recent = [t for t in self.deaths.get(slot, []) if now - t < _RESTART_WINDOW_S]
        recent.append(now)
        self.deaths[slot] = recent
        return min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** min(len(recent) - 1, 10))

    def _on_exit(self, pid: int, slot: int, status: int) -> None:
        """A child ended: decide whether and when its slot starts again, say why."""
        code = os.waitstatus_to_exitcode(status)
        self.stopped_ns.pop(pid, None)
        state = self.board.read(slot)
        if self.relay is not None:
            # Its running task is reported lost (blamed), what else it held goes back.
            how = self.killed.get(pid) or describe_exit(status)
            lost = self._lost_entry(slot, state, how) if state.busy else None
            self.relay.release(slot, lost)
        if self.stopping or (code == EXIT_OK and not state.busy):
            return
        if code == EXIT_RETIRED and not state.busy:
            self.due[slot] = time.monotonic()  # it said why in its log
            return
        if not state.busy and code in (EXIT_CONFIG, EXIT_LOST):
            self.exit_code = max(self.exit_code, code)
            return
        how = self.killed.pop(pid, None) or describe_exit(status)
        delay = self._backoff(slot, state)
        if state.busy:
            self._report(slot, state, how)
            self.board.add_suspect(state.task_id)
            log(
                f"child {pid} (slot {slot}) {how} while running task {state.task_id} (attempt "
                f"{state.attempt}); the master is told, and blames the task; restarting the "
                f"slot in {delay:g} s",
                logging.WARNING,
            )
        else:
            log(
                f"child {pid} (slot {slot}) died ({how}); restarting it in {delay:g} s",
                logging.WARNING,
            )
        self.due[slot] = time.monotonic() + delay

    def _report(self, slot: int, state: SlotState, how: str) -> None:
        if self.relay is not None:
            return  # release() reported it already, on the host's connection
        entry = self._lost_entry(slot, state, how)
        self.reports.setdefault(slot, []).append((state.instance, entry))

    def _lost_entry(self, slot: int, state: SlotState, how: str) -> list:
        """The RESULT entry (status LOST) of the task a dead child was running, with what
        the task printed before (``docs/protocol.md``, "Task output")."""
        from .. import _protocol as P
        from .._output import wrap

        text = f"worker process {how} while running task {state.task_id}".encode()
        if self.outputs is not None:  # (the child names itself so too: its identity)
            worker = worker_identity(slot, os.getpid())
            text = wrap(self.outputs.take(slot, state.task_id, state.attempt, worker), text)
        return [state.task_id, state.attempt, P.STATUS_LOST, text, 0, 0, 0]

    def _check_gil(self) -> None:
        """Kill a child whose in-process task has starved its heartbeat thread for most of
        the lease: the master would expel it anyway, without knowing why."""
        now = time.perf_counter_ns()  # the board's clock
        for pid, slot in self.children.items():
            if pid in self.killed:
                continue
            state = self.board.read(slot)
            # (No beat yet is no beat since the task started: the task took the GIL first.)
            if not (state.busy and state.lease_ms):
                continue
            limit_ns = state.lease_ms * 1_000_000 * _GIL_SHARE
            quiet_ns = now - max(state.beat_ns, state.started_ns, self.stopped_ns.get(pid, 0))
            if quiet_ns < limit_ns / 2:
                continue
            if _is_stopped(pid):
                # A stopped child (SIGSTOP, a debugger) holds nothing: not its task. Looked at
                # from half the limit on, so a stop long enough to matter is seen.
                self.stopped_ns[pid] = now
                continue
            if quiet_ns < limit_ns:
                continue
            self.killed[pid] = (
                f"was killed (signal 9, SIGKILL) by the worker because its task held the GIL for "
                f"more than {quiet_ns / 1e9:.1f} s, past {_GIL_SHARE:.0%} of the master's lease "
                f"of {state.lease_ms / 1000:g} s (its heartbeat thread could not run)"
            )
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            slot = self.children.pop(pid, None)
            if slot is not None:
                self._on_exit(pid, slot, status)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for slot in range(self.args.procs):
            self._spawn(slot)
        relay = self.relay
        check_at = 0.0
        # Bounded by the children's lives: it ends when no child runs and none is due.
        while self.children or self.due:
            now = time.monotonic()
            if now >= check_at:  # (the relay wakes far more often: not on its path)
                check_at = now + _POLL_S
                self._look_after_children(now)
            if relay is None:
                time.sleep(_POLL_S)
                continue
            if self.stopping:
                relay.drain()
            elif relay.exit_code is not None:  # a refused token, no master in time
                self.exit_code = max(self.exit_code, relay.exit_code)
                self._on_signal(signal.SIGTERM, None)
            relay.poll(max(0.0, check_at - time.monotonic()))
        if relay is not None:
            relay.close()
        return self.exit_code

    def _look_after_children(self, now: float) -> None:
        """Reap the dead, kill a task that holds the GIL, restart the slots that are due."""
        self._reap()
        self._check_gil()
        for slot, when in list(self.due.items()):
            if when <= now and not self.stopping:
                del self.due[slot]
                self._spawn(slot)


def run(args: argparse.Namespace) -> int:
    """Run ``rtpool worker`` with parsed arguments; return the exit code."""
    try:  # first: every line below goes through it (and the forked children inherit it)
        _logging.configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))
    except ValueError as exc:
        _logging.configure()
        log(str(exc), logging.ERROR)
        return EXIT_CONFIG
    token = args.token
    if token is None and args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            log(
                f"cannot read the worker token from --token-file {args.token_file}: {exc}",
                logging.ERROR,
            )
            return EXIT_CONFIG
    token = token or os.environ.get("RTPOOL_WORKER_TOKEN")
    if not token:
        log(
            "no worker token: pass --token or --token-file or set RTPOOL_WORKER_TOKEN (the "
            "master keeps it in its data dir as worker.token)",
            logging.ERROR,
        )
        return EXIT_CONFIG
    problem = check_arguments(args) or check_resources(args)
    if problem:
        log(problem, logging.ERROR)
        return EXIT_CONFIG
    if args.keep_mb is not None:
        _kept.set_limit_mb(args.keep_mb)  # before forking: the children inherit it
    problem = keep_freed_heap(args.heap_keep_mb)  # also inherited
    if problem:
        log(problem, logging.WARNING)
    try:
        # Once, before forking: a module that does not load stops the worker here with its
        # name, rather than each child in a restart loop.
        services = services_of(args)
    except ServeError as exc:
        log(str(exc), logging.ERROR)
        return EXIT_CONFIG
    if services:
        names = ", ".join(f"{s.name} (version {s.version})" for s in services)
        log(f"serving {plural(len(services), 'function')}: {names}")
    connection = "host" if host_connection(args) else "process"
    log(
        f"worker {args.name or default_name()}: {plural(args.procs, 'process', 'processes')} "
        f"(--connection {connection}); {args.inventory.describe()}"
    )
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
