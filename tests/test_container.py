"""The rtpool container image, built and run for real with podman (issue 28 item 7): the image
of deploy/container/Containerfile.prebuilt (the Dockerfile's runtime on a Debian base made with
debootstrap, the wheel made here; scripts/container-test-image) runs the master as its
non-root user, serves workers and clients on the host, stops gracefully on SIGTERM, and keeps
its journal in the volume: a package accepted before a restart of the container completes
after it; and an HA pair made from the deployment files (the systemd drop-in's command line on
the host, the Kubernetes overlay's args in the image) on one PostgreSQL fails over to the
master in the image when the host's is killed. Root only (podman, runc and debootstrap come
from Debian's packages when missing)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest
import yaml

import rtpool
import tasks
from conftest import MasterProcess, attach_master
from helpers import stop_process, wait_until, worker_processes

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "container-test-image"
UID = 10001  # the image's user (USER in the Dockerfile and Containerfile.prebuilt)

# The image is built in the first test's setup: debootstrap, maturin and podman take minutes.
pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("apt-get") is None and shutil.which("podman") is None,
        reason="building the image needs root (podman with runc) and podman or apt-get to get it",
    ),
]


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


# --- HA: the deployment files' command lines, one master in the image --------------------


def _drop_in_command(rtpool: str, listen: str, http: str, data: Path) -> List[str]:
    """The ExecStart of deploy/systemd/rtpool-master-ha.conf, as systemd would run it here."""
    text = (ROOT / "deploy" / "systemd" / "rtpool-master-ha.conf").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=/")]
    argv = shlex.split(line.split("=", 1)[1].replace("${RTPOOL_ADVERTISE}", listen))
    swap = {"/usr/local/bin/rtpool": rtpool, "0.0.0.0:7070": listen, "0.0.0.0:7071": http}
    return [swap.get(a, str(data) if a == "/var/lib/rtpool" else a) for a in argv]


def _overlay_args(listen: str, http: str) -> List[str]:
    """The master args of deploy/kubernetes-ha's patch, with this pod's address."""
    patch = yaml.safe_load((ROOT / "deploy" / "kubernetes-ha" / "master-ha-patch.yaml").read_text())
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    pod = "$(POD_NAME).rtpool-master-pods.$(POD_NAMESPACE).svc:7070"
    swap = {pod: listen, "0.0.0.0:7070": listen, "0.0.0.0:7071": http}
    return [swap.get(a, a) for a in c["args"]]


def _http_json(http: str, path: str, token: str) -> dict:
    req = urllib.request.Request(
        f"http://{http}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def test_an_ha_pair_from_the_deploy_files_fails_over_to_the_master_in_the_image(
    image, pg_url, data_dir, tmp_path
):
    from rtpool_bench.ha_cluster import free_port, fresh_database, wait_leader, wait_ready

    db = fresh_database(pg_url, f"rtpool_test_container_ha_{os.getpid()}")
    token = "h" * 40
    env_file = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "systemd" / "master-ha.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    # Master A: the systemd drop-in's command line, a host process with its env file's names.
    a_listen, a_http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    a_data = tmp_path / "a"
    rtpool_bin = str(Path(sys.executable).parent / "rtpool")
    env = {**os.environ, **env_file, "RTPOOL_HA": db, "RTPOOL_ADVERTISE": a_listen}
    env["RTPOOL_HTTP_TOKEN"] = token
    with open(tmp_path / "a.log", "ab") as log:
        a_proc = subprocess.Popen(
            _drop_in_command(rtpool_bin, a_listen, a_http, a_data),
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    b = None
    try:
        a = attach_master(a_proc, a_data, tmp_path / "a.log")
        wait_leader(a_http, 30)
        # Master B: the Kubernetes overlay's args, in the image, the tokens copied as the
        # docs say (the overlay's init container does it from the Secret).
        for name in ("client.token", "worker.token"):
            shutil.copy2(a_data / name, data_dir / name)
            os.chown(data_dir / name, UID, UID)
        b_listen, b_http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        name = f"rtpool-test-ha-{os.getpid()}"
        cmd = ["podman", "run", "--rm", "--name", name, "--network=host"]
        cmd += ["-e", f"RTPOOL_HA={db}", "-e", f"RTPOOL_HTTP_TOKEN={token}"]
        cmd += ["-v", f"{data_dir}:/var/lib/rtpool", image, *_overlay_args(b_listen, b_http)]
        with open(tmp_path / "b.log", "ab") as log:
            b_proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        b = (name, b_proc)
        wait_ready(b_http, 60)
        sb = _http_json(b_http, "/api/status", token)["ha"]
        assert sb["role"] == "standby" and sb["leader"] == a_listen, sb
        epoch = sb["epoch"]
        addresses = f"{a_listen},{b_listen}"
        with worker_processes(a, tmp_path) as start:
            # The worker and the client are given both masters (the Service's two pods).
            a.address = addresses
            start()
            with rtpool.Client(addresses, a.client_token, reconnect_timeout=120) as client:
                wait_until(lambda: len(client.status()["workers"]) == 1, timeout=60)
                assert client.submit(pow, 3, 4).result(timeout=60) == 81
                futures = [client.submit(tasks.sleep_return, n, 0.05) for n in range(40)]
                futures[0].result(timeout=60)
                a_proc.kill()  # the host's master dies under load: B, in the image, takes over
                a_proc.wait(10)
                wait_leader(b_http, 30)
                assert [f.result(timeout=120) for f in futures] == list(range(40))
                assert client.submit(pow, 2, 10).result(timeout=60) == 1024
        sb = _http_json(b_http, "/api/status", token)["ha"]
        assert sb["role"] == "leader" and sb["epoch"] > epoch and sb["leader"] == b_listen, sb
        assert podman("exec", name, "id", "-u") == str(UID)
    finally:
        stop_process(a_proc)
        if a_proc.stdout is not None:
            a_proc.stdout.close()
        if b is not None:
            podman("rm", "-f", b[0], timeout=60, check=False)
            stop_process(b[1])
