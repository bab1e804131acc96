"""GPUs end to end (issue 26): real master and workers whose GPUs come from a fake
``nvidia-smi`` on PATH or from ``--resources gpu=N``. A host with two GPUs runs at most two
``gpu=1`` tasks at once (measured inside the tasks), each on a device of its own
(``CUDA_VISIBLE_DEVICES``); a worker killed mid-task has its task run again on another matching
worker."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import tasks.resources as rtasks
from helpers import wait_until
from test_resources_unit import FAKE_SMI


def _fake_smi(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def _status_workers(client, n: int) -> list:
    return wait_until(
        lambda: len(ws := client.status()["workers"]) >= n and ws, timeout=30, interval=0.05
    )


def test_fake_nvidia_smi_is_detected_and_filtered(workers, client_factory, tmp_path):
    path = _fake_smi(tmp_path)
    workers.start(1, env={"PATH": path, "CUDA_VISIBLE_DEVICES": "2,0", rtasks.TAG: "w"})
    client = client_factory()
    (w,) = _status_workers(client, 1)
    assert w["resources"]["gpu"] == 2, w  # three detected, two visible
    tag, devices, _ = client.options(resources={"gpu": 1}).submit(rtasks.where).result(30)
    assert devices in ("2", "0")
    log = workers.log_text(0)
    assert "gpu=2" in log and "GPU ids 2,0" in log, log


def test_two_gpus_run_at_most_two_gpu_tasks_at_once(workers, client_factory, tmp_path):
    path = _fake_smi(tmp_path)
    # Four processes, two visible GPUs: the slots would allow four tasks at once.
    workers.start(4, env={"PATH": path, "CUDA_VISIBLE_DEVICES": "0,1", rtasks.TAG: "gpu2"})
    client = client_factory()
    _status_workers(client, 1)
    shared = tmp_path / "present"
    shared.mkdir()
    view = client.options(resources={"gpu": 1})
    futures = [view.submit(rtasks.overlap, str(shared), i) for i in range(6)]
    results = [f.result(timeout=60) for f in futures]
    most = max(r[0] for r in results)
    print(f"most gpu=1 tasks present at once on a gpu=2 host: {most} (of {len(results)})")
    assert most == 2, results  # never three, and two did run together
    assert all(r[1] in ("0", "1") for r in results), results  # one device each
    assert not any(r[2] for r in results), results  # never a device shared at once
    # Tasks without a request still use all four slots meanwhile.
    assert client.map(rtasks.where_of, range(20))


def test_killed_worker_task_runs_again_on_another_matching_worker(
    workers, client_factory, tmp_path
):
    hide = {"CUDA_VISIBLE_DEVICES": ""}
    first = workers.start(1, "--resources", "gpu=1", env={**hide, rtasks.TAG: "a1"})
    second = workers.start(1, "--resources", "gpu=1", env={**hide, rtasks.TAG: "a2"})
    workers.start(1, env={**hide, rtasks.TAG: "plain"})
    client = client_factory()
    _status_workers(client, 3)
    shared = tmp_path / "held"
    shared.mkdir()
    fut = client.options(resources={"gpu": 1}).submit(rtasks.held, str(shared))
    started = wait_until(lambda: list(shared.glob("started-*")), timeout=30)
    tag = started[0].name.split("-")[1]
    victim = {"a1": first, "a2": second}[tag]
    os.killpg(victim.pid, signal.SIGKILL)  # the worker, its processes and the task's
    victim.wait(timeout=10)
    (shared / "release").write_text("")
    again, devices, _ = fut.result(timeout=60)
    assert again == {"a1": "a2", "a2": "a1"}[tag]  # the other gpu worker, never "plain"
    assert devices == "0"
    assert not list(shared.glob("started-plain-*"))


def test_a_task_process_killed_mid_task_frees_its_devices(workers, client_factory, tmp_path):
    # One host connection (two processes, two GPUs): the relay holds the devices.
    hide = {"CUDA_VISIBLE_DEVICES": "", rtasks.TAG: "host"}
    workers.start(2, "--resources", "gpu=2", env=hide)
    client = client_factory()
    _status_workers(client, 1)
    shared = tmp_path / "held"
    shared.mkdir()
    fut = client.options(resources={"gpu": 2}).submit(rtasks.held, str(shared))
    (first,) = wait_until(lambda: list(shared.glob("started-*")), timeout=30)
    os.kill(int(first.name.rsplit("-", 1)[1]), signal.SIGKILL)  # the task's own process
    wait_until(lambda: len(list(shared.glob("started-*"))) == 2, timeout=30)
    (shared / "release").write_text("")
    tag, devices, _ = fut.result(timeout=60)
    # Its retry got both devices again: the lost attempt gave them back.
    assert tag == "host" and sorted(devices.split(",")) == ["0", "1"], devices
    assert "shares busy" not in workers.log_text(0)
