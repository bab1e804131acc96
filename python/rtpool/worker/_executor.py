"""Running task code: a pickled task's function, or a call of a named function, here or in
the executor process, and the status and data reported for it.

A task with a time limit (``timeout_ms``), or any task when the worker has a memory limit
(``--task-memory-mb``), runs in the executor process (``_executor_process.py``), which the
child kills, with its whole process group, past the limit or on ``ABORT``. Other tasks run in
the child itself: no process hop on the fast path, but they cannot be interrupted.

:class:`Executing` is the part of ``WorkerConnection`` (``_loop.py``) that runs code. It reads
the session's socket and wake pipe while the executor process works (``ABORT`` is seen at once)
and the loop's pending results (flushed before a long task); each method returns ``(status,
data, start_ns, end_ns)`` and leaves queueing the result to the loop.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import struct
import traceback
from typing import Any, Dict, List, Tuple

import msgpack

from .. import _protocol as P
from .._serialize import ENVELOPE_TAG, dumps_result, loads_args
from .._shm import forget_arguments
from ..errors import KeptResultLost
from ..rpc.schema import input_blob, kept_blob
from ._common import RESULT_FRAME_OVERHEAD, log, perf_ns
from ._executor_process import ExecutorDied, ExecutorProcess, address_space_mib
from ._kept import store as kept_store
from ._services import CALL_INDEX, CALL_KEY, Service
from ._task import Task

_loads = pickle.loads
#: The variable that gives a GPU task its devices (``docs/resources.md``).
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_dumps = pickle.dumps


def _seconds(ms: int) -> str:
    """``2000`` -> ``"2.0"``, ``300`` -> ``"0.3"``, ``1250`` -> ``"1.25"``."""
    text = f"{ms / 1000:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


class _LoadFailure:
    """A function whose code could not be loaded: every task of it gets this report."""

    __slots__ = ("report",)

    def __init__(self, report: bytes) -> None:
        self.report = report


def _load_error_report(exc: BaseException, what: str, where: str) -> bytes:
    from .._serialize import dumps_error

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


class Executing:
    """Runs tasks and calls for a worker child (see the module docstring)."""

    name: str
    task_memory_mb: int | None
    frame_budget: int
    pending: List[list]
    services: List[Service]
    _suspects: set
    _capture: Any

    def _init_executing(self, services: List[Service]) -> None:
        #: Function code by hash, as ASSIGN sent it (per connection).
        self.codes: Dict[bytes, bytes] = {}
        #: Loaded functions by hash (per connection).
        self.functions: Dict[bytes, Any] = {}
        self._executor: ExecutorProcess | None = None
        #: The CUDA_VISIBLE_DEVICES ids the executor process was started with (None: the
        #: worker's own environment).
        self._executor_devices: Tuple[str, ...] | None = None
        self._memory_warned = False
        # (task, attempt) running in the executor process, and whether ABORT named it.
        self._running: Tuple[int, int] | None = None
        self._abort_running = False
        #: The output prefix of the task the executor process ran last (``_output.py``).
        self._taken = b""
        self.services = list(services)
        self._services_by_key = {(s.name, s.version): s for s in self.services}
        if self.services:
            from ..rpc.encoding import encode_error  # only with --serve: it may need numpy
            from ..rpc.invocation import invoke

            self._invoke = invoke
            self._encode_error = encode_error

    def _function(self, fn_hash: bytes) -> Any:
        fn = self.functions.get(fn_hash)
        if fn is not None:
            return fn
        # The code stays cached: a fresh executor process needs it again.
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

    # -- the executor process (tasks with limits) -------------------------------------------

    def _run_in_executor(
        self, t: Task, devices: Tuple[str, ...] | None = None
    ) -> Tuple[int, bytes, int, int]:
        """Run a task in the executor process until it answers, its time limit passes, or
        ``ABORT``. With ``devices`` (a GPU task's), in an executor started with them in its
        ``CUDA_VISIBLE_DEVICES``: CUDA reads it once per process, so a task on other devices
        than the last one's gets a fresh executor.

        Returns ``(status, data, start_ns, end_ns)`` like :meth:`_execute`; the executor is
        killed (with its process group) on a timeout or an abort, and when the connection
        drops meanwhile (``Stop`` goes on up: the master requeued the task).
        """
        fn_hash, payload, timeout_ms, attempt = t.function, t.args, t.timeout_ms, t.attempt
        code = None
        if t.is_call:  # its service's key, its arguments and inputs in one blob
            service = self._services_by_key.get(fn_hash)
            if service is None:
                now = perf_ns()
                return P.STATUS_FAILED, self._not_served(fn_hash), now, now
            fn_hash = CALL_KEY + CALL_INDEX.pack(service.index)
            payload = msgpack.packb([payload, t.inputs, t.keep], use_bin_type=True)
        else:
            code = self.codes.get(fn_hash)
        capture = self._capture if not t.is_call else None
        if capture is not None:
            capture.mark(t.task_id, attempt)
        if self.pending:
            self._flush(pull=False)  # a long task must not hold earlier results back
        ex = self._executor
        if devices is not None and devices != self._executor_devices:
            self._kill_executor()
            ex = None
        if ex is None or not ex.is_alive():
            ex = self._executor = self._start_executor(devices)
        t_start = perf_ns()
        deadline = t_start + timeout_ms * 1_000_000 if timeout_ms else None
        self._running = (t.task_id, attempt)
        self._abort_running = False
        try:
            ex.submit(fn_hash, code, payload)
            answer = self._await_executor(ex, deadline)
        except ExecutorDied as died:
            self._executor = None
            self._suspects.add(t.task_id)
            text = self._died_message(str(died), t.task_id)
            log(
                f"{text.decode()} (attempt {attempt}); the master is told and blames the task",
                logging.WARNING,
            )
            return P.STATUS_LOST, text, t_start, perf_ns()
        except BaseException:
            self._kill_executor()
            raise
        finally:
            self._running = None
            if capture is not None:  # what it wrote, whatever became of it
                self._taken = capture.take_area(self.identity)
        if answer is not None:
            status, data, exec_ns = answer
            t_end = perf_ns()
            return status, data, max(t_start, t_end - exec_ns), t_end
        self._kill_executor()
        t_end = perf_ns()
        if self._abort_running:
            text = f"aborted by the master while running; killed (attempt {attempt})"
            return P.STATUS_CANCELLED, text.encode(), t_start, t_end
        text = (
            f"task exceeded its time limit of {_seconds(timeout_ms)} s and was killed "
            f"(attempt {attempt})"
        )
        return P.STATUS_TIMEOUT, text.encode(), t_start, t_end

    def _await_executor(
        self, ex: ExecutorProcess, deadline: int | None
    ) -> Tuple[int, bytes, int] | None:
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
                timeout = (deadline - perf_ns()) / 1e9
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

    def _start_executor(self, devices: Tuple[str, ...] | None = None) -> ExecutorProcess:
        if devices is None:
            self._executor_devices = None
            return self._fork_executor()
        # The fork inherits the environment: set for it, put back here at once.
        saved = os.environ.get(CUDA_VISIBLE_DEVICES)
        os.environ[CUDA_VISIBLE_DEVICES] = ",".join(devices)
        try:
            ex = self._fork_executor()
        finally:
            if saved is None:
                del os.environ[CUDA_VISIBLE_DEVICES]
            else:
                os.environ[CUDA_VISIBLE_DEVICES] = saved
        self._executor_devices = devices
        return ex

    def _fork_executor(self) -> ExecutorProcess:
        limit = self.task_memory_mb
        if limit and not self._memory_warned:
            self._memory_warned = True
            base = address_space_mib()
            if base is not None and base >= limit:
                log(
                    f"--task-memory-mb {limit} is below the address space the executor starts "
                    f"with ({base} MiB, the worker's own): tasks will get MemoryError as soon as "
                    f"they need more memory; use a limit well above {base}",
                    logging.WARNING,
                )
        return ExecutorProcess.start(
            self._executor_task, limit, close=(self.sock, self._wake_r, self._wake_w)
        )

    def _executor_task(self, fn_hash: bytes, code: bytes | None, payload: bytes) -> tuple:
        """Runs in the executor process (a fork of this object): one task -> (status, data,
        exec_ns)."""
        if fn_hash.startswith(CALL_KEY):
            service = self.services[CALL_INDEX.unpack_from(fn_hash, len(CALL_KEY))[0]]
            args, inputs, keep = msgpack.unpackb(payload, raw=False)
            key = (service.name, service.version)
            status, data, t_start, t_end = self._execute_call(key, args, inputs, keep)
            return status, data, t_end - t_start
        if code is not None:
            self.codes[fn_hash] = code
        capture = self._capture
        if capture is not None:
            capture.reset()  # the child emptied the area (mark); its state is a fork's copy
            capture.active = True
        try:
            status, data, t_start, t_end = self._execute(self._function(fn_hash), payload)
        finally:
            if capture is not None:
                capture.active = None
        return status, data, t_end - t_start

    def _kill_executor(self) -> None:
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.kill()

    def _died_message(self, how: str, task_id: int) -> bytes:
        """Status ``LOST``'s message: the master retries the task (``max_attempts``), then
        fails it as a poison task with this text for the attempt."""
        text = f"task process {how} while running task {task_id}"
        limit = self.task_memory_mb
        if limit and ("SIGKILL" in how or "SIGSEGV" in how or "SIGABRT" in how):
            text += f"; it may have run out of memory (its limit is {limit} MiB)"
        elif "SIGKILL" in how:
            text += "; the kernel's out-of-memory killer may have ended it"
        return text.encode()

    # -- executing and reporting ------------------------------------------------------------

    def _execute(self, fn: Any, payload: bytes) -> Tuple[int, bytes, int, int]:
        """Run one task: ``(status, data, start_ns, end_ns)`` of the call itself."""
        if type(fn) is _LoadFailure:
            now = perf_ns()
            return P.STATUS_ERROR, fn.report, now, now
        try:
            args, kwargs = loads_args(payload)
        except BaseException as exc:
            now = perf_ns()
            return (
                P.STATUS_ERROR,
                _load_error_report(exc, "the task's arguments", self.name),
                now,
                now,
            )
        try:
            t_start = perf_ns()
            try:
                value = fn(*args, **kwargs) if kwargs else fn(*args)
            except BaseException as exc:
                t_end = perf_ns()
                if isinstance(exc, MemoryError) and self.task_memory_mb:
                    self._note_memory_limit(exc)
                return P.STATUS_ERROR, self._error(exc), t_start, t_end
            t_end = perf_ns()
            try:
                # Large buffers out of band (a Payload), to the client's shared memory when
                # the arguments came that way; plain pickle for the rest.
                return P.STATUS_OK, dumps_result(value), t_start, t_end
            except Exception:
                data = self._result_fallback(value)
                if not isinstance(data, BaseException):
                    return P.STATUS_OK, data, t_start, t_end
                return P.STATUS_ERROR, self._error(data), t_start, t_end
        finally:
            if payload[0] >= ENVELOPE_TAG:  # its arguments' bytes, noted for refer(): gone
                forget_arguments()

    def _execute_call(
        self, key: Tuple[str, str], args: bytes, inputs: List[bytes], keep: bool = False
    ) -> Tuple[int, bytes, int, int]:
        """Run one call of a named function: ``(status, data, start_ns, end_ns)``. Inputs kept
        on other workers are read from there; with ``keep`` the result stays in this process
        and ``data`` is a reference to it (``docs/rpc.md``, "Transactions")."""
        service = self._services_by_key.get(key)
        if service is None:  # the master assigns only what SERVE announced
            now = perf_ns()
            return P.STATUS_FAILED, self._not_served(key), now, now
        t_start = perf_ns()
        read: List[Any] = []
        for position, blob in enumerate(inputs):
            try:
                read.append(input_blob(blob))
            except KeptResultLost as exc:
                # The master makes that input again and runs this call again with it.
                why = struct.pack(">I", position) + str(exc).encode()
                return P.STATUS_INPUT_LOST, why, t_start, perf_ns()
            except BaseException as exc:
                return P.STATUS_ERROR, self._call_error(exc), t_start, perf_ns()
        try:
            data = self._invoke(service.fn, service.interface, args, read)
            if keep:
                data = kept_blob(kept_store().put(bytes(data)))
        except BaseException as exc:
            t_end = perf_ns()
            return P.STATUS_ERROR, self._call_error(exc), t_start, t_end
        return P.STATUS_OK, data, t_start, perf_ns()

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

    def _note_memory_limit(self, exc: MemoryError) -> None:
        """Say which limit a task's ``MemoryError`` hit (shown with its traceback)."""
        note = (
            f"the task ran under the worker's memory limit of {self.task_memory_mb} MiB of "
            f"address space (rtpool worker --task-memory-mb, on worker {self.name}); "
            "use less memory per task or run workers with a larger limit"
        )
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(note)
        elif not exc.args:
            exc.args = (note,)

    def _too_large(self, size: int) -> Exception:
        limit = self.frame_budget + RESULT_FRAME_OVERHEAD
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
        from .._serialize import dumps_error

        return dumps_error(exc)

    @staticmethod
    def _result_fallback(value: Any) -> Any:
        from .._serialize import dumps_result

        try:
            return dumps_result(value)
        except Exception as exc:
            return exc
