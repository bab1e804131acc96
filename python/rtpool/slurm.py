"""``SlurmCluster``: a master in this process, workers as Slurm batch jobs or job steps.

The master is a ``LocalCluster``'s (embedded, no local workers) listening on an address the
nodes can reach; each worker is one ``sbatch`` job running ``rtpool worker --procs K`` (the job
script and the ``sbatch``/``squeue``/``scancel`` calls are in ``_slurm_jobs.py``), or with
``mode="srun"`` one job step of an allocation (``_slurm_steps.py``). Job ids are tracked here,
and every job this object started is cancelled by ``close()``, at interpreter exit and after
Ctrl-C. ``adapt()`` runs a thread that sizes the pool by the master's queue and its packages'
deadlines (the rule in ``_slurm_adapt.py``); TLS files are made and placed by ``_slurm_tls.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Sequence

from . import _slurm_adapt as adapt
from . import _slurm_jobs as jobs
from . import _slurm_steps as steps
from . import _slurm_tls as tls_files
from .client import Client
from .cluster import LocalCluster

__all__ = ["SlurmCluster"]


class _Pool:
    """The worker jobs (or steps), kept apart from ``SlurmCluster`` so neither the finalizer
    nor the adapt thread keeps the cluster alive. ``backend`` is ``_slurm_jobs.Batch`` or
    ``_slurm_steps.Steps``: ``submit``, ``states``, ``cancel``, ``close``, ``name``."""

    def __init__(self, spec: jobs.JobSpec, backend: Any) -> None:
        self.spec = spec
        self.backend = backend
        self.lock = threading.Lock()
        self.jobs: List[str] = []  # submission order
        self.draining: set = set()  # signalled to drain; still listed until they exit
        self.adapt_stop: threading.Event | None = None
        self.adapt_thread: threading.Thread | None = None

    def refresh(self) -> Dict[str, str]:
        """Forget jobs that ended; the states of the others."""
        states = self.backend.states(self.jobs)
        self.jobs = [j for j in self.jobs if j in states]
        self.draining &= set(self.jobs)
        return states

    def live(self) -> List[str]:
        return [j for j in self.jobs if j not in self.draining]

    def scale(self, n: int) -> None:
        """Submit or cancel jobs until ``n`` are pending or running (draining ones left out)."""
        if n < 0:
            raise ValueError("the number of worker jobs must be 0 or more")
        with self.lock:
            states = self.refresh()
            live = self.live()
            for _ in range(n - len(live)):
                self.jobs.append(self.backend.submit())
            if n >= len(live):
                return
            # Pending jobs first (nothing to drain), then the newest running ones.
            order = {j: i for i, j in enumerate(self.jobs)}
            victims = sorted(live, key=lambda j: (states.get(j) != "PENDING", -order[j]))
            victims = victims[: len(live) - n]
            pending = [j for j in victims if states.get(j) == "PENDING"]
            running = [j for j in victims if j not in pending]
            self.backend.cancel(pending)
            self.backend.cancel(running, graceful=True)
            self.draining.update(running)
            self.jobs = [j for j in self.jobs if j not in pending]

    def stop_adapt(self) -> None:
        if self.adapt_stop is not None:
            self.adapt_stop.set()
            if (
                self.adapt_thread is not None
                and self.adapt_thread is not threading.current_thread()
            ):
                self.adapt_thread.join()
        self.adapt_stop = self.adapt_thread = None

    def cancel_all(self) -> None:
        self.stop_adapt()
        with self.lock:
            ids, self.jobs = list(self.jobs), []
            self.draining.clear()
        try:
            self.backend.cancel(ids)
        finally:
            self.backend.close()


def _poller(master: LocalCluster, offer: Dict[str, Any]) -> Callable[[], adapt.Demand]:
    """What ``adapt`` asks the master each time: its status snapshot when the client can ask
    for one (per-package deadlines, per-worker execution time, the resource classes: tasks
    of a class the pool's jobs (``offer``) cannot serve do not count, and are named once on
    stderr), else ``stats()``."""
    timer = adapt.TaskTimer()
    probe: List[Client] = []  # the connection the snapshot is asked over, made on first use
    told: set = set()

    def poll() -> adapt.Demand:
        snapshot = _status_snapshot(master, probe)
        if snapshot is not None:
            for name in set(adapt.unserved(snapshot, offer)) - told:
                told.add(name)
                print(
                    f"rtpool SlurmCluster.adapt: tasks of class {name} wait and no worker job "
                    "of this pool could run them; start a SlurmCluster whose jobs have it "
                    "(gpus=, mem_gb=, worker_args=['--label', ...])",
                    file=sys.stderr,
                    flush=True,
                )
            return adapt.demand_from_status(snapshot, offer)
        return adapt.demand_from_stats(master.stats(), timer, time.monotonic())

    return poll


def _status_snapshot(master: LocalCluster, probe: List[Client]) -> Dict[str, Any] | None:
    """The master's status snapshot (``docs/operations.md``) over ``CLUSTER_STATUS``, asked
    with the operator's token (it sees every user's packages); None when this build's
    ``Client`` cannot ask for it (then ``adapt`` sees no deadlines)."""
    if not hasattr(Client, "status"):
        return None
    if not probe:
        probe.append(master.client(name="rtpool SlurmCluster.adapt"))
    return dict(probe[0].status(timeout=10.0))


def _shutdown(
    pool: _Pool, master: LocalCluster, job_dir: str, own_dir: bool, tls_dir: str | None
) -> None:
    try:
        pool.cancel_all()
    finally:
        master.close()
        if tls_dir is not None:
            shutil.rmtree(tls_dir, ignore_errors=True)
        if own_dir:
            shutil.rmtree(job_dir, ignore_errors=True)
        else:
            try:
                os.unlink(pool.spec.token_file)
            except FileNotFoundError:
                pass


def _default_host() -> str:
    """This machine's hostname, or when it does not resolve (some containers), the address of
    the interface that routes outward (no packet is sent), or loopback."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class SlurmCluster:
    """A master here and workers as Slurm jobs: ``LocalCluster``'s shape for a Slurm cluster.

    Example::

        with rtpool.SlurmCluster(partition="short", walltime="1:00:00", procs=4) as cluster:
            cluster.scale(8)                       # 8 jobs x 4 worker processes
            client = cluster.client()
            results = list(client.map(f, range(10_000)))

    Run it on a login node: the jobs need this ``python`` and the task functions' modules at
    the same paths (a shared file system), and must reach ``host`` at the master's port. The
    worker token is written to a 0600 file in ``job_dir`` (a new 0700 directory under
    ``~/.rtpool/slurm`` by default), never to a command line, a script or the job environment.
    With ``mode="srun"`` (inside an allocation: ``salloc``, or ``allocation=JOBID``) each
    worker is a job step instead of a job.

    Args:
        workers: Worker jobs to submit at once (see :meth:`scale`).
        procs: Worker processes per job (``rtpool worker --procs``, ``--cpus-per-task``).
        partition: ``sbatch --partition``; None: the default partition.
        walltime: ``sbatch --time`` of each job (``"1:00:00"``); None: the partition's.
        sbatch_args: More ``sbatch`` options, e.g. ``["--account", "proj", "--mem", "4G"]``.
        job_name: ``sbatch --job-name``.
        listen: The master's address (port 0: a free one); by default every interface.
        host: The name or address the nodes reach this machine at (default: its hostname,
            or its outward address when the name does not resolve).
        job_dir: Where the job script, token file and ``slurm-<jobid>.out`` logs go; must be
            visible to the nodes. Given: kept after ``close()`` (the token file is removed);
            None: a new directory under ``~/.rtpool/slurm``, removed by ``close()``.
        python: The interpreter the jobs run (default: this one).
        prefetch: ``rtpool worker --prefetch``.
        reconnect_timeout_s: Workers that lose the master exit after this long (so jobs of a
            killed client do not run to their time limit).
        worker_args: More ``rtpool worker`` options.
        master_options: The embedded master's options, as ``LocalCluster`` takes them.
        data_dir: The master's data dir (journal, store); None: nothing on disk.
        mode: ``"sbatch"``: each worker a batch job; ``"srun"``: each worker a job step
            (``srun --exact``) of the allocation ``allocation``, named ``slurm-<jobid>.<step>``.
        allocation: The job id whose resources ``mode="srun"`` uses; default
            ``$SLURM_JOB_ID`` (set inside ``salloc``/``sbatch``).
        srun_args: More ``srun`` options for ``mode="srun"``, e.g. ``["--mem", "4G"]``.
        tls: Serve TLS with a self-signed certificate made for ``host`` (and loopback) with
            ``openssl``; the workers trust it (``--ca-file``). The key never leaves this
            machine's temporary directory.
        tls_cert: Serve TLS with this certificate (PEM) and ``tls_key`` instead.
        tls_key: The private key of ``tls_cert``; stays here (only read by the master).
        ca_file: What the workers trust with ``tls_cert`` (default: ``tls_cert`` itself, right
            for a self-signed one); copied into ``job_dir`` as ``ca.pem``.
        gpus: GPUs per worker job: ``--gres=gpu:N`` for Slurm, ``--resources gpu=N`` for the
            worker, so tasks with ``options(resources={"gpu": 1})`` run there
            (``docs/resources.md``). 0: none asked.
        mem_gb: Memory per worker job in GiB: ``--mem=NG`` and ``--resources mem_gb=N``.
            None: the partition's default (the worker detects the node's).

    Raises:
        RtpoolError: The master cannot start, ``sbatch``/``srun`` fails (its message
            included), or ``openssl`` cannot make the certificate.
        ValueError: A bad ``mode``, or ``mode="srun"`` outside an allocation.
    """

    def __init__(
        self,
        workers: int = 0,
        *,
        procs: int = 1,
        partition: str | None = None,
        walltime: str | None = None,
        sbatch_args: Sequence[str] = (),
        job_name: str = "rtpool-worker",
        listen: str = "0.0.0.0:0",
        host: str | None = None,
        job_dir: str | os.PathLike | None = None,
        python: str = sys.executable,
        prefetch: int | None = None,
        reconnect_timeout_s: float = 60.0,
        worker_args: Sequence[str] = (),
        master_options: Dict[str, Any] | None = None,
        data_dir: str | os.PathLike | None = None,
        mode: str = "sbatch",
        allocation: str | None = None,
        srun_args: Sequence[str] = (),
        tls: bool = False,
        tls_cert: str | os.PathLike | None = None,
        tls_key: str | os.PathLike | None = None,
        ca_file: str | os.PathLike | None = None,
        gpus: int = 0,
        mem_gb: int | None = None,
    ) -> None:
        if mode not in ("sbatch", "srun"):
            raise ValueError(f"mode must be 'sbatch' or 'srun', got {mode!r}")
        allocation = allocation or os.environ.get("SLURM_JOB_ID")
        if mode == "srun" and not allocation:
            raise ValueError(
                "mode='srun' starts workers as steps of an allocation: run inside salloc or "
                "sbatch, or pass allocation=JOBID"
            )
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("pass tls_cert and tls_key together")
        host = host or _default_host()
        options = dict(master_options or {})
        tls_dir = None
        if tls and tls_cert is None:
            tls_dir, tls_cert, tls_key = tls_files.self_signed(host)
        if tls_cert is not None:
            options.update(tls_cert=os.fspath(tls_cert), tls_key=os.fspath(tls_key))
        try:
            self._master = LocalCluster(
                workers=0, listen=listen, master_options=options, data_dir=data_dir
            )
        except BaseException:
            if tls_dir is not None:
                shutil.rmtree(tls_dir, ignore_errors=True)
            raise
        try:
            own_dir = job_dir is None
            if job_dir is None:
                base = os.path.join(os.path.expanduser("~"), ".rtpool", "slurm")
                os.makedirs(base, mode=0o700, exist_ok=True)
                job_dir = tempfile.mkdtemp(prefix="cluster-", dir=base)  # mode 0700
            job_dir = os.path.abspath(os.fspath(job_dir))
            os.makedirs(job_dir, mode=0o700, exist_ok=True)
            token_file = os.path.join(job_dir, "worker.token")
            jobs.write_private(token_file, self._master.worker_token)
            worker_ca = None
            if tls_cert is not None:
                worker_ca = tls_files.worker_ca_file(os.fspath(ca_file or tls_cert), job_dir)
            port = self._master.address.rpartition(":")[2]
            args = ["--reconnect-timeout", str(reconnect_timeout_s)]
            if prefetch is not None:
                args += ["--prefetch", str(prefetch)]
            spec = jobs.JobSpec(
                master=f"{host}:{port}",
                token_file=token_file,
                job_dir=job_dir,
                procs=procs,
                partition=partition,
                walltime=walltime,
                sbatch_args=sbatch_args,
                job_name=job_name,
                python=python,
                worker_args=args + list(worker_args),
                ca_file=worker_ca,
                gpus=gpus,
                mem_gb=mem_gb,
            )
            env = jobs.worker_env(sys.path)
            if mode == "srun":
                script = jobs.write_script(spec, step=True)
                backend: Any = steps.Steps(spec, str(allocation), script, env, srun_args)
            else:
                backend = jobs.Batch(spec, jobs.write_script(spec), env)
            self._pool = _Pool(spec, backend)
        except BaseException:
            self._master.close()
            if tls_dir is not None:
                shutil.rmtree(tls_dir, ignore_errors=True)
            raise
        self._job_dir = job_dir
        self._mode = mode
        self._finalizer = weakref.finalize(
            self, _shutdown, self._pool, self._master, job_dir, own_dir, tls_dir
        )
        if workers:
            try:
                self.scale(workers)
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if not self._finalizer.alive else f"{len(self._pool.jobs)} jobs"
        return f"<rtpool.SlurmCluster {self.worker_address} {state}>"

    @property
    def address(self) -> str:
        """Where this machine's clients connect (``host:port``)."""
        return self._master.address

    @property
    def worker_address(self) -> str:
        """Where the jobs' workers connect (``host:port``)."""
        return self._pool.spec.master

    @property
    def job_dir(self) -> str:
        """The job script, the token file and the jobs' ``slurm-<jobid>.out``."""
        return self._job_dir

    @property
    def job_ids(self) -> List[str]:
        """Ids of the jobs this cluster submitted that have not left ``squeue`` yet (as last
        seen; :meth:`jobs` asks Slurm). With ``mode="srun"``, the steps' ``jobid.stepid``
        (a step not started yet: the ``--job-name`` it was given)."""
        return [self._pool.backend.name(j) for j in self._pool.jobs]

    def jobs(self) -> Dict[str, str]:
        """Each tracked job's Slurm state (``PENDING``, ``RUNNING``, ...), from ``squeue``."""
        with self._pool.lock:
            states = self._pool.refresh()
        return {self._pool.backend.name(j): state for j, state in states.items()}

    def client(self, **kwargs: Any) -> Client:
        """Connect a :class:`~rtpool.Client` to the master; closed with the cluster."""
        self._check_open()
        return self._master.client(**kwargs)

    def stats(self) -> Dict[str, Any]:
        """The master's gauges and counters (``workers`` counts worker processes)."""
        return self._master.stats()

    def scale(self, n: int) -> None:
        """Have ``n`` worker jobs: submit the missing ones, or cancel the surplus (pending
        ones first, then the newest running ones, which drain: SIGTERM to a batch job's
        worker, SIGINT to a step's; their running tasks finish, prefetched ones go back to
        the master). Returns once submitted or
        signalled; :meth:`wait_for_workers` waits for them to serve. Stops :meth:`adapt`.

        Raises:
            RtpoolError: ``sbatch`` or ``scancel`` failed.
        """
        self._check_open()
        self._pool.stop_adapt()
        self._pool.scale(n)

    def adapt(
        self,
        minimum: int = 0,
        maximum: int = 8,
        *,
        interval_s: float = 1.0,
        cooldown_s: float = 10.0,
        target_s: float = 10.0,
        startup_s: float = 5.0,
    ) -> None:
        """Size the pool by the master's queue and its packages' deadlines, in a background
        thread: every ``interval_s``, the larger of

        - by queue: enough worker processes for the queued and running tasks to take about
          ``target_s`` seconds (at most one per task; one per task while no task time is
          known yet),
        - by deadlines: for each deadline (earliest first), the work of the packages due by
          then divided by the time left after ``startup_s`` (a new job's time to serve),

        in jobs of ``procs`` processes, within ``[minimum, maximum]``; up at once, down
        (gracefully, as :meth:`scale`) once fewer have sufficed for ``cooldown_s``. The task
        time is the master's per-worker execution time when it serves a status snapshot, else
        Little's law on ``stats()`` (tasks running / completion rate over 30 s). Runs until
        :meth:`scale`, another ``adapt`` or :meth:`close`. See ``docs/slurm.md``, "adapt"."""
        self._check_open()
        if not 0 <= minimum <= maximum:
            raise ValueError("adapt needs 0 <= minimum <= maximum")
        if not (target_s > 0 and startup_s >= 0 and interval_s > 0 and cooldown_s >= 0):
            raise ValueError(
                "adapt needs target_s > 0, interval_s > 0, startup_s >= 0 and cooldown_s >= 0"
            )
        self._pool.stop_adapt()
        stop = threading.Event()
        thread = threading.Thread(
            target=adapt.adapt_loop,
            args=(self._pool, _poller(self._master, self._pool.spec.offer()), stop),
            kwargs=dict(
                minimum=minimum,
                maximum=maximum,
                interval_s=interval_s,
                cooldown_s=cooldown_s,
                rule=dict(target_s=target_s, startup_s=startup_s),
            ),
            name="rtpool-slurm-adapt",
            daemon=True,
        )
        self._pool.adapt_stop, self._pool.adapt_thread = stop, thread
        thread.start()

    def wait_for_workers(self, n: int | None = None, timeout: float = 60.0) -> None:
        """Wait until ``n`` jobs' workers (``n * procs`` processes) are connected to the
        master; by default those of every pending or running job.

        Raises:
            TimeoutError: Fewer connected in time (the message names the jobs' states and
                their log directory).
        """
        if n is None:
            n = len(self._pool.live())
        want = n * self._pool.spec.procs
        end = time.monotonic() + timeout
        while int(self.stats().get("workers", 0)) < want:
            if time.monotonic() >= end:
                got = int(self.stats().get("workers", 0))
                raise TimeoutError(
                    f"{got} of {want} worker processes ({n} jobs x {self._pool.spec.procs}) "
                    f"connected within {timeout:g} s; jobs: {self.jobs() or 'none in squeue'}; "
                    f"job logs in {self._job_dir}"
                )
            time.sleep(0.05)

    def close(self) -> None:
        """Cancel every job this cluster started, close the clients and the master, remove
        the token file (and ``job_dir`` when it was made here). Idempotent; also runs at
        interpreter exit (so after an uncaught Ctrl-C too)."""
        self._finalizer()

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("the SlurmCluster is closed")
