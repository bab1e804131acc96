"""Real hosts (issue 13): the master and workers on network namespaces joined by a bridge.

* A worker host's cable is pulled mid-package and plugged back: the cut host's tasks run on the
  other host within a few leases, the cut worker notices the silence and rejoins soon after the
  link returns.
* TLS across hosts: a master serving a certificate for its bridge address, signed by a CA made
  in the test; workers on two hosts and a client on a third trust that CA; a worker and a
  client trusting another CA are refused with a clear error.
* A host that joins late: a package started with one worker host gets work done on a second
  host whose worker starts in the middle of it.

Every test checks that each task's result reaches the client exactly once and that each task
ran once (0 lost, 0 duplicated). Needs root (CI runs it); skipped otherwise with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

import rtpool
import tasks
from conftest import MasterProcess, attach_master, close_master
from helpers import TESTS_DIR, stop_process, wait_until, worker_env
from rtpool_bench.netns import Network, skip_reason

_SKIP = skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

LEASE_MS = 1000


@pytest.fixture
def net():
    network = Network(["w1", "w2"])
    try:
        yield network
    finally:
        network.close()


def _start_master(net: Network, tmp_path: Path, *extra: str) -> MasterProcess:
    data_dir = tmp_path / "data"
    log = tmp_path / "master.log"
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", f"{net.ip['master']}:0"]
    cmd += ["--data-dir", str(data_dir), "--lease-ms", str(LEASE_MS), *extra]
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            net.run("master", cmd), stdout=subprocess.PIPE, stderr=log_file,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return attach_master(proc, data_dir, log)


def _start_worker(
    net: Network, host: str, m: MasterProcess, log: Path, *extra: str
) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", m.address, "--procs", "1"]
    cmd += ["--reconnect-timeout", "60", *extra]
    with open(log, "ab") as out:
        return subprocess.Popen(
            net.run(host, cmd), stdout=out, stderr=subprocess.STDOUT,
            env=worker_env(m.worker_token), start_new_session=True,
        )  # fmt: skip


@pytest.mark.parametrize(
    "cut_s",
    [0, pytest.param(10, marks=pytest.mark.slow), pytest.param(40, marks=pytest.mark.slow)],
    ids=["until-noticed", "10s", "40s"],
)
def test_a_host_cut_mid_package_fails_over_and_rejoins_with_nothing_lost(net, tmp_path, cut_s):
    m = _start_master(net, tmp_path)
    logs = {h: tmp_path / f"{h}.log" for h in ("w1", "w2")}
    workers = {h: _start_worker(net, h, m, logs[h]) for h in logs}
    client = rtpool.Client(m.address, m.client_token)
    runs = tmp_path / "runs.txt"
    try:
        for log in logs.values():
            wait_until(lambda log=log: "connected to the master at" in log.read_text(), 30)
        n = 40
        futures = [client.submit(tasks.logged, x, str(runs), 0.1) for x in range(n)]
        # Both hosts at work (a pid each) before the cut.
        wait_until(lambda: len({f.result()[1] for f in futures if f.done()}) == 2, timeout=30)
        net.cut("w1")
        cut_at = time.monotonic()
        # The other host runs everything within the lease and then some: w1 is lost after
        # one lease of silence, its tasks requeued.
        results = [f.result(timeout=30)[0] for f in futures]
        failover_s = time.monotonic() - cut_at
        assert results == list(range(n)), "every result, in order, exactly once"
        ran = {int(x) for x in runs.read_text().split()}
        assert ran == set(range(n))
        # The cut worker notices (TCP_USER_TIMEOUT or its silence check) and tries again.
        wait_until(lambda: "reconnection attempt 1 failed" in logs["w1"].read_text(), timeout=15)
        assert workers["w1"].poll() is None, logs["w1"].read_text()
        if cut_s:  # the fault's own length (the rejoin time depends on it: TCP backoff)
            time.sleep(max(0.0, cut_at + cut_s - time.monotonic()))
        net.restore("w1")
        restored_at = time.monotonic()
        cut_length_s = restored_at - cut_at
        wait_until(lambda: logs["w1"].read_text().count("connected to the master at") >= 2, 15)
        rejoin_s = time.monotonic() - restored_at
        # The rejoined host takes work again.
        more = [client.submit(tasks.pid_of, x, 0.05) for x in range(20)]
        assert [f.result(timeout=30)[0] for f in more] == list(range(20))
        assert client._conn.duplicate_results == 0
        print(f"netns: all {n} results {failover_s:.2f} s after the cut; after a "
              f"{cut_length_s:.1f} s cut w1 rejoined {rejoin_s:.2f} s "
              "after the link came back")  # fmt: skip
    finally:
        client.close()
        for proc in workers.values():
            stop_process(proc, group=True)
        close_master(m)


def _wait_connected(proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    """Wait for a worker's first connection; fail at once, with its log, if it exits."""

    def connected() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}: {log.read_text()}")
        return "connected to the master at" in log.read_text()

    wait_until(connected, timeout)


# ---------------------------------------------------------------------------------------------
# TLS across hosts


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"openssl {' '.join(args)}: {proc.stderr}"


def _make_ca(d: Path, name: str) -> Path:
    """A CA certificate and key (``d/name.pem``, ``d/name.key``); returns the certificate."""
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return cert


def _issue(d: Path, ca: Path, ip: str) -> tuple[Path, Path]:
    """A server certificate for ``ip`` signed by the CA ``ca``; returns ``(cert, key)``."""
    cert, key, csr, ext = d / "master.pem", d / "master.key", d / "master.csr", d / "ext.cnf"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", "/CN=rtpool master")  # fmt: skip
    ext.write_text(
        f"subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca.with_suffix(".key")),
             "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return cert, key


def _run_client(net: Network, host: str, m: MasterProcess, ca: Path, *args: str) -> Dict:
    """``netns_client.py`` run on ``host``: its JSON line."""
    cmd = [sys.executable, str(Path(TESTS_DIR) / "netns_client.py"), "--master", m.address]
    env = worker_env(m.worker_token)
    env["RTPOOL_TOKEN"] = m.client_token
    proc = subprocess.run(
        net.run(host, [*cmd, "--ca-file", str(ca), *args]), env=env, capture_output=True,
        text=True, timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_across_hosts_completes_a_package_and_refuses_the_wrong_ca(tmp_path):
    net = Network(["w1", "w2", "cl"])
    certs = tmp_path / "certs"
    certs.mkdir()
    ca = _make_ca(certs, "rtpool-test-ca")
    wrong_ca = _make_ca(certs, "another-ca")
    cert, key = _issue(certs, ca, net.ip["master"])
    workers: Dict[str, subprocess.Popen] = {}
    m = None
    try:
        m = _start_master(net, tmp_path, "--tls-cert", str(cert), "--tls-key", str(key),
                          "--log-level", "debug")  # fmt: skip
        logs = {h: tmp_path / f"{h}.log" for h in ("w1", "w2", "wrong")}
        for h in ("w1", "w2"):
            workers[h] = _start_worker(net, h, m, logs[h], "--ca-file", str(ca))
        # A worker on the client's host that trusts another CA: refused at once, exit code 2
        # (a configuration error; no point retrying).
        workers["wrong"] = _start_worker(net, "cl", m, logs["wrong"], "--ca-file", str(wrong_ca))
        for h in ("w1", "w2"):
            _wait_connected(workers[h], logs[h])
        runs = tmp_path / "runs.txt"
        n = 30
        out = _run_client(net, "cl", m, ca, "--tasks", str(n), "--runs", str(runs),
                          "--seconds", "0.05")  # fmt: skip
        assert [x for x, _ in out["results"]] == list(range(n)), out
        assert out["duplicates"] == 0
        assert sorted(int(x) for x in runs.read_text().split()) == list(range(n)), "each ran once"
        hosts = {net.netns_id(h): h for h in ("w1", "w2")}
        ran_on = [hosts.get(ns, f"netns {ns}") for _, ns in out["results"]]
        assert set(ran_on) == {"w1", "w2"}, ran_on

        assert workers["wrong"].wait(30) == 2, logs["wrong"].read_text()
        wrong_log = logs["wrong"].read_text()
        assert f"TLS certificate of master at {m.address} is not trusted" in wrong_log, wrong_log
        assert "certificate verify failed" in wrong_log or "issuer" in wrong_log, wrong_log
        refused = _run_client(net, "cl", m, wrong_ca, "--tasks", "1", "--runs", str(runs))
        assert refused.get("refused") == "ConnectError", refused
        assert "is not trusted" in refused["message"] and "ca_file" in refused["message"]
        # The master saw both refusals as failed handshakes, and kept serving.
        assert m.log_text().count("TLS handshake failed") >= 2, m.log_text()[-3000:]
        assert m.proc.poll() is None
        print(f"netns TLS: {n} tasks from host cl ran on {ran_on.count('w1')} (w1) + "
              f"{ran_on.count('w2')} (w2); wrong CA: {refused['message']}")  # fmt: skip
    finally:
        for proc in workers.values():
            stop_process(proc, group=True)
        if m is not None:
            close_master(m)
        net.close()


# ---------------------------------------------------------------------------------------------
# A host that joins late


def test_a_host_that_joins_mid_package_gets_work_with_nothing_lost(net, tmp_path):
    m = _start_master(net, tmp_path)
    logs = {h: tmp_path / f"{h}.log" for h in ("w1", "w2")}
    workers = {"w1": _start_worker(net, "w1", m, logs["w1"])}
    client = rtpool.Client(m.address, m.client_token)
    runs = tmp_path / "runs.txt"
    try:
        _wait_connected(workers["w1"], logs["w1"])
        # 80 tasks of 0.1 s: 8 s on w1 alone, time enough for w2's worker to start.
        n = 80
        futures = [client.submit(tasks.logged_netns, x, str(runs), 0.1) for x in range(n)]
        wait_until(lambda: sum(f.done() for f in futures) >= 3, timeout=30)
        workers["w2"] = _start_worker(net, "w2", m, logs["w2"])
        _wait_connected(workers["w2"], logs["w2"])
        joined_with = n - sum(f.done() for f in futures)
        assert joined_with > 0, "the package ended before w2 joined (a slow start here?)"
        results = [f.result(timeout=30) for f in futures]
        assert [x for x, _ in results] == list(range(n)), "every result, in order, once"
        assert sorted(int(x) for x in runs.read_text().split()) == list(range(n)), "each ran once"
        assert client._conn.duplicate_results == 0
        hosts = {net.netns_id("w1"): "w1", net.netns_id("w2"): "w2"}
        ran_on: List[str] = [hosts.get(ns, f"netns {ns}") for _, ns in results]
        assert set(ran_on) == {"w1", "w2"}, ran_on
        assert set(ran_on[:3]) == {"w1"}, "the first tasks ran before w2 existed"
        print(f"netns late join: w2 joined with {joined_with} of {n} tasks left and ran "
              f"{ran_on.count('w2')} of them")  # fmt: skip
    finally:
        client.close()
        for proc in workers.values():
            stop_process(proc, group=True)
        close_master(m)
