"""What the bench scripts in this folder share: reading a started master's address."""

from __future__ import annotations

import os
import select
import subprocess
import time


def listening_address(proc: subprocess.Popen, timeout: float) -> tuple[str | None, bytes]:
    """The address a started ``rtpool master`` prints (``listening on ADDR``) on its stdout,
    read for at most ``timeout`` seconds; ``(None, what it printed)`` if it never did."""
    end, out = time.monotonic() + timeout, b""
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
            for line in out.decode(errors="replace").splitlines():
                if line.startswith("listening on "):
                    return line.split()[-1], out
    return None, out
