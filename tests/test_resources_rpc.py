"""Calls of named functions with resource requests (issue 26): the same ``options(resources=,
labels=)`` as tasks; a call runs on a server of its function that also matches, and a call no
server could ever run is refused by name. Real master, real workers serving ``tasks.rpc_e2e``."""

from __future__ import annotations

import pytest

import rtpool
from helpers import wait_until

# The master does not match calls of named functions to classes yet (branch res up to
# 58ee685: the core's classes cover SUBMIT packages only); strict: passing means remove this.
pytestmark = pytest.mark.xfail(
    strict=True, reason="the master does not match calls to resource classes yet"
)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))


def test_calls_run_on_a_matching_server(workers, client_factory, tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": ""}
    a = workers.start(1, "--serve", "tasks.rpc_e2e", "--label", "zone=a", env=env)
    b = workers.start(1, "--serve", "tasks.rpc_e2e", "--label", "zone=b", env=env)
    client = client_factory()
    wait_until(lambda: len(client.status()["workers"]) == 2, timeout=30)
    wait_until(lambda: client.describe("pid_after").servers == 2, timeout=30)
    for zone, want in (("a", a.pid), ("b", b.pid)):
        view = client.options(labels={"zone": zone})
        pids = [view.call("pid_after", str(tmp_path / f"p{zone}{i}"), 0.0) for i in range(6)]
        assert {_parent(p) for p in pids} == {want}, (zone, pids)


def test_a_call_nobody_can_run_is_refused(workers, client_factory, tmp_path):
    workers.start(1, "--serve", "tasks.rpc_e2e", env={"CUDA_VISIBLE_DEVICES": ""})
    client = client_factory()
    wait_until(lambda: client.describe("pid_after").servers == 1, timeout=30)
    view = client.options(resources={"gpu": 1})
    with pytest.raises(rtpool.UnschedulableError, match="gpu=1"):
        view.call("pid_after", str(tmp_path / "p"), 0.0, timeout=10)
