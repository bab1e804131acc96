"""Executor processes: where a worker child runs the tasks it must be able to kill.

A worker child runs tasks in its own process (the fast path) unless a task has a time limit
(``Task.timeout_ms``) or the worker a memory limit (``--task-memory-mb``). Those run in an
**executor process**: a process the child forks once and reuses, which

* leads its own process group, so one ``killpg(SIGKILL)`` ends the task whatever it does:
  ignore SIGTERM, loop in C code, fork grandchildren (unless they leave the group themselves);
* dies with the child (``PR_SET_PDEATHSIG`` = SIGKILL), so it never outlives its worker;
* runs under ``RLIMIT_AS`` when a memory limit is set, so an allocation past it raises
  ``MemoryError`` in the task instead of pushing the machine into the OOM killer.

This module owns the executor process's life (fork, framing over a socketpair, kill, reap).
What runs inside it (loading functions, pickling results) and what is reported to the master
stay in ``_executor.py``, which passes the task runner in. Not to be confused with
``_supervisor.py``: the parent of the worker children, which restarts a child that crashes.

Framing, child -> executor: ``_REQUEST`` (hash length, code length, args length), then the
hash, the code (absent when the executor has it) and the args payload. Executor -> child:
``_RESPONSE`` (status, execution time in ns, data length), then the data.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import sys
import warnings
from typing import Any, Callable, Iterable, Optional, Set, Tuple

from .. import _shm
from .._frame import recv_exact, recv_some
from ._common import describe_exit, set_parent_death_signal

__all__ = ["ExecutorDied", "ExecutorProcess", "address_space_mib"]

_REQUEST = struct.Struct("!BII")
_RESPONSE = struct.Struct("!BQQ")
_RECV_BYTES = 1 << 18
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)

#: What the executor runs: ``(fn_hash, fn_code or None, args payload) -> (status, data,
#: exec_ns)``. It must not raise.
TaskRunner = Callable[[bytes, Optional[bytes], bytes], Tuple[int, bytes, int]]


class ExecutorDied(Exception):
    """The executor process ended without answering; ``str()`` says how it ended."""


def address_space_mib() -> int | None:
    """This process's virtual memory size in MiB (what RLIMIT_AS limits), if known."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes as ``bytes`` (a function hash is a dict key), or None at EOF."""
    buf = recv_exact(sock, n)
    return None if buf is None else bytes(buf)


def _executor_main(sock: socket.socket, run: TaskRunner) -> int:
    """The executor's loop: read a request, run it, answer; exit 0 when the child closes."""
    while True:
        header = _recv_exact(sock, _REQUEST.size)
        if header is None:
            return 0
        hash_len, code_len, args_len = _REQUEST.unpack(header)
        fn_hash = _recv_exact(sock, hash_len)
        code = _recv_exact(sock, code_len) if code_len else None
        payload = _recv_exact(sock, args_len)
        if fn_hash is None or payload is None or (code_len and code is None):
            return 0
        status, data, exec_ns = run(fn_hash, code, payload)
        sock.sendall(_RESPONSE.pack(status, exec_ns, len(data)))
        for part in getattr(data, "parts", (data,)):  # a Payload's parts, as they lie
            sock.sendall(part)


def _in_executor(parent: int, close: Iterable[Any], memory_mb: int | None) -> None:
    """First steps of the forked executor, before its loop."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # the parent's setpgid() won the race; same result
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the child died before the prctl() took effect
        os._exit(0)
    # The master connection, the child's signal pipe: not the executor's. Closing the forked
    # socket objects (not just their fds) keeps them from closing a reused fd later.
    for item in close:
        try:
            item.close() if hasattr(item, "close") else os.close(item)
        except OSError:
            pass
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if memory_mb:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class ExecutorProcess:
    """A forked executor process and the child's end of its socketpair.

    Use :meth:`start`, then :meth:`submit` one task and :meth:`read` until it returns the
    result, or :meth:`kill` it. One task at a time.
    """

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        #: Function hashes whose code this executor has received (it caches the functions).
        self.hashes: Set[bytes] = set()
        self._buf = bytearray()
        self._recv_buf = bytearray(_RECV_BYTES)  # see _frame.recv_some
        self._reaped = False

    @classmethod
    def start(
        cls, run: TaskRunner, memory_mb: int | None = None, close: Iterable[Any] = ()
    ) -> ExecutorProcess:
        """Fork an executor that runs tasks with ``run``.

        Args:
            run: The task runner, called in the executor (it sees the child's memory as of
                the fork: loaded modules, cached functions).
            memory_mb: ``RLIMIT_AS`` of the executor in MiB (its whole address space), or None.
            close: Sockets (or raw fds) of the child the executor must not keep open.

        Returns:
            The executor, ready for :meth:`submit`.
        """
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # else the fork would print their buffers again
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a threaded process. The executor only uses
            # state of the forking thread and its own socket; the other threads (heartbeats)
            # hold no lock it needs.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _in_executor(parent, [*close, mine], memory_mb)
                code = _executor_main(theirs, run)
            except BaseException:
                pass
            finally:
                try:
                    _shm.at_exit()
                finally:
                    os._exit(code)
        theirs.close()
        try:
            os.setpgid(pid, pid)  # both sides set it: no window where a kill misses the group
        except OSError:
            pass
        return cls(pid, mine)

    def fileno(self) -> int:
        return self.sock.fileno()

    def is_alive(self) -> bool:
        """Whether the process still runs (if it died by itself: kill its group, reap it)."""
        if self._reaped:
            return False
        try:
            # WNOWAIT: look without reaping, so the group id stays ours until kill().
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            self._reaped = True
            return False
        if info is None:
            return True
        self.kill()
        return False

    def submit(self, fn_hash: bytes, code: bytes | None, payload: bytes) -> None:
        """Send one task.

        Raises:
            ExecutorDied: The executor is gone (its socket is closed).
        """
        if fn_hash in self.hashes:
            code = None
        header = _REQUEST.pack(len(fn_hash), len(code) if code else 0, len(payload))
        try:
            self.sock.sendall(header + fn_hash + (code or b""))
            self.sock.sendall(payload)
        except OSError:
            raise ExecutorDied(self.kill()) from None
        if code:
            self.hashes.add(fn_hash)

    def read(self) -> Tuple[int, bytes, int] | None:
        """Take what the executor sent without blocking: ``(status, data, exec_ns)`` once the
        whole answer is there, else None.

        Raises:
            ExecutorDied: The executor closed its socket (it died); it is reaped.
        """
        try:
            chunk = recv_some(self.sock, self._recv_buf, _MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        if not chunk:
            raise ExecutorDied(self.kill())
        buf = self._buf
        buf += chunk
        if len(buf) < _RESPONSE.size:
            return None
        status, exec_ns, size = _RESPONSE.unpack_from(buf)
        end = _RESPONSE.size + size
        if len(buf) < end:
            return None
        with memoryview(buf) as view:
            data = bytes(view[_RESPONSE.size : end])
        del buf[:end]
        return status, data, exec_ns

    def kill_group(self) -> None:
        # The group outlives its leader while grandchildren are in it; a dead, unreaped leader
        # keeps its pid (= the group id) from being reused, so this cannot hit another group.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> str:
        """SIGKILL the executor's process group, reap the executor; say how it ended."""
        self.kill_group()
        how = "already reaped"
        if not self._reaped:
            try:
                _, status = os.waitpid(self.pid, 0)
                how = describe_exit(status)
            except ChildProcessError:
                pass
            self._reaped = True
        try:
            self.sock.close()
        except OSError:
            pass
        return how
