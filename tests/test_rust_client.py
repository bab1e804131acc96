"""The Rust client (crates/rtpool-client) against a real master and a Python worker serving
rtpool.lib.linalg: examples/rust/dmmul.rs calls dmmul (n = 100 and 1000) and linpack, and
its results are compared with numpy's; bad input gets a clear typed error."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rtpool
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "target" / "debug" / "examples" / "dmmul"


@pytest.fixture(scope="module")
def example() -> Path:
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not installed: the Rust client example cannot be built")
    subprocess.run(
        [cargo, "build", "-q", "-p", "rtpool-client", "--example", "dmmul"],
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return EXAMPLE


@pytest.fixture
def linalg_master(tmp_path):
    """A master (frame limit 20 MiB) and one worker process serving rtpool.lib.linalg."""
    m = start_master(tmp_path, args=["--http", "off", "--max-frame-mb", "20"])
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address, "--procs", "1"]
    cmd += ["--serve", "rtpool.lib.linalg"]
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(
            cmd,
            env=worker_env(m.worker_token),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    client = rtpool.Client(m.address, m.client_token)
    try:
        wait_until(lambda: any(i.name == "dmmul" for i in client.functions()), timeout=30)
        yield m
    finally:
        client.close()
        stop_process(worker, group=True)
        close_master(m)


def run_example(path: Path, address: str, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RTPOOL_TOKEN": token}
    return subprocess.run(
        [str(path), address, *args], env=env, capture_output=True, text=True, timeout=120
    )


def matrices(n: int):
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    a = ((i * 31 + j * 17) % 97) / 97.0 + np.eye(n) * n
    b = ((i * 13 + j * 7) % 89) / 89.0
    rhs = (np.arange(n) % 10) / 10.0 + 1.0
    return a, b, rhs


def test_rust_client_calls_dmmul_and_linpack_and_gets_numpys_answer(example, linalg_master):
    out = run_example(example, linalg_master.address, linalg_master.client_token, "100", "1000")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["fn"], r["n"]) for r in lines] == [
        ("dmmul", 100),
        ("linpack", 100),
        ("dmmul", 1000),
        ("linpack", 1000),
    ]
    for r in lines:
        n = r["n"]
        a, b, rhs = matrices(n)
        if r["fn"] == "dmmul":
            c = a @ b
            np.testing.assert_allclose(r["sum"], c.sum(), rtol=1e-12)
            want = [c[k * 37 % n, k * 53 % n] for k in range(20)]
            np.testing.assert_allclose(r["sample"], want, rtol=1e-12)
        else:
            np.testing.assert_allclose(r["x"], np.linalg.solve(a, rhs), rtol=1e-9)


def test_bad_input_gets_clear_errors_and_the_client_goes_on(example, linalg_master):
    out = run_example(example, linalg_master.address, linalg_master.client_token, "--checks")
    assert out.returncode == 0, out.stderr
    got = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert got["count"] == (
        "dmmul: takes 3 arguments (n, A, B) or 4 with the outputs (n, A, B, C), got 1"
    )
    assert got["dtype"] == "dmmul: argument A has dtype int32, expected float64"
    assert got["shape"] == "dmmul: argument B has shape (2, 3), expected (n, n) = (2, 2)"
    assert got["scalar"] == "dmmul: argument n has type float, expected int"
    assert got["unknown"].startswith("no worker serves no_such_function; served: dgefa (1)")
    assert "above the master's frame limit of 20971520 bytes" in got["too_large"]
    # after all of that, the same client still calls: [[1,1],[1,1]] squared
    assert got["after"] == "ok [2.0, 2.0, 2.0, 2.0]"


def test_wrong_token_and_master_down_are_clear_errors(example, linalg_master):
    out = run_example(example, linalg_master.address, "not-the-token", "4")
    assert out.returncode == 1
    assert f"the master at {linalg_master.address} refused the token" in out.stderr
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run_example(example, f"127.0.0.1:{port}", "t", "4")
    assert out.returncode == 1
    assert f"cannot reach a master at 127.0.0.1:{port}" in out.stderr
    assert "is `rtpool master` running?" in out.stderr


def test_rust_client_reconnects_after_a_master_restart(example, tmp_path):
    m = start_master(tmp_path, args=["--http", "off"])
    port = m.address.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address, "--procs", "1"]
    cmd += ["--serve", "rtpool.lib.linalg"]
    worker = subprocess.Popen(
        cmd,
        env=worker_env(m.worker_token),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = rtpool.Client(m.address, m.client_token)
    proc = None
    try:
        wait_until(lambda: any(i.name == "dmmul" for i in client.functions()), timeout=30)
        env = {**os.environ, "RTPOOL_TOKEN": m.client_token}
        proc = subprocess.Popen(
            [str(example), m.address, "--stdin"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

        def ask(n: int) -> list:
            proc.stdin.write(f"{n}\n")
            proc.stdin.flush()
            return [json.loads(proc.stdout.readline()) for _ in range(2)]

        before = ask(8)
        close_master(m)  # the same data dir and port: the client's token stays valid
        m = start_master(tmp_path, listen=f"127.0.0.1:{port}", args=["--http", "off"])
        wait_until(lambda: any(i.name == "dmmul" for i in client.functions()), timeout=30)
        after = ask(8)
        assert after == before
        a, b, _ = matrices(8)
        np.testing.assert_allclose(after[0]["sum"], (a @ b).sum(), rtol=1e-12)
    finally:
        if proc is not None:
            proc.stdin.close()
            stop_process(proc)
            proc.stdout.close()
        client.close()
        stop_process(worker, group=True)
        close_master(m)
