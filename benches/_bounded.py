"""One command run to its end or to a timeout, in its own process group (killed whole past
the timeout and after it ends: a worker that outlived its cluster goes too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Mapping, Sequence


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_json(argv: Sequence[str], shown: str, timeout: float, env: Mapping | None = None):
    """The JSON the command prints; SystemExit naming ``shown`` if it runs past ``timeout``
    seconds or prints no JSON."""
    proc = subprocess.Popen(
        list(argv),
        env=None if env is None else dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        raise SystemExit(f"{shown} ran past {timeout:g} s; stopped") from None
    finally:
        _kill_group(proc.pid)
    try:
        return json.loads(out)
    except ValueError:
        raise SystemExit(f"{shown} printed no JSON (exit {proc.returncode})") from None
