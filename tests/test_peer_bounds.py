"""Numbers a peer reports are bounded: a worker reporting an absurd ``exec_us`` (2^63-1 and
above) is charged at most what the master saw (assignment to result, plus 1 ms), cannot poison
the user store, break ``rtpool token list`` or stop quota accounting; a store already poisoned
by an older master is repaired when it is opened."""

from __future__ import annotations

import pickle
import socket
import sqlite3
import time
from pathlib import Path

import rtpool
import tasks
from conftest import close_master, start_master
from helpers import wait_until
from rtpool import _native
from rtpool import _protocol as P
from test_tokens import create, token_cli

# The master's slack on a reported time above the assignment-to-result time it saw, us.
REPORT_MARGIN_US = 1_000


class FakeWorker:
    """A worker speaking the protocol by hand, so it can report whatever numbers it likes."""

    def __init__(self, address: str, token: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.reader = P.FrameReader()
        self.pending: list = []
        self.sock.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, "worker", token, "fake-worker", 1))
        welcome = self.recv()
        assert welcome[0] == P.WELCOME, welcome

    def recv(self) -> list:
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "the master closed the fake worker's connection"
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)

    def run_one(self, exec_us: int, value: object, run_s: float = 0.0) -> None:
        """Take one task, "run" it ``run_s`` seconds and report ``value`` as its result, with
        ``exec_us``."""
        self.sock.sendall(P.encode(P.PULL, 1))
        while True:
            msg = self.recv()
            if msg[0] == P.ASSIGN:
                break
        task, attempt = msg[1][0][0], msg[1][0][1]
        if run_s:
            time.sleep(run_s)  # the task's run time, not a wait for a race
        data = pickle.dumps(value, 5)
        result = [task, attempt, P.STATUS_OK, data, exec_us, 0, 0]
        self.sock.sendall(P.encode(P.RESULT, [result]))

    def close(self) -> None:
        self.sock.close()


def used_us(data_dir: Path, user: str) -> int:
    quotas = {q["user"]: q for q in _native.token_quotas(str(data_dir))}
    return quotas[user]["used_us"] if user in quotas else 0


def test_absurd_exec_us_is_charged_what_the_master_saw_and_the_store_stays_readable(
    tmp_path: Path,
):
    master = start_master(tmp_path)
    where = ["--data-dir", str(master.data_dir)]
    try:
        client_token, _ = create(where, "alice", "client", "--quota-seconds", "1000000000")
        worker_token, _ = create(where, "alice", "worker")
        worker = FakeWorker(master.address, worker_token)
        try:
            with rtpool.Client(master.address, client_token) as client:
                # A sane report first (a 20 ms task claiming 1 ms), so alice has usage in the
                # store before the absurd ones.
                first = client.submit(tasks.square, 2)
                worker.run_one(exec_us=1_000, value=4, run_s=0.02)
                assert first.result(30) == 4
                wait_until(lambda: used_us(master.data_dir, "alice") >= 1_000, timeout=15)
                # Three ~10 ms tasks each claiming 2^63-1 us (on main: 30 days each, 7,776,000 s
                # in all). The master saw each from its ASSIGN to its RESULT, which lies
                # inside the span this test measures around run_one and the result.
                spans_us = []
                for x in (3, 4, 5):
                    began = time.monotonic()
                    fut = client.submit(tasks.square, x)
                    worker.run_one(exec_us=(1 << 63) - 1, value=x * x, run_s=0.01)
                    assert fut.result(30) == x * x
                    spans_us.append((time.monotonic() - began) * 1e6)
                    # The client gets the clamped figure too: the master's own, plus 1 ms.
                    t = fut.timings
                    assert t is not None and t["worker_us"] >= 10_000, t
                    assert t["exec_us"] == t["worker_us"] + REPORT_MARGIN_US, t
                wait_until(lambda: used_us(master.data_dir, "alice") > 31_000, timeout=15)
        finally:
            worker.close()
        charged = used_us(master.data_dir, "alice") - 1_000
        bound = sum(spans_us) + 3 * REPORT_MARGIN_US
        assert 30_000 <= charged <= bound, (charged, spans_us)
        listed = token_cli("list", *where).stdout
        assert "alice" in listed, listed
        log = master.log_text()
        assert log.count("longer than the master saw it run") == 1, log[-3000:]
        assert "cannot read quotas" not in log, log[-3000:]
        assert "cannot write usage" not in log, log[-3000:]
    finally:
        close_master(master)


def test_a_store_poisoned_by_an_older_master_is_repaired(tmp_path: Path):
    data_dir = tmp_path / "data"
    where = ["--data-dir", str(data_dir)]
    create(where, "alice", "client")
    # What an older master left: a REAL in the usage column.
    with sqlite3.connect(data_dir / "rtpool.db") as db:
        db.execute("UPDATE users SET used_us = 9.3e18 WHERE user_name = 'alice'")
        kind = db.execute("SELECT typeof(used_us) FROM users").fetchone()[0]
    assert kind == "real"
    listed = token_cli("list", *where).stdout
    assert "alice" in listed, listed
    assert used_us(data_dir, "alice") == (1 << 63) - 1
    with sqlite3.connect(data_dir / "rtpool.db") as db:
        kind = db.execute("SELECT typeof(used_us) FROM users").fetchone()[0]
    assert kind == "integer", "opening the store did not repair the row"
