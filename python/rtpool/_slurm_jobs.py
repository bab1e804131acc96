"""Worker jobs on Slurm: the job script, ``sbatch``, ``squeue`` and ``scancel``, shared by
``SlurmCluster`` (``slurm.py``) and ``rtpool slurm up|down`` (``_slurm_cli.py``).

Each worker is one batch job whose script ``exec``s ``rtpool worker --procs K --name
slurm-$SLURM_JOB_ID``, so the batch shell *is* the worker's supervisor: ``scancel --batch
--signal=TERM`` reaches it alone and it drains gracefully (running tasks finish, prefetched ones
go back to the master). The token never appears on a command line, in the script or in the job's
environment: the script names a 0600 file the worker reads (``--token-file``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any, Dict, Iterable, List, Mapping, Sequence

from .errors import RtpoolError

__all__ = [
    "Batch",
    "JobSpec",
    "cancel",
    "job_states",
    "submit",
    "worker_env",
    "write_private",
    "write_script",
]

#: Seconds a Slurm command may take (slurmctld answers in milliseconds when healthy).
_COMMAND_TIMEOUT_S = 60.0
#: Token variables kept out of the environment ``sbatch`` copies into the job.
_SECRET_VARS = ("RTPOOL_TOKEN", "RTPOOL_WORKER_TOKEN")


class JobSpec:
    """What every worker job of one pool gets.

    Args:
        master: ``host:port`` the Slurm nodes reach the master at.
        token_file: Path of the worker token file (readable by the nodes, mode 0600).
        job_dir: Directory of the job script and the jobs' output (``slurm-<jobid>.out``).
        procs: Worker processes per job (``--procs``, also ``--cpus-per-task``).
        partition: ``--partition``, or None for Slurm's default.
        walltime: ``--time`` (``"1:00:00"``, ``"30"`` minutes), or None for the partition's.
        sbatch_args: More ``sbatch`` options, as a list.
        job_name: ``--job-name``.
        python: The interpreter the jobs run (must exist on the nodes).
        worker_args: More ``rtpool worker`` options, as a list.
        ca_file: The master's certificate (or its CA) for ``--ca-file``, readable by the nodes;
            None: plain TCP.
        gpus: GPUs per job: ``--gres=gpu:N`` for Slurm and ``--resources gpu=N`` for the
            worker (0: none asked; a GPU Slurm gives anyway is still detected).
        mem_gb: Memory per job in GiB: ``--mem=NG`` and ``--resources mem_gb=N`` (None:
            the partition's default, and the worker detects the node's).
    """

    def __init__(
        self,
        master: str,
        token_file: str,
        job_dir: str,
        procs: int = 1,
        partition: str | None = None,
        walltime: str | None = None,
        sbatch_args: Sequence[str] = (),
        job_name: str = "rtpool-worker",
        python: str = sys.executable,
        worker_args: Sequence[str] = (),
        ca_file: str | None = None,
        gpus: int = 0,
        mem_gb: int | None = None,
    ) -> None:
        if procs < 1:
            raise ValueError("procs must be at least 1")
        if gpus < 0 or (mem_gb is not None and mem_gb < 1):
            raise ValueError("gpus must be 0 or more and mem_gb at least 1 (or None)")
        self.gpus = gpus
        self.mem_gb = mem_gb
        self.master = master
        self.token_file = token_file
        self.job_dir = job_dir
        self.procs = procs
        self.partition = partition
        self.walltime = walltime
        self.sbatch_args = list(sbatch_args)
        self.job_name = job_name
        self.python = python
        self.worker_args = list(worker_args)
        self.ca_file = ca_file

    def script(self, step: bool = False) -> str:
        """The batch script (``step``: the job step script): no secret in it, the token is read
        from ``token_file``. A batch job's worker is named ``slurm-<jobid>``, a step's
        ``slurm-<jobid>.<stepid>`` (Slurm's own notation for a step), with ``.<task>`` for each
        task of a step of several (``rtpool slurm up --mode srun``)."""
        cmd = [self.python, "-m", "rtpool", "worker", "--master", self.master]
        cmd += ["--token-file", self.token_file, "--procs", str(self.procs)]
        if self.ca_file is not None:
            cmd += ["--ca-file", self.ca_file]
        declared = self.declared()
        if declared:  # what Slurm gives the job is what the worker offers its tasks
            cmd += ["--resources", ",".join(f"{k}={v}" for k, v in declared.items())]
        cmd += self.worker_args
        line = " ".join(shlex.quote(c) for c in cmd)
        if step:
            return (
                "#!/bin/sh\n"
                "# An rtpool worker as a job step; written by rtpool (SlurmCluster(mode='srun')).\n"
                "# Slurm signals every process of a step: SIGINT drains the worker (its children\n"
                "# ignore SIGINT), SIGTERM stops it at once.\n"
                'name="slurm-$SLURM_JOB_ID.$SLURM_STEP_ID"\n'
                '[ "${SLURM_STEP_NUM_TASKS:-1}" -gt 1 ] && name="$name.$SLURM_PROCID"\n'
                f'exec {line} --name "$name"\n'
            )
        return (
            "#!/bin/sh\n"
            "# An rtpool worker; written by rtpool (SlurmCluster or `rtpool slurm up`).\n"
            "# exec: the worker is the batch shell, so `scancel --batch --signal=TERM` drains it.\n"
            f'exec {line} --name "slurm-$SLURM_JOB_ID"\n'
        )

    def declared(self) -> Dict[str, int]:
        """The ``--resources`` of the worker: the job's GPUs and memory, when asked."""
        out = {}
        if self.gpus:
            out["gpu"] = self.gpus
        if self.mem_gb:
            out["mem_gb"] = self.mem_gb
        return out

    def slurm_resources(self) -> List[str]:
        """The ``sbatch``/``srun`` options asking for the job's GPUs and memory."""
        out = []
        if self.gpus:
            out.append(f"--gres=gpu:{self.gpus}")
        if self.mem_gb:
            out.append(f"--mem={self.mem_gb}G")
        return out

    def offer(self) -> Dict[str, Any]:
        """What one job's worker offers tasks, for ``adapt``: ``{"resources", "labels"}``
        (its slots, GPUs and memory, and what ``worker_args`` declare with ``--resources``
        and ``--label``)."""
        from ._resources import parse_labels, parse_resources

        resources: Dict[str, int] = {"cpu": self.procs, **self.declared()}
        texts, labels = [], []
        args = iter(self.worker_args)
        for arg in args:
            if arg in ("--resources", "--label"):
                (texts if arg == "--resources" else labels).append(next(args, ""))
            elif arg.startswith("--resources="):
                texts.append(arg.partition("=")[2])
            elif arg.startswith("--label="):
                labels.append(arg.partition("=")[2])
        try:
            resources.update(parse_resources(texts))
            return {"resources": resources, "labels": parse_labels(labels)}
        except ValueError:  # the worker says so itself at startup
            return {"resources": resources, "labels": {}}

    def srun_script(self, step_script: str) -> str:
        """The batch script of ``rtpool slurm up --mode srun``: one ``srun`` starting the step
        script in every task of the allocation (``--ntasks`` workers, on as many nodes as
        Slurm gave)."""
        srun = ["srun", "--kill-on-bad-exit=0", "--cpus-per-task", str(self.procs)]
        srun += [*self.slurm_resources(), step_script]
        return (
            "#!/bin/sh\n"
            "# rtpool workers as the tasks of one job step; by `rtpool slurm up --mode srun`.\n"
            f"exec {' '.join(shlex.quote(c) for c in srun)}\n"
        )

    def sbatch_command(self, script_path: str, ntasks: int = 1) -> List[str]:
        cmd = ["sbatch", "--parsable", "--export=ALL", "--job-name", self.job_name]
        cmd += ["--ntasks", str(ntasks), "--cpus-per-task", str(self.procs)]
        cmd += ["--output", os.path.join(self.job_dir, "slurm-%j.out")]
        if self.partition:
            cmd += ["--partition", self.partition]
        if self.walltime:
            cmd += ["--time", self.walltime]
        return cmd + self.slurm_resources() + self.sbatch_args + [script_path]


def write_private(path: str, text: str) -> None:
    """Write ``text`` to a new file readable by its owner only (0600), replacing ``path``."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_script(spec: JobSpec, step: bool = False) -> str:
    """Write the job script (``step``: the step script, ``worker-step.sh``) into
    ``spec.job_dir`` (0700); returns its path."""
    path = os.path.join(spec.job_dir, "worker-step.sh" if step else "worker.sh")
    write_private(path, spec.script(step))
    os.chmod(path, 0o700)
    return path


def worker_env(extra_path: Iterable[str] = ()) -> Dict[str, str]:
    """The environment ``sbatch`` hands the job: this one without token variables, with
    ``extra_path`` (this process's ``sys.path``) on ``PYTHONPATH`` so the workers import what
    this process can (given a shared file system)."""
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_VARS}
    paths = [p or os.getcwd() for p in extra_path]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _run(cmd: List[str], env: Mapping[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(
            cmd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise RtpoolError(
            f"{cmd[0]} not found: run this on a Slurm login node (or install slurm-client and "
            "set SLURM_CONF)"
        ) from None
    except subprocess.TimeoutExpired:
        raise RtpoolError(
            f"{cmd[0]} did not answer within {_COMMAND_TIMEOUT_S:g} s; is slurmctld up "
            "(scontrol ping)?"
        ) from None
    if proc.returncode != 0:
        err = proc.stderr.strip() or proc.stdout.strip()
        raise RtpoolError(f"{' '.join(cmd[:2])} ... failed (exit {proc.returncode}): {err}")
    return proc.stdout


def submit(spec: JobSpec, script_path: str, env: Mapping[str, str], ntasks: int = 1) -> str:
    """Submit one job of ``ntasks`` tasks (a worker job: 1); returns its job id."""
    out = _run(spec.sbatch_command(script_path, ntasks), env).strip()
    # --parsable prints "jobid" or "jobid;cluster".
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise RtpoolError(f"sbatch printed {out!r}, not a job id")
    return job_id


def job_states(job_ids: Iterable[str]) -> Dict[str, str]:
    """The Slurm state (``PENDING``, ``RUNNING``, ``COMPLETING``, ...) of each of ``job_ids``
    still in ``squeue``; finished jobs are left out."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    # All of our jobs rather than --jobs: squeue fails on ids it has already forgotten.
    out = _run(["squeue", f"--user={os.getuid()}", "--noheader", "--format=%i %T"])
    states = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in wanted:
            states[parts[0]] = parts[1]
    return states


def cancel(job_ids: Sequence[str], graceful: bool = False) -> None:
    """Cancel jobs. ``graceful``: SIGTERM to the worker only (it drains, then the job ends);
    only for running jobs. Otherwise Slurm's cancel (pending jobs never start; running ones get
    SIGTERM, then SIGKILL after KillWait). Jobs that already ended are not an error."""
    if not job_ids:
        return
    refused = list(job_ids)
    if graceful:
        # One at a time: a job Slurm refuses to signal (its batch step is not running yet, or
        # it just ended) is cancelled outright, and only that one.
        refused = []
        for job_id in job_ids:
            try:
                _run(["scancel", "--batch", "--signal=TERM", job_id])
            except RtpoolError:
                refused.append(job_id)
    if not refused:
        return
    try:
        _run(["scancel", *refused])
    except RtpoolError as exc:
        # scancel exits non-zero when some job already finished; the others were cancelled.
        if "already complet" not in str(exc) and "Invalid job id" not in str(exc):
            raise


class Batch:
    """Worker jobs as batch jobs, one per worker (``SlurmCluster``'s default mode); the keys
    are the job ids. ``Steps`` (``_slurm_steps.py``) has the same methods."""

    def __init__(self, spec: JobSpec, script: str, env: Mapping[str, str]) -> None:
        self.spec = spec
        self.script = script
        self.env = dict(env)

    def submit(self) -> str:
        """Submit one worker job; returns its id."""
        return submit(self.spec, self.script, self.env)

    def states(self, keys: Iterable[str]) -> Dict[str, str]:
        """The Slurm state of each job still in ``squeue``."""
        return job_states(keys)

    def cancel(self, keys: Sequence[str], graceful: bool = False) -> None:
        """Cancel jobs (``graceful``: SIGTERM to the worker only, it drains)."""
        cancel(keys, graceful)

    def close(self) -> None:
        """Nothing to release beyond the jobs (``cancel`` does that)."""

    def name(self, key: str) -> str:
        """The job id (the key itself)."""
        return key
