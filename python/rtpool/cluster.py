"""``LocalCluster``: a master and workers on this machine, for tests, demos and notebooks.

The master runs embedded in this process (``rtpool._native.Master``, background threads, an
ephemeral port, generated tokens); each worker is an ``rtpool worker`` subprocess in its own
process group. Nothing waits for the workers to start: tasks queue at the master until they
join, so the first result comes as soon as the first worker is up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any, Dict, List, Mapping, Sequence

from .async_client import AsyncClient
from .client import Client

__all__ = ["LocalCluster"]

_STOP_TIMEOUT_S = 5.0


class _State:
    """Everything ``close()`` must release, kept apart so the finalizer does not keep the
    cluster alive."""

    def __init__(self, master: Any) -> None:
        self.master = master
        self.workers: List[subprocess.Popen | None] = []
        self.clients: List[Client] = []
        # The self-signed certificate's directory (LocalCluster(tls=True)), removed last.
        self.tls_dir: tempfile.TemporaryDirectory | None = None


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    # Each worker leads its own process group: its forked children go with it.
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass


def _cpu_set(cpus: str | List[int] | None) -> List[int]:
    """The CPUs to spread real-time workers over: ``cpus`` (as ``LocalCluster`` takes it),
    else the ones this process may use; [] where affinity is unknown."""
    if cpus is not None:
        from ._realtime import parse_cpus

        return parse_cpus(cpus) if isinstance(cpus, str) else sorted(set(cpus))
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def _stop_workers(procs: List[subprocess.Popen], graceful: bool, timeout: float) -> None:
    live = [p for p in procs if p.poll() is None]
    try:
        for proc in live:
            if graceful:
                proc.send_signal(signal.SIGTERM)
            else:
                _kill_group(proc, signal.SIGKILL)
        end = time.monotonic() + timeout
        for proc in live:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        # Stragglers (a task that does not finish, or an interrupted wait) and whatever a
        # stopped worker left in its process group.
        for proc in procs:
            _kill_group(proc, signal.SIGKILL)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass


def _shutdown(state: _State) -> None:
    try:
        for client in state.clients:
            try:
                client.close()
            except Exception:
                pass
        state.clients.clear()
        procs = [p for p in state.workers if p is not None]
        _stop_workers(procs, graceful=True, timeout=_STOP_TIMEOUT_S)
    finally:
        state.master.stop()
        if state.tls_dir is not None:
            state.tls_dir.cleanup()


class LocalCluster:
    """A master and ``workers`` worker processes on this machine.

    Example::

        with rtpool.LocalCluster(workers=2) as cluster:
            client = cluster.client()
            print(client.submit(pow, 2, 10).result())

    Worker processes get this process's ``sys.path`` as ``PYTHONPATH`` (so functions this
    process can import, the workers can too) and die with it (PR_SET_PDEATHSIG on Linux).

    Args:
        workers: Worker processes to start (each ``rtpool worker --procs 1``).
        prefetch: ``--prefetch`` of the workers (the bound of their adaptive prefetch).
        tls: Serve TLS with a self-signed certificate (in a temporary data dir); its clients
            and workers trust that certificate.
        task_memory_mb: ``--task-memory-mb`` of the workers: every task runs in a killable
            executor process whose address space is limited to this many MiB (None: no limit).
        data_dir: The master's data dir (tokens, journal, user store); None (default): nothing
            on disk, no journal.
        master_options: Reliability options of the master, as ``rtpool master`` takes them:
            ``lease_ms``, ``result_ttl_s``, ``max_attempts``, ``max_task_seconds``,
            ``timeout_grace_s``, ``service_grace_s``, ``fsync`` (``"always"``, ``"batch:10"``,
            ``"off"``), ``journal`` (False: none), ``store``.
        worker_env: Extra environment variables per worker: ``worker_env[i]`` is added to
            the environment of worker ``i`` (a list shorter than ``workers`` leaves the rest
            alone). Tests use it to make one worker different, e.g. ``worker_env=[{"SLOW":
            "10"}, {}]``; see also ``add_worker(env=...)``.
        realtime: Real-time mode for the whole path: the master, the workers (``rtpool
            worker --realtime``) and the clients of :meth:`client` (``Client(realtime=True)``:
            their reader and heartbeat threads): memory locked, SCHED_FIFO, optional pinning,
            each as far as the OS permits. ``stats()["realtime"]`` says what took effect for
            the master, and under ``"clients"`` for each client. The master is embedded: its
            memory lock covers this whole process until ``close()``. The application's own
            threads are left alone: see :meth:`~rtpool.Client.realtime_thread`.
        rt_priority: SCHED_FIFO priority of the workers, 1-99 (default 50). The master's
            threads and the clients' I/O threads run one above (at most 99), so that they
            preempt a task a worker runs on the same CPU rather than wait for its end.
        rt_budget_ms: ``--rt-budget-ms`` of the workers: CPU time a worker may spend under
            SCHED_FIFO without waiting for work before it is demoted until its next wait
            (None: the workers' default, 100 ms; 0: no budget). Tasks longer than it (a
            chess search of a second) run demoted past it, behind normal processes.
        cpus: CPUs to pin the master's threads and the workers to (a list of ints or
            ``"0,1"``); None: the master is not pinned (and the workers only as
            ``pin_workers`` says).
        pin_workers: In real-time mode, pin worker ``i`` to the ``i``-th CPU of ``cpus``
            (None: of the CPUs this process may use), one CPU per worker; a worker beyond
            the number of CPUs gets the whole set. Unpinned ``SCHED_FIFO`` workers pile up
            on one CPU at times, and a CPU whose real-time threads pass the kernel's 95 %
            per second (``sched_rt_runtime_us``) has them all stopped for the rest of that
            second: 50-100 ms stalls once a second at 80 % load (``docs/realtime.md``).
            False: every worker on the whole of ``cpus`` (or unpinned).
        serve: Modules whose ``@rtpool.remote`` functions every worker serves (``rtpool
            worker --serve MODULE`` for each), e.g. ``serve=["mypkg.linalg"]``; see
            ``docs/rpc.md``. A module a worker cannot load makes that worker exit at start
            (its log names the module).
        listen: The master's address; port 0 picks a free one. A wildcard (``0.0.0.0:0``)
            lets other machines' workers in (``SlurmCluster``); this process's clients and
            workers still connect over loopback.
        http: The master's HTTP listener (dashboard, Prometheus ``/metrics``,
            ``/api/status``, ``/api/events``; see ``docs/operations.md``): an address such as
            ``"127.0.0.1:0"`` (port 0 picks a free one; :attr:`dashboard_url` tells which) or
            None (default): no listener.

    Raises:
        RtpoolError: The embedded master cannot start.
        ValueError: ``worker_env`` has more entries than ``workers``.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        prefetch: int | None = None,
        tls: bool = False,
        task_memory_mb: int | None = None,
        data_dir: str | os.PathLike | None = None,
        master_options: Dict[str, Any] | None = None,
        worker_env: Sequence[Mapping[str, str]] | None = None,
        realtime: bool = False,
        rt_priority: int = 50,
        rt_budget_ms: int | None = None,
        cpus: str | List[int] | None = None,
        pin_workers: bool = True,
        serve: Sequence[str] = (),
        listen: str = "127.0.0.1:0",
        http: str | None = None,
    ) -> None:
        from . import _native

        if isinstance(serve, str):
            serve = [serve]  # one module, not its letters

        worker_env = list(worker_env or ())
        if len(worker_env) > workers:
            raise ValueError(
                f"worker_env has {len(worker_env)} entries for {workers} workers; give at most "
                "one per worker"
            )

        self._prefetch = prefetch
        self._serve_args = [arg for module in serve for arg in ("--serve", module)]
        self._probe: Client | None = None
        self._task_memory_mb = task_memory_mb
        self._realtime_args: List[str] = []
        self._worker_cpus: List[int] = []
        self._cpus_text: str | None = None
        self._client_rt: Dict[str, Any] = {}
        rt_args: Dict[str, Any] = {}
        if rt_budget_ms is not None and (not realtime or rt_budget_ms < 0):
            raise ValueError(
                f"rt_budget_ms={rt_budget_ms!r}: give milliseconds >= 0 (0: no budget), with "
                "realtime=True"
            )
        if realtime:
            # The I/O threads one above the workers: see rtpool/_realtime_client.py.
            io_priority = min(99, rt_priority + 1) if 1 <= rt_priority <= 99 else rt_priority
            rt_args = {"realtime": True, "rt_priority": io_priority, "cpus": cpus}
            self._client_rt = {"realtime": True, "rt_priority": io_priority}
            self._realtime_args = ["--realtime", "--rt-priority", str(rt_priority)]
            if rt_budget_ms is not None:
                self._realtime_args += ["--rt-budget-ms", str(rt_budget_ms)]
            if cpus is not None:
                self._cpus_text = cpus if isinstance(cpus, str) else ",".join(map(str, cpus))
            if pin_workers:
                self._worker_cpus = _cpu_set(cpus)
        tls_dir = tempfile.TemporaryDirectory(prefix="rtpool-cluster-") if tls else None
        tls_args: Dict[str, Any] = {}
        if tls_dir is not None:
            tls_args = {"data_dir": tls_dir.name, "tls_self_signed": True}
        if data_dir is not None:
            tls_args["data_dir"] = os.fspath(data_dir)
        options = dict(master_options or {})
        if http is not None:
            options["http"] = http
        try:
            self._master = _native.Master(listen=listen, options=options, **tls_args, **rt_args)
        except BaseException:
            if tls_dir is not None:
                tls_dir.cleanup()
            raise
        self._ca_file = None if self._master.tls_cert is None else str(self._master.tls_cert)
        self._state = _State(self._master)
        self._state.tls_dir = tls_dir
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        try:
            for i in range(workers):
                self.add_worker(env=worker_env[i] if i < len(worker_env) else None)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    async def __aenter__(self) -> LocalCluster:
        # The cluster started in __init__ (an in-process master, worker processes spawned,
        # nothing waited for): only stopping it waits, so only that leaves the loop.
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    async def async_client(self, **kwargs: Any) -> AsyncClient:
        """:meth:`client` for asyncio: a connected :class:`~rtpool.AsyncClient`, closed with
        the cluster (connecting runs in the loop's default executor)."""
        loop = asyncio.get_running_loop()
        return AsyncClient.from_client(
            await loop.run_in_executor(None, lambda: self.client(**kwargs))
        )

    async def wait_for_workers_async(self, n: int | None = None, timeout: float = 10.0) -> None:
        """:meth:`wait_for_workers` from the loop's default executor."""
        await asyncio.get_running_loop().run_in_executor(None, self.wait_for_workers, n, timeout)

    def __repr__(self) -> str:
        state = "closed" if not self._finalizer.alive else f"{len(self.worker_pids)} workers"
        return f"<rtpool.LocalCluster {self.address} {state}>"

    @property
    def address(self) -> str:
        """The master's ``host:port`` (a wildcard host is given as loopback: where this
        machine connects)."""
        host, _, port = self._master.address.rpartition(":")
        if host in ("0.0.0.0", "[::]", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
        return f"{host}:{port}"

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's URL (``http://127.0.0.1:PORT/``; ``https://`` with ``tls``), or
        None without ``http``. ``/metrics``, ``/api/status`` and ``/api/events`` are beside
        it."""
        return self._master.dashboard_url

    @property
    def client_token(self) -> str:
        """The token clients present."""
        return self._master.client_token

    @property
    def worker_token(self) -> str:
        """The token workers present."""
        return self._master.worker_token

    @property
    def worker_pids(self) -> List[int]:
        """PIDs of the worker processes still running, by index (stopped ones are left out)."""
        return [p.pid for p in self._state.workers if p is not None and p.poll() is None]

    def client(self, **kwargs: Any) -> Client:
        """Connect a :class:`~rtpool.Client` to this cluster; it is closed with the cluster.

        Args:
            **kwargs: Passed to :class:`~rtpool.Client` (``name``, ``connect_timeout``; in a
                real-time cluster ``realtime`` and ``rt_priority`` default to the cluster's).
        """
        self._check_open()
        if self._ca_file is not None:
            kwargs.setdefault("ca_file", self._ca_file)
        for key, value in self._client_rt.items():
            kwargs.setdefault(key, value)
        client = Client(self.address, self.client_token, **kwargs)
        self._state.clients.append(client)
        return client

    def add_worker(self, env: Mapping[str, str] | None = None) -> int:
        """Start one more worker process (it joins in the background).

        Args:
            env: Extra environment variables of this worker (on top of this process's).

        Returns:
            The worker's index, for :meth:`stop_worker`.
        """
        self._check_open()
        paths = [p or os.getcwd() for p in sys.path]
        proc_env = {**os.environ, **(env or {})}
        proc_env["RTPOOL_WORKER_TOKEN"] = self.worker_token
        proc_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", self.address]
        cmd += ["--procs", "1", "--parent-pid", str(os.getpid())]
        if self._prefetch is not None:
            cmd += ["--prefetch", str(self._prefetch)]
        if self._ca_file is not None:
            cmd += ["--ca-file", self._ca_file]
        if self._task_memory_mb is not None:
            cmd += ["--task-memory-mb", str(self._task_memory_mb)]
        cmd += self._realtime_args
        index = len(self._state.workers)
        if index < len(self._worker_cpus):
            cmd += ["--cpus", str(self._worker_cpus[index])]
        elif self._cpus_text is not None:
            cmd += ["--cpus", self._cpus_text]
        cmd += self._serve_args
        proc = subprocess.Popen(cmd, env=proc_env, stdin=subprocess.DEVNULL, start_new_session=True)
        self._state.workers.append(proc)
        return len(self._state.workers) - 1

    def stop_worker(self, index: int, graceful: bool = True, timeout: float = 10.0) -> int:
        """Stop worker ``index``: SIGTERM (graceful drain) or SIGKILL of its process group.

        Args:
            index: As returned by :meth:`add_worker` (the first ``workers`` are 0, 1, ...).
            graceful: SIGTERM and let it finish its running task, or kill it at once.
            timeout: Seconds to wait for a graceful stop before killing it.

        Returns:
            The worker process's exit code (negative: killed by that signal).
        """
        proc = self._state.workers[index]
        if proc is None:
            raise ValueError(f"worker {index} was already stopped")
        self._state.workers[index] = None
        _stop_workers([proc], graceful, timeout)
        return proc.returncode

    def wait_for_workers(self, n: int | None = None, timeout: float = 10.0) -> None:
        """Wait until the master counts at least ``n`` worker connections, and with
        ``serve``, until ``n`` workers serve every function (a call made before its function
        is served raises :class:`~rtpool.UnknownFunctionError`).

        Args:
            n: Workers to wait for; by default every worker process started.
            timeout: Seconds to wait.

        Raises:
            TimeoutError: Fewer than ``n`` workers connected (or served) in time.
        """
        if n is None:
            n = len(self.worker_pids)
        end = time.monotonic() + timeout
        while True:
            count = int(self.stats().get("workers", 0))
            serving = self._serving() if self._serve_args and count >= n else count
            if count >= n and serving >= n:
                return
            if time.monotonic() >= end:
                dead = [
                    f"pid {p.pid} exit {p.returncode}"
                    for p in self._state.workers
                    if p is not None and p.poll() is not None
                ]
                what = "connected to" if count < n else "serve their functions at"
                raise TimeoutError(
                    f"{min(count, serving)} of {n} workers {what} {self.address} within "
                    f"{timeout:g} s" + (f"; exited: {', '.join(dead)}" if dead else "")
                )
            time.sleep(0.01)

    def _serving(self) -> int:
        """The fewest servers of any function served (0 when none is)."""
        if self._probe is None:
            self._probe = self.client(name="LocalCluster.wait_for_workers")
        ifaces = self._probe.functions()
        return min((i.servers for i in ifaces), default=0)

    def stats(self) -> Dict[str, Any]:
        """The master's gauges and counters (``workers``, ``queued``, ``running``, ...; in
        real-time mode ``realtime``, a dict: see ``rtpool._native.Master.stats``, with
        ``clients``: :attr:`rtpool.Client.realtime` of each open client of :meth:`client`)."""
        stats = dict(self._master.stats())
        if isinstance(stats.get("realtime"), dict):
            stats["realtime"]["clients"] = [
                c.realtime for c in self._state.clients if c.realtime is not None and not c.closed
            ]
        return stats

    def close(self) -> None:
        """Close the clients, stop the workers (SIGTERM, then SIGKILL after 5 s) and the
        master. Idempotent."""
        self._finalizer()

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("the LocalCluster is closed")
