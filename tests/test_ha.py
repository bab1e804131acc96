"""High availability (issue 28 items 1-3, master side): two real ``rtpool master --ha``
processes on one real PostgreSQL database (the ``pg_url`` fixture).

- The second master stands by: its answer to HELLO is ``ERROR not_leader`` naming the leader;
  ``/api/status``, ``/metrics``, ``/readyz`` and ``/leader`` say each master's role.
- The leader is killed with SIGKILL under load from recording clients and real workers given
  one address (a front that forwards to whichever master answers ``/leader`` 200, as a
  Kubernetes Service would; the address lists of the client side are another branch's): the
  standby takes over and the history checker finds nothing acknowledged lost, nothing twice.
- The leader is SIGSTOPped past its lease: the standby takes over; on SIGCONT the old leader
  finds it lost the lease, closes its connections with ``not_leader`` and stands by. Frozen
  with a journal write in flight while another epoch takes the row, its write is refused by
  the database (the log line is asserted).

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
from rtpool_bench.ha_cluster import fresh_database, start_pair, wait_leader, wait_ready
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


def test_a_killed_leader_is_replaced_at_once_not_when_its_lease_runs_out(pg_url, tmp_path):
    """SIGKILL ends the leader's database session at once (its kernel closes the socket), so
    the standby takes the lease early, by the leader's lock, not by the expiry: with a lease
    of two minutes only the early path can make it lead within ``LEAD_TIMEOUT_S`` (30 s), and
    its log says which path it took."""
    a, b = start_pair(tmp_path, _db(pg_url, "early"), 120_000)
    try:
        a.kill()
        wait_leader(b.http, 30)
        ha = json.loads(_get(b.http, "/api/status")[1])["ha"]
        assert ha["role"] == "leader" and ha["epoch"] == 2
        assert _log_has(
            b.m.log,
            "took the leader lease early, epoch 2 (120000 ms): the database session of epoch "
            "1's leader has ended",
        ), b.m.log.read_text()[-3000:]
        # Restarted, the old leader stands by: the new leader's session holds its lock.
        a.restart()
        wait_ready(a.http, 30)
        assert json.loads(_get(a.http, "/api/status")[1])["ha"]["role"] == "standby"
    finally:
        a.kill()
        b.kill()


def _logged_in(address: str, token: str) -> tuple[socket.socket, P.FrameReader]:
    """A raw client connection past its WELCOME."""
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "client", token, "raw", 0))
    reader = P.FrameReader()
    msgs: list = []
    while not msgs:
        data = s.recv(65536)
        assert data, "closed during the handshake"
        msgs = reader.feed(data)
    assert msgs[0][0] == P.WELCOME, msgs
    return s, reader


def _read_all(s: socket.socket, reader: P.FrameReader) -> list:
    """Every message until the master closes the connection (bounded by the socket timeout)."""
    out: list = []
    with s:
        while True:
            data = s.recv(65536)
            if not data:
                return out
            out += reader.feed(data)


def _log_has(path: Path, text: str) -> bool:
    return text in path.read_text(errors="replace")


def test_a_leader_frozen_past_its_lease_is_taken_over_and_fences_itself_on_resume(pg_url, tmp_path):
    """SIGSTOP past the lease: the standby takes over by the lease's expiry alone; SIGCONT: the
    old leader's renewal is overdue by its own clock, it closes its connections with
    ``not_leader`` and stands by, naming the new leader. (Whether it still had a journal write
    to be refused depends on timing; the next test makes one certain.)"""
    a, b = start_pair(tmp_path, _db(pg_url, "frozen"), 1000)
    token = (a.data / "client.token").read_text().strip()
    stopped = False
    raw, reader = _logged_in(a.address, token)
    try:
        os.kill(a.pid, signal.SIGSTOP)
        stopped = True
        t_stop = time.monotonic()
        wait_leader(b.http, 30)
        print(f"\nstandby led {time.monotonic() - t_stop:.3f} s after SIGSTOP")
        ha = json.loads(_get(b.http, "/api/status")[1])["ha"]
        assert ha["role"] == "leader" and ha["epoch"] == 2
        os.kill(a.pid, signal.SIGCONT)
        stopped = False
        answers = _read_all(raw, reader)
        errors = [m for m in answers if m[0] == P.ERROR]
        assert [m[1] for m in errors] == ["not_leader"], answers
        assert "no longer leads" in errors[0][2], errors

        def standby_naming_b() -> bool:
            status, text = _get(a.http, "/api/status")
            ha = json.loads(text).get("ha", {}) if status == 200 else {}
            return ha.get("role") == "standby" and ha.get("leader") == b.address

        wait_until(standby_naming_b, timeout=30)
        assert _log_has(a.m.log, "the lease of epoch 1 was not renewed in time")
    finally:
        if stopped:
            os.kill(a.pid, signal.SIGCONT)
        raw.close()
        a.kill()
        b.kill()


def test_a_frozen_leaders_write_in_flight_is_refused_by_the_database(pg_url, tmp_path):
    """The leader freezes (SIGSTOP) with a journal write in flight; meanwhile its lease runs
    out and another epoch takes the row; the standby takes over. Resumed (SIGCONT), the old
    leader fences itself, and the database refuses its write. The write is made to be in flight
    deterministically: this test holds the lease row's lock (as a takeover's UPDATE would)
    while the leader commits, then moves the epoch on before letting go."""
    import subprocess

    import rtpool
    from rtpool_bench.ha_cluster import psql
    from rtpool_bench.tasks import noop

    url = _db(pg_url, "freeze")
    a, b = start_pair(tmp_path, url, 1000)
    token = (a.data / "client.token").read_text().strip()
    wtoken = (a.data / "worker.token").read_text().strip()
    worker = _start_worker_at(a.address, wtoken, tmp_path / "worker.log", ["--procs", "2"])
    client = rtpool.Client(a.address, token, name="frozen-test")
    lock = subprocess.Popen(
        [psql(), url, "-q", "-v", "ON_ERROR_STOP=1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    stopped = False
    raw = None
    try:
        assert (
            client.submit_many(noop, [() for _ in range(20)], star=True).futures[-1].result(30)
            is None
        )
        raw, reader = _logged_in(a.address, token)
        assert lock.stdin is not None
        lock.stdin.write("BEGIN; SELECT epoch FROM rtpool_leader WHERE id = 1 FOR UPDATE;\n")
        lock.stdin.flush()

        def count(q: str) -> int:
            out = subprocess.run(
                [psql(), url, "-tA", "-c", q], capture_output=True, text=True, timeout=30
            )
            return int(out.stdout.strip() or 0)

        # The row is locked before the package comes.
        wait_until(
            lambda: (
                count(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                    "AND query LIKE 'SELECT epoch FROM rtpool_leader%FOR UPDATE%'"
                )
                == 1
            ),
            timeout=10,
        )
        # A package whose commit waits for the row (its ACCEPTED with it).
        pkg = client.submit_many(noop, [() for _ in range(50)], star=True)

        def insert_waits() -> bool:
            q = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'WITH lease%'"
            )
            return count(q) == 1

        wait_until(insert_waits, timeout=10)
        os.kill(a.pid, signal.SIGSTOP)
        stopped = True
        t_stop = time.monotonic()
        # Another epoch takes the row, its lease already over: the standby takes it next.
        lock.stdin.write(
            "UPDATE rtpool_leader SET epoch = epoch + 1, holder = 'test', "
            "expires_at = '-infinity' WHERE id = 1; COMMIT;\n"
        )
        lock.stdin.flush()
        wait_leader(b.http, 30)
        print(f"\nstandby led {time.monotonic() - t_stop:.3f} s after SIGSTOP")
        ha = json.loads(_get(b.http, "/api/status")[1])["ha"]
        # Past the test's epoch 2. Next to a CPU hog the standby's first term can lapse before
        # this read and be taken again (epoch 4, seen in a CI run with two hogs): the claim is
        # that the write of epoch 1 is refused, checked below, not how many terms came between.
        assert ha["role"] == "leader" and ha["epoch"] >= 3
        os.kill(a.pid, signal.SIGCONT)
        stopped = False
        log = a.m.log
        wait_until(lambda: _log_has(log, "no longer leads"), timeout=30)
        wait_until(
            lambda: _log_has(log, "journal write refused: epoch 1 is not the leader's ("),
            timeout=30,
        )

        # Back as a standby, which names the new leader once it looked at the lease row.
        def standby_naming_b() -> bool:
            status, text = _get(a.http, "/api/status")
            ha = json.loads(text).get("ha", {}) if status == 200 else {}
            return ha.get("role") == "standby" and ha.get("leader") == b.address

        wait_until(standby_naming_b, timeout=30)
        kind, code, message = _hello_answer(a.address, token)[:3]
        assert code == "not_leader" and message.endswith(f"(leader: {b.address})"), message
        # Its peers were told: the raw client got not_leader.
        answers = _read_all(raw, reader)
        assert [m[1] for m in answers if m[0] == P.ERROR] == ["not_leader"], answers
        # The refused package is in no epoch's journal: not one row of epoch 1 after the cut.
        rows = subprocess.run(
            [psql(), url, "-tA", "-c", "SELECT count(*) FROM rtpool_journal WHERE epoch = 1"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        before = int(rows.stdout.strip())
        assert before > 0  # the first package's records, committed while it led
        del pkg
    finally:
        if stopped:
            os.kill(a.pid, signal.SIGCONT)
        if raw is not None:
            raw.close()
        if lock.poll() is None:
            assert lock.stdin is not None
            lock.stdin.close()
            lock.wait(30)
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
            # Past 4/5 of its lease it fences itself by its own clock, and from then on says
            # standby although its term still winds down (closing the journal waits for the
            # database): a front following /leader must not route to it meanwhile.
            wait_until(lambda: _get(a.http, "/leader")[0] == 503, timeout=30)
            assert json.loads(_get(a.http, "/api/status")[1])["ha"]["role"] == "standby"
            assert _log_has(a.m.log, "no longer leads")
    finally:
        subprocess.run(
            [psql(), pg_url, "-q", "-c", f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true"],
            timeout=60,
        )
        a.kill()
