"""``rtpool worker``: processes that pull tasks from the master and run them.

The parent process forks ``--procs`` children and supervises them (forwards SIGTERM/SIGINT,
restarts a child that crashes, with a bounded backoff). Each child holds one connection with
``slots=1`` and runs a single-threaded loop:

* **Credit-based pull.** The child keeps ``1 + prefetch`` tasks assigned to it (running, queued
  locally or promised by outstanding credits). ``prefetch`` adapts to about 2 ms of work by an
  EMA of the observed time per task: no-op tasks get a deep pipeline (throughput), 10 ms tasks
  keep one queued (load balance at the end of a package).
* **Batched results.** Results go out in one ``RESULT`` frame, with the ``PULL`` that tops the
  credits up, in one write: when the local queue runs empty, 64 results are pending, or the
  oldest pending result would wait more than 1 ms (also counting the next task's expected time,
  so a long task never holds back the result before it).
* **Graceful shutdown.** SIGTERM only sets a flag; after the running task the child sends
  ``DRAIN``, its pending results and ``RETURN`` of every unstarted task, then closes. A second
  signal exits at once. Whatever is still in flight is requeued by the master on disconnect.
* **Limits.** A task with a time limit (``timeout_ms``), or any task when the worker has a
  memory limit (``--task-memory-mb``), runs in an executor process (``_supervise.py``) that the
  child kills, with its whole process group, past the deadline or on ``ABORT``. Other tasks run
  in the child itself: no process hop on the fast path, but they cannot be interrupted.
* **Real-time mode** (``--realtime``). Each child locks its memory and runs its main thread (I/O
  and the tasks it runs itself) under ``SCHED_FIFO``, within a CPU budget; what it starts runs
  normal. Why, and what a refusal does: ``_realtime.py``.
* **Named functions** (``--serve MODULE``, grid RPC: ``docs/rpc.md``). The modules are
  imported once, in the parent before it forks; each session starts with ``SERVE`` (before the
  first ``PULL``), and ``ASSIGN_CALLS`` runs through the same queue, credits, executor and
  result batching as ``ASSIGN``, with msgpack arguments and results instead of pickle.
* **Reconnection.** When the connection drops, the child reconnects with backoff (until
  ``--reconnect-timeout``); the new session holds nothing, so unstarted tasks of the old one are
  dropped (the master requeued them), and unsent results are sent again only to the same
  master instance (which counts them as stale).

A background thread sends ``HEARTBEAT`` when nothing was sent for ``heartbeat_ms``, also while
a task runs, so the master's lease never expires for a busy worker. Imports are kept light:
start-up time counts.
"""

from __future__ import annotations

import argparse
import os
import pickle
import select
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

import msgpack

from . import _dial
from . import _protocol as P
from ._dial import default_name
from ._supervise import Executor, ExecutorDied, address_space_mib
from .errors import AuthenticationError, ConnectError, ProtocolError, RtpoolError

__all__ = [
    "ServeError",
    "Service",
    "WorkerConnection",
    "add_arguments",
    "load_services",
    "main",
    "run",
]

EXIT_OK = 0
#: The child cannot start: bad address, bad token. Restarting would not help.
EXIT_CONFIG = 2
#: The connection to the master dropped and could not be restored within
#: ``--reconnect-timeout`` (or reconnection is off).
EXIT_LOST = 3

DEFAULT_PREFETCH = 64
#: Prefetch aims at this much queued work per child.
PREFETCH_TARGET_NS = 2_000_000
#: Results wait at most this long for company before they are sent.
FLUSH_AFTER_NS = 1_000_000
FLUSH_AFTER_RESULTS = 64
_EMA_ALPHA = 0.2

_perf_ns = time.perf_counter_ns
_loads = pickle.loads
_dumps = pickle.dumps
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_RECV_BYTES = 1 << 18
_HEARTBEAT = P.encode(P.HEARTBEAT)
_SO_TIMESTAMPNS = 35  # Linux (asm-generic); not in the socket module
_TIMESPEC = struct.Struct("qq")
_CMSG_BYTES = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64
# Bytes of a RESULT frame besides the data (prefix, headers, ids, times), and per result.
_RESULT_FRAME_OVERHEAD = 64
_RESULT_OVERHEAD = 64

# Restarting crashed children: at most this many restarts of one slot within the window.
_RESTART_MAX = 5
_RESTART_WINDOW_S = 60.0
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0
# Reconnecting to the master: exponential backoff with jitter, each attempt bounded.
_RECONNECT_FIRST_S = 0.1
_RECONNECT_MAX_S = 5.0
_RECONNECT_ATTEMPT_TIMEOUT_S = 5.0
# In-session ERROR codes after which reconnecting would not help.
_CONFIG_ERRORS = frozenset({P.ERR_AUTH, P.ERR_VERSION})


def _log(message: str) -> None:
    print(f"rtpool worker[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def adaptive_prefetch(task_ns: float, max_prefetch: int) -> int:
    """Tasks to queue ahead: about 2 ms of tasks of ``task_ns`` each, from 1 to ``max_prefetch``."""
    return min(max_prefetch, max(1, int(PREFETCH_TARGET_NS / (task_ns + 1))))


def _enable_kernel_timestamps(sock: socket.socket) -> bool:
    # An assignment that arrives while a task runs waits in the socket until the task ends;
    # the kernel's receive timestamp (SO_TIMESTAMPNS) lets wait_us count that time too.
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def _received_ns(ancillary: Any) -> int:
    """perf_counter_ns() of when the kernel received the data just read (else: now)."""
    now = _perf_ns()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            age = time.time_ns() - (sec * 1_000_000_000 + nsec)
            if 0 < age < 60_000_000_000:  # the wall clock may have been stepped
                return now - age
    return now


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except Exception:
        pass


class _Welcome(NamedTuple):
    """``WELCOME`` as a worker reads it: ``lease_ms`` and ``instance`` are None when an older
    master leaves them out."""

    version: int
    session: int
    max_frame_bytes: int
    heartbeat_ms: int
    lease_ms: int | None
    instance: int | None


def _connect_worker(
    address: str, token: str, name: str, timeout: float, tls: ssl.SSLContext | None
) -> Tuple[socket.socket, _Welcome, P.FrameReader, List[list]]:
    """``_dial.connect()`` for a worker, tolerant of a ``WELCOME`` with 4 to 6 fields.

    Raises:
        ConnectError, AuthenticationError, ProtocolError: As ``_dial.connect()``.
    """
    host, port = _dial.parse_address(address)
    where = f"{host}:{port}"
    sock = _dial._open_socket(host, port, timeout)
    if tls is not None:
        sock = _dial._wrap_tls(sock, tls, host, where)
    try:
        hello = P.encode(P.HELLO, P.PROTOCOL_VERSION, "worker", token, _dial._clip_name(name), 1)
        sock.sendall(hello)
        reader = P.FrameReader(P.PRE_AUTH_MAX_FRAME)
        msgs: List[list] = []
        while not msgs:
            try:
                data = sock.recv(65536)
            except OSError as exc:
                raise ConnectError(
                    f"connection to master at {where} failed during the handshake "
                    f"({exc.strerror or exc})"
                ) from None
            if not data:
                raise ConnectError(f"master at {where} closed the connection during the handshake")
            msgs = reader.feed(data)
        first = msgs[0]
        if first[0] == P.ERROR:
            raise _dial._handshake_error(first, where, "worker")
        if first[0] != P.WELCOME or not 5 <= len(first) <= 7:
            raise ProtocolError(f"master at {where} answered HELLO with {first!r:.100}")
        fields = first[1:] + [None] * (7 - len(first))
        welcome = _Welcome(*fields)
        reader.max_frame = welcome.max_frame_bytes
        sock.settimeout(None)
        return sock, welcome, reader, msgs[1:]
    except BaseException:
        sock.close()
        raise


def _seconds(ms: int) -> str:
    """``2000`` -> ``"2.0"``, ``300`` -> ``"0.3"``, ``1250`` -> ``"1.25"``."""
    text = f"{ms / 1000:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


class _Stop(Exception):
    """The connection is unusable; carries the exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _LoadFailure:
    """A function whose code could not be loaded: every task of it gets this report."""

    __slots__ = ("report",)

    def __init__(self, report: bytes) -> None:
        self.report = report


def _load_error_report(exc: BaseException, what: str, where: str) -> bytes:
    from ._serialize import dumps_error

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        hint = f"install module {exc.name!r} on the worker or put it on the worker's PYTHONPATH"
        new: BaseException = ModuleNotFoundError(
            f"cannot load {what} on worker {where}: {exc}; {hint}", name=exc.name
        )
    else:
        message = f"cannot load {what} on worker {where}: {type(exc).__name__}: {exc}"
        try:
            new = type(exc)(message) if type(exc).__module__ == "builtins" else None
        except Exception:
            new = None
        if new is None:
            new = RuntimeError(message)
    return dumps_error(new, tb)


class ServeError(RtpoolError):
    """A ``--serve`` module cannot be served: it does not import, it marks no function, or
    two modules serve the same name and version."""


class Service(NamedTuple):
    """One named function this worker serves."""

    #: Its position in the worker's list: the executor's key for it (see ``_CALL_KEY``).
    index: int
    name: str
    version: str
    fn: Any
    interface: Any
    module: str


# A call run in the executor travels as a task whose "function hash" is this prefix and the
# service's index (a code hash is a 32-byte digest: it never has this form).
_CALL_KEY = b"\0rtpool-call\0"
_CALL_INDEX = struct.Struct(">I")


def load_services(modules: Sequence[str]) -> List[Service]:
    """Import the ``--serve`` modules and collect the functions they mark with ``@remote``.

    Only this imports the interface machinery (and, through the modules, numpy): a worker
    that serves nothing never loads them.

    Args:
        modules: Importable module names, in the order given on the command line.

    Returns:
        The services, in module order.

    Raises:
        ServeError: A module fails to import or marks no function, or a name and version is
            served by two modules; the message names the module.
    """
    from .rpc import remote

    services: List[Service] = []
    seen: Dict[Tuple[str, str], str] = {}
    for module_name in modules:
        try:
            # It imports the module; its errors name the module.
            found = remote.served_functions(module_name)
        except Exception as exc:
            hint = ""
            if isinstance(exc, ModuleNotFoundError):
                hint = "; install it, or put its directory on the worker's PYTHONPATH"
            raise ServeError(f"--serve {module_name}: {type(exc).__name__}: {exc}{hint}") from exc
        if not found:  # served_functions refuses that already; kept for the message
            raise ServeError(
                f"--serve {module_name}: module {module_name} serves no functions: mark them "
                "with @rtpool.remote"
            )
        for fn, iface in found:
            key = (iface.name, iface.version)
            if key in seen:
                raise ServeError(
                    f"--serve {module_name}: function {iface.name!r} version {iface.version!r} "
                    f"is also served by module {seen[key]!r}; give one of them another version"
                )
            seen[key] = module_name
            services.append(Service(len(services), key[0], key[1], fn, iface, module_name))
    return services


def _serve_frame(services: Sequence[Service]) -> bytes:
    """The ``SERVE`` frame of these services (sent at the start of every session)."""
    return P.encode(P.SERVE, [[s.name, s.version, s.interface.to_bytes()] for s in services])


class WorkerConnection:
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
    ) -> None:
        self.address = address
        self.name = name
        self._token = token
        self.connect_timeout = connect_timeout
        self.max_prefetch = max(1, max_prefetch)
        self.task_memory_mb = task_memory_mb or None
        self.reconnect_timeout = reconnect_timeout
        self._tls_context = _dial.tls_context(tls, ca_file)  # also for reconnections
        self.pending_bytes = 0
        self.stopping = False
        self._signals = 0
        self._send_lock = threading.Lock()
        self._hb_stop = threading.Event()
        # Credits granted with PULL and not yet used by ASSIGN.
        self.outstanding = 0
        self.ema_ns: float | None = None
        self.prefetch = 1
        self.codes: Dict[bytes, bytes] = {}
        self.functions: Dict[bytes, Any] = {}
        self.queue: deque = deque()
        self.pending: List[list] = []
        # Results whose write failed when the connection dropped, for the next session.
        self.unsent: List[list] = []
        #: The master's ``WELCOME.instance`` (None: not announced yet).
        self.instance: int | None = None
        #: Sessions opened so far (1 + successful reconnections).
        self.sessions = 0
        self._executor: Executor | None = None
        self._memory_warned = False
        # (task, attempt) running in the executor, and whether ABORT named it.
        self._running: Tuple[int, int] | None = None
        self._abort_running = False
        #: Real-time mode of this process (``run_child`` sets it), or None.
        self.realtime: Any = None
        self.services: List[Service] = list(services)
        self._services_by_key = {(s.name, s.version): s for s in self.services}
        self._serve = b""
        if self.services:
            from .rpc import codec as _callcodec  # only with --serve: it may need numpy

            self._serve = _serve_frame(self.services)
            self._invoke = _callcodec.invoke
            self._encode_error = _callcodec.encode_error
        #: Messages of the master's ``ERROR serve_conflict`` answers (functions refused).
        self.refused: List[str] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._start_session(
            *_connect_worker(address, token, name, connect_timeout, self._tls_context)
        )

    def _start_session(
        self, sock: socket.socket, welcome: _Welcome, reader: P.FrameReader, early: List[list]
    ) -> None:
        with self._send_lock:
            self.sock = sock
            self._last_send = time.monotonic()
        self.reader = reader
        self._early = early
        self.session = welcome.session
        heartbeat_ms = max(welcome.heartbeat_ms, 1)
        if welcome.lease_ms:
            # At least three heartbeats per lease, whatever heartbeat_ms says.
            heartbeat_ms = min(heartbeat_ms, max(welcome.lease_ms // 3, 1))
        self.heartbeat_s = heartbeat_ms / 1000
        # An SSLSocket has no recvmsg and takes no recv flags; it may hold decrypted bytes
        # that select() does not see.
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._kernel_ts = not self._tls and _enable_kernel_timestamps(sock)
        # A RESULT frame must fit the master's frame limit: results are batched up to this
        # many bytes, and a single larger result is replaced by an error.
        self.frame_budget = welcome.max_frame_bytes - _RESULT_FRAME_OVERHEAD
        old, new = self.instance, welcome.instance
        if old is not None and new is not None and old != new:
            # A restarted master requeued every task of ours: their results are not wanted.
            dropped = len(self.unsent) + len(self.pending)
            if dropped:
                _log(f"the master restarted; dropping {dropped} results it no longer expects")
            self.unsent = []
            self.pending = []
            self.pending_bytes = 0
        if new is not None:
            self.instance = new
        self.sessions += 1

    def _end_session(self) -> None:
        """Close the connection and forget what the master took back with it."""
        with self._send_lock:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        # The master requeued the unstarted tasks; the code cache is per connection.
        self.queue.clear()
        self.outstanding = 0
        self.codes.clear()
        self.functions.clear()
        self._early = []

    # -- signals ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM: graceful shutdown, a second one exits at once. SIGINT is the parent's."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            ex = self._executor
            if ex is not None:  # its parent-death signal would spare the task's grandchildren
                ex.kill_group()
            os._exit(1)
        self.stopping = True

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    # -- I/O --------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(data)
                self._last_send = time.monotonic()
        except OSError as exc:
            raise _Stop(EXIT_LOST, f"sending to the master failed: {exc.strerror or exc}") from None

    def _heartbeat_loop(self) -> None:
        # Runs for the life of serve(), across reconnections; it also keeps the lease while a
        # task runs (in the executor, or here between the task's bytecodes).
        while not self._hb_stop.wait(self.heartbeat_s / 2):
            if time.monotonic() - self._last_send >= self.heartbeat_s * 0.9:
                try:
                    with self._send_lock:
                        self.sock.sendall(_HEARTBEAT)
                        self._last_send = time.monotonic()
                except OSError:
                    pass  # the main loop finds the broken connection and reconnects

    def _recv_nowait(self) -> None:
        """Take whatever the socket holds without blocking."""
        try:
            if self._tls:
                if not self.sock.pending() and not select.select([self.sock], [], [], 0)[0]:
                    return
                data, ancillary = self.sock.recv(_RECV_BYTES), ()
            elif self._kernel_ts:
                data, ancillary, _, _ = self.sock.recvmsg(_RECV_BYTES, _CMSG_BYTES, _MSG_DONTWAIT)
            else:
                data, ancillary = self.sock.recv(_RECV_BYTES, _MSG_DONTWAIT), ()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise _Stop(EXIT_LOST, f"connection error: {exc.strerror or exc}") from None
        if not data:
            raise _Stop(EXIT_LOST, "the master closed the connection")
        try:
            msgs = self.reader.feed(data)
        except ProtocolError as exc:
            raise _Stop(EXIT_LOST, f"bad frame from the master: {exc}") from None
        self._on_messages(msgs, _received_ns(ancillary))

    def _wait(self) -> None:
        """Block until the master sends something or a signal arrives."""
        if self.realtime is not None:
            self.realtime.before_wait()  # back to SCHED_FIFO if the budget demoted us
        if self._tls and self.sock.pending():
            self._recv_nowait()
            return
        readable, _, _ = select.select([self.sock, self._wake_r], [], [])
        if self._wake_r in readable:
            self._drain_wakeups()
        if self.sock in readable:
            self._recv_nowait()

    def _on_messages(self, msgs: List[list], now: int) -> None:
        queue = self.queue
        codes = self.codes
        for msg in msgs:
            kind = msg[0]
            if kind == P.ASSIGN:
                tasks = msg[1]
                self.outstanding = max(0, self.outstanding - len(tasks))
                for t in tasks:  # [task, attempt, fn_hash, fn_code|nil, args, timeout_ms]
                    if t[3] is not None:
                        codes[t[2]] = t[3]
                    t[3] = now  # reuse the slot: receipt time
                    if len(t) < 6:
                        t.append(0)  # a master older than timeout_ms
                    queue.append(t)
            elif kind == P.ASSIGN_CALLS:
                calls = msg[1]
                self.outstanding = max(0, self.outstanding - len(calls))
                for c in calls:  # [task, attempt, name, version, args, inputs, timeout_ms]
                    # Queued as a task whose function is (name, version), with its inputs
                    # appended: [task, attempt, (name, version), received_ns, args,
                    # timeout_ms, inputs].
                    queue.append([c[0], c[1], (c[2], c[3]), now, c[4], c[6], c[5]])
            elif kind == P.ABORT:
                self._on_abort(msg[1], now)
            elif kind == P.ERROR:
                code, message = msg[1], msg[2]
                if code == P.ERR_SERVE_CONFLICT:
                    # Not fatal: the master serves the worker's other functions.
                    self.refused.append(message)
                    _log(f"warning: the master refused to serve a function: {message}")
                elif code in P.NON_FATAL_ERRORS:
                    _log(f"master reported {code}: {message}")
                elif code in _CONFIG_ERRORS:
                    raise _Stop(EXIT_CONFIG, f"the master reported {code}: {message}")
                else:
                    raise _Stop(EXIT_LOST, f"the master reported {code}: {message}")
            else:
                raise _Stop(EXIT_LOST, f"unexpected message kind {kind} from the master")

    def _on_abort(self, tasks: List[list], now: int) -> None:
        """Drop the named unstarted tasks, flag the running one for a kill; answer status 2.

        A task that runs here (not in the executor) is never named: this is only read between
        such tasks, when its result is already pending or sent, and the master discards it.
        """
        wanted = {(t[0], t[1]) for t in tasks}
        if self._running is not None and self._running in wanted:
            self._abort_running = True  # _await_executor kills it and reports it
        queue = self.queue
        aborted = [t for t in queue if (t[0], t[1]) in wanted]
        if not aborted:
            return
        kept = [t for t in queue if (t[0], t[1]) not in wanted]
        queue.clear()
        queue.extend(kept)
        message = b"aborted by the master before it started"
        for t in aborted:
            self._add_result(
                [t[0], t[1], P.STATUS_CANCELLED, message, 0, (now - t[3]) // 1000, _perf_ns()]
            )

    def _add_result(self, result: list) -> None:
        """Queue a result that is not the end of a task run here (it asks for no credit)."""
        size = len(result[3]) + _RESULT_OVERHEAD
        if self.pending_bytes + size > self.frame_budget:
            self._flush(pull=False)
        self.pending_bytes += size
        self.pending.append(result)

    # -- running tasks ----------------------------------------------------------------------

    def _function(self, fn_hash: bytes) -> Any:
        fn = self.functions.get(fn_hash)
        if fn is not None:
            return fn
        # The code stays cached: a fresh executor needs it again.
        code = self.codes.get(fn_hash)
        try:
            if code is None:
                raise LookupError(
                    f"the master sent no code for function {fn_hash.hex()[:16]}; "
                    "this is a bug in the master"
                )
            fn = _loads(code)
        except BaseException as exc:
            fn = _LoadFailure(_load_error_report(exc, "the task's function", self.name))
        self.functions[fn_hash] = fn
        return fn

    def _run(self, t: list) -> None:
        # t = [task, attempt, fn_hash, received_ns, args, timeout_ms], and for a call of a
        # named function [task, attempt, (name, version), received_ns, args, timeout_ms,
        # inputs]. wait_us runs from receipt to the call (unpickling the arguments included),
        # exec_us is the call (for a named function, decoding its arguments and encoding its
        # results included), and flush_us from its end to the write (pickling the result
        # included).
        if t[5] or self.task_memory_mb:
            status, data, t_start, t_end = self._run_in_executor(t)
            t_begin = t_start
        else:
            if t[1] > 1 and self.pending:
                # A retried task may be the one that killed its last worker: send the results
                # before it first, so that if it kills this one too, the master sees it as the
                # oldest task this worker held (the one it blames), not an innocent neighbour
                # whose result was still waiting to be batched.
                self._flush(pull=False)
            if len(t) > 6:
                t_begin = _perf_ns()
                status, data, t_start, t_end = self._execute_call(t[2], t[4], t[6])
            else:
                fn = self._function(t[2])
                t_begin = _perf_ns()  # after the one-time code load, no guide to the next
                status, data, t_start, t_end = self._execute(fn, t[4])
        size = len(data) + _RESULT_OVERHEAD
        if size > self.frame_budget:
            status = P.STATUS_ERROR
            exc = self._too_large(len(data))
            data = self._call_error(exc) if len(t) > 6 else self._error(exc)
            size = len(data) + _RESULT_OVERHEAD
        if self.pending_bytes + size > self.frame_budget:
            self._flush()
        self.pending_bytes += size
        self.pending.append(
            [t[0], t[1], status, data, (t_end - t_start) // 1000, (t_start - t[3]) // 1000, t_end]
        )
        sample = _perf_ns() - t_begin
        ema = self.ema_ns
        if ema is None or sample > 2 * ema:
            # Fast attack: one task much slower than the average is enough to stop hoarding
            # (a package of 10 ms tasks after a run of no-ops); the average decays slowly.
            ema = sample
        else:
            ema += _EMA_ALPHA * (sample - ema)
        self.ema_ns = ema
        self.prefetch = adaptive_prefetch(ema, self.max_prefetch)
        surplus = len(self.queue) - self.prefetch
        if surplus > 0:
            self._give_back(surplus)

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
        self._send(P.encode(P.RETURN, [[t[0], t[1]] for t in given]))
        self.outstanding = 0

    # -- the executor (tasks with limits) ---------------------------------------------------

    def _run_in_executor(self, t: list) -> Tuple[int, bytes, int, int]:
        """Run a task in the executor until it answers, its deadline passes, or ``ABORT``.

        Returns ``(status, data, start_ns, end_ns)`` like :meth:`_execute`; the executor is
        killed (with its process group) on a timeout or an abort, and when the connection
        drops meanwhile (``_Stop`` goes on up: the master requeued the task).
        """
        task, attempt, fn_hash, _, payload, timeout_ms = t[:6]
        code = None
        if len(t) > 6:  # a call: its service's key, its arguments and inputs in one blob
            service = self._services_by_key.get(fn_hash)
            if service is None:
                now = _perf_ns()
                return P.STATUS_FAILED, self._not_served(fn_hash), now, now
            fn_hash = _CALL_KEY + _CALL_INDEX.pack(service.index)
            payload = msgpack.packb([payload, t[6]], use_bin_type=True)
        else:
            code = self.codes.get(fn_hash)
        if self.pending:
            self._flush(pull=False)  # a long task must not hold earlier results back
        ex = self._executor
        if ex is None or not ex.is_alive():
            ex = self._executor = self._start_executor()
        t_start = _perf_ns()
        deadline = t_start + timeout_ms * 1_000_000 if timeout_ms else None
        self._running = (task, attempt)
        self._abort_running = False
        try:
            ex.submit(fn_hash, code, payload)
            answer = self._await_executor(ex, deadline)
        except ExecutorDied as died:
            self._executor = None
            return P.STATUS_FAILED, self._died_message(str(died), attempt), t_start, _perf_ns()
        except BaseException:
            self._kill_executor()
            raise
        finally:
            self._running = None
        if answer is not None:
            status, data, exec_ns = answer
            t_end = _perf_ns()
            return status, data, max(t_start, t_end - exec_ns), t_end
        self._kill_executor()
        t_end = _perf_ns()
        if self._abort_running:
            text = f"aborted by the master while running; killed (attempt {attempt})"
            return P.STATUS_CANCELLED, text.encode(), t_start, t_end
        text = (
            f"task exceeded its time limit of {_seconds(timeout_ms)} s and was killed "
            f"(attempt {attempt})"
        )
        return P.STATUS_TIMEOUT, text.encode(), t_start, t_end

    def _await_executor(self, ex: Executor, deadline: int | None) -> Tuple[int, bytes, int] | None:
        """The executor's answer, or None at the deadline or on ``ABORT`` of the task.

        Meanwhile it reads the master's messages (assignments queue up, ``ABORT`` is seen at
        once) and signals (SIGTERM lets the task finish, as for a task run here).
        """
        fds = [ex, self.sock, self._wake_r]
        while not self._abort_running:
            if self._tls and self.sock.pending():  # decrypted bytes select() cannot see
                self._recv_nowait()
                continue
            timeout = None
            if deadline is not None:
                timeout = (deadline - _perf_ns()) / 1e9
                if timeout <= 0:
                    return None
            readable, _, _ = select.select(fds, [], [], timeout)
            if ex in readable:
                answer = ex.read()
                if answer is not None:
                    return answer
            if self.sock in readable:
                self._recv_nowait()
            if self._wake_r in readable:
                self._drain_wakeups()
        return None

    def _start_executor(self) -> Executor:
        limit = self.task_memory_mb
        if limit and not self._memory_warned:
            self._memory_warned = True
            base = address_space_mib()
            if base is not None and base >= limit:
                _log(
                    f"--task-memory-mb {limit} is below the address space the executor starts "
                    f"with ({base} MiB, the worker's own): tasks will get MemoryError as soon as "
                    f"they need more memory; use a limit well above {base}"
                )
        return Executor.start(
            self._executor_task, limit, close=(self.sock, self._wake_r, self._wake_w)
        )

    def _executor_task(self, fn_hash: bytes, code: bytes | None, payload: bytes) -> tuple:
        """Runs in the executor (a fork of this object): one task -> (status, data, exec_ns)."""
        if fn_hash.startswith(_CALL_KEY):
            service = self.services[_CALL_INDEX.unpack_from(fn_hash, len(_CALL_KEY))[0]]
            args, inputs = msgpack.unpackb(payload, raw=False)
            key = (service.name, service.version)
            status, data, t_start, t_end = self._execute_call(key, args, inputs)
            return status, data, t_end - t_start
        if code is not None:
            self.codes[fn_hash] = code
        status, data, t_start, t_end = self._execute(self._function(fn_hash), payload)
        return status, data, t_end - t_start

    def _kill_executor(self) -> None:
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.kill()

    @staticmethod
    def _died_message(how: str, attempt: int) -> bytes:
        text = f"the task's process died ({how}) while running the task (attempt {attempt})"
        if "SIGKILL" in how:
            text += "; the kernel's out-of-memory killer may have ended it"
        return text.encode()

    # -- executing and reporting ------------------------------------------------------------

    def _execute(self, fn: Any, payload: bytes) -> Tuple[int, bytes, int, int]:
        """Run one task: ``(status, data, start_ns, end_ns)`` of the call itself."""
        if type(fn) is _LoadFailure:
            now = _perf_ns()
            return P.STATUS_ERROR, fn.report, now, now
        try:
            args, kwargs = _loads(payload)
        except BaseException as exc:
            now = _perf_ns()
            return (
                P.STATUS_ERROR,
                _load_error_report(exc, "the task's arguments", self.name),
                now,
                now,
            )
        t_start = _perf_ns()
        try:
            value = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as exc:
            t_end = _perf_ns()
            return P.STATUS_ERROR, self._error(exc), t_start, t_end
        t_end = _perf_ns()
        try:
            return P.STATUS_OK, _dumps(value, 5), t_start, t_end
        except Exception:
            data = self._result_fallback(value)
            if type(data) is bytes:
                return P.STATUS_OK, data, t_start, t_end
            return P.STATUS_ERROR, self._error(data), t_start, t_end

    def _execute_call(
        self, key: Tuple[str, str], args: bytes, inputs: List[bytes]
    ) -> Tuple[int, bytes, int, int]:
        """Run one call of a named function: ``(status, data, start_ns, end_ns)``."""
        service = self._services_by_key.get(key)
        if service is None:  # the master assigns only what SERVE announced
            now = _perf_ns()
            return P.STATUS_FAILED, self._not_served(key), now, now
        t_start = _perf_ns()
        try:
            data = self._invoke(service.fn, service.interface, args, inputs)
        except BaseException as exc:
            t_end = _perf_ns()
            return P.STATUS_ERROR, self._call_error(exc), t_start, t_end
        return P.STATUS_OK, data, t_start, _perf_ns()

    def _not_served(self, key: Tuple[str, str]) -> bytes:
        served = ", ".join(f"{s.name!r} version {s.version!r}" for s in self.services)
        return (
            f"worker {self.name} does not serve {key[0]!r} version {key[1]!r} "
            f"(it serves {served or 'nothing'})"
        ).encode()

    def _call_error(self, exc: BaseException) -> bytes:
        """The msgpack error map of a call that raised (never pickle: see docs/rpc.md)."""
        try:
            return self._encode_error(exc)
        except Exception:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return msgpack.packb(
                {"type": type(exc).__name__, "message": repr(exc), "traceback": tb},
                use_bin_type=True,
            )

    def _too_large(self, size: int) -> Exception:
        limit = self.frame_budget + _RESULT_FRAME_OVERHEAD
        try:
            raise ValueError(
                f"the task's result pickles to {size} bytes, above the master's frame limit of "
                f"{limit} bytes; return less data (or write it elsewhere and return a "
                "reference), or start the master with a larger --max-frame-mb"
            )
        except ValueError as exc:
            return exc

    @staticmethod
    def _error(exc: BaseException) -> bytes:
        from ._serialize import dumps_error

        return dumps_error(exc)

    @staticmethod
    def _result_fallback(value: Any) -> Any:
        from ._serialize import dumps_result

        try:
            return dumps_result(value)
        except Exception as exc:
            return exc

    def _results_frame(self) -> bytes:
        """The pending results as one RESULT frame (or nothing), their flush_us filled in."""
        pending = self.pending
        if not pending:
            return b""
        now = _perf_ns()
        for r in pending:
            r[6] = (now - r[6]) // 1000  # end of execution -> flush_us
        frame = P.encode(P.RESULT, pending)
        self.pending = []  # a new list: _flush keeps the old one if the write fails
        self.pending_bytes = 0
        return frame

    def _flush(self, pull: bool = True) -> None:
        """Send the pending results and (``pull``) top the credits up, in one write."""
        pending = self.pending
        out = self._results_frame()
        if pull:
            credits = 1 + self.prefetch - len(self.queue) - self.outstanding
            if credits > 0:
                out += P.encode(P.PULL, credits)
                self.outstanding += credits
        if out:
            try:
                self._send(out)
            except _Stop:
                self.unsent += pending  # (empty if there were no results)
                raise

    def _send_unsent(self) -> None:
        """Send the results a dropped connection kept back, in frames within the limit."""
        unsent, self.unsent = self.unsent, []
        frames = []
        batch: List[list] = []
        size = 0
        for r in unsent:
            n = len(r[3]) + _RESULT_OVERHEAD
            if n > self.frame_budget:
                continue  # the new session's limit is lower; stale anyway
            if batch and size + n > self.frame_budget:
                frames.append(P.encode(P.RESULT, batch))
                batch, size = [], 0
            batch.append(r)
            size += n
        if batch:
            frames.append(P.encode(P.RESULT, batch))
        if frames:
            try:
                self._send(b"".join(frames))
            except _Stop:
                self.unsent = unsent
                raise

    def _should_flush(self) -> bool:
        pending = self.pending
        if not pending:
            return False
        if len(pending) >= FLUSH_AFTER_RESULTS:
            return True
        # Flush now if the oldest result would otherwise wait past the deadline during the
        # next task.
        return _perf_ns() - pending[0][6] + (self.ema_ns or 0) >= FLUSH_AFTER_NS

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
                except _Stop as stop:
                    self._end_session()
                    if self.stopping:
                        _log(f"{stop}; exiting")
                        return EXIT_OK
                    if stop.code != EXIT_LOST or self.reconnect_timeout is None:
                        _log(f"{stop}; exiting (master {self.address})")
                        return stop.code
                    _log(f"{stop}; reconnecting (master {self.address})")
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
            self._on_messages(early, _perf_ns())
        if self.unsent:
            self._send_unsent()
        self._flush()
        queue = self.queue
        while not self.stopping:
            if queue:
                self._recv_nowait()
                if not queue:  # an ABORT took it
                    continue
            else:
                if self.pending:
                    self._flush()
                self._wait()  # it also reads what woke it: no second recv
                if not queue or self.stopping:
                    continue
            self._run(queue.popleft())
            if not queue or self._should_flush():
                self._flush()
        return self._drain()

    def _reconnect(self) -> int | None:
        """Connect again, with exponential backoff and jitter: None once a new session is up,
        else the exit code (``reconnect_timeout`` passed, bad token, or a signal)."""
        import random  # only here: start-up time counts

        lost = time.monotonic()
        limit = self.reconnect_timeout
        attempt = 0
        while True:  # bounded by reconnect_timeout when set (0 = forever, by request)
            attempt += 1
            delay = min(_RECONNECT_MAX_S, _RECONNECT_FIRST_S * 2 ** min(attempt - 1, 10))
            delay *= random.uniform(0.5, 1.0)  # workers of a restarted master spread out
            if limit:
                left = lost + limit - time.monotonic()
                if left <= 0:
                    _log(f"could not reconnect to the master at {self.address} within {limit:g} s")
                    return EXIT_LOST
                delay = min(delay, left)
            if self._sleep(delay):
                return EXIT_OK
            timeout = min(self.connect_timeout, _RECONNECT_ATTEMPT_TIMEOUT_S)
            try:
                parts = _connect_worker(
                    self.address, self._token, self.name, timeout, self._tls_context
                )
            except AuthenticationError as exc:
                _log(f"{exc}; exiting")
                return EXIT_CONFIG
            except (RtpoolError, OSError, ValueError) as exc:
                if attempt & (attempt - 1) == 0:  # attempts 1, 2, 4, 8...: a falling rate
                    _log(f"reconnection attempt {attempt} failed: {exc}")
                continue
            self._start_session(*parts)
            _log(f"reconnected to the master at {self.address} after {attempt} attempt(s)")
            return None

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until a signal; return whether the worker is stopping."""
        if not self.stopping and seconds > 0:
            readable, _, _ = select.select([self._wake_r], [], [], seconds)
            if readable:
                self._drain_wakeups()
        return self.stopping

    def _drain(self) -> int:
        """Graceful shutdown: DRAIN, pending results, RETURN of unstarted tasks, close."""
        self._hb_stop.set()
        try:
            self._recv_nowait()
        except _Stop:
            return EXIT_OK
        out = P.encode(P.DRAIN) + self._results_frame()
        if self.queue:
            out += P.encode(P.RETURN, [[t[0], t[1]] for t in self.queue])
            self.queue.clear()
        try:
            self._send(out)
            # Half-close and wait for the master to close: closing with unread data would
            # reset the connection, and the master could miss the frames above.
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(2.0)
            while self.sock.recv(_RECV_BYTES):
                pass
        except (_Stop, OSError):
            pass
        return EXIT_OK


def _services(args: argparse.Namespace) -> List[Service]:
    """The services of ``args.serve``: loaded by :func:`run` before the fork (so every child
    inherits them), or here when a child runs without it.

    Raises:
        ServeError: As :func:`load_services`.
    """
    services = getattr(args, "services", None)
    if services is None:
        services = args.services = load_services(getattr(args, "serve", None) or ())
    return services


def run_child(args: argparse.Namespace, token: str, name: str) -> int:
    """Body of one child process: connect, serve, return the exit code."""
    realtime = None
    if getattr(args, "realtime", False):
        from ._realtime import Realtime

        realtime = Realtime(args.rt_priority, args.cpus, args.rt_budget_ms, log=_log)
        realtime.apply()
    try:
        conn = WorkerConnection(
            args.master,
            token,
            name,
            args.prefetch,
            tls=args.tls,
            ca_file=args.ca_file,
            task_memory_mb=getattr(args, "task_memory_mb", None),
            reconnect_timeout=getattr(args, "reconnect_timeout", 0.0),
            services=_services(args),
        )
    except RtpoolError as exc:
        _log(str(exc))
        return EXIT_CONFIG
    except ValueError as exc:
        _log(str(exc))
        return EXIT_CONFIG
    conn.realtime = realtime
    conn.install_signal_handlers()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    return conn.serve()


class _Supervisor:
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
                _log(
                    f"child {pid} died ({_describe(code)}) {_RESTART_MAX} times within "
                    f"{_RESTART_WINDOW_S:g} s; not restarting it"
                )
                self.exit_code = max(self.exit_code, 1)
                continue
            _log(f"child {pid} died ({_describe(code)}); restarting it in {delay:g} s")
            self._sleep(delay)
            if not self.stopping:
                self._spawn(slot)
        return self.exit_code


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``rtpool worker`` options to a parser."""
    parser.add_argument("--master", required=True, metavar="HOST:PORT", help="master address")
    parser.add_argument(
        "--token", default=None, help="worker token (default: $RTPOOL_WORKER_TOKEN)"
    )
    parser.add_argument(
        "--procs", type=int, default=1, metavar="N", help="worker processes (default: 1)"
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=DEFAULT_PREFETCH,
        metavar="MAX",
        help=f"most tasks a process queues ahead; adaptive below that (default: "
        f"{DEFAULT_PREFETCH})",
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
    parser.add_argument("--name", default=None, help="name in the master's log (hostname:pid)")
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
        "--reconnect-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="after losing the master, keep reconnecting (backoff 0.1 s doubling to 5 s) for "
        "S seconds, then exit; 0 = forever (default: 0)",
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
        "--parent-pid",
        type=int,
        default=None,
        metavar="PID",
        help="exit when process PID exits (used by LocalCluster)",
    )


def _cpu_list(text: str) -> List[int]:
    from ._realtime import parse_cpus

    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; write CPUs as taskset -c does") from None


def _check_realtime(args: argparse.Namespace) -> str | None:
    """Fill the real-time defaults; the error message for a bad combination, else None."""
    from ._realtime import DEFAULT_BUDGET_MS, DEFAULT_PRIORITY

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


def run(args: argparse.Namespace) -> int:
    """Run ``rtpool worker`` with parsed arguments; return the exit code."""
    token = args.token or os.environ.get("RTPOOL_WORKER_TOKEN")
    if not token:
        _log(
            "no worker token: pass --token or set RTPOOL_WORKER_TOKEN (the master keeps it in "
            "its data dir as worker.token)"
        )
        return EXIT_CONFIG
    if args.procs < 1:
        _log("--procs must be at least 1")
        return EXIT_CONFIG
    if args.task_memory_mb is not None and args.task_memory_mb < 1:
        _log("--task-memory-mb must be at least 1")
        return EXIT_CONFIG
    if args.reconnect_timeout < 0:
        _log("--reconnect-timeout must be 0 (forever) or more")
        return EXIT_CONFIG
    problem = _check_realtime(args)
    if problem:
        _log(problem)
        return EXIT_CONFIG
    try:
        # Once, before forking: a module that does not load stops the worker here with its
        # name, rather than each child in a restart loop.
        services = _services(args)
    except ServeError as exc:
        _log(str(exc))
        return EXIT_CONFIG
    if services:
        names = ", ".join(f"{s.name} (version {s.version})" for s in services)
        _log(f"serving {len(services)} functions: {names}")
    if args.parent_pid is not None:
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != args.parent_pid:
            return EXIT_OK
    return _Supervisor(args, token).run()


def main(argv: List[str] | None = None) -> int:
    """Entry point of ``rtpool worker`` (also ``python -m rtpool.worker``)."""
    parser = argparse.ArgumentParser(prog="rtpool worker", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
