"""``rtpool worker``: processes that pull tasks from the master and run them.

The parent process forks ``--procs`` children and supervises them; each child holds one
connection with ``slots=1`` and runs a single-threaded pull loop. By concern:

* ``_supervisor.py``: the parent. Checks the options, imports the ``--serve`` modules once
  before it forks, forwards SIGTERM/SIGINT, restarts a child that crashes (bounded backoff);
  :func:`run` and :func:`main` are its entry points.
* ``_arguments.py``: the command-line options (:func:`add_arguments`) and their checks.
* ``_session.py``: a child's connection: handshake, reading and writing, heartbeats (also
  while a task runs, so the master's lease never expires for a busy worker), signals,
  reconnection with backoff (until ``--reconnect-timeout``).
* ``_loop.py``: a child's run loop (:class:`WorkerConnection`): credit-based pull, ``ABORT``,
  graceful shutdown (``DRAIN``, pending results, ``RETURN`` of unstarted tasks).
* ``_prefetch.py``: how many tasks a child queues ahead (the adaptive prefetch).
* ``_results.py``: batching a child's results into ``RESULT`` frames with its ``PULL``.
* ``_failures.py``: the rate-limited log lines of failed tasks.
* ``_task.py``: a task as the loop queues it (named fields, built where ``ASSIGN`` and
  ``ASSIGN_CALLS`` are decoded).
* ``_executor.py``: running task code, in the child (the fast path) or, for a task with a
  time limit or under ``--task-memory-mb``, in the executor process
  (``_executor_process.py``), which the child kills with its process group past the limit or
  on ``ABORT``.
* ``_services.py``: named functions (``--serve MODULE``, grid RPC: ``docs/rpc.md``), announced
  with ``SERVE`` at the start of every session; their calls run like tasks.
* Real-time mode (``--realtime``): each child locks its memory and runs its main thread under
  ``SCHED_FIFO``, within a CPU budget (``rtpool/_realtime.py``).

Imports are kept light: start-up time counts (numpy and the interface machinery load only
with ``--serve``).
"""

from __future__ import annotations

from ..errors import ServeError
from ._arguments import add_arguments
from ._common import DEFAULT_PREFETCH, EXIT_CONFIG, EXIT_LOST, EXIT_OK, set_parent_death_signal
from ._loop import WorkerConnection
from ._prefetch import adaptive_prefetch
from ._services import Service, load_services
from ._supervisor import main, run, run_child

__all__ = [
    "DEFAULT_PREFETCH",
    "EXIT_CONFIG",
    "EXIT_LOST",
    "EXIT_OK",
    "ServeError",
    "Service",
    "WorkerConnection",
    "adaptive_prefetch",
    "add_arguments",
    "load_services",
    "main",
    "run",
    "run_child",
    "set_parent_death_signal",
]
