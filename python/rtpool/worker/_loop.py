"""The run loop of a worker child: pull tasks, run them, send their results.

Each child holds one connection with ``slots=1`` and runs a single-threaded loop
(:meth:`WorkerConnection.serve`):

* **Credit-based pull.** The child keeps ``1 + prefetch`` tasks assigned to it (running, queued
  locally or promised by outstanding credits). ``prefetch`` adapts to about 2 ms of work, plus
  2 round trips to the master, by an EMA of the observed time per task (``_prefetch.py``),
  and what the child holds beyond it goes back to the master (``RETURN``).
* **Batched results.** Results go out in one ``RESULT`` frame, with the ``PULL`` that tops the
  credits up, in one write (``_results.py``).
* **Graceful shutdown.** SIGTERM only sets a flag; after the running task the child sends
  ``DRAIN``, its pending results and ``RETURN`` of every unstarted task, then closes. A second
  signal exits at once. Whatever is still in flight is requeued by the master on disconnect.
* **Reconnection.** When the connection drops, the child reconnects with backoff (until
  ``--reconnect-timeout``); the new session holds nothing, so unstarted tasks of the old one are
  dropped (the master requeued them), and unsent results are sent again only to the same
  master instance (which counts them as stale).

The connection itself is ``_session.py``'s, running the code ``_executor.py``'s, the log of
failed tasks ``_failures.py``'s.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from typing import Any, List, Sequence, Tuple

from .. import _dial
from .. import _protocol as P
from .._frame import as_payload
from .._output import wrap
from ..errors import ProtocolError
from . import _kept
from ._common import (
    DEFAULT_PREFETCH,
    EXIT_CONFIG,
    EXIT_LOST,
    EXIT_OK,
    RESULT_OVERHEAD,
    Stop,
    log,
    perf_ns,
)
from ._devices import DevicePool, gpu_count
from ._executor import Executing
from ._failures import FailureLog
from ._latency import RoundTrip
from ._output import Capture
from ._prefetch import EMA_ALPHA, prefetch_target_ns
from ._results import SEGMENT_RESULT_BYTES, Reporting
from ._services import Service, serve_frame
from ._session import RECV_BYTES, Session
from ._task import Task, queue_assignments, queue_calls
from ._watchdog import Watchdog

#: Between two queued tasks the socket is read (new assignments, ABORT) once this long has
#: passed since the last read. A read that finds nothing costs ~1.7 us (a system call and
#: Python's BlockingIOError), a third of a no-op task's time in the worker: they now read
#: every ~10 tasks. A task aborted in the queue meanwhile may start up to this much later
#: (its result is discarded); arrival times come from the kernel's timestamps either way.
READ_BETWEEN_TASKS_NS = 50_000
# In-session ERROR codes after which reconnecting would not help.
_CONFIG_ERRORS = frozenset({P.ERR_AUTH, P.ERR_VERSION})


class WorkerConnection(Session, Executing, Watchdog, Reporting):
    """One worker connection (``slots=1``): the pull loop of a child process.

    Args:
        address: The master's ``host:port``.
        token: The worker token.
        name: Informational name sent in ``HELLO``.
        max_prefetch: Upper bound of the adaptive prefetch.
        connect_timeout: Seconds to wait for the connection and the handshake.
        tls: Connect with TLS (``True`` or an ``ssl.SSLContext``).
        ca_file: PEM certificate(s) to trust (implies TLS).
        task_memory_mb: Address-space limit (``RLIMIT_AS``, MiB) of the executor process;
            when set, every task runs in the executor. None: no limit.
        reconnect_timeout: Seconds to keep trying to reconnect after the connection drops
            (0: forever; None: do not reconnect, exit with ``EXIT_LOST``).
        services: The named functions to serve (:func:`load_services`); announced with
            ``SERVE`` at the start of every session.
        board: This child's record on the parent's slot board (``_board.py``): the task it
            runs in its own process and its heartbeat stamps. None: not supervised.
        identity: The stable identity sent in ``HELLO`` (``host:supervisor-pid/slot`` for a
            supervised child, so a replaced child is the same worker to the master, which
            keeps its pace for hedging). None: ``host:pid`` of this process.
        capture: This process's capture of task output (``_output.py``), installed by
            :func:`~rtpool.worker.run_child`; None: tasks print to the worker's stdout.

    Raises:
        RtpoolError: The first connection fails (``ConnectError``, ``AuthenticationError``,
            ``ProtocolError``).
    """

    def __init__(
        self,
        address: str,
        token: str,
        name: str,
        max_prefetch: int = DEFAULT_PREFETCH,
        connect_timeout: float = 10.0,
        tls: Any = False,
        ca_file: str | None = None,
        *,
        task_memory_mb: int | None = None,
        reconnect_timeout: float | None = 0.0,
        services: Sequence[Service] = (),
        board: Any = None,
        connect: bool = True,
        identity: str | None = None,
        capture: Capture | None = None,
    ) -> None:
        Session.__init__(
            self, address, token, name, connect_timeout, tls, ca_file, reconnect_timeout
        )
        self.identity = identity or _dial.worker_identity()
        self.board = board
        self._init_executing(list(services))
        self._init_watchdog()
        #: Tasks whose executor process died here (their retries run there too).
        self._suspects: set = set()
        self.max_prefetch = max(1, max_prefetch)
        self.task_memory_mb = task_memory_mb or None
        self.pending_bytes = 0
        # Credits granted with PULL and not yet used by ASSIGN.
        self.outstanding = 0
        self.ema_ns: float | None = None
        #: PULL -> ASSIGN delays: the round trip that prefetch covers.
        self.round_trip = RoundTrip()
        #: The prefetch target (ns of work) for the round trip ``_target_rtt_ns``.
        self._target_rtt_ns = 0
        self._target_ns = prefetch_target_ns(0)
        self.prefetch = 1
        self.queue: deque[Task] = deque()
        self.pending: List[list] = []
        #: The main loop is between a batch's arrival and its return to waiting, so a task
        #: taken from the queue may be running (read by the heartbeat thread; set per batch,
        #: not per task: the no-op hot path).
        self._busy = True
        # Results whose write failed when the connection dropped, for the next session.
        self.unsent: List[list] = []
        self._serve = serve_frame(self.services) if self.services else b""
        #: Messages of the master's ``ERROR serve_conflict`` answers (functions refused).
        self.refused: List[str] = []
        self._failures = FailureLog()
        self._capture = capture
        #: This process's GPUs when it holds its own connection and the host's devices
        #: (``--procs 1``), else None (a host's relay gives each task its devices).
        self.devices: DevicePool | None = None
        if connect:  # else the owner calls connect_first() once its signal handlers are in
            self._start_session(*self._connect(connect_timeout))

    def _start_session(self, *parts: Any) -> bool:
        restarted = Session._start_session(self, *parts)
        self.round_trip.reset()
        if restarted:
            # A restarted master requeued every task of ours: their results are not wanted.
            dropped = len(self.unsent) + len(self.pending)
            if dropped:
                log(
                    f"the master restarted; dropping {dropped} results it no longer expects",
                    logging.WARNING,
                )
            self.unsent = []
            self.pending = []
            self.pending_bytes = 0
        return restarted

    def _holds_tasks(self) -> bool:
        return self._busy or bool(self.queue) or bool(self.pending)

    def _end_session(self) -> None:
        """Close the connection and forget what the master took back with it."""
        Session._end_session(self)
        # The master requeued the unstarted tasks; the code cache is per connection.
        self.queue.clear()
        self.outstanding = 0
        self.round_trip.withdraw()
        self.codes.clear()
        self.functions.clear()

    def _on_second_signal(self) -> None:
        ex = self._executor
        if ex is not None:  # its parent-death signal would spare the task's grandchildren
            ex.kill_group()

    # -- messages ---------------------------------------------------------------------------

    def _on_messages(self, msgs: List[list], now: int) -> None:
        put = self.queue.append
        try:
            for msg in msgs:
                kind = msg[0]
                if kind == P.ASSIGN:
                    tasks = msg[1]
                    self.outstanding = max(0, self.outstanding - len(tasks))
                    self.round_trip.on_assign(len(tasks), now)
                    queue_assignments(tasks, self.codes, now, put)
                elif kind == P.ASSIGN_CALLS:
                    calls = msg[1]
                    self.outstanding = max(0, self.outstanding - len(calls))
                    self.round_trip.on_assign(len(calls), now)
                    queue_calls(calls, now, put)
                elif kind == P.ABORT:
                    self._on_abort(msg[1], now)
                elif kind == P.DROP:
                    _kept.drop(msg[1])
                elif kind == P.ERROR:
                    self._on_error(msg[1], msg[2])
                elif kind == P.HEARTBEAT:
                    self.master_answers = True  # its answer to ours: the path works
                else:
                    raise Stop(EXIT_LOST, f"unexpected message kind {kind} from the master")
        except ProtocolError as exc:
            raise Stop(EXIT_LOST, str(exc)) from None

    def _on_error(self, code: str, message: str) -> None:
        if code == P.ERR_SERVE_CONFLICT:
            # Not fatal: the master serves the worker's other functions.
            self.refused.append(message)
            log(f"the master refused to serve a function: {message}", logging.WARNING)
        elif code in P.NON_FATAL_ERRORS:
            log(f"master reported {code}: {message}", logging.WARNING)
        elif code in _CONFIG_ERRORS:
            raise Stop(EXIT_CONFIG, f"the master reported {code}: {message}")
        else:
            if code == P.ERR_NOT_LEADER:  # deposed: dial the leader it names first
                self.masters.follow(message)
            raise Stop(EXIT_LOST, f"the master reported {code}: {message}")

    def _on_abort(self, entries: List[list], now: int) -> None:
        """Drop the named unstarted tasks, flag the running one for a kill; answer status 2.

        ``entries`` are ``[task, attempt]``. A task that runs here (not in the executor
        process) cannot be interrupted: when the watchdog reads its ``ABORT`` while it runs,
        a supervised child retires (``_watchdog.py``); otherwise (read between tasks, or not
        a child of ``rtpool worker``) its result is sent when it ends and the master discards
        it.
        """
        wanted = {(e[0], e[1]) for e in entries}
        if self._running is not None and self._running in wanted:
            self._abort_running = True  # _await_executor kills it and reports it
        inproc = self._inproc
        if inproc is not None and self.board is not None:
            if (inproc.task_id, inproc.attempt) in wanted:
                self._on_abort_running()  # the watchdog read it: retire this child process
        queue = self.queue
        aborted = [t for t in queue if (t.task_id, t.attempt) in wanted]
        if not aborted:
            return
        kept = [t for t in queue if (t.task_id, t.attempt) not in wanted]
        queue.clear()
        queue.extend(kept)
        message = b"aborted by the master before it started"
        for t in aborted:
            wait_us = (now - t.received_ns) // 1000
            self._add_result(
                [t.task_id, t.attempt, P.STATUS_CANCELLED, message, 0, wait_us, perf_ns()]
            )

    # -- running tasks ----------------------------------------------------------------------

    def _run(self, t: Task) -> None:
        # wait_us runs from receipt to the call (unpickling the arguments included), exec_us
        # is the call (for a named function, decoding its arguments and encoding its results
        # included), and flush_us from its end to the write (pickling the result included).
        devices = None if t.res is None else self._devices_of(t)
        if (
            t.timeout_ms
            or self.task_memory_mb
            or devices is not None
            or (t.attempt > 1 and self._is_suspect(t))
        ):
            # A retry of a task that killed a child of this worker runs where a crash costs
            # only the executor, and is reported as the task's (status LOST). A GPU task
            # runs there with its devices in CUDA_VISIBLE_DEVICES (_executor.py).
            try:
                status, data, t_start, t_end = self._run_in_executor(t, devices)
            finally:
                if devices is not None and t.devices is None:
                    self.devices.free((t.task_id, t.attempt))  # type: ignore[union-attr]
            t_begin = t_start
            output, self._taken = self._taken, b""
        else:
            if t.attempt > 1 and self.pending:
                # A retried task may be the one that killed its last worker: send the results
                # before it first, so that if it kills this one too, the master sees it as the
                # oldest task this worker held (the one it blames), not an innocent neighbour
                # whose result was still waiting to be batched.
                self._flush(pull=False)
            board = self.board
            self._inproc_ns = started = perf_ns()
            if board is not None:  # if this process dies now, the parent blames the task
                board.task_started(t.task_id, t.attempt, started)
            self._inproc = t  # watched by the heartbeat thread (_watchdog.py)
            output = b""
            if t.inputs is not None:
                t_begin = perf_ns()
                status, data, t_start, t_end = self._execute_call(
                    t.function, t.args, t.inputs, t.keep
                )
            else:
                fn = self._function(t.function)
                out = self._capture
                if out is not None:
                    out.active = t  # its prints and log records go to its output area
                t_begin = perf_ns()  # after the one-time code load, no guide to the next
                status, data, t_start, t_end = self._execute(fn, t.args)
                if out is not None:
                    out.active = None
                    if out.started:  # it printed: rare, and only then any cost
                        output = out.take(self.identity)
            self._inproc = None
            if self._watching:  # the watchdog acts for this task now: wait until it is done
                with self._watch_lock:
                    pass
            if board is not None:
                board.task_ended()
        size = len(data) + RESULT_OVERHEAD
        if size > self.frame_budget:
            status = P.STATUS_ERROR
            exc = self._too_large(len(data))
            data = self._call_error(exc) if t.inputs is not None else self._error(exc)
            size = len(data) + RESULT_OVERHEAD
        if size >= SEGMENT_RESULT_BYTES:
            data = as_payload(data)  # sent as a segment, not copied into msgpack
        if status != P.STATUS_OK and status != P.STATUS_CANCELLED:
            self._failures.task_failed(t, status, data, self.functions)
        if output:
            if size + len(output) <= self.frame_budget:  # else the result goes without it
                data = wrap(output, data)
                size += len(output)
        if self.pending_bytes + size > self.frame_budget:
            self._flush()
        self.pending_bytes += size
        self.pending.append(
            [
                t.task_id,
                t.attempt,
                status,
                data,
                (t_end - t_start) // 1000,
                (t_start - t.received_ns) // 1000,
                t_end,
            ]
        )
        sample = perf_ns() - t_begin
        ema = self.ema_ns
        if ema is None or sample > 2 * ema:
            # Fast attack: one task much slower than the average is enough to stop hoarding
            # (a package of 10 ms tasks after a run of no-ops); the average decays slowly.
            ema = sample
        else:
            ema += EMA_ALPHA * (sample - ema)
        self.ema_ns = ema
        # adaptive_prefetch(ema, self.max_prefetch, rtt), without a call per task: the target
        # changes only with the round trip.
        rtt = self.round_trip.rtt_ns
        if rtt != self._target_rtt_ns:
            self._target_rtt_ns = rtt
            self._target_ns = prefetch_target_ns(rtt)
        prefetch = int(self._target_ns / (ema + 1))
        self.prefetch = prefetch = (
            1 if prefetch < 1 else prefetch if prefetch < self.max_prefetch else self.max_prefetch
        )
        surplus = len(self.queue) - prefetch
        # Some slack above a deep prefetch: a round trip or task time measured a little
        # differently must not hand back one task and withdraw every credit (a whole round
        # trip idle to get them back). A prefetch of 1 (a near master, tasks of 2 ms or more)
        # has none: a slow worker hands back all it cannot start.
        if surplus > prefetch // 2:
            self._give_back(surplus)

    def _devices_of(self, t: Task) -> Tuple[str, ...] | None:
        """The device ids a task with a request runs on: those its host's relay gave it, else
        those this process takes for it now (freed when it ends); None: it asks for no GPU."""
        if t.devices is not None:
            return t.devices or None
        count = gpu_count(t.res)
        if not count or self.devices is None:
            return None
        return self.devices.take((t.task_id, t.attempt), count, owner=0)

    def _is_suspect(self, t: Task) -> bool:
        """Whether a retried task killed a child of this worker (or its executor here)."""
        if t.task_id in self._suspects:
            return True
        board = self.board
        return board is not None and board.board.is_suspect(t.task_id)

    def _give_back(self, count: int) -> None:
        """RETURN the last ``count`` unstarted tasks, so idle workers can take them.

        The prefetch was sized for shorter tasks: what this worker holds beyond its new prefetch
        would otherwise wait here while other workers run dry (the end of a package, or a slow
        machine among fast ones). ``RETURN`` also withdraws the credits still outstanding at the
        master, so the tasks do not come straight back; the next flush asks for what the new
        prefetch wants.
        """
        queue = self.queue
        given = [queue.pop() for _ in range(count)]
        given.reverse()
        self._send(P.encode(P.RETURN, [[t.task_id, t.attempt] for t in given]))
        self.outstanding = 0
        self.round_trip.withdraw()

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> int:
        """Pull and run tasks until a signal, a fatal error, or a connection loss that
        reconnection could not repair; return the exit code."""
        hb = threading.Thread(target=self._heartbeat_loop, name="rtpool-heartbeat", daemon=True)
        hb.start()
        try:
            while True:
                try:
                    return self._serve_session()
                except Stop as stop:
                    self._end_session()
                    if self.stopping:
                        log(f"{stop}; exiting")
                        return EXIT_OK
                    if stop.code != EXIT_LOST or self.reconnect_timeout is None:
                        log(f"{stop}; exiting (master {self.address})", logging.ERROR)
                        return stop.code
                    log(f"{stop}; reconnecting (master {self.address})", logging.WARNING)
                code = self._reconnect()
                if code is not None:
                    return code
        finally:
            self._hb_stop.set()
            self._kill_executor()
            try:
                self.sock.close()
            except OSError:
                pass

    def _serve_session(self) -> int:
        if self._serve:
            self._send(self._serve)  # before the first PULL, in every session
        if self._early:
            early, self._early = self._early, []
            self._on_messages(early, perf_ns())
        if self.unsent:
            self._send_unsent()
        self._flush()
        # At once, so the master's answer (which sets master_answers: a cut path is then
        # noticed) comes right behind the first assignments.
        self._send(P.encode(P.HEARTBEAT))
        queue = self.queue
        realtime = self.realtime
        read_ns = 0
        self._busy = True  # until the loop first waits with nothing held
        while not self.stopping:
            if queue:
                now = perf_ns()
                if now - read_ns >= READ_BETWEEN_TASKS_NS:
                    read_ns = now
                    self._recv_nowait()
                    if not queue:  # an ABORT took it
                        continue
            else:
                if self.pending:
                    self._flush()
                # Nothing queued, running or unsent: the heartbeat thread may go idle (an
                # assignment read by _wait fills the queue before a task can run).
                self._busy = False
                self._wait()  # it also reads what woke it: no second recv
                if not queue or self.stopping:
                    continue
                self._busy = True
            if realtime is not None:
                realtime.between_tasks()  # back to SCHED_FIFO if the last task was demoted
            self._run(queue.popleft())
            if not queue or self._should_flush():
                self._flush()
        return self._drain()

    def _drain(self) -> int:
        """Graceful shutdown: DRAIN, pending results, RETURN of unstarted tasks, close."""
        self._hb_stop.set()
        try:
            self._recv_nowait()
        except Stop:
            return EXIT_OK
        results, returned = len(self.pending), len(self.queue)
        log(
            f"stopping: sending {results} pending results and handing {returned} unstarted "
            f"tasks back to the master at {self.address}; exiting"
        )
        out = P.encode(P.DRAIN) + self._results_frame()
        if self.queue:
            out += P.encode(P.RETURN, [[t.task_id, t.attempt] for t in self.queue])
            self.queue.clear()
        try:
            self._send(out)
            # Half-close and wait for the master to close: closing with unread data would
            # reset the connection, and the master could miss the frames above.
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(2.0)
            while self.sock.recv(RECV_BYTES):
                pass
        except (Stop, OSError):
            pass
        return EXIT_OK
