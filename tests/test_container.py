"""The rtpool container image, built and run for real with podman (issue 28 item 7): the image
of deploy/container/Containerfile.prebuilt (the Dockerfile's runtime on a Debian base made with
debootstrap, the wheel made here; scripts/container-test-image) runs the master as its
non-root user, serves workers and clients on the host, stops gracefully on SIGTERM, and keeps
its journal in the volume: a package accepted before a restart of the container completes
after it. Root only (podman, runc and debootstrap come from Debian's packages when missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

import rtpool
from conftest import MasterProcess, attach_master
from helpers import stop_process, wait_until, worker_processes

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "container-test-image"
UID = 10001  # the image's user (USER in the Dockerfile and Containerfile.prebuilt)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("apt-get") is None and shutil.which("podman") is None,
    reason="building the image needs root (podman with runc) and podman or apt-get to get it",
)


def _script(command: str, timeout: float) -> str:
    env = {**os.environ, "PYTHON": sys.executable}
    maturin = Path(sys.executable).parent / "maturin"
    if maturin.exists():
        env["MATURIN"] = str(maturin)
    out = subprocess.run(
        [str(SCRIPT), command], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert out.returncode == 0, f"{SCRIPT.name} {command} failed:\n{out.stderr[-3000:]}"
    return out.stdout.strip()


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The image name, built from this checkout (the base image is made once per machine)."""
    os.environ["CONTAINERS_CONF"] = _script("conf", 30)
    yield _script("build", 1500)


def podman(*args: str, timeout: float = 60, check: bool = True) -> str:
    out = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert out.returncode == 0, f"podman {' '.join(args)}: {out.stderr[-2000:]}"
    return out.stdout.strip()


class Container:
    """One ``podman run`` of the image's master, attached (its stdout is the master's)."""

    def __init__(self, image: str, data: Path, name: str, log: Path, listen: str) -> None:
        self.name = name
        cmd = ["podman", "run", "--rm", "--name", name, "--network=host"]
        cmd += ["-v", f"{data}:/var/lib/rtpool", image]
        cmd += ["master", "--listen", listen, "--data-dir", "/var/lib/rtpool"]
        with open(log, "ab") as log_file:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL
            )
        self.master: MasterProcess = attach_master(self.proc, data, log)

    def stop(self) -> int:
        """SIGTERM to the master (PID 1 of the container), then its exit status."""
        podman("stop", "-t", "20", self.name, timeout=60)
        return self.proc.wait(30)

    def kill(self) -> None:
        podman("rm", "-f", self.name, timeout=60, check=False)
        stop_process(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The volume: a host directory owned by the image's user, as the Dockerfile's is."""
    d = tmp_path / "volume"
    d.mkdir(mode=0o700)
    os.chown(d, UID, UID)
    return d


@pytest.fixture
def containers(image: str, tmp_path: Path) -> Iterator[List[Container]]:
    started: List[Container] = []
    yield started
    for c in started:
        c.kill()


def _run(image, data_dir, tmp_path, containers, listen="127.0.0.1:0") -> Container:
    name = f"rtpool-test-{os.getpid()}-{len(containers)}"
    c = Container(image, data_dir, name, tmp_path / f"master-{len(containers)}.log", listen)
    containers.append(c)
    return c


def test_the_image_runs_the_master_as_its_user_and_serves_host_workers(
    image, data_dir, tmp_path, containers
):
    c = _run(image, data_dir, tmp_path, containers)
    # The master inside is PID 1, running as the image's user, and its files are that user's.
    assert podman("exec", c.name, "id", "-u") == str(UID)
    assert podman("exec", c.name, "cat", "/proc/1/comm") == "rtpool"
    assert (data_dir / "client.token").stat().st_uid == UID
    with worker_processes(c.master, tmp_path) as start:
        start()
        with rtpool.Client(c.master.address, c.master.client_token) as client:
            wait_until(lambda: len(client.status()["workers"]) == 1, timeout=60)
            assert list(client.map(pow, range(20), [3] * 20, timeout=60)) == [
                n**3 for n in range(20)
            ]
    # SIGTERM (podman stop) is a graceful stop of PID 1: exit status 0, not podman's kill.
    assert c.stop() == 0
    assert "stopping" in c.master.log_text() or "shut" in c.master.log_text().lower()


def test_a_package_accepted_before_a_container_restart_completes_after_it(
    image, data_dir, tmp_path, containers
):
    first = _run(image, data_dir, tmp_path, containers)
    listen = first.master.address  # the second run takes the same port: clients reconnect
    client = rtpool.Client(listen, first.master.client_token, reconnect_timeout=120)
    try:
        # No worker yet: the package is accepted (journaled in the volume) and waits.
        futures = [client.submit(pow, n, 2) for n in range(10)]
        wait_until(lambda: client.status()["totals"]["queued"] >= 10, timeout=30)
        assert first.stop() == 0
        second = _run(image, data_dir, tmp_path, containers, listen=listen)
        assert second.master.worker_token == first.master.worker_token
        with worker_processes(second.master, tmp_path) as start:
            start()
            assert [f.result(timeout=120) for f in futures] == [n * n for n in range(10)]
    finally:
        client.close()
