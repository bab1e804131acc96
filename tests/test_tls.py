"""TLS end to end: a master started with ``--tls-self-signed``, clients and workers that trust
its certificate, and the errors of a peer of the wrong kind."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import rtpool
from conftest import MasterProcess, _read_listening_line
from helpers import stop_process, worker_env
from rtpool.errors import ConnectError, ProtocolError


class TlsMaster(MasterProcess):
    """A master subprocess serving TLS with a self-signed certificate."""

    cert: Path


@pytest.fixture
def tls_master(tmp_path: Path) -> Iterator[TlsMaster]:
    # Not the `master` fixture's data dir: some tests use both (one master per data dir).
    data_dir = tmp_path / "tls-data"
    log = tmp_path / "tls-master.log"
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(data_dir), "--tls-self-signed", "--log-level", "debug"]
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL
        )
    try:
        address = _read_listening_line(proc, log, timeout=30.0)
        m = TlsMaster(
            proc=proc,
            address=address,
            client_token=(data_dir / "client.token").read_text().strip(),
            worker_token=(data_dir / "worker.token").read_text().strip(),
            data_dir=data_dir,
            log=log,
        )
        m.cert = data_dir / "tls" / "cert.pem"
        yield m
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _start_worker(m: MasterProcess, tmp_path: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address, *extra]
    with open(tmp_path / "worker.log", "wb") as log:
        return subprocess.Popen(
            cmd,
            env=worker_env(m.worker_token),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def test_self_signed_files_are_written_with_a_private_key(tls_master: TlsMaster) -> None:
    key = tls_master.data_dir / "tls" / "key.pem"
    assert tls_master.cert.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


def test_round_trip_over_tls_with_the_self_signed_certificate(
    tls_master: TlsMaster, tmp_path: Path
) -> None:
    import tasks

    worker = _start_worker(tls_master, tmp_path, "--ca-file", str(tls_master.cert))
    try:
        with rtpool.Client(
            tls_master.address, tls_master.client_token, tls=True, ca_file=str(tls_master.cert)
        ) as client:
            assert list(client.map(tasks.square, range(20), timeout=60)) == [
                x * x for x in range(20)
            ]
    finally:
        stop_process(worker, group=True)
    assert "connected" in tls_master.log_text()


def test_a_ready_ssl_context_is_used_as_given(tls_master: TlsMaster) -> None:
    context = ssl.create_default_context(cafile=str(tls_master.cert))
    with rtpool.Client(tls_master.address, tls_master.client_token, tls=context) as client:
        assert client.session > 0
    with pytest.raises(ValueError, match="not both"):
        rtpool.Client(tls_master.address, tls_master.client_token, tls=context, ca_file="x")


def test_the_system_trust_store_does_not_trust_a_self_signed_master(
    tls_master: TlsMaster,
) -> None:
    with pytest.raises(ConnectError, match="not trusted.*ca_file"):
        rtpool.Client(tls_master.address, tls_master.client_token, tls=True)


def test_a_plain_client_of_a_tls_master_is_told_to_use_tls(tls_master: TlsMaster) -> None:
    started = time.monotonic()
    with pytest.raises(ProtocolError, match="requires TLS"):
        rtpool.Client(tls_master.address, tls_master.client_token, connect_timeout=5)
    assert time.monotonic() - started < 4


def test_a_tls_client_of_a_plain_master_fails_fast(
    master: MasterProcess, tls_master: TlsMaster
) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectError, match="TLS"):
        rtpool.Client(
            master.address, master.client_token, ca_file=str(tls_master.cert), connect_timeout=5
        )
    assert time.monotonic() - started < 4


def test_a_tls_worker_of_a_plain_master_exits_with_a_config_error(
    master: MasterProcess, tls_master: TlsMaster, tmp_path: Path
) -> None:
    worker = _start_worker(master, tmp_path, "--ca-file", str(tls_master.cert))
    try:
        worker.wait(30)
    finally:
        stop_process(worker, group=True)
    assert "TLS handshake" in (tmp_path / "worker.log").read_text()


def test_local_cluster_with_tls() -> None:
    import tasks

    with rtpool.LocalCluster(workers=1, tls=True) as cluster:
        client = cluster.client()
        assert client.submit(tasks.square, 7).result(timeout=60) == 49


def test_tls_checks_each_record_against_the_configured_name(
    tls_master: TlsMaster, monkeypatch
) -> None:
    """A name with two records (a dead 127.0.0.2, then the master's 127.0.0.1) is dialled
    record by record, and the certificate (for localhost and 127.0.0.1) is checked against the
    name: ``localhost`` passes, ``other.test`` does not, though its record is 127.0.0.1."""
    import socket

    port = int(tls_master.address.rsplit(":", 1)[1])
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if host in ("localhost", "other.test"):
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                for ip in ("127.0.0.2", "127.0.0.1")
            ]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    ca = str(tls_master.cert)
    with rtpool.Client(f"localhost:{port}", tls_master.client_token, ca_file=ca) as client:
        assert client.address == f"localhost:{port} (127.0.0.1)"
    with pytest.raises(ConnectError, match=r"other\.test:\d+ \(127\.0\.0\.1\) is not trusted"):
        rtpool.Client(f"other.test:{port}", tls_master.client_token, ca_file=ca)
