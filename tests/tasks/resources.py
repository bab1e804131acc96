"""Tasks of the resource tests (``tests/test_resources*.py``): where a task ran, which devices
it saw, and how many tasks of a kind ran at once on one worker host."""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Each test worker's tag, set in its environment by the test.
TAG = "RTPOOL_TEST_WORKER_TAG"


def where() -> tuple:
    """``(worker tag, CUDA_VISIBLE_DEVICES, pid)`` of the process that runs the task."""
    return os.environ.get(TAG), os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid()


def overlap(shared_dir: str, index: int, watch_s: float = 1.5) -> tuple:
    """Run alongside the other tasks of the test: mark this task present in ``shared_dir``
    (a file named by its devices), wait until a second one is there (at most 10 s), then
    watch the others for ``watch_s`` or until a third one shows up (the limit broken), and
    leave. Returns ``(most present at once, devices, devices shared with another task,
    worker tag)``."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    me = Path(shared_dir) / f"{index}-{os.getpid()}-dev{devices.replace(',', '_')}"
    me.write_text(devices)
    most, shared = 0, False
    try:
        end = time.monotonic() + 10.0
        watch_end = None
        while True:
            present = [p for p in Path(shared_dir).iterdir() if p.is_file()]
            most = max(most, len(present))
            others = [p.read_text() for p in present if p != me]
            mine = set(devices.split(","))
            shared = shared or any(mine & set(o.split(",")) for o in others if o)
            now = time.monotonic()
            if len(present) >= 2 and watch_end is None:
                watch_end = now + watch_s
            if len(present) >= 3 or now >= (watch_end or end):
                break
            time.sleep(0.005)
    finally:
        me.unlink()
    return most, devices, shared, os.environ.get(TAG)


def held(shared_dir: str) -> tuple:
    """Say where it runs (``started-TAG-PID`` in ``shared_dir``), then wait for the test's
    ``release`` file (at most 30 s); returns ``where()``."""
    tag, devices, pid = where()
    (Path(shared_dir) / f"started-{tag}-{pid}").write_text("")
    end = time.monotonic() + 30.0
    while not (Path(shared_dir) / "release").exists() and time.monotonic() < end:
        time.sleep(0.01)
    return tag, devices, pid


def where_of(i: int) -> tuple:
    """:func:`where`, for ``map`` and ``submit_many`` (one argument)."""
    return where()
