"""rtpool: a real-time distributed task pool.

Clients submit packages of tasks to a Rust master, pull-based Python workers run them, and the
results come back as ``concurrent.futures`` futures::

    import rtpool

    with rtpool.LocalCluster(workers=2) as cluster:
        client = cluster.client()
        print(list(client.map(pow, range(5), range(5))))

Against a running master (``rtpool master``, ``rtpool worker``)::

    client = rtpool.Client("127.0.0.1:7070", token)

The heavy parts (the client, the embedded master) are imported on first use, so
``rtpool worker`` starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from .errors import (
    AdmissionError,
    CallError,
    DeadlineMissedError,
    NotFetchedError,
    OverloadWarning,
    PoisonTaskError,
    QueueLimitError,
    QuorumError,
    QuotaExceededError,
    ResultsLost,
    TaskTimeoutError,
    UnknownFunctionError,
    UnschedulableError,
    UnschedulableWarning,
)

__version__ = "0.1.0"

__all__ = [
    "AdmissionError",
    "Array",
    "AsyncClient",
    "CallError",
    "CallFuture",
    "Client",
    "DeadlineMissedError",
    "In",
    "InOut",
    "Interface",
    "LocalCluster",
    "NotFetchedError",
    "Out",
    "OverloadWarning",
    "Package",
    "PoisonTaskError",
    "QueueLimitError",
    "QuorumError",
    "QuotaExceededError",
    "ResultsLost",
    "SlurmCluster",
    "TaskOutput",
    "TaskTimeoutError",
    "Transaction",
    "UnknownFunctionError",
    "UnschedulableError",
    "UnschedulableWarning",
    "__version__",
    "as_completed",
    "errors",
    "progress",
    "remote",
]

if TYPE_CHECKING:
    from ._output import TaskOutput
    from ._progress import as_completed, progress
    from .async_client import AsyncClient
    from .client import CallFuture, Client, Package, Transaction
    from .cluster import LocalCluster
    from .rpc.annotations import Array, In, InOut, Out
    from .rpc.interface import Interface
    from .rpc.remote import remote
    from .slurm import SlurmCluster

_LAZY = {"Client": "client", "Package": "client", "LocalCluster": "cluster"}
_LAZY.update(
    AsyncClient="async_client", CallFuture="client", Transaction="client", SlurmCluster="slurm"
)
# Grid RPC (docs/rpc.md): named remote functions and their interfaces.
_LAZY.update(dict.fromkeys(["Array", "In", "InOut", "Out"], "rpc.annotations"))
_LAZY.update(Interface="rpc.interface", remote="rpc.remote")
# Progress of a user's own work (docs/status.md).
_LAZY.update(progress="_progress", as_completed="_progress")
# A task's prints and log records (docs/logs.md).
_LAZY.update(TaskOutput="_output")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rtpool' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
