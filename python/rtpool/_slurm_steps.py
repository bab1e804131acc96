"""Worker steps of one Slurm allocation: ``SlurmCluster(mode="srun")``.

Each worker is one job step, ``srun --jobid ALLOC --ntasks 1 --cpus-per-task K --exact`` of the
step script (``JobSpec.script(step=True)``: ``rtpool worker --name slurm-<jobid>.<stepid>``),
started from this process: the ``srun`` client runs here until its step ends. A step is known
by the unique ``--job-name`` given to it, and by its ``<jobid>.<stepid>`` once ``squeue
--steps`` lists it. Slurm signals every process of a step, so the graceful stop is SIGINT, not
SIGTERM: the worker's supervisor drains on it (running tasks finish, prefetched ones go back)
and its children ignore it, where a SIGTERM to every process would stop the children at once.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from typing import Dict, Iterable, List, Mapping, Sequence

from . import _slurm_jobs as jobs
from .errors import RtpoolError

__all__ = ["Steps"]

#: Seconds ``close()`` waits for the ``srun`` clients to exit once their steps are cancelled.
_SRUN_EXIT_S = 10.0


class Steps:
    """Worker steps in allocation ``allocation``; the keys are the steps' ``--job-name``.

    Args:
        spec: What every worker gets (``procs``, ``job_name``, ``job_dir``, ...).
        allocation: The id of a running job whose resources the steps use.
        script: Path of the step script.
        env: The ``srun`` client's environment (no token in it).
        srun_args: More ``srun`` options, e.g. ``["--mem", "4G"]`` or ``["--overcommit"]``.
    """

    def __init__(
        self,
        spec: jobs.JobSpec,
        allocation: str,
        script: str,
        env: Mapping[str, str],
        srun_args: Sequence[str] = (),
    ) -> None:
        self.spec = spec
        self.allocation = allocation
        self.script = script
        self.env = dict(env)
        self.srun_args = list(srun_args)
        self._seq = itertools.count()
        self._clients: Dict[str, subprocess.Popen] = {}
        self._step_ids: Dict[str, str] = {}

    def submit(self) -> str:
        """Start one worker step (its ``srun`` client runs here); returns its key."""
        key = f"{self.spec.job_name}-{os.getpid()}-{next(self._seq)}"
        out = os.path.join(self.spec.job_dir, "slurm-%j.%s.out")
        cmd = ["srun", "--jobid", self.allocation, "--job-name", key, "--ntasks", "1"]
        cmd += ["--cpus-per-task", str(self.spec.procs), "--exact", "--output", out]
        cmd += ["--kill-on-bad-exit=0", *self.spec.slurm_resources(), *self.srun_args, self.script]
        log = open(os.path.join(self.spec.job_dir, f"srun-{key}.log"), "ab")
        try:
            self._clients[key] = subprocess.Popen(
                cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the terminal's Ctrl-C is ours to handle, not srun's
            )
        except FileNotFoundError:
            raise RtpoolError(
                "srun not found: mode='srun' runs inside a Slurm allocation (salloc, sbatch)"
            ) from None
        finally:
            log.close()
        return key

    def _lookup(self) -> Dict[str, str]:
        """``--job-name`` -> ``jobid.stepid`` of this allocation's steps."""
        out = jobs._run(
            ["squeue", "--steps", f"--jobs={self.allocation}", "--noheader", "--format=%i %j"]
        )
        found = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] in self._clients:
                found[parts[1]] = parts[0]
        self._step_ids.update(found)
        return found

    def states(self, keys: Iterable[str]) -> Dict[str, str]:
        """``RUNNING`` for steps Slurm lists, ``PENDING`` for those whose ``srun`` still
        waits; ended steps (their ``srun`` exited) are left out."""
        alive = [k for k in keys if k in self._clients and self._clients[k].poll() is None]
        for key in list(self._clients):
            if key not in alive and self._clients[key].poll() is not None:
                del self._clients[key]
                self._step_ids.pop(key, None)
        if not alive:
            return {}
        listed = self._lookup()
        return {k: "RUNNING" if k in listed else "PENDING" for k in alive}

    def cancel(self, keys: Sequence[str], graceful: bool = False) -> None:
        """Stop steps: ``graceful``, SIGINT (the worker drains); otherwise ``scancel`` (SIGTERM,
        then SIGKILL after KillWait). A step not started yet: its ``srun`` is killed."""
        if not keys:
            return
        if any(k not in self._step_ids for k in keys):
            self._lookup()
        ids = [self._step_ids[k] for k in keys if k in self._step_ids]
        for key in keys:
            client = self._clients.get(key)
            if key not in self._step_ids and client is not None and client.poll() is None:
                client.kill()
        if ids:
            cmd = ["scancel", "--signal=INT", *ids] if graceful else ["scancel", *ids]
            try:
                jobs._run(cmd)
            except RtpoolError as exc:
                if "already complet" not in str(exc) and "Invalid job id" not in str(exc):
                    raise

    def close(self) -> None:
        """Cancel every step started here and reap the ``srun`` clients."""
        keys = list(self._clients)
        try:
            self.cancel(keys)
        finally:
            end = time.monotonic() + _SRUN_EXIT_S
            for client in self._clients.values():
                try:
                    client.wait(max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    client.send_signal(signal.SIGKILL)
                    client.wait()
            self._clients.clear()

    def name(self, key: str) -> str:
        """``jobid.stepid`` of a step once Slurm listed it, else its key."""
        return self._step_ids.get(key, key)

    def started(self) -> List[str]:
        """Keys of the steps whose ``srun`` runs."""
        return [k for k, c in self._clients.items() if c.poll() is None]
