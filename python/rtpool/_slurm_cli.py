"""``rtpool slurm up|down``: worker jobs for a master that already runs (``rtpool master``).

``up`` writes the job script into ``--job-dir`` and submits ``--workers`` jobs (one
``rtpool worker --procs K`` each, named ``slurm-<jobid>``), or with ``--mode srun`` one job of
``--workers`` tasks whose ``srun`` starts a worker in each (named
``slurm-<jobid>.<step>.<task>``); their ids are added to ``JOB_DIR/jobs.json``. ``down``
cancels the jobs recorded there and empties it. The token stays in its file: the jobs read
``--token-file`` (by default the master's ``worker.token``). ``--ca-file``: the certificate
of a TLS master, copied into the job directory for the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Callable, List

from . import _slurm_jobs as jobs
from ._slurm_tls import worker_ca_file
from .errors import RtpoolError

_HELP = """\
Run rtpool workers as Slurm batch jobs for a running master, and cancel them.

examples:
  rtpool slurm up --workers 4 --partition short --time 1:00:00 --procs 8 \\
      --master login1:7070 --token-file ~/.local/share/rtpool/worker.token
  rtpool slurm up --mode srun --workers 16 --procs 8 --master login1:7070 \\
      --ca-file ~/.local/share/rtpool/tls/cert.pem
  rtpool slurm down
"""


def add_arguments(parser: argparse.ArgumentParser, default_data_dir: Callable[[], str]) -> None:
    """Add ``up`` and ``down`` to the ``rtpool slurm`` parser."""
    parser.description = _HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="slurm_command", metavar="up|down")
    sub.required = True
    job_dir = os.path.join(os.path.expanduser("~"), ".rtpool", "slurm", "cli")
    up = sub.add_parser("up", help="submit worker jobs; prints their ids")
    up.add_argument("--workers", type=int, default=1, metavar="N", help="jobs (default: 1)")
    up.add_argument("--procs", type=int, default=1, metavar="K", help="worker processes per job")
    up.add_argument("--partition", default=None, metavar="P", help="sbatch --partition")
    up.add_argument("--time", default=None, metavar="T", help="sbatch --time of each job")
    up.add_argument(
        "--master",
        default=None,
        metavar="HOST:PORT",
        help="where the nodes reach the master (default: this host's name, port 7070)",
    )
    up.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="worker token file the jobs read (default: worker.token in the master's data dir: "
        f"{os.path.join(default_data_dir(), 'worker.token')})",
    )
    up.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more sbatch argument, e.g. --sbatch-arg=--account=proj; repeatable",
    )
    up.add_argument("--python", default=sys.executable, help="interpreter on the nodes")
    up.add_argument(
        "--gpus",
        type=int,
        default=0,
        metavar="N",
        help="GPUs per job: sbatch --gres=gpu:N, and the worker offers gpu=N to tasks that ask "
        "(options(resources={'gpu': 1})) (default: 0, none asked)",
    )
    up.add_argument(
        "--mem-gb",
        type=int,
        default=None,
        metavar="N",
        help="memory per job in GiB: sbatch --mem=NG, and the worker offers mem_gb=N "
        "(default: the partition's; the worker detects the node's)",
    )
    up.add_argument(
        "--mode",
        choices=("sbatch", "srun"),
        default="sbatch",
        help="sbatch: one job per worker (default); srun: one job of N tasks, a worker in each",
    )
    up.add_argument(
        "--ca-file",
        default=None,
        metavar="PATH",
        help="the TLS master's certificate (or CA) the workers trust; copied into --job-dir",
    )
    down = sub.add_parser("down", help="cancel the jobs `up` submitted")
    for p in (up, down):
        p.add_argument(
            "--job-dir",
            default=job_dir,
            metavar="DIR",
            help=f"job script, logs and jobs.json, visible to the nodes (default: {job_dir})",
        )
    parser.set_defaults(default_data_dir=default_data_dir)


def _state_path(job_dir: str) -> str:
    return os.path.join(job_dir, "jobs.json")


def _recorded(job_dir: str) -> List[str]:
    try:
        with open(_state_path(job_dir), encoding="utf-8") as f:
            return [str(j) for j in json.load(f)["jobs"]]
    except FileNotFoundError:
        return []


def _record(job_dir: str, ids: List[str]) -> None:
    jobs.write_private(_state_path(job_dir), json.dumps({"jobs": ids}) + "\n")


def _up(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.procs < 1:
        print("rtpool slurm up: --workers and --procs must be at least 1", file=sys.stderr)
        return 2
    if args.gpus < 0 or (args.mem_gb is not None and args.mem_gb < 1):
        print("rtpool slurm up: --gpus must be 0 or more, --mem-gb at least 1", file=sys.stderr)
        return 2
    token_file = args.token_file or os.path.join(args.default_data_dir(), "worker.token")
    token_file = os.path.abspath(os.path.expanduser(token_file))
    if not os.path.isfile(token_file):
        print(
            f"rtpool slurm up: no token file {token_file}; pass --token-file (the master writes "
            "worker.token into its data dir on first start)",
            file=sys.stderr,
        )
        return 2
    job_dir = os.path.abspath(args.job_dir)
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    ca_file = None
    if args.ca_file is not None:
        ca_file = worker_ca_file(os.path.expanduser(args.ca_file), job_dir)
    spec = jobs.JobSpec(
        master=args.master or f"{socket.gethostname()}:7070",
        token_file=token_file,
        job_dir=job_dir,
        procs=args.procs,
        partition=args.partition,
        walltime=args.time,
        sbatch_args=args.sbatch_arg,
        python=args.python,
        ca_file=ca_file,
        gpus=args.gpus,
        mem_gb=args.mem_gb,
    )
    env = jobs.worker_env()
    ids = _recorded(job_dir)
    try:
        if args.mode == "srun":
            step = jobs.write_script(spec, step=True)
            script = os.path.join(job_dir, "workers-srun.sh")
            jobs.write_private(script, spec.srun_script(step))
            os.chmod(script, 0o700)
            ids.append(jobs.submit(spec, script, env, ntasks=args.workers))
            print(ids[-1], flush=True)
            return 0
        script = jobs.write_script(spec)
        for _ in range(args.workers):
            job_id = jobs.submit(spec, script, env)
            ids.append(job_id)
            print(job_id, flush=True)
    finally:
        _record(job_dir, ids)
    return 0


def _down(args: argparse.Namespace) -> int:
    job_dir = os.path.abspath(args.job_dir)
    ids = _recorded(job_dir)
    jobs.cancel(ids)
    _record(job_dir, [])
    print(f"cancelled {len(ids)} jobs" + (f": {' '.join(ids)}" if ids else ""), file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``rtpool slurm up|down``; returns the exit code."""
    try:
        return _up(args) if args.slurm_command == "up" else _down(args)
    except RtpoolError as exc:
        print(f"rtpool slurm {args.slurm_command}: {exc}", file=sys.stderr)
        return 1
