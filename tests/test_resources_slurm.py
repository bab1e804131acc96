"""Slurm and resources (issue 26) without a Slurm cluster: the worker jobs ask Slurm for their
GPUs and memory (``--gres``, ``--mem``) and their worker offers the same (``--resources``); the
adapt rule does not count the tasks of a class the pool's jobs could not serve, and names it.
The Kubernetes manifest passes its limits to the worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import TESTS_DIR
from rtpool import _slurm_jobs as jobs
from rtpool._slurm_adapt import demand_from_status, serves, unserved


def _spec(tmp_path, **kw) -> jobs.JobSpec:
    return jobs.JobSpec(
        master="login:7070", token_file=str(tmp_path / "t"), job_dir=str(tmp_path), **kw
    )


def test_jobs_ask_slurm_for_gpus_and_memory_and_offer_them(tmp_path):
    spec = _spec(tmp_path, procs=4, gpus=2, mem_gb=64, worker_args=["--label", "zone=a"])
    cmd = spec.sbatch_command("worker.sh")
    assert "--gres=gpu:2" in cmd and "--mem=64G" in cmd and cmd[-1] == "worker.sh"
    script = spec.script()
    assert "--resources gpu=2,mem_gb=64" in script and "--label zone=a" in script
    assert "--gres=gpu:2" in spec.srun_script("step.sh")
    assert spec.offer() == {
        "resources": {"cpu": 4, "gpu": 2, "mem_gb": 64},
        "labels": {"zone": "a"},
    }
    plain = _spec(tmp_path)
    assert "--gres" not in " ".join(plain.sbatch_command("w.sh"))
    assert "--resources" not in plain.script()
    with pytest.raises(ValueError, match="gpus must be 0 or more"):
        _spec(tmp_path, gpus=-1)


def test_adapt_counts_only_the_classes_the_jobs_could_serve():
    snapshot = {
        "totals": {"queued": 30, "running": 0},
        "workers": [],
        "resource_classes": [
            {"name": "gpu=1", "resources": {"gpu": 1}, "labels": {}, "queued": 10,
             "unschedulable": True},
            {"name": "gpu=8", "resources": {"gpu": 8}, "labels": {}, "queued": 15,
             "unschedulable": True},
        ],
    }  # fmt: skip
    gpu_jobs = {"resources": {"cpu": 1, "gpu": 2}, "labels": {}}
    cpu_jobs = {"resources": {"cpu": 1}, "labels": {}}
    assert serves(gpu_jobs, snapshot["resource_classes"][0])
    assert not serves(cpu_jobs, snapshot["resource_classes"][0])
    assert demand_from_status(snapshot).tasks == 30  # as before: no offer, everything counts
    assert demand_from_status(snapshot, gpu_jobs).tasks == 15  # 5 default + 10 gpu=1
    assert demand_from_status(snapshot, cpu_jobs).tasks == 5
    assert unserved(snapshot, gpu_jobs) == ("gpu=8",)
    assert unserved(snapshot, cpu_jobs) == ("gpu=1", "gpu=8")
    labelled = {"resources": {"cpu": 1}, "labels": {"zone": "a"}}
    assert serves(labelled, {"resources": {}, "labels": {"zone": "a"}})
    assert not serves(labelled, {"resources": {}, "labels": {"zone": "b"}})


def test_kubernetes_worker_passes_its_limits_as_resources():
    deploy = Path(TESTS_DIR).parent / "deploy" / "kubernetes"
    text = "\n".join(p.read_text() for p in sorted(deploy.glob("*.y*ml")))
    assert "RTPOOL_WORKER_RESOURCES" in text and "mem_gb=$(RTPOOL_MEM_GB)" in text
    assert "nvidia.com/gpu" in text
    assert "resource: limits.memory" in text and "divisor: 1Gi" in text
