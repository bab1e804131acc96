"""Two (or more) ``rtpool master --ha`` processes on one PostgreSQL database, for the HA tests
and ``rtpool bench ha``: a fresh database, masters on fixed loopback ports sharing one set of
tokens, and waits on their ``/leader`` endpoint. Every wait is bounded.
"""

from __future__ import annotations

import glob
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Tuple

from .recovery import _Master

#: How long a master may take to lead (or a standby to take over) before the run is stuck.
LEAD_TIMEOUT_S = 30.0


def free_port() -> int:
    """A loopback port free now (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def psql() -> str:
    """The ``psql`` client of the PostgreSQL install the test server uses."""
    found = shutil.which("psql") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True)), None
    )
    if not found:
        raise RuntimeError("psql not found: install PostgreSQL (Debian: postgresql-client)")
    return found


def fresh_database(url: str, name: str) -> str:
    """Creates database ``name`` on ``url``'s server; returns its URL."""
    subprocess.run(
        [psql(), url, "-q", "-c", f"CREATE DATABASE {name}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return url.rsplit("/", 1)[0] + "/" + name


def is_leader(http: str) -> bool:
    """Whether the master with HTTP address ``http`` answers ``/leader`` 200."""
    try:
        with urllib.request.urlopen(f"http://{http}/leader", timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


def wait_leader(http: str, timeout: float) -> float:
    """Waits until ``http`` leads; returns the monotonic time it was seen leading."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if is_leader(http):
            return time.monotonic()
        time.sleep(0.01)
    raise TimeoutError(f"the master at {http} did not lead within {timeout:g} s")


class HaMaster:
    """An ``rtpool master --ha`` subprocess on a fixed port, restartable, with its HTTP port."""

    def __init__(self, directory: Path, name: str, url: str, lease_ms: int, tokens_from=None):
        self.data = directory / f"data-{name}"
        self.data.mkdir(parents=True, exist_ok=True)
        if tokens_from is not None:  # every master accepts the same tokens
            for f in ("client.token", "worker.token"):
                shutil.copy2(tokens_from / f, self.data / f)
        self.listen = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        args = ["--ha", url, "--http", self.http, "--ha-lease-ms", str(lease_ms)]
        self.m = _Master(self.data, directory / f"master-{name}.log", args, self.listen)

    @property
    def address(self) -> str:
        return self.listen

    def kill(self) -> None:
        self.m.kill()

    def restart(self) -> None:
        self.m.start(self.listen)

    @property
    def pid(self) -> int:
        return self.m.proc.pid


def start_pair(directory: Path, url: str, lease_ms: int) -> Tuple[HaMaster, HaMaster]:
    """Two masters on ``url``: the first leads once it is up, the second stands by."""
    a = HaMaster(directory, "a", url, lease_ms)
    wait_leader(a.http, LEAD_TIMEOUT_S)
    b = HaMaster(directory, "b", url, lease_ms, tokens_from=a.data)
    wait_ready(b.http, LEAD_TIMEOUT_S)
    return a, b


def wait_ready(http: str, timeout: float) -> None:
    """Waits until ``http`` answers ``/readyz`` 200 (a standby once it reached the database)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://{http}/readyz", timeout=0.5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"the master at {http} was not ready within {timeout:g} s")


def wait_standby(http: str, timeout: float) -> None:
    """Waits until ``http``'s status says it stands by (a resumed leader fenced itself)."""
    import json

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://{http}/api/status", timeout=0.5) as r:
                if json.loads(r.read()).get("ha", {}).get("role") == "standby":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise TimeoutError(f"the master at {http} did not stand by within {timeout:g} s")
