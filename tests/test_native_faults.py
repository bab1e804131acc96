"""Faults seen from the native clients (issue 27), with real processes: a worker killed
(SIGKILL by PID) mid-call re-runs the call and the C and the Rust client get its result; an
array above the master's frame limit from C is a clear error and the session goes on; one C
session used from several threads at once; the Rust client over TLS, and a wrong CA refused.

The C side is tests/c/faults.c (built with gcc against librtpool.a), the Rust side
examples/rust/call.rs (cargo, debug build)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import rtpool
from conftest import close_master, start_master
from helpers import stop_process, wait_until, worker_env
from test_capi import c_examples  # noqa: F401 (a fixture)
from test_tls import TlsMaster, _start_worker, tls_master  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
RTPOOL_ARGUMENTS_TOO_LARGE = 101


@pytest.fixture(scope="module")
def faults_c(c_examples, tmp_path_factory) -> Path:  # noqa: F811 (the fixture imported above)
    # c_examples (test_capi.py) has installed gcc and built librtpool.
    exe = tmp_path_factory.mktemp("faults") / "faults"
    cmd = ["gcc", "-O1", "-Wall", "-Wextra", "-std=c99", f"-I{ROOT / 'include'}", "-o", str(exe)]
    cmd += [str(ROOT / "tests" / "c" / "faults.c"), str(ROOT / "target/release/librtpool.a")]
    build = subprocess.run(
        cmd + ["-lpthread", "-ldl", "-lm", "-lrt"], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr
    return exe


@pytest.fixture(scope="module")
def rust_call() -> Path:
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not installed: the Rust client example cannot be built")
    subprocess.run(
        ["cargo", "build", "-q", "-p", "rtpool-client", "--example", "call"],
        cwd=ROOT,
        check=True,
        timeout=900,
    )
    return ROOT / "target" / "debug" / "examples" / "call"


def _workers(m, tmp_path: Path, count: int, serve: list) -> list:
    procs = []
    for i in range(count):
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address, "--procs", "1"]
        with open(tmp_path / f"worker{i}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    cmd + [arg for module in serve for arg in ("--serve", module)],
                    env=worker_env(m.worker_token),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
    return procs


def _served_by(m, name: str, servers: int) -> None:
    client = rtpool.Client(m.address, m.client_token)
    try:
        wait_until(
            lambda: any(i.name == name and i.servers >= servers for i in client.functions()),
            timeout=60,
        )
    finally:
        client.close()


@pytest.fixture
def cluster(tmp_path):
    """A master (frame limit 1 MiB) and two one-process workers serving linalg and
    tasks.rpc_e2e (pid_after)."""
    m = start_master(tmp_path, args=["--http", "off", "--max-frame-mb", "1"])
    procs = _workers(m, tmp_path, 2, ["rtpool.lib.linalg", "tasks.rpc_e2e"])
    try:
        _served_by(m, "pid_after", 2)
        _served_by(m, "dmmul", 2)
        yield m
    finally:
        for p in procs:
            stop_process(p, group=True)
        close_master(m)


def _env(m) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTPOOL_")}
    return env | {"RTPOOL_MASTER": m.address, "RTPOOL_TOKEN": m.client_token}


def _kill_mid_call(cmd: list, env: dict, path: Path) -> tuple:
    """Start the client's pid_after call, SIGKILL the worker process running it, and return
    (killed PID, the client's output)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = int(wait_until(lambda: path.exists() and path.read_text(), timeout=60))
        os.kill(pid, signal.SIGKILL)  # the worker process inside the call's 3 s sleep
        out, err = proc.communicate(timeout=120)
    finally:
        stop_process(proc)
    assert proc.returncode == 0, out + err
    return pid, out


@pytest.mark.parametrize("client", ["c", "rust"])
def test_a_worker_killed_mid_call_reruns_it_and_the_native_client_gets_the_result(
    cluster, faults_c, rust_call, tmp_path, client
):
    path = tmp_path / "pid"
    if client == "c":
        cmd = [str(faults_c), "pid_after", str(path), "3.0"]
    else:
        cmd = [str(rust_call), cluster.address, "pid_after", str(path), "3.0"]
    killed, out = _kill_mid_call(cmd, _env(cluster), path)
    prefix = "pid " if client == "c" else "int "
    assert out.startswith(prefix), out
    ran = int(out.split()[1])
    # The result is the re-run's: another process, the one that wrote the path last.
    assert ran != killed and int(path.read_text()) == ran


def test_c_array_above_the_frame_limit_is_a_clear_error_and_the_session_goes_on(cluster, faults_c):
    # dmmul n = 400: two 1.28 MB arrays, above the master's 1 MiB frame limit.
    out = subprocess.run(
        [str(faults_c), "too_large", "400"],
        env=_env(cluster),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    first, after = out.stdout.splitlines()
    code, _, message = first.partition(" ")
    assert int(code) == RTPOOL_ARGUMENTS_TOO_LARGE, first
    assert "frame limit of 1048576 bytes" in message, message
    assert after == "after ok"  # a right dmmul on the same session afterwards


def test_one_c_session_from_four_threads_at_once(cluster, faults_c):
    out = subprocess.run(
        [str(faults_c), "threads", "4", "50"],
        env=_env(cluster),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "threads ok calls=200"


def test_rust_client_over_tls_and_a_wrong_ca_refused(
    tls_master: TlsMaster,  # noqa: F811 (the fixture imported above)
    rust_call,
    tmp_path,
):
    ca = ["--ca-file", str(tls_master.cert)]
    worker = _start_worker(tls_master, tmp_path, *ca, "--serve", "tasks.rpc")
    wrong_dir = tmp_path / "other-tls"
    other = start_master(
        tmp_path, data_dir=wrong_dir, args=["--tls-self-signed", "--http", "off"], log_name="o.log"
    )
    close_master(other)  # only its certificate is wanted: a CA that did not sign the master's
    wrong_ca = wrong_dir / "tls" / "cert.pem"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTPOOL_")}
    env["RTPOOL_TOKEN"] = tls_master.client_token
    try:
        client = rtpool.Client(
            tls_master.address, tls_master.client_token, tls=True, ca_file=str(tls_master.cert)
        )
        try:
            wait_until(lambda: any(i.name == "add" for i in client.functions()), timeout=60)
        finally:
            client.close()
        base = [str(rust_call), tls_master.address, "--connect-timeout-ms", "3000"]
        ok = subprocess.run(
            base[:2] + ["--ca-file", str(tls_master.cert)] + base[2:] + ["add", "2", "40"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == "int 42"
        bad = subprocess.run(
            base[:2] + ["--ca-file", str(wrong_ca)] + base[2:] + ["add", "2", "40"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode == 1, bad.stdout
        assert "TLS handshake failed" in bad.stderr, bad.stderr
        assert "CA file" in bad.stderr, bad.stderr
    finally:
        stop_process(worker, group=True)
