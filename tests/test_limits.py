"""Connection limits seen from the Python SDK (the master's own tests cover the rest:
crates/rtpool-master/tests/limits.rs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import rtpool
from conftest import MasterProcess, _read_listening_line
from helpers import stop_process
from rtpool.errors import MasterBusy


@pytest.fixture
def small_master(tmp_path: Path) -> Iterator[MasterProcess]:
    data_dir = tmp_path / "data"
    log = tmp_path / "master.log"
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(data_dir), "--max-connections", "1"]
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL
        )
    try:
        yield MasterProcess(
            proc=proc,
            address=_read_listening_line(proc, log, timeout=30.0),
            client_token=(data_dir / "client.token").read_text().strip(),
            worker_token=(data_dir / "worker.token").read_text().strip(),
            data_dir=data_dir,
            log=log,
        )
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_client_beyond_the_connection_limit_is_refused_as_busy(
    small_master: MasterProcess, monkeypatch
) -> None:
    # The client retries `busy` with backoff (60 s by default), then says why it gave up.
    monkeypatch.setattr("rtpool._dial.BUSY_TIMEOUT_S", 1.5)
    with rtpool.Client(small_master.address, small_master.client_token):
        with pytest.raises(
            MasterBusy, match=r"busy.*--max-connections.*gave up after \d+ attempts"
        ):
            rtpool.Client(small_master.address, small_master.client_token, connect_timeout=5)


def test_master_help_documents_the_limits() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rtpool", "master", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag in (
        "--tls-cert",
        "--tls-key",
        "--tls-self-signed",
        "--max-connections",
        "--max-buffered-mb",
        "--lease-ms",
        "--client-timeout-ms",
    ):
        assert flag in out
