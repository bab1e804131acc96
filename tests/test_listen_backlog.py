"""The master's listen backlog follows its connection limit (crates/rtpool-master/src/listen.rs):
with tokio's fixed 128 (the standard library's value), a burst of thousands of workers (a
master restart) overflowed the accept queue and waited for SYN retransmissions (`rtpool bench
scale --handshake-concurrency`, docs/benchmarks.md). `ss` shows a listening socket's backlog
as its Send-Q."""

import shutil
import subprocess
from pathlib import Path

import pytest

from rtpool import _native


def _somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


def _listen_backlog(port: int) -> int:
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    # State Recv-Q Send-Q Local Peer: Send-Q of a listening socket is its backlog.
    return int(out[2])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs `ss` (iproute2)")
@pytest.mark.skipif(
    not Path("/proc/sys/net/core/somaxconn").exists() or _somaxconn() <= 1024,
    reason="net.core.somaxconn <= 1024: the kernel caps the backlog below what is checked",
)
def test_listen_backlog_is_sized_for_the_connection_limit():
    with _native.Master(max_connections=3000) as master:
        port = int(master.address.rsplit(":", 1)[1])
        assert _listen_backlog(port) == min(3000, _somaxconn())
