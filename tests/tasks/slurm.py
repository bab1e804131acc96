"""Tasks for the Slurm tests (tests/test_slurm.py), importable by Slurm-started workers as
``tasks.slurm`` (tests/ is on their PYTHONPATH, over the shared local file system)."""

from __future__ import annotations

import os
import time


def worker_name() -> str:
    """The name of the worker running this task (``rtpool worker`` exports it)."""
    return os.environ.get("RTPOOL_WORKER_NAME", "")


def square(x: int) -> int:
    return x * x


def marked_square(marker_dir: str, x: int, seconds: float) -> int:
    """Appends ``start NAME`` to ``<marker_dir>/<x>``, sleeps, appends ``end NAME``, returns
    ``x * x``: the file counts the task's executions and says where each one ran."""
    path = os.path.join(marker_dir, str(x))
    name = os.environ.get("RTPOOL_WORKER_NAME", "")
    with open(path, "a") as f:
        f.write(f"start {name}\n")
    time.sleep(seconds)
    # A test that kills this worker's job holds its tasks here until the kill is done
    # (bounded), so the kill lands mid-task however long scancel takes on a loaded machine.
    hold = os.path.join(marker_dir, f"hold-{name}")
    deadline = time.monotonic() + 60
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(path, "a") as f:
        f.write(f"end {name}\n")
    return x * x
