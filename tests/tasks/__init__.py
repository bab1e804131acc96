"""Task functions used by the tests: module-level, so workers can import them by name.

Workers started by the fixtures and by ``LocalCluster`` have ``tests/`` on their PYTHONPATH
(``helpers.worker_env``, ``conftest.py``), so ``tasks`` and its submodules import there as here.
This package holds the general tasks; the submodules hold what one concern needs:

* ``tasks.faults``: tasks that crash, burn CPU or ignore SIGTERM (fault injection);
* ``tasks.deadline``: workers that lie or run slow (deadlines, hedging, quorum);
* ``tasks.realtime``: scheduling facts of the process (SCHED_FIFO mode);
* ``tasks.rpc``, ``tasks.rpc_v2``, ``tasks.rpc_e2e``: named functions for ``--serve`` (grid
  RPC); ``rpc_v2`` serves another version of ``add``, so it cannot share a module with ``rpc``.
  They import numpy, so this package does not import them.
"""

from __future__ import annotations

import itertools
import os
import signal
import time


def noop() -> None:
    return None


def square(x: int) -> int:
    return x * x


def add(a: int, b: int) -> int:
    return a + b


def echo(*args, **kwargs):
    """Return exactly what the function received."""
    return args, kwargs


def apply(fn, *args):
    """Call a function passed as an argument (a lambda exercises the cloudpickle fallback)."""
    return fn(*args)


def pid_of(x: int, seconds: float = 0.0):
    """Return ``(x, pid of the worker process)`` after sleeping ``seconds``."""
    if seconds:
        time.sleep(seconds)
    return x, os.getpid()


def slow_where_marked(x: int, seconds: float):
    """``(x, pid)`` after ``seconds``, or five times that on a worker started with
    ``RTPOOL_TEST_SLOW=1`` (a slow machine among fast ones)."""
    time.sleep(seconds * (5 if os.environ.get("RTPOOL_TEST_SLOW") else 1))
    return x, os.getpid()


def logged(x: int, path: str, seconds: float = 0.0):
    """Append ``x`` to the file at ``path`` (one line per execution), then return ``(x, pid)``."""
    with open(path, "a") as f:
        f.write(f"{x}\n")
    if seconds:
        time.sleep(seconds)
    return x, os.getpid()


def logged_netns(x: int, path: str, seconds: float = 0.0):
    """Like :func:`logged`, but return ``(x, network namespace)``: the inode of the running
    process's network namespace, which tells the multi-host tests which host ran the task."""
    with open(path, "a") as f:
        f.write(f"{x}\n")
    if seconds:
        time.sleep(seconds)
    return x, os.stat("/proc/self/ns/net").st_ino


def sleep_return(x, seconds: float):
    time.sleep(seconds)
    return x


class TaskError(ValueError):
    """A user-defined exception type that pickles normally."""


def fail(message: str):
    raise TaskError(message)


def fail_builtin(message: str):
    raise KeyError(message)


class UnpicklableError(Exception):
    """Its __init__ needs two arguments but passes one to Exception: unpickling it fails."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def fail_unpicklable(a, b):
    raise UnpicklableError(a, b)


def return_unpicklable():
    return lambda: None  # cloudpickle fallback makes this picklable after all


def return_generator():
    return (i for i in range(3))  # cannot be pickled at all


# -- for time limits, memory limits and ABORT (they run in the worker's executor process) --


def spin_forever():
    """Loop in Python bytecode forever: only a kill ends it."""
    while True:
        pass


def spin_in_c():
    """Loop forever inside one C call (no bytecode runs, so no Python signal handler either)."""
    return sum(itertools.repeat(0))


def ignore_sigterm_and_sleep(path: str, seconds: float = 60.0):
    """Ignore SIGTERM, write ``started`` to ``path``, sleep."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(path, "w") as f:
        f.write("started")
    time.sleep(seconds)


def sleep_with_pid(path: str, seconds: float = 60.0):
    """Write this process's pid to ``path``, sleep, return the pid and process group."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)  # readers never see a partial pid
    time.sleep(seconds)
    return os.getpid(), os.getpgid(0)


def fork_grandchild(path: str, seconds: float = 60.0):
    """Fork a process that sleeps ``seconds``, write its pid to ``path``, then sleep too."""
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(seconds)
        finally:
            os._exit(0)
    with open(path + ".tmp", "w") as f:
        f.write(str(pid))
    os.rename(path + ".tmp", path)
    time.sleep(seconds)


def allocate_mib(n: int) -> int:
    """Allocate (and zero) ``n`` MiB; return the size."""
    return len(bytearray(n << 20))


def kill_self(sig: int = signal.SIGKILL):
    """Die by ``sig``, as if the kernel's OOM killer (SIGKILL) or a crash (SIGSEGV) struck."""
    import faulthandler
    import resource

    faulthandler.disable()  # pytest's handler would print a "fatal error" report
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # and the kernel could write a core file
    os.kill(os.getpid(), sig)
    time.sleep(10)


def where():
    """``(pid, process group)`` of the process running the task."""
    return os.getpid(), os.getpgid(0)


def print_text(text: str, flush: bool = False):
    """Print ``text`` to stdout (buffered unless ``flush``)."""
    print(text, flush=flush)


def make_bytes(n: int) -> bytes:
    """``n`` bytes (kept-result tests)."""
    return b"x" * n


def length(b: bytes) -> int:
    return len(b)


def reverse(b: bytes) -> bytes:
    return b[::-1]


def pid_and_length(b: bytes) -> tuple:
    """``(pid of the worker process that ran it, len(b))``."""
    return os.getpid(), len(b)


def kept_here() -> tuple:
    """``(pid, bytes this worker process keeps for clients)``: its store's count, 0 without one."""
    from rtpool.worker import _kept

    st = _kept._store
    return os.getpid(), (st.used_bytes if st is not None and st.pid == os.getpid() else 0)


def _wait_for_file(path: str, timeout: float) -> None:
    """Wait (bounded) until the file at ``path`` exists: the test's gate."""
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.005)


def make_bytes_after(n: int, gate: str, timeout: float = 60.0) -> bytes:
    """``n`` bytes once the file ``gate`` exists (held-dependency tests)."""
    _wait_for_file(gate, timeout)
    return b"x" * n


def fail_after(message: str, gate: str, timeout: float = 60.0):
    """Raise :class:`TaskError` once the file ``gate`` exists."""
    _wait_for_file(gate, timeout)
    raise TaskError(message)


def return_after(x, gate: str, timeout: float = 60.0):
    """Return ``x`` once the file ``gate`` exists (a blocker that holds a worker)."""
    _wait_for_file(gate, timeout)
    return x


def length_and_log(b: bytes, path: str) -> int:
    """Append a line to ``path``, then return ``len(b)``."""
    with open(path, "a") as f:
        f.write("ran\n")
    return len(b)


def reverse_after(b: bytes, marker: str, gate: str, timeout: float = 60.0) -> bytes:
    """Write this process's pid to ``marker``, then return ``b`` reversed once ``gate`` exists
    (a task to kill mid-chain)."""
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    _wait_for_file(gate, timeout)
    return b[::-1]


def mark_then_return_after(x, marker: str, gate: str, timeout: float = 60.0):
    """Create the file ``marker`` (the task has started), then return ``x`` once the file
    ``gate`` exists."""
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    _wait_for_file(gate, timeout)
    return x
