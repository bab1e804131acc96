"""``SlurmCluster``: a master in this process, workers as Slurm batch jobs.

The master is a ``LocalCluster``'s (embedded, no local workers) listening on an address the
nodes can reach; each worker is one ``sbatch`` job running ``rtpool worker --procs K`` (the job
script and the ``sbatch``/``squeue``/``scancel`` calls are in ``_slurm_jobs.py``). Job ids are
tracked here, and every job this object started is cancelled by ``close()``, at interpreter
exit and after Ctrl-C. ``adapt()`` runs a thread that sizes the pool by the master's queue.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Dict, List, Sequence

from . import _slurm_jobs as jobs
from .client import Client
from .cluster import LocalCluster

__all__ = ["SlurmCluster"]


class _Pool:
    """The worker jobs, kept apart from ``SlurmCluster`` so neither the finalizer nor the
    adapt thread keeps the cluster alive."""

    def __init__(self, spec: jobs.JobSpec, script: str, env: Dict[str, str]) -> None:
        self.spec = spec
        self.script = script
        self.env = env
        self.lock = threading.Lock()
        self.jobs: List[str] = []  # submission order
        self.draining: set = set()  # sent SIGTERM; still in squeue until they exit
        self.adapt_stop: threading.Event | None = None
        self.adapt_thread: threading.Thread | None = None

    def refresh(self) -> Dict[str, str]:
        """Forget jobs that left ``squeue``; the states of the others."""
        states = jobs.job_states(self.jobs)
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
                self.jobs.append(jobs.submit(self.spec, self.script, self.env))
            if n >= len(live):
                return
            # Pending jobs first (nothing to drain), then the newest running ones.
            victims = sorted(live, key=lambda j: (states.get(j) != "PENDING", -int(j)))
            victims = victims[: len(live) - n]
            pending = [j for j in victims if states.get(j) == "PENDING"]
            running = [j for j in victims if j not in pending]
            jobs.cancel(pending)
            jobs.cancel(running, graceful=True)
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
        jobs.cancel(ids)


def _adapt_loop(pool: _Pool, master: LocalCluster, stop: threading.Event, **kw: Any) -> None:
    """Every ``interval_s``: want ``ceil((queued + running) / procs)`` jobs within bounds; scale
    up at once, down once the demand has stayed lower for ``cooldown_s``."""
    minimum, maximum = kw["minimum"], kw["maximum"]
    low_since: float | None = None
    while not stop.wait(kw["interval_s"]):
        try:
            stats = master.stats()
            demand = int(stats.get("queued", 0)) + int(stats.get("running", 0))
            want = min(maximum, max(minimum, math.ceil(demand / pool.spec.procs)))
            with pool.lock:
                have = len(pool.live())
            now = time.monotonic()
            if want > have:
                pool.scale(want)
                low_since = None
            elif want < have:
                low_since = now if low_since is None else low_since
                if now - low_since >= kw["cooldown_s"]:
                    pool.scale(want)
                    low_since = None
            else:
                low_since = None
        except Exception as exc:  # a Slurm hiccup must not end adaptation
            print(f"rtpool SlurmCluster.adapt: {exc}", file=sys.stderr, flush=True)


def _shutdown(pool: _Pool, master: LocalCluster, job_dir: str, own_dir: bool) -> None:
    try:
        pool.cancel_all()
    finally:
        master.close()
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

    Raises:
        RtpoolError: The master cannot start, or ``sbatch`` fails (its message included).
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
    ) -> None:
        self._master = LocalCluster(
            workers=0, listen=listen, master_options=master_options, data_dir=data_dir
        )
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
            port = self._master.address.rpartition(":")[2]
            args = ["--reconnect-timeout", str(reconnect_timeout_s)]
            if prefetch is not None:
                args += ["--prefetch", str(prefetch)]
            spec = jobs.JobSpec(
                master=f"{host or _default_host()}:{port}",
                token_file=token_file,
                job_dir=job_dir,
                procs=procs,
                partition=partition,
                walltime=walltime,
                sbatch_args=sbatch_args,
                job_name=job_name,
                python=python,
                worker_args=args + list(worker_args),
            )
            self._pool = _Pool(spec, jobs.write_script(spec), jobs.worker_env(sys.path))
        except BaseException:
            self._master.close()
            raise
        self._job_dir = job_dir
        self._finalizer = weakref.finalize(
            self, _shutdown, self._pool, self._master, job_dir, own_dir
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
        seen; :meth:`jobs` asks Slurm)."""
        return list(self._pool.jobs)

    def jobs(self) -> Dict[str, str]:
        """Each tracked job's Slurm state (``PENDING``, ``RUNNING``, ...), from ``squeue``."""
        with self._pool.lock:
            return self._pool.refresh()

    def client(self, **kwargs: Any) -> Client:
        """Connect a :class:`~rtpool.Client` to the master; closed with the cluster."""
        self._check_open()
        return self._master.client(**kwargs)

    def stats(self) -> Dict[str, Any]:
        """The master's gauges and counters (``workers`` counts worker processes)."""
        return self._master.stats()

    def scale(self, n: int) -> None:
        """Have ``n`` worker jobs: submit the missing ones, or cancel the surplus (pending
        ones first, then the newest running ones, which get SIGTERM and drain: their running
        tasks finish, prefetched ones go back to the master). Returns once submitted or
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
    ) -> None:
        """Size the pool by the master's queue in a background thread: every ``interval_s``,
        ``ceil((queued + running tasks) / procs)`` jobs, within ``[minimum, maximum]``; up at
        once, down (gracefully, as :meth:`scale`) once fewer have sufficed for ``cooldown_s``.
        Runs until :meth:`scale`, another ``adapt`` or :meth:`close`."""
        self._check_open()
        if not 0 <= minimum <= maximum:
            raise ValueError("adapt needs 0 <= minimum <= maximum")
        self._pool.stop_adapt()
        stop = threading.Event()
        thread = threading.Thread(
            target=_adapt_loop,
            args=(self._pool, self._master, stop),
            kwargs=dict(
                minimum=minimum, maximum=maximum, interval_s=interval_s, cooldown_s=cooldown_s
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
