"""A multi-host HA cluster for ``rtpool bench ha netns`` and tests/test_ha_netns.py (issue 28
item 5): every process on a host of its own, a network namespace each
(:mod:`rtpool_bench.netns`):

* ``db``: PostgreSQL (``scripts/pg-test-server`` with ``PG_TEST_LISTEN`` = the host's address);
* ``m1``, ``m2``: ``rtpool master --ha`` each, listening and advertising its own address;
* ``w1``, ``w2``: one ``rtpool worker`` each, given both masters' addresses;
* ``c``: the recording clients (:mod:`rtpool_bench.history`), given both addresses too: they
  follow ``not_leader`` to the leader, no front in between.

The test process reaches every host over the bridge (the masters' ``/leader`` and
``/api/status``, PostgreSQL with ``psql``). :class:`NetCluster` is made once (the network and
the database server); each run gets a fresh database, masters, workers and clients
(:meth:`NetCluster.start_run`), all stopped by PID at its end. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List

from .ha_cluster import LEAD_TIMEOUT_S, fresh_database, psql
from .netns import Network
from .recovery import _stop_group

#: The hosts besides the bridge's own.
HOSTS = ["db", "m1", "m2", "w1", "w2", "c"]
MASTER_HOSTS = ["m1", "m2"]
#: Every master has a host (an address) of its own, so all use the same ports.
PORT, HTTP_PORT = 7070, 8080
_PG_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pg-test-server"


#: The masters' ``--http-token`` (beyond loopback their HTTP listener needs one).
HTTP_TOKEN = "rtpool-netns-test"


def _get(http: str, path: str) -> tuple[int, bytes]:
    """``(status, body)`` of ``GET path`` with the token; ``(0, b"")`` when unreachable."""
    try:
        url = f"http://{http}{path}?token={HTTP_TOKEN}"
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def status(http: str) -> Dict:
    """The master's ``/api/status`` ``ha`` part, or ``{}`` when it does not answer."""
    code, body = _get(http, "/api/status")
    try:
        return json.loads(body).get("ha", {}) if code == 200 else {}
    except ValueError:
        return {}


def is_leader(http: str) -> bool:
    """Whether the master at ``http`` answers ``/leader`` 200."""
    return _get(http, "/leader")[0] == 200


def wait_leader(http: str, timeout: float) -> float:
    """Waits until ``http`` leads; returns the monotonic time it was seen leading."""
    wait_for(lambda: is_leader(http), timeout, f"the master at {http} to lead")
    return time.monotonic()


def wait_for(pred, timeout: float, what: str):
    """``pred()``'s first truthy value, polled every 10 ms; TimeoutError after ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


class NetMaster:
    """``rtpool master --ha`` on host ``host`` (its PID is the master's: ``ip netns exec``
    execs it), restartable on the same address."""

    def __init__(
        self,
        net: Network,
        host: str,
        directory: Path,
        url: str,
        lease_ms: int,
        peer_lease_ms: int = 3000,
    ):
        self.net, self.host = net, host
        self.data = directory / f"data-{host}"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log = directory / f"master-{host}.log"
        self.address = f"{net.ip[host]}:{PORT}"
        self.http = f"{net.ip[host]}:{HTTP_PORT}"
        self.cmd = [sys.executable, "-m", "rtpool", "master", "--listen", self.address]
        self.cmd += ["--advertise", self.address, "--http", self.http, "--ha", url]
        self.cmd += ["--ha-lease-ms", str(lease_ms), "--lease-ms", str(peer_lease_ms)]
        self.cmd += ["--data-dir", str(self.data)]
        self.cmd += ["--http-token", HTTP_TOKEN, "--log-level", "info"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.net.run(self.host, self.cmd),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        wait_for(
            lambda: self.proc.poll() is not None or status(self.http).get("role"),
            LEAD_TIMEOUT_S,
            f"master {self.host} to answer /api/status",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"master {self.host} exited: {self.log.read_text()[-2000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL by PID (a SIGSTOPped one too), and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class NetRun:
    """One run's processes: two masters, workers on ``w1`` and ``w2``, clients on ``c``."""

    def __init__(self, cluster: NetCluster, directory: Path, url: str, opts) -> None:
        self.cluster, self.dir, self.url, self.opts = cluster, directory, url, opts
        net = cluster.net
        self.masters = [
            NetMaster(net, h, directory, url, opts.lease_ms, opts.peer_lease_ms)
            for h in MASTER_HOSTS
        ]
        self.stop_file = directory / "stop"
        self.workers: List[subprocess.Popen] = []
        self.clients: List[subprocess.Popen] = []
        addresses = ",".join(m.address for m in self.masters)
        first, second = self.masters
        first.start()
        wait_for(lambda: is_leader(first.http), LEAD_TIMEOUT_S, "m1 to lead")
        for f in ("client.token", "worker.token"):  # every master accepts the same tokens
            shutil.copy2(first.data / f, second.data / f)
        second.start()
        wait_for(lambda: _get(second.http, "/readyz")[0] == 200, LEAD_TIMEOUT_S, "m2 to be ready")
        wtoken = (first.data / "worker.token").read_text().strip()
        token = (first.data / "client.token").read_text().strip()
        for host in ("w1", "w2"):
            cmd = [sys.executable, "-m", "rtpool", "worker", "--master", addresses]
            cmd += ["--procs", "2", "--token", wtoken, "--reconnect-timeout", "120"]
            self.workers.append(self._spawn(host, cmd, directory / f"worker-{host}.log", {}))
        for c in range(opts.clients):
            cmd = [sys.executable, "-m", "rtpool_bench.history", "client", "--dir", str(directory)]
            cmd += ["--client", str(c), "--address", addresses, "--tasks", str(opts.tasks)]
            cmd += ["--inflight", str(opts.inflight), "--seconds", str(opts.seconds)]
            cmd += ["--stop", str(self.stop_file)]
            env = {"RTPOOL_TOKEN": token}
            self.clients.append(self._spawn("c", cmd, directory / f"client-{c}.log", env))

    def _spawn(self, host: str, cmd: List[str], log: Path, env: Dict) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(
                self.cluster.net.run(host, cmd),
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                start_new_session=True,
            )

    def leader(self) -> NetMaster:
        """The master answering ``/leader`` 200 (bounded wait)."""
        return wait_for(
            lambda: next((m for m in self.masters if is_leader(m.http)), None),
            LEAD_TIMEOUT_S,
            "a leader",
        )

    def other(self, m: NetMaster) -> NetMaster:
        return next(x for x in self.masters if x is not m)

    def finish(self, timeout: float) -> None:
        """Stop submitting; wait (bounded) for the clients to drain and write ``end``."""
        self.stop_file.touch()
        end = time.monotonic() + timeout
        for p in self.clients:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # its history lacks the end event: the checker says so

    def close(self) -> None:
        """Every process of the run stopped by PID (a frozen master is killed too)."""
        for p in self.clients + self.workers:
            _stop_group(p)
        for m in self.masters:
            m.kill()

    def journal_epochs(self) -> Dict[int, List[int]]:
        """``{epoch: [rows, min seq, max seq]}`` of the journal table (seq 0, the compaction's
        meta record, left out)."""
        out = self._query(
            "SELECT epoch, count(*), min(seq), max(seq) FROM rtpool_journal WHERE seq > 0 "
            "GROUP BY epoch ORDER BY epoch"
        )
        rows = [list(map(int, line.split())) for line in out.split("\n") if line.strip()]
        return {r[0]: r[1:] for r in rows}

    def old_epoch_writes_after(self, old: int) -> int:
        """Journal rows of epoch ``old`` (or before) above the first row of a later epoch:
        writes of an old epoch the database accepted after a newer leader wrote (must be 0;
        a package is acknowledged only once its record is committed, so also no package
        acknowledged by the old leader after the new one started)."""
        return int(
            self._query(
                f"SELECT count(*) FROM rtpool_journal WHERE epoch <= {int(old)} AND seq > "
                f"(SELECT min(seq) FROM rtpool_journal WHERE epoch > {int(old)})"
            ).strip()
        )

    def _query(self, sql: str) -> str:
        """``sql``'s rows (``psql -At``), with connect and statement timeouts of 10 s and one
        more try: a fact query must not hang a run, and reading twice changes nothing."""
        env = {**os.environ, "PGCONNECT_TIMEOUT": "10", "PGOPTIONS": "-c statement_timeout=10000"}
        cmd = [psql(), self.url, "-At", "-F", " ", "-c", sql]
        why = ""
        for _ in range(2):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
            except subprocess.TimeoutExpired:
                why = "timed out after 30 s"
                continue
            if out.returncode == 0:
                return out.stdout
            why = out.stderr.strip()
        raise RuntimeError(f"psql on {self.url} failed twice ({why}): {sql}")


class NetCluster:
    """The network of :data:`HOSTS` and PostgreSQL on ``db``; :meth:`close` removes both."""

    def __init__(self) -> None:
        self.net = Network(HOSTS)
        self.pg_dir = tempfile.mkdtemp(prefix="rtpool-pg-netns-")  # reachable by `postgres`
        self._pg_started = False
        try:
            self.url = self._pg("start")
            self._pg_started = True
        except BaseException:
            self.close()
            raise
        self._runs = 0

    def _pg(self, verb: str) -> str:
        env = {**os.environ, "PG_TEST_LISTEN": self.net.ip["db"]}
        out = subprocess.run(
            self.net.run("db", [str(_PG_SCRIPT), verb, self.pg_dir]),
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"pg-test-server {verb} on host db failed: {out.stderr[-2000:]}")
        return out.stdout.strip()

    def pg_stop(self) -> None:
        """PostgreSQL stopped (fast: sessions cut), its data kept."""
        self._pg("stop")

    def pg_resume(self) -> None:
        """PostgreSQL started again on the same data, address and port."""
        self._pg("resume")

    def start_run(self, directory: Path, opts) -> NetRun:
        """A fresh database, then the masters, workers and clients of one run."""
        directory.mkdir(parents=True, exist_ok=True)
        self._runs += 1
        url = fresh_database(self.url, f"rtpool_netns_{os.getpid()}_{self._runs}")
        return NetRun(self, directory, url, opts)

    def close(self) -> None:
        if self._pg_started:
            try:
                self._pg("stop")
            except RuntimeError:
                pass  # already stopped (a failed resume): nothing runs there
            self._pg_started = False
        shutil.rmtree(self.pg_dir, ignore_errors=True)
        self.net.close()


def freeze(m: NetMaster) -> None:
    os.kill(m.pid, signal.SIGSTOP)


def thaw(m: NetMaster) -> None:
    os.kill(m.pid, signal.SIGCONT)
