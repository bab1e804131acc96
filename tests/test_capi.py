"""librtpool, the GridRPC C API (issue 27): the C examples built with gcc against the static
library, run against a real master and a Python worker serving rtpool.lib.linalg.

The examples check their results themselves (dmmul against a local triple loop, linpack by
its residual) and exit non-zero on a wrong answer; a failed GridRPC call exits with
10 + its code and prints the library's message. Needs gcc (scripts/ensure-native-toolchain
installs it as root) and cargo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import rtpool
from rtpool.errors import RtpoolError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "c"
GRPC_SERVER_NOT_FOUND = 4
GRPC_FUNCTION_NOT_FOUND = 5
GRPC_RPC_REFUSED = 8


@pytest.fixture(scope="module")
def c_examples() -> Path:
    ensure = subprocess.run(
        [ROOT / "scripts" / "ensure-native-toolchain", "gcc"], capture_output=True, text=True
    )
    if ensure.returncode != 0:
        pytest.skip(f"no C toolchain: {ensure.stderr.strip()}")
    if shutil.which("cargo") is None:
        pytest.skip("cargo not found: librtpool is built from crates/rtpool-capi")
    build = subprocess.run(
        ["make", "-C", str(EXAMPLES)], capture_output=True, text=True, timeout=900
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return EXAMPLES


@pytest.fixture
def linalg_master(master, workers):
    """The master with one worker serving rtpool.lib.linalg, once dmmul is served."""
    workers.start(2, "--serve", "rtpool.lib.linalg")
    client = rtpool.Client(master.address, master.client_token)
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                client.describe("linpack")
                break
            except RtpoolError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()
    return master


def run(
    program: Path, *args: str, master=None, env: dict | None = None
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RTPOOL_")}
    if master is not None:
        base |= {"RTPOOL_MASTER": master.address, "RTPOOL_TOKEN": master.client_token}
    return subprocess.run(
        [str(program), *args], env=base | (env or {}), capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("n", [100, 1000])
def test_c_dmmul_matches_a_local_product(c_examples, linalg_master, n):
    out = run(c_examples / "dmmul", str(n), master=linalg_master)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith(f"dmmul n={n} max_abs_err=")


def test_c_linpack_solves(c_examples, linalg_master):
    out = run(c_examples / "linpack", "200", master=linalg_master)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("linpack n=200 residual=")


def test_c_async_calls_with_wait_all(c_examples, linalg_master):
    out = run(c_examples / "async_calls", "300", "6", master=linalg_master)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "async calls=300 n=6" in out.stdout


def test_fortran_dmmul_and_linpack(linalg_master):
    ensure = subprocess.run(
        [ROOT / "scripts" / "ensure-native-toolchain", "gfortran"], capture_output=True, text=True
    )
    if ensure.returncode != 0:
        pytest.skip(f"no Fortran compiler: {ensure.stderr.strip()}")
    fortran = ROOT / "examples" / "fortran"
    build = subprocess.run(
        ["make", "-C", str(fortran)], capture_output=True, text=True, timeout=900
    )
    assert build.returncode == 0, build.stdout + build.stderr
    for n in ("100", "1000"):
        out = run(fortran / "dmmul_linpack", n, master=linalg_master)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"fortran dmmul n={n} max_abs_err=" in out.stdout
        assert f"fortran linpack n={n} residual=" in out.stdout


def test_c_master_down_is_server_not_found(c_examples, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nobody listens there
    env = {"RTPOOL_MASTER": f"127.0.0.1:{port}", "RTPOOL_TOKEN": "x"}
    conf = tmp_path / "rtpool.conf"
    conf.write_text("connect_timeout_ms = 2000\nreconnect_timeout_ms = 0\n")
    out = run(c_examples / "dmmul", "4", str(conf), env=env)
    assert out.returncode == 10 + GRPC_SERVER_NOT_FOUND, out.stdout + out.stderr
    assert f"127.0.0.1:{port}" in out.stderr and "rtpool master" in out.stderr


def test_c_wrong_token_is_refused(c_examples, linalg_master):
    out = run(c_examples / "dmmul", "4", master=linalg_master, env={"RTPOOL_TOKEN": "wrong"})
    assert out.returncode == 10 + GRPC_RPC_REFUSED, out.stdout + out.stderr
    assert "refused the token" in out.stderr


def test_c_program_linked_against_the_shared_library_calls_grpc_call(
    c_examples, linalg_master, tmp_path
):
    # The variadic grpc_call comes from librtpool.so (not a static copy linked into the
    # program): the program needs the .so and leaves grpc_call undefined in itself.
    libdir = ROOT / "target" / "release"
    exports = subprocess.run(
        ["nm", "-D", "--defined-only", str(libdir / "librtpool.so")], capture_output=True, text=True
    ).stdout.split()
    assert "grpc_call" in exports and "grpc_call_async" in exports
    exe = tmp_path / "dmmul_shared"
    cmd = ["gcc", "-O1", f"-I{ROOT / 'include'}", "-o", str(exe), str(EXAMPLES / "dmmul.c")]
    cmd += [f"-L{libdir}", "-lrtpool", f"-Wl,-rpath,{libdir}", "-lm"]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    dynamic = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    assert "librtpool.so" in dynamic
    undefined = subprocess.run(["nm", "-u", str(exe)], capture_output=True, text=True).stdout
    assert "grpc_call" in undefined.split()
    out = run(exe, "50", master=linalg_master)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("dmmul n=50 max_abs_err=")


@pytest.fixture(scope="module")
def bad_calls(c_examples, tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("capi") / "bad_calls"
    lib = ROOT / "target" / "release" / "librtpool.a"
    cmd = [
        "gcc",
        "-O1",
        "-Wall",
        f"-I{ROOT / 'include'}",
        "-o",
        str(exe),
        str(ROOT / "tests" / "c" / "bad_calls.c"),
    ]
    build = subprocess.run(
        cmd + [str(lib), "-lpthread", "-ldl", "-lm", "-lrt"], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr
    return exe


@pytest.mark.parametrize(
    "case, code, message",
    [
        ("unknown", GRPC_FUNCTION_NOT_FOUND, "no worker serves no_such_function"),
        ("argc", 100, "dmmul: 3 arguments given, the interface takes 4"),
        ("null_handle", 6, "function handle was never initialized"),
        ("wait_unknown", 7, "session 12345 is unknown"),
        ("unschedulable", GRPC_RPC_REFUSED, "it asks gpu=1,zone=nowhere"),
    ],
)
def test_c_bad_calls_get_their_code_and_message(bad_calls, linalg_master, case, code, message):
    out = run(bad_calls, case, master=linalg_master)
    assert out.returncode == 0, out.stdout + out.stderr
    got_code, _, got_message = out.stdout.strip().partition(" ")
    assert int(got_code) == code, out.stdout
    assert message in got_message, out.stdout


def test_the_checked_in_header_is_what_cbindgen_makes(tmp_path):
    ensure = subprocess.run(
        [ROOT / "scripts" / "ensure-native-toolchain", "cbindgen"], capture_output=True, text=True
    )
    if ensure.returncode != 0:
        pytest.skip(f"no cbindgen: {ensure.stderr.strip()}")
    crate = ROOT / "crates" / "rtpool-capi"
    fresh = tmp_path / "rtpool_grpc.h"
    cmd = ["cbindgen", "--config", str(crate / "cbindgen.toml"), "--crate", "rtpool-capi"]
    gen = subprocess.run(
        cmd + ["--output", str(fresh), str(crate)], capture_output=True, text=True, timeout=120
    )
    assert gen.returncode == 0, gen.stderr
    checked_in = (ROOT / "include" / "rtpool_grpc.h").read_text()
    assert fresh.read_text() == checked_in, "include/rtpool_grpc.h is stale: run `make capi-header`"


def test_c_config_file_errors_name_the_line(c_examples, tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("master = 127.0.0.1:1\nmastr = x\n")
    out = run(c_examples / "dmmul", "4", str(conf))
    assert out.returncode == 10 + 3, out.stdout + out.stderr  # GRPC_CONFIGFILE_ERROR
    assert 'line 2: unknown key "mastr"' in out.stderr


def test_c_follows_the_leader_a_standby_names(c_examples, linalg_master):
    """``RTPOOL_MASTER`` lists a dead address, a standby naming the leader, and another
    standby: the C program reaches the leader (named, not next in the list)."""
    import socket

    from fakemaster import FakeMaster

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with FakeMaster() as standby, FakeMaster() as other:
        standby.refusal = ("not_leader", f"standby (leader: {linalg_master.address})")
        other.refusal = ("not_leader", "standby (leader: unknown)")
        masters = f"{dead},{standby.address},{other.address}"
        env = {"RTPOOL_MASTER": masters, "RTPOOL_TOKEN": linalg_master.client_token}
        out = run(c_examples / "dmmul", "50", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("dmmul n=50 max_abs_err=")
        assert standby.hellos >= 1 and other.hellos == 0
