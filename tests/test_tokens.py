"""Per-user tokens: the `rtpool token` CLI on SQLite and PostgreSQL, and store tokens against a
real master (accepted, revoked, wrong role)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import List, Tuple

import pytest

import rtpool
import tasks
from helpers import wait_until
from rtpool import _protocol as P
from rtpool.errors import AuthenticationError


def token_cli(*args: str, expect_rc: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "token", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def create(where: List[str], user: str, role: str, *extra: str) -> Tuple[str, str]:
    """Create a token with the CLI; returns (token, id)."""
    proc = token_cli("create", "--user", user, "--role", role, *where, *extra)
    token = proc.stdout.strip()
    prefix = {"client": "rtc_", "worker": "rtw_"}[role]
    assert re.fullmatch(re.escape(prefix) + r"[A-Za-z0-9_-]{43}", token), proc.stdout
    assert "cannot be shown again" in proc.stderr
    match = re.search(r"token ([0-9a-f]{12}) for user " + re.escape(user), proc.stderr)
    assert match, proc.stderr
    return token, match.group(1)


def listed(where: List[str]) -> dict:
    """`rtpool token list` as {id: [user, role, date, time, revoked, quota..., used...]}."""
    lines = token_cli("list", *where).stdout.split("\n\n")[0].splitlines()
    assert lines[0].split()[:3] == ["ID", "USER", "ROLE"], lines
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def test_cli_creates_lists_revokes_and_sets_quotas(tmp_path: Path):
    data_dir = tmp_path / "data"
    where = ["--data-dir", str(data_dir)]

    token, token_id = create(where, "alice", "client", "--quota-seconds", "2.5")
    _, worker_id = create(where, "alice", "worker")
    rows = listed(where)
    assert set(rows) == {token_id, worker_id}
    assert rows[token_id][:2] == ["alice", "client"]
    assert rows[worker_id][:2] == ["alice", "worker"]
    # user role date time revoked quota used max-priority
    assert rows[token_id][4:] == ["no", "2.5", "s", "0", "s", "-"]

    # Only the SHA-256 is stored, not the token (nor its random part).
    for db_file in data_dir.glob("rtpool.db*"):
        content = db_file.read_bytes()
        assert token.encode() not in content and token[4:].encode() not in content

    token_cli("quota", "--user", "alice", "--unlimited", *where)
    assert listed(where)[token_id][5] == "unlimited"
    out = token_cli("quota", "--user", "alice", "--seconds", "60", *where).stdout
    assert "60 s" in out
    assert listed(where)[token_id][5:7] == ["60", "s"]

    # A user with a quota but no token is listed too.
    token_cli("quota", "--user", "carol", "--seconds", "0.5", *where)
    out = token_cli("list", *where).stdout
    assert out.split("\n\n")[1].splitlines()[2].split() == ["carol", "0.5", "s", "0", "s"]

    out = token_cli("revoke", token_id[:6], *where).stdout
    assert f"revoked client token {token_id} of user alice" in out
    rows = listed(where)
    assert rows[token_id][4] == "yes" and rows[worker_id][4] == "no"


def test_cli_errors_say_what_to_do(tmp_path: Path):
    where = ["--data-dir", str(tmp_path / "data")]
    token_cli("quota", "--user", "u", "--unlimited", *where)  # makes the store
    err = token_cli("revoke", "abcdef", *where, expect_rc=1).stderr
    assert "no token with id" in err and "rtpool token list" in err
    err = token_cli("revoke", "abc", *where, expect_rc=1).stderr
    assert "at least 6 hex characters" in err
    err = token_cli("create", "--user", "two words", "--role", "client", *where, expect_rc=1)
    assert "invalid user name" in err.stderr
    err = token_cli("quota", "--user", "u", "--seconds", "-1", *where, expect_rc=1).stderr
    assert "invalid quota" in err
    err = token_cli("list", "--store", "mysql://u:pw@h/db", *where, expect_rc=1).stderr
    assert "unsupported store" in err and "pw" not in err
    # --seconds or --unlimited is required (argparse: exit 2).
    token_cli("quota", "--user", "u", *where, expect_rc=2)


def test_cli_with_a_sqlite_url(tmp_path: Path):
    db = tmp_path / "elsewhere.db"
    where = ["--store", f"sqlite://{db}", "--data-dir", str(tmp_path / "unused")]
    _, token_id = create(where, "bob", "worker")
    assert db.exists() and not (tmp_path / "unused").exists()
    assert listed(where)[token_id][:2] == ["bob", "worker"]


def test_cli_against_postgres(pg_url: str, tmp_path: Path):
    # The database is shared with other tests and runs: use a user of our own.
    user = f"pg-{uuid.uuid4().hex[:12]}"
    where = ["--store", pg_url, "--data-dir", str(tmp_path / "unused")]
    _, token_id = create(where, user, "client", "--quota-seconds", "1")
    rows = listed(where)
    assert rows[token_id][:2] == [user, "client"]
    assert rows[token_id][4:7] == ["no", "1", "s"]
    token_cli("revoke", token_id, *where)
    assert listed(where)[token_id][4] == "yes"
    err = token_cli("list", "--store", "postgres://nobody@127.0.0.1:1/x", expect_rc=1).stderr
    assert "cannot connect to PostgreSQL at postgres://nobody@127.0.0.1:1/x" in err


def plain_log(master) -> str:
    """The master's log without terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", master.log_text())


def refusal(master, role: str, token: str) -> List[list]:
    """Send a raw HELLO and return every message until the master closes the connection."""
    with socket.create_connection(master.host_port, timeout=10) as sock:
        slots = 1 if role == "worker" else 0
        sock.sendall(P.encode(P.HELLO, P.PROTOCOL_VERSION, role, token, "token-test", slots))
        reader, msgs = P.FrameReader(), []
        while data := sock.recv(65536):
            msgs += reader.feed(data)
    return msgs


def test_store_tokens_against_a_running_master(master, workers):
    where = ["--data-dir", str(master.data_dir)]
    # Created while the master runs: it looks tokens up on every handshake.
    client_token, client_id = create(where, "alice", "client", "--quota-seconds", "100")
    worker_token, _ = create(where, "alice", "worker")

    workers.start(procs=1, token=worker_token)
    with rtpool.Client(master.address, client_token) as client:
        assert client.submit(tasks.square, 7).result(30) == 49
    # Both connections acted for alice, not for the built-in `default` user.
    wait_until(lambda: plain_log(master).count("user=alice") >= 2, timeout=10)

    # A worker token cannot connect a client; the message names the right kind.
    with pytest.raises(AuthenticationError, match="this is a worker token.*use a client token"):
        rtpool.Client(master.address, worker_token)

    token_cli("revoke", client_id, *where)
    with pytest.raises(AuthenticationError, match=r"invalid client token \(unknown or revoked\)"):
        rtpool.Client(master.address, client_token)
    msgs = refusal(master, "client", client_token)
    assert [m[:2] for m in msgs] == [[P.ERROR, "auth"]]
    assert "revoked" in msgs[0][2]

    # The built-in token still works, for user `default`.
    with rtpool.Client(master.address, master.client_token) as client:
        assert client.submit(tasks.square, 3).result(30) == 9
    assert master.proc.poll() is None
