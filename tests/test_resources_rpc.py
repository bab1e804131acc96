"""Calls of named functions with resource requests (issue 26), end to end: a call (and every
call of a transaction) runs only on a worker that serves its function and has what its package
asks; a ``gpu=1`` call gets one device of its host in ``CUDA_VISIBLE_DEVICES`` and a host with
two GPUs runs at most two at once (measured inside the calls); a call whose server is killed
runs again on another matching server; a call no server of its function could ever run is
refused by name. Real master, real workers serving ``tasks.rpc_e2e`` or
``tasks.rpc_resources``."""

from __future__ import annotations

import os
import signal
import warnings

import pytest

import rtpool
import rtpool.errors
import tasks.resources as rtasks
from helpers import wait_until
from test_resources_gpu import _fake_smi

HIDE = {"CUDA_VISIBLE_DEVICES": ""}


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))


def _served(client, name: str, n: int) -> None:
    def served() -> bool:
        try:
            return client.describe(name).servers == n
        except rtpool.errors.UnknownFunctionError:  # no worker has declared it yet
            return False

    wait_until(served, timeout=30)


def test_calls_run_on_a_matching_server(workers, client_factory, tmp_path):
    a = workers.start(1, "--serve", "tasks.rpc_e2e", "--label", "zone=a", env=HIDE)
    b = workers.start(1, "--serve", "tasks.rpc_e2e", "--label", "zone=b", env=HIDE)
    client = client_factory()
    wait_until(lambda: len(client.status()["workers"]) == 2, timeout=30)
    _served(client, "pid_after", 2)
    for zone, want in (("a", a.pid), ("b", b.pid)):
        view = client.options(labels={"zone": zone})
        pids = [view.call("pid_after", str(tmp_path / f"p{zone}{i}"), 0.0) for i in range(6)]
        assert {_parent(p) for p in pids} == {want}, (zone, pids)
    # Without a request, either server.
    assert _parent(client.call("pid_after", str(tmp_path / "q"), 0.0)) in (a.pid, b.pid)


def test_a_call_nobody_can_run_is_refused(workers, client_factory, tmp_path):
    workers.start(1, "--serve", "tasks.rpc_e2e", env=HIDE)
    client = client_factory()
    _served(client, "pid_after", 1)
    view = client.options(resources={"gpu": 1})
    with pytest.raises(rtpool.UnschedulableError, match="gpu=1"):
        view.call("pid_after", str(tmp_path / "p"), 0.0, timeout=10)


def test_a_call_whose_matching_worker_does_not_serve_it_is_refused_or_waits(
    workers, client_factory, tmp_path
):
    workers.start(1, "--serve", "tasks.rpc_e2e", env=HIDE)
    workers.start(1, "--label", "zone=a", env=HIDE)  # has the label, serves nothing
    client = client_factory()
    wait_until(lambda: len(client.status()["workers"]) == 2, timeout=30)
    _served(client, "pid_after", 1)
    view = client.options(labels={"zone": "a"})
    with pytest.raises(rtpool.UnschedulableError) as refused:
        view.call("pid_after", str(tmp_path / "p"), 0.0, timeout=10)
    text = str(refused.value)
    assert "zone=a" in text and "'pid_after'" in text and 'unschedulable="wait"' in text, text
    # With unschedulable="wait" it is accepted with the notice, and runs once a worker that
    # has the label serves the function.
    waiting = client.options(labels={"zone": "a"}, unschedulable="wait")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fut = waiting.call_async("pid_after", str(tmp_path / "w"), 0.0)
        wait_until(
            lambda: any(issubclass(w.category, rtpool.UnschedulableWarning) for w in caught),
            timeout=10,
        )
    notice = [str(w.message) for w in caught if issubclass(w.category, rtpool.UnschedulableWarning)]
    assert len(notice) == 1 and "zone=a" in notice[0] and "'pid_after'" in notice[0], notice
    assert not fut.done()
    late = workers.start(1, "--serve", "tasks.rpc_e2e", "--label", "zone=a", env=HIDE)
    assert _parent(fut.result(timeout=30)) == late.pid


def test_a_gpu_call_gets_one_device_and_two_gpus_run_at_most_two_at_once(
    workers, client_factory, tmp_path
):
    path = _fake_smi(tmp_path)
    # Four processes, two visible GPUs: the slots would allow four calls at once.
    env = {"PATH": path, "CUDA_VISIBLE_DEVICES": "0,1", rtasks.TAG: "gpu2"}
    workers.start(4, "--serve", "tasks.rpc_resources", env=env)
    client = client_factory()
    _served(client, "overlap_call", 1)
    shared = tmp_path / "present"
    shared.mkdir()
    view = client.options(resources={"gpu": 1})
    futures = [view.call_async("overlap_call", str(shared), i) for i in range(6)]
    results = [f.result(timeout=60).split("|") for f in futures]
    most = max(int(r[0]) for r in results)
    print(f"most gpu=1 calls present at once on a gpu=2 host: {most} (of {len(results)})")
    assert most == 2, results  # never three, and two did run together
    assert all(r[1] in ("0", "1") for r in results), results  # one device each
    assert not any(int(r[2]) for r in results), results  # never a device shared at once


def test_a_transaction_with_labels_runs_every_call_on_the_matching_server(workers, client_factory):
    workers.start(1, "--serve", "tasks.rpc_resources", "--label", "zone=a", env={rtasks.TAG: "a"})
    workers.start(1, "--serve", "tasks.rpc_resources", "--label", "zone=b", env={rtasks.TAG: "b"})
    client = client_factory()
    _served(client, "chain", 2)
    for zone in ("a", "b", "a"):
        with client.options(labels={"zone": zone}).transaction() as tx:
            first = tx.call("chain", "")
            second = tx.call("chain", first)
            last = tx.call("chain", second)
        assert last.result(timeout=30) == f",{zone},{zone},{zone}"


def test_a_killed_server_s_call_runs_again_on_the_other_matching_server(
    workers, client_factory, tmp_path
):
    serve = ("--serve", "tasks.rpc_resources")
    first = workers.start(1, *serve, "--resources", "gpu=1", env={**HIDE, rtasks.TAG: "a1"})
    second = workers.start(1, *serve, "--resources", "gpu=1", env={**HIDE, rtasks.TAG: "a2"})
    workers.start(1, *serve, env={**HIDE, rtasks.TAG: "plain"})
    client = client_factory()
    _served(client, "held_call", 3)
    shared = tmp_path / "held"
    shared.mkdir()
    fut = client.options(resources={"gpu": 1}).call_async("held_call", str(shared))
    started = wait_until(lambda: list(shared.glob("started-*")), timeout=30)
    tag = started[0].name.split("-")[1]
    victim = {"a1": first, "a2": second}[tag]
    os.killpg(victim.pid, signal.SIGKILL)  # the worker, its processes and the call's
    victim.wait(timeout=10)
    (shared / "release").write_text("")
    again, devices = fut.result(timeout=60).split("|")
    assert again == {"a1": "a2", "a2": "a1"}[tag]  # the other gpu worker, never "plain"
    assert devices == "0"
    assert not list(shared.glob("started-plain-*"))
