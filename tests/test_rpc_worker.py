"""A worker serving named functions (``--serve``), against the scripted fake master: SERVE,
ASSIGN_CALLS, results and errors on the wire, start-up failures, a worker without numpy."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from fakemaster import FakeMaster
from helpers import stop_process, wait_until, worker_env
from rtpool import _protocol as P
from rtpool import errors
from rtpool.rpc import codec
from rtpool.rpc import interface as _interface
from rtpool.rpc import remote as _remote
from rtpool.worker import EXIT_CONFIG, ServeError, WorkerConnection, load_services


class Serving:
    """A WorkerConnection serving modules in a thread, and the master's side of it."""

    def __init__(self, fake: FakeMaster, modules=("tasks.rpc",), **kwargs) -> None:
        kwargs.setdefault("reconnect_timeout", None)
        services = load_services(modules)
        self.conn = WorkerConnection(fake.address, "tok", "rpc-worker", services=services, **kwargs)
        self.code = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.master = fake.accept()

    def _serve(self) -> None:
        self.code = self.conn.serve()

    def call(self, task, name, args, inputs=(), version="1", timeout_ms=0, attempt=1) -> list:
        """Assign one call; return its ``WorkerResult``."""
        payload = codec.encode_args(list(args))
        self.master.send(
            P.ASSIGN_CALLS, [[task, attempt, name, version, payload, list(inputs), timeout_ms]]
        )
        (result,) = self.master.recv_kind(P.RESULT, skip=(P.HEARTBEAT, P.PULL))[1]
        assert result[:2] == [task, attempt]
        return result

    def close(self) -> None:
        self.master.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


@pytest.fixture
def serving(fake):
    w = Serving(fake)
    yield w
    w.close()


def expected_serve(*modules) -> list:
    return [
        [iface.name, iface.version, iface.to_bytes()]
        for module in modules
        for _, iface in _remote.served_functions(module)
    ]


def test_serve_comes_right_after_welcome_then_pull(serving):
    msg = serving.master.recv()
    assert msg[0] == P.SERVE
    assert msg[1] == expected_serve("tasks.rpc")
    names = {entry[0] for entry in msg[1]}
    assert {"add", "scale", "noop", "fail", "slow", "shape_of"} <= names
    # Each interface is the one the module declares, readable by a client.
    add = next(_interface.Interface.from_bytes(e[2]) for e in msg[1] if e[0] == "add")
    assert str(add).startswith("add(a: int, b: int) -> int")
    assert serving.master.recv_kind(P.PULL)[0] == P.PULL  # only then it pulls


def test_serve_is_sent_again_in_every_session(fake):
    w = Serving(fake, modules=("tasks.rpc", "tasks.rpc_v2"), reconnect_timeout=10.0)
    first = w.master.recv()
    assert first[0] == P.SERVE
    assert first[1] == expected_serve("tasks.rpc", "tasks.rpc_v2")
    w.master.close()  # the worker reconnects
    again = fake.accept(timeout=10)
    assert again.recv()[:2] == [P.SERVE, first[1]]
    assert again.recv_kind(P.PULL)[0] == P.PULL
    assert w.conn.sessions == 2
    w.master = again
    w.conn.stopping = True
    os.write(w.conn._wake_w, b"\0")
    w.close()


def test_call_result_is_the_encoded_outputs(serving):
    serving.master.recv_kind(P.PULL, skip=(P.SERVE,))
    status, data = serving.call(1, "add", [2, 40])[2:4]
    assert status == P.STATUS_OK
    assert codec.decode_results(data) == [42]
    # An InOut array comes back modified, without pickle.
    x = np.arange(4, dtype=np.float64)
    status, data = serving.call(2, "scale", [4, x, 2.5])[2:4]
    assert status == P.STATUS_OK
    assert not data.startswith(b"\x80")  # not a pickle stream
    (out,) = codec.decode_results(data)
    np.testing.assert_array_equal(out, x * 2.5)
    # A reference to an input: the first output of the call's dependency.
    dep = codec.encode_results([np.ones((2, 3))])
    status, data = serving.call(3, "shape_of", [2, 3, codec.Ref(0, 0)], inputs=[dep])[2:4]
    assert status == P.STATUS_OK
    np.testing.assert_array_equal(codec.decode_results(data)[0], [2, 3])


def test_several_calls_in_one_assignment_come_back_batched(serving):
    serving.master.recv_kind(P.PULL, skip=(P.SERVE,))
    calls = [[10 + i, 1, "add", "1", codec.encode_args([i, i]), [], 0] for i in range(2)]
    serving.master.send(P.ASSIGN_CALLS, calls)
    results = []
    while len(results) < 2:
        results += serving.master.recv_kind(P.RESULT, skip=(P.HEARTBEAT, P.PULL))[1]
    assert sorted((r[0], r[2], codec.decode_results(r[3])[0]) for r in results) == [
        (10, P.STATUS_OK, 0),
        (11, P.STATUS_OK, 2),
    ]


def test_exception_is_status_1_with_a_decodable_error_map(serving):
    serving.master.recv_kind(P.PULL, skip=(P.SERVE,))
    status, data = serving.call(1, "fail", ["no luck"])[2:4]
    assert status == P.STATUS_ERROR
    report = codec.decode_error(data)
    assert report["type"] == "ValueError"
    assert report["message"] == "no luck"
    assert "in fail" in report["traceback"]
    # A payload that does not fit the interface is the worker's CallError, not a crash.
    status, data = serving.call(2, "add", ["two", 3])[2:4]
    assert status == P.STATUS_ERROR
    report = codec.decode_error(data)
    assert report["type"] == "rtpool.errors.CallError"
    assert "argument a" in report["message"]


def test_unknown_name_or_version_is_status_3(serving):
    serving.master.recv_kind(P.PULL, skip=(P.SERVE,))
    status, data = serving.call(1, "add", [1, 2], version="9")[2:4]
    assert status == P.STATUS_FAILED
    assert b"does not serve 'add' version '9'" in data
    assert b"rpc-worker" in data


def test_calls_with_a_timeout_run_in_the_executor(serving):
    serving.master.recv_kind(P.PULL, skip=(P.SERVE,))
    status, data = serving.call(1, "add", [5, 6], timeout_ms=10_000)[2:4]
    assert (status, codec.decode_results(data)) == (P.STATUS_OK, [11])
    assert serving.conn._executor is not None  # it ran there
    status, data = serving.call(2, "fail", ["inside"], timeout_ms=10_000)[2:4]
    assert status == P.STATUS_ERROR
    assert codec.decode_error(data)["message"] == "inside"
    status, data = serving.call(3, "slow", [30.0], timeout_ms=100)[2:4]
    assert status == P.STATUS_TIMEOUT
    assert b"time limit of 0.1 s" in data


def test_serve_conflict_is_logged_and_the_worker_goes_on(serving, capfd):
    serving.master.recv_kind(P.PULL, skip=(P.SERVE,))
    serving.master.send(P.ERROR, P.ERR_SERVE_CONFLICT, "'add' version 1 conflicts", 0)
    status, data = serving.call(1, "add", [1, 1])[2:4]
    assert (status, codec.decode_results(data)) == (P.STATUS_OK, [2])
    assert serving.conn.refused == ["'add' version 1 conflicts"]
    assert "refused to serve a function: 'add' version 1 conflicts" in capfd.readouterr().err


def test_load_services_names_the_bad_module():
    assert ServeError is errors.ServeError  # one class, re-exported by rtpool.worker
    with pytest.raises(ServeError, match="--serve no_such_module_xyz: ModuleNotFoundError"):
        load_services(["no_such_module_xyz"])
    with pytest.raises(ServeError, match="module tasks serves no functions"):
        load_services(["tasks"])
    with pytest.raises(ServeError, match="'add' version '1' is also served by module 'tasks.rpc'"):
        load_services(["tasks.rpc", "tasks.rpc"])


def run_worker_cli(*args: str, env: dict | None = None, timeout: float = 30) -> tuple:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", "127.0.0.1:1", *args]
    proc = subprocess.run(
        cmd, env=env or worker_env("tok"), capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    "module, message",
    [
        ("no_such_module_xyz", "--serve no_such_module_xyz: ModuleNotFoundError"),
        ("tasks", "module tasks serves no functions: mark them with @rtpool.remote"),
    ],
)
def test_a_bad_module_fails_the_worker_at_start(module, message):
    # Before any connection (the address is unreachable): the module is the problem.
    code, err = run_worker_cli("--serve", "tasks.rpc_v2", "--serve", module)
    assert code == EXIT_CONFIG
    assert message in err
    assert "cannot reach" not in err


@pytest.fixture
def no_numpy_env(tmp_path):
    """A worker environment where ``import numpy`` raises ImportError."""
    fake = tmp_path / "nonumpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("numpy is not installed (test)")\n')
    env = worker_env("tok")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "nonumpy"), env["PYTHONPATH"]])
    return env


def test_a_worker_without_numpy_serves_scalar_functions(fake, no_numpy_env):
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", fake.address]
    cmd += ["--serve", "tasks.rpc_v2", "--name", "no-numpy"]
    proc = subprocess.Popen(
        cmd,
        env=no_numpy_env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        conn = fake.accept(timeout=20)
        serve = conn.recv(timeout=20)
        assert serve[0] == P.SERVE
        assert [(e[0], e[1]) for e in serve[1]] == [("add", "2")]
        conn.recv_kind(P.PULL)
        conn.send(P.ASSIGN_CALLS, [[1, 1, "add", "2", codec.encode_args([1, 2]), [], 0]])
        (result,) = conn.recv_kind(P.RESULT, skip=(P.HEARTBEAT, P.PULL))[1]
        assert (result[2], codec.decode_results(result[3])) == (P.STATUS_OK, [1003])
        # An array argument cannot be decoded there: a clear error, not a crash.
        conn.send(P.ASSIGN_CALLS, [[2, 1, "add", "2", codec.encode_args([np.ones(1), 2]), [], 0]])
        (result,) = conn.recv_kind(P.RESULT, skip=(P.HEARTBEAT, P.PULL))[1]
        assert result[2] == P.STATUS_ERROR
        assert "no numpy" in codec.decode_error(result[3])["message"]
    finally:
        stop_process(proc, group=True)
        proc.stderr.close()


def test_a_module_needing_numpy_fails_on_a_worker_without_it(no_numpy_env):
    code, err = run_worker_cli("--serve", "tasks.rpc", env=no_numpy_env)
    assert code == EXIT_CONFIG
    assert "--serve tasks.rpc" in err and "numpy is not installed" in err


def test_the_worker_imports_no_numpy_unless_a_module_does(fake):
    # A worker serving a scalar module, in a fresh interpreter: numpy never gets imported.
    script = (
        "import sys\n"
        "from rtpool.worker import load_services, WorkerConnection\n"
        "services = load_services(['tasks.rpc_v2'])\n"
        f"WorkerConnection({fake.address!r}, 'tok', 'n', services=services)\n"
        "print('numpy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=worker_env("tok"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    wait_until(lambda: fake.hellos >= 1)
