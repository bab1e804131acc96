"""What a worker host has (``docs/resources.md``): its resources, detected where that is cheap
and safe, overridden by ``--resources``, and its labels (``--label``).

Detection at startup, once, in the parent process:

* ``cpu``: the worker's slots (``--procs``), not the machine's CPUs: a task asking for
  ``cpu=2`` holds two of the worker's slots' worth.
* ``mem_gb``: ``MemTotal`` of ``/proc/meminfo`` in whole GiB.
* ``gpu``: the ``GPU N: ...`` lines of ``nvidia-smi -L`` (on ``PATH``, at most
  :data:`NVIDIA_SMI_TIMEOUT_S`), else the entries of ``/proc/driver/nvidia/gpus/``; filtered by
  ``CUDA_VISIBLE_DEVICES`` when it is set (as CUDA does: its entries up to the first that
  names no detected device; empty: none).

A declared value wins (``--resources gpu=0`` turns detected GPUs off). The device ids a task
gets in its ``CUDA_VISIBLE_DEVICES`` are those the worker's own variable lists (indices or
UUIDs), else the detected indices; declared GPUs past the detected ones are numbered on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Dict, List, NamedTuple, Tuple

#: Seconds ``nvidia-smi -L`` may take before the worker gives up on it (a hung driver).
NVIDIA_SMI_TIMEOUT_S = 3.0
#: Resources every worker process accounts by itself; any other (a GPU, a declared licence)
#: belongs to the host, so a multi-process worker holds one connection for them.
PER_PROCESS = frozenset({"cpu", "mem_gb"})
_GPU_LINE = re.compile(r"^GPU (\d+):.*?(?:\(UUID: ([^)]+)\))?\s*$")
_PROC_GPUS = "/proc/driver/nvidia/gpus"


class Inventory(NamedTuple):
    """A host's resources and labels, and its GPU ids."""

    #: ``{name: total}`` of the host, sorted, zeros left out.
    resources: Dict[str, int]
    #: ``{key: value}``, sorted.
    labels: Dict[str, str]
    #: The ids a task's ``CUDA_VISIBLE_DEVICES`` lists, one per GPU of ``resources``.
    gpu_ids: Tuple[str, ...]
    #: How each resource was found, for the startup line: ``{name: "detected"|"declared"}``.
    origin: Dict[str, str]

    def has_host_resources(self) -> bool:
        """Whether it has a resource other than ``cpu`` and ``mem_gb`` (see
        :data:`PER_PROCESS`)."""
        return any(name not in PER_PROCESS for name in self.resources)

    def per_process(self, procs: int) -> Dict[str, int]:
        """What one of ``procs`` processes with its own connection declares: its share of
        ``cpu`` and ``mem_gb`` (rounded down), nothing else (there is none: see
        ``_arguments.check_resources``)."""
        out = {n: v // procs for n, v in self.resources.items() if n in PER_PROCESS}
        return {n: v for n, v in out.items() if v}

    def describe(self) -> str:
        """``gpu=2 (detected), mem_gb=64, cpu=4; labels zone=a`` for the startup line."""
        res = ", ".join(
            f"{n}={v}" + (" (declared)" if self.origin.get(n) == "declared" else "")
            for n, v in self.resources.items()
        )
        text = f"resources {res or 'none'}"
        if self.gpu_ids:
            text += f" (GPU ids {','.join(self.gpu_ids)})"
        labels = ", ".join(f"{k}={v}" for k, v in self.labels.items())
        return f"{text}; labels {labels or 'none'}"


def mem_gb(path: str = "/proc/meminfo") -> int | None:
    """``MemTotal`` in whole GiB, or None when it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // (1 << 20)  # kB -> GiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def detect_gpus(env: Dict[str, str] | None = None, proc_dir: str = _PROC_GPUS) -> List[str]:
    """The ids of this host's visible NVIDIA GPUs (see the module docstring); [] for none."""
    env = os.environ if env is None else env
    found = _nvidia_smi(env)
    if found is None:
        try:
            found = [(str(i), "") for i in range(len(os.listdir(proc_dir)))]
        except OSError:
            found = []
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [index for index, _ in found]
    return _filter_visible(visible, found)


def _nvidia_smi(env: Dict[str, str]) -> List[Tuple[str, str]] | None:
    """``[(index, uuid)]`` from ``nvidia-smi -L``; None when it is not there or fails."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "-L"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            env=dict(env),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.splitlines():
        m = _GPU_LINE.match(line.strip())
        if m:
            gpus.append((m.group(1), m.group(2) or ""))
    return gpus


def _filter_visible(visible: str, found: List[Tuple[str, str]]) -> List[str]:
    """The entries of ``CUDA_VISIBLE_DEVICES`` naming a detected GPU (an index or a UUID, or
    its prefix), up to the first that names none, as CUDA reads it."""
    out: List[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            break
        hit = any(
            entry == index or (uuid and entry.startswith("GPU-") and uuid.startswith(entry))
            for index, uuid in found
        )
        if not hit or entry in out:
            break
        out.append(entry)
    return out


def inventory(
    procs: int, declared: Dict[str, int], labels: Dict[str, str], detect: bool = True
) -> Inventory:
    """The host's :class:`Inventory`: detected values (``detect``), then ``declared`` over
    them."""
    found: Dict[str, int] = {"cpu": procs}
    gpu_ids: List[str] = []
    if detect:
        mem = mem_gb()
        if mem:
            found["mem_gb"] = mem
        if "gpu" not in declared or declared["gpu"]:
            gpu_ids = detect_gpus()
            if gpu_ids:
                found["gpu"] = len(gpu_ids)
    origin = {n: "detected" for n in found}
    origin.update({n: "declared" for n in declared})
    values = {**found, **declared}
    gpus = values.get("gpu", 0)
    ids = gpu_ids[:gpus]
    n = 0
    while len(ids) < gpus:  # declared past the detected: the next unused indices
        if str(n) not in ids:
            ids.append(str(n))
        n += 1
    resources = {n: values[n] for n in sorted(values) if values[n]}
    return Inventory(resources, dict(sorted(labels.items())), tuple(ids), origin)
