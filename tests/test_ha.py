"""High availability (issue 28 items 1-3, master side): two real ``rtpool master --ha``
processes on one real PostgreSQL database (the ``pg_url`` fixture).

- The second master stands by: its answer to HELLO is ``ERROR not_leader`` naming the leader;
  ``/api/status``, ``/metrics``, ``/readyz`` and ``/leader`` say each master's role.
- The leader is killed with SIGKILL under load from recording clients and real workers given
  one address (a front that forwards to whichever master answers ``/leader`` 200, as a
  Kubernetes Service would; the address lists of the client side are another branch's): the
  standby takes over and the history checker finds nothing acknowledged lost, nothing twice.
- The leader is SIGSTOPped past its lease: the standby takes over; on SIGCONT the old leader
  finds it lost the lease, closes its connections with ``not_leader`` and the database refuses
  its journal writes (the log line is asserted).

Figures (failover times) are printed, not asserted; ``rtpool bench ha`` measures them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import wait_until
from rtpool import _protocol as P
from rtpool_bench.ha_cluster import fresh_database, is_leader, start_pair, wait_leader
from rtpool_bench.history_ha import run_failover
from rtpool_bench.recovery import _start_worker_at, _stop_group

pytestmark = pytest.mark.timeout(240)


def _db(pg_url: str, tag: str) -> str:
    return fresh_database(
        pg_url, f"rtpool_test_ha_{tag}_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    )


def _get(http: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _hello_answer(address: str, token: str) -> list:
    """The first message a master answers a client HELLO with."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "client", token, "test-ha", 0))
        reader = P.FrameReader()
        msgs: list = []
        while not msgs:
            data = s.recv(65536)
            assert data, "closed without an answer"
            msgs = reader.feed(data)
        return msgs[0]


def test_the_second_master_stands_by_names_the_leader_and_says_its_role(pg_url, tmp_path):
    a, b = start_pair(tmp_path, _db(pg_url, "standby"), 1000)
    try:
        token = (a.data / "client.token").read_text().strip()
        kind, code, message = _hello_answer(b.address, token)[:3]
        assert (kind, code) == (P.ERROR, "not_leader"), message
        assert message.endswith(f"(leader: {a.address})"), message
        # The leader answers WELCOME.
        assert _hello_answer(a.address, token)[0] == P.WELCOME
        sa = json.loads(_get(a.http, "/api/status")[1])["ha"]
        sb = json.loads(_get(b.http, "/api/status")[1])["ha"]
        assert sa["role"] == "leader" and sa["epoch"] >= 1 and sa["leader"] == a.address
        assert sb == {"role": "standby", "epoch": sa["epoch"], "leader": a.address, "db_ok": True}
        metrics = _get(b.http, "/metrics")[1]
        assert 'rtpool_ha_role{role="standby"} 1' in metrics, metrics[-2000:]
        assert 'rtpool_ha_role{role="leader"} 0' in metrics
        assert f"rtpool_ha_epoch {sa['epoch']}" in metrics
        assert 'rtpool_ha_role{role="leader"} 1' in _get(a.http, "/metrics")[1]
        assert _get(a.http, "/readyz")[0] == 200 and _get(b.http, "/readyz")[0] == 200
        assert _get(a.http, "/leader")[0] == 200
        status, text = _get(b.http, "/leader")
        assert status == 503 and a.address in text
    finally:
        a.kill()
        b.kill()


def test_leader_killed_under_load_the_standby_takes_over_and_nothing_acknowledged_is_lost(
    pg_url, tmp_path
):
    args = argparse.Namespace(
        pg=pg_url,
        kills=2,
        clients=2,
        workers=2,
        tasks=10,
        inflight=4,
        results_between=100,
        seconds=120.0,
        lease_ms=1000,
        fault="kill",
    )
    out = run_failover(tmp_path / "run", args)
    v = out["verdict"]
    print(f"\nfailover ms (SIGKILL -> first result from the new leader): {out['failover_ms']}; {v}")
    assert len(out["failover_ms"]) == 2
    # Not vacuous: results before, between and after the kills.
    assert v["clients"] == 2 and v["unfinished_clients"] == []
    assert v["ok"] >= 3 * 100
    assert (v["lost"], v["duplicated"], v["wrong"], v["phantom"]) == (0, 0, 0, 0), (
        v["examples"],
        v["lost_errors"],
    )
    assert v["valid"]


def _log_has(path: Path, text: str) -> bool:
    return text in path.read_text(errors="replace")


def test_a_frozen_leader_loses_the_lease_and_fences_itself_when_it_resumes(pg_url, tmp_path):
    import rtpool
    from rtpool_bench.tasks import noop

    a, b = start_pair(tmp_path, _db(pg_url, "freeze"), 1000)
    token = (a.data / "client.token").read_text().strip()
    wtoken = (a.data / "worker.token").read_text().strip()
    worker = _start_worker_at(a.address, wtoken, tmp_path / "worker.log", ["--procs", "2"])
    client = rtpool.Client(a.address, token, name="frozen-test")
    stopped = False
    try:
        assert (
            client.submit_many(noop, [() for _ in range(20)], star=True).futures[-1].result(30)
            is None
        )
        # Load on the leader while it freezes: its journal has records to commit on resume.
        pkgs = [client.submit_many(noop, [() for _ in range(50)], star=True) for _ in range(4)]
        os.kill(a.pid, signal.SIGSTOP)
        stopped = True
        t_stop = time.monotonic()
        more = [client.submit_many(noop, [() for _ in range(50)], star=True) for _ in range(4)]
        wait_leader(b.http, 30)
        print(f"\nstandby led {time.monotonic() - t_stop:.3f} s after SIGSTOP")
        ha = json.loads(_get(b.http, "/api/status")[1])["ha"]
        assert ha["role"] == "leader" and ha["epoch"] == 2
        os.kill(a.pid, signal.SIGCONT)
        stopped = False
        log = a.m.log
        wait_until(lambda: _log_has(log, "no longer leads"), timeout=30)
        wait_until(
            lambda: _log_has(log, "journal write refused: epoch 1 is not the leader's (2)"),
            timeout=30,
        )
        wait_until(
            lambda: not is_leader(a.http) and _get(a.http, "/api/status")[0] == 200, timeout=30
        )
        sa = json.loads(_get(a.http, "/api/status")[1])["ha"]
        assert sa["role"] == "standby" and sa["leader"] == b.address
        # Back as a standby: it names the new leader.
        kind, code, message = _hello_answer(a.address, token)[:3]
        assert code == "not_leader" and message.endswith(f"(leader: {b.address})"), message
        del pkgs, more
    finally:
        if stopped:
            os.kill(a.pid, signal.SIGCONT)
        client.close()
        _stop_group(worker)
        a.kill()
        b.kill()


def test_sigterm_gives_the_lease_up_so_the_standby_takes_over_at_once(pg_url, tmp_path):
    a, b = start_pair(tmp_path, _db(pg_url, "term"), 60_000)
    try:
        # With a one-minute lease, only a lease given up lets b lead within the bound.
        a.m.proc.send_signal(signal.SIGTERM)
        assert a.m.proc.wait(30) == 0
        wait_leader(b.http, 20)
        assert _log_has(a.m.log, "gave up the lease of epoch 1")
        ha = json.loads(_get(b.http, "/api/status")[1])["ha"]
        assert ha["role"] == "leader" and ha["epoch"] == 2
    finally:
        a.kill()
        b.kill()


def test_a_bad_ha_url_is_refused_with_what_to_give(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtpool",
            "master",
            "--ha",
            "mysql://db/x",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RTPOOL_DATA_DIR": str(tmp_path)},
    )
    assert out.returncode == 1, out
    assert "must be a postgres://user@host:port/db URL" in out.stderr, out.stderr


def test_while_the_database_is_unreachable_the_leader_refuses_new_packages_saying_so(
    pg_url, tmp_path
):
    import subprocess

    from rtpool_bench.ha_cluster import HaMaster, psql

    url = _db(pg_url, "down")
    name = url.rsplit("/", 1)[1]
    a = HaMaster(tmp_path, "a", url, 5000)  # a long lease: the window before it fences
    try:
        wait_leader(a.http, 30)
        token = (a.data / "client.token").read_text().strip()
        host, port = a.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "client", token, "test-ha", 0))
            reader = P.FrameReader()
            msgs: list = []

            def read_one() -> list:
                while not msgs:
                    data = s.recv(65536)
                    assert data, "closed"
                    msgs.extend(reader.feed(data))
                return msgs.pop(0)

            assert read_one()[0] == P.WELCOME
            sql = (
                f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false; SELECT "
                f"pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            )
            subprocess.run(
                [psql(), pg_url, "-q", "-c", sql], check=True, timeout=60, capture_output=True
            )
            # The first package's commit finds the database gone (it waits, unacknowledged);
            # the next is refused at once, saying why.
            code = b"never runs: no worker"
            fn_hash = hashlib.sha256(code).digest()
            s.sendall(P.encode_submit(1, fn_hash, code, {}, [b"\x90"]))
            wait_until(lambda: _log_has(a.m.log, "journal database unreachable"), timeout=10)
            s.sendall(P.encode_submit(2, fn_hash, code, {}, [b"\x90"]))
            answer = read_one()
            assert answer[:2] == [P.ERROR, "rejected"], answer
            assert "journal database is unreachable" in answer[2], answer
            assert answer[3] == 2, answer
    finally:
        subprocess.run(
            [psql(), pg_url, "-q", "-c", f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true"],
            timeout=60,
        )
        a.kill()
