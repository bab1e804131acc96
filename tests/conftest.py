"""Fixtures: a master subprocess, worker subprocesses against it, and a LocalCluster.

Processes are started with their output in ``tmp_path`` and stopped by PID (each worker leads
its own process group, so its forked children are stopped with it).
"""

from __future__ import annotations

import glob
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from helpers import stop_process, worker_env


@dataclass
class MasterProcess:
    """A running ``rtpool master`` subprocess."""

    proc: subprocess.Popen
    address: str
    client_token: str
    worker_token: str
    data_dir: Path
    log: Path
    #: What it printed up to its ``listening on`` line.
    stdout_lines: List[str] = field(default_factory=list)

    @property
    def dashboard_url(self) -> str | None:
        """The URL of its ``dashboard on URL`` line, if it printed one."""
        for line in self.stdout_lines:
            if line.startswith("dashboard on "):
                return line.split()[-1]
        return None

    @property
    def host_port(self):
        host, _, port = self.address.rpartition(":")
        return host, int(port)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _read_listening_line(
    proc: subprocess.Popen, log: Path, timeout: float, seen: List[str] | None = None
) -> str:
    # Raw reads of the pipe: a buffered readline() could hold the line select() waits for.
    fd = proc.stdout.fileno()
    end = time.monotonic() + timeout
    out = b""
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        out += chunk
        for line in out.decode(errors="replace").splitlines():
            if line.startswith("listening on "):
                if seen is not None:
                    seen.extend(out.decode(errors="replace").splitlines())
                return line.split()[-1]
    stop_process(proc)
    raise RuntimeError(
        f"master did not print 'listening on' within {timeout} s; stdout: {out!r}; "
        f"log: {log.read_text(errors='replace')[-2000:]!r}"
    )


def start_master(
    tmp_path: Path,
    data_dir: Path | None = None,
    listen: str = "127.0.0.1:0",
    args: List[str] | None = None,
    log_name: str = "master.log",
) -> MasterProcess:
    """Start an ``rtpool master`` subprocess and wait for its ``listening on`` line."""
    data_dir = data_dir or tmp_path / "data"
    log = tmp_path / log_name
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", listen]
    cmd += ["--data-dir", str(data_dir), "--log-level", "debug", *(args or [])]
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL
        )
    return attach_master(proc, data_dir, log)


def attach_master(proc: subprocess.Popen, data_dir: Path, log: Path) -> MasterProcess:
    """A started ``rtpool master`` process (stdout piped) once it prints ``listening on``,
    with the tokens of its data dir."""
    seen: List[str] = []
    address = _read_listening_line(proc, log, timeout=30.0, seen=seen)
    return MasterProcess(
        proc=proc,
        address=address,
        client_token=(data_dir / "client.token").read_text().strip(),
        worker_token=(data_dir / "worker.token").read_text().strip(),
        data_dir=data_dir,
        log=log,
        stdout_lines=seen,
    )


def close_master(m: MasterProcess) -> None:
    """Stop a master started by :func:`start_master` (by PID) and close its pipe."""
    stop_process(m.proc)
    if m.proc.stdout is not None:
        m.proc.stdout.close()


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    """An ``rtpool master`` subprocess on an ephemeral port with its data dir in tmp_path."""
    m = start_master(tmp_path)
    try:
        yield m
    finally:
        close_master(m)


@dataclass
class Workers:
    """Factory of ``rtpool worker`` subprocesses against the ``master`` fixture."""

    master: MasterProcess
    tmp_path: Path
    procs: List[subprocess.Popen] = field(default_factory=list)

    def start(
        self, procs: int = 1, *extra: str, token: str = "", env: dict | None = None
    ) -> subprocess.Popen:
        n = len(self.procs)
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", self.master.address]
        cmd += ["--procs", str(procs), "--name", f"test-worker-{n}", *extra]
        with open(self.tmp_path / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen(
                cmd,
                env={**worker_env(token or self.master.worker_token), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def log_text(self, index: int) -> str:
        return (self.tmp_path / f"worker-{index}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            stop_process(proc, group=True)


@pytest.fixture
def workers(master: MasterProcess, tmp_path: Path) -> Iterator[Workers]:
    """Start worker subprocesses with ``workers.start(procs=1)``; all are stopped by PID."""
    factory = Workers(master, tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def client_factory(master: MasterProcess) -> Iterator[Callable[..., object]]:
    """Connect Clients to the ``master`` fixture; all are closed at the end."""
    import rtpool

    clients = []

    def make(**kwargs):
        client = rtpool.Client(master.address, master.client_token, **kwargs)
        clients.append(client)
        return client

    try:
        yield make
    finally:
        for client in clients:
            client.close()


@pytest.fixture
def cluster() -> Iterator[object]:
    """A LocalCluster with 2 workers."""
    import rtpool

    with rtpool.LocalCluster(workers=2) as c:
        yield c


@pytest.fixture
def cluster_client(cluster):
    """A Client of the ``cluster`` fixture."""
    return cluster.client()


_PG_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pg-test-server"


def _cluster_workers(module) -> int:
    return getattr(module, "CLUSTER_WORKERS", 2)


@pytest.fixture(scope="module")
def shared_cluster(request) -> Iterator[object]:
    """A LocalCluster for the whole module that asks for it (a killed worker child is
    restarted by its parent); tests take a ``client`` of it. The module may set
    ``CLUSTER_WORKERS`` (default 2) and ``CLUSTER_SERVE``, the modules its workers serve."""
    import rtpool

    workers = _cluster_workers(request.module)
    serve = list(getattr(request.module, "CLUSTER_SERVE", ()))
    with rtpool.LocalCluster(workers=workers, serve=serve) as c:
        yield c


@pytest.fixture
def client(shared_cluster, request) -> Iterator[object]:
    """A Client of the module's ``shared_cluster`` once all its workers are there, closed
    after the test (a module with a ``client`` fixture of its own uses that one)."""
    shared_cluster.wait_for_workers(_cluster_workers(request.module), timeout=30)
    c = shared_cluster.client()
    yield c
    c.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a PostgreSQL test database: ``$RTPOOL_TEST_PG_URL`` (``make test`` sets it), else
    a server started with scripts/pg-test-server when PostgreSQL is installed, else a skip."""
    url = os.environ.get("RTPOOL_TEST_PG_URL")
    if url:
        yield url
        return
    if shutil.which("initdb") is None and not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        pytest.skip("PostgreSQL is not installed: set RTPOOL_TEST_PG_URL or run `make test`")
    # Under /tmp, not tmp_path: as root the server runs as `postgres`, which must reach it.
    pg_dir = tempfile.mkdtemp(prefix="rtpool-pg-")
    started = subprocess.run(
        [str(_PG_SCRIPT), "start", pg_dir], capture_output=True, text=True, timeout=120
    )
    try:
        if started.returncode != 0:
            pytest.skip(f"cannot start a PostgreSQL test server: {started.stderr[-1000:]}")
        yield started.stdout.strip()
    finally:
        if started.returncode == 0:
            subprocess.run([str(_PG_SCRIPT), "stop", pg_dir], capture_output=True, timeout=60)
        shutil.rmtree(pg_dir, ignore_errors=True)


def pytest_configure(config) -> None:
    # Workers import task functions from this directory as the module ``tasks``.
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)


def pytest_collection_modifyitems(config, items) -> None:
    # `slow` tests are opt-in: they run only when selected, e.g. `pytest -m slow`.
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow test: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def raw_client(real_master):
    """A hand-written protocol client (``test_worker_supervisor.RawClient``) of the module's
    ``real_master`` (a ``_native.Master``), closed after the test."""
    from test_worker_supervisor import RawClient

    client = RawClient(real_master.address, real_master.client_token)
    try:
        yield client
    finally:
        client.close()
