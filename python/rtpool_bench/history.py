"""The history recorder of issue 28's checker: a client process that submits packages of tasks
and writes down every event it sees, for :mod:`rtpool_bench.history_check` to judge.

Each client (a separate process, ``python -m rtpool_bench.history client ...``) submits
packages one after another, at most ``--inflight`` of them unfinished at a time, until it has
submitted ``--packages`` or the stop file appears or ``--seconds`` pass. Task ``i`` of package
``p`` of client ``c`` returns :func:`expected_value` of ``(c, p, i)``, so a result that belongs
to another task, or to no task at all, is told from the right one.

Every event is one JSON line in ``DIR/client-C.jsonl``, stamped with ``time.monotonic()``
(``CLOCK_MONOTONIC``: one clock for every process of the machine, so the fault driver's
``kill`` events line up with the clients' results):

* ``invoke``: ``{c, p, n}``, just before ``submit_many`` (the package is owed only once
  acknowledged);
* ``ack``: ``{c, p, id}``, the master's ``ACCEPTED`` (the package id);
* ``submit_error``: ``{c, p, error}``, the submission failed or was never acknowledged within
  ``ACK_WAIT_S``: the package is indeterminate, it may or may not complete. A refusal the
  master says is passing (``ERROR rejected``: its journal database is unreachable, "retry
  shortly") also gets ``"retry": true``; the client then pauses (``REJECTED_PAUSE_S``,
  doubling to ``REJECTED_PAUSE_MAX_S``) before its next package, so an outage of the
  database does not use up its packages at once;
* ``result``: ``{c, p, i, value}``, a task's value as its future resolved;
* ``fail``: ``{c, p, i, error}``, a task's future failed (``ResultsLost``, a connection lost);
* ``pending``: ``{c, p, i}`` at the end, for a future still unresolved after the drain;
* ``start`` and ``end`` of the client, with its counts.

The file is flushed line by line (no fsync: the client processes outlive the master's faults;
a client killed itself would leave a history that ends early, which the checker reports).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Sequence

#: How long a client waits for a package's ``ACCEPTED`` (across a master restart) before it
#: gives up on it and calls the submission indeterminate.
ACK_WAIT_S = 60.0
#: How long a client waits at the end for its last results before writing ``pending`` events.
DRAIN_S = 60.0
#: The pause after a passing refusal (the journal database unreachable), doubling up to the max.
REJECTED_PAUSE_S, REJECTED_PAUSE_MAX_S = 0.1, 1.0


def is_passing_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the master's refusal of a package while its journal database is out
    of reach (``ERROR rejected`` saying to retry shortly): the package was not acknowledged,
    the same one later may be."""
    from rtpool.errors import SubmitRejected

    return isinstance(exc, SubmitRejected) and "journal database is unreachable" in str(exc)


def expected_value(c: int, p: int, i: int) -> str:
    """The value task ``(c, p, i)`` must return: its own coordinates, spelled out."""
    return f"c{c}.p{p}.i{i}"


def history_task(c: int, p: int, i: int) -> str:
    """The task every history client submits: returns :func:`expected_value` of its triple."""
    return expected_value(c, p, i)


def history_path(directory: Path, client: int) -> Path:
    """The history file of client ``client`` in ``directory``."""
    return Path(directory) / f"client-{client}.jsonl"


class Recorder:
    """Appends events as JSON lines, stamped with ``time.monotonic()``, from any thread."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"t": time.monotonic(), "type": kind, **fields})
        with self._lock:
            if self._file.closed:
                return  # a future cancelled by the client's close, after the `end` event
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _Room:
    """How many futures are unresolved, and a wait until there is room for ``n`` more."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    def take(self, n: int, until: float, stop: Path | None) -> bool:
        """Reserve ``n``; False when the time is up or the stop file exists first."""
        with self._cond:
            while self.used + n > self.limit:
                if time.monotonic() >= until or (stop is not None and stop.exists()):
                    return False
                self._cond.wait(0.05)
            self.used += n
            return True

    def give(self, n: int = 1) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


def _on_done(rec: Recorder, c: int, p: int, i: int, room: _Room):
    def callback(fut) -> None:
        try:
            value = fut.result(0)
        except BaseException as e:  # the future's own failure, recorded as such
            rec.record("fail", c=c, p=p, i=i, error=f"{type(e).__name__}: {e}")
        else:
            rec.record("result", c=c, p=p, i=i, value=value)
        room.give()

    return callback


def _wait_ack(rec: Recorder, pkg, c: int, p: int) -> bool | None:
    """Record the package's ``ACCEPTED`` (``ack``) or why there is none (``submit_error``).
    Returns True when acknowledged, None when refused for a passing reason, else False."""
    end = time.monotonic() + ACK_WAIT_S
    while True:
        try:
            rec.record("ack", c=c, p=p, id=pkg.id)
            return True
        except TimeoutError as e:
            # The master is down and the client is reconnecting: the SUBMIT is still queued
            # and will be sent again with its idempotency key; keep waiting, bounded.
            if time.monotonic() >= end:
                rec.record("submit_error", c=c, p=p, error=f"TimeoutError: {e}")
                return False
        except Exception as e:
            if is_passing_refusal(e):
                rec.record("submit_error", c=c, p=p, error=f"{type(e).__name__}: {e}", retry=True)
                return None
            rec.record("submit_error", c=c, p=p, error=f"{type(e).__name__}: {e}")
            return False


def _pause(seconds: float, until: float, stop: Path | None) -> None:
    """Sleeps ``seconds`` at most, less if the time budget ends or the stop file appears."""
    end = min(time.monotonic() + seconds, until)
    while time.monotonic() < end and not (stop is not None and stop.exists()):
        time.sleep(min(0.02, max(0.0, end - time.monotonic())))


def run_client(args: argparse.Namespace) -> int:
    """Submit packages until done, stopped or out of time; record everything. Returns 0."""
    import rtpool

    rec = Recorder(history_path(args.dir, args.client))
    c, n = args.client, args.tasks
    rec.record("start", c=c, pid=os.getpid(), tasks=n, inflight=args.inflight)
    client = rtpool.Client(args.address, args.token, name=f"history-{c}")
    room = _Room(args.inflight * n)  # at most `inflight` packages unresolved at a time
    futures: List[Any] = []
    stop, end = Path(args.stop) if args.stop else None, time.monotonic() + args.seconds
    submitted, pause = 0, REJECTED_PAUSE_S
    try:
        for p in range(args.packages):
            # Room first (bounded by the time budget): a master that is down does not make
            # the client's queue grow.
            if (stop is not None and stop.exists()) or not room.take(n, end, stop):
                break
            rec.record("invoke", c=c, p=p, n=n)
            try:
                pkg = client.submit_many(history_task, [(c, p, i) for i in range(n)], star=True)
            except Exception as e:
                rec.record("submit_error", c=c, p=p, error=f"{type(e).__name__}: {e}")
                room.give(n)
                continue
            submitted += 1
            for i, fut in enumerate(pkg.futures):
                fut.add_done_callback(_on_done(rec, c, p, i, room))
            futures += [(p, i, f) for i, f in enumerate(pkg.futures)]
            if _wait_ack(rec, pkg, c, p) is None:
                # Refused while the master's journal database is unreachable: back off before
                # the next package (bounded by the budget), as a real client retries.
                _pause(pause, end, stop)
                pause = min(pause * 2, REJECTED_PAUSE_MAX_S)
            else:
                pause = REJECTED_PAUSE_S
        drain_end = time.monotonic() + DRAIN_S
        for _, _, fut in futures:
            try:
                fut.exception(max(0.0, drain_end - time.monotonic()))
            except Exception:
                pass  # timed out or cancelled: recorded below, or by its callback
        pending = [(p, i) for p, i, f in futures if not f.done()]
        for p, i in pending:
            rec.record("pending", c=c, p=p, i=i)
        rec.record("end", c=c, packages=submitted, pending=len(pending))
    finally:
        client.close()
        rec.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rtpool_bench.history client ...``: one recording client."""
    ap = argparse.ArgumentParser(prog="python -m rtpool_bench.history", description=__doc__)
    sub = ap.add_subparsers(dest="verb", required=True)
    cl = sub.add_parser("client", help="run one recording client")
    cl.add_argument("--dir", type=Path, required=True, help="where client-C.jsonl goes")
    cl.add_argument("--client", type=int, required=True, help="this client's number")
    cl.add_argument("--address", required=True, help="the master, HOST:PORT")
    cl.add_argument("--token", default=os.environ.get("RTPOOL_TOKEN"), help="client token")
    cl.add_argument("--packages", type=int, default=1000, help="packages at most (1000)")
    cl.add_argument("--tasks", type=int, default=10, help="tasks per package (10)")
    cl.add_argument("--inflight", type=int, default=4, help="unfinished packages at most (4)")
    cl.add_argument("--seconds", type=float, default=120.0, help="submission budget (120 s)")
    cl.add_argument("--stop", default=None, help="stop submitting once this file exists")
    args = ap.parse_args(argv)
    for name in ("packages", "tasks", "inflight"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not args.token:
        ap.error("no client token: pass --token or set RTPOOL_TOKEN")
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
