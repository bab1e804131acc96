"""Task output reaches the client (issue 26, item 6): what tasks print and log on real
``rtpool worker`` processes comes back with their results, in order and with the right task,
also for a task that fails, times out or crashes its process; a task printing 100 MB is
bounded (the figures are printed, not asserted as timings)."""

from __future__ import annotations

import logging
import time

import pytest

import rtpool
import tasks.output as out
from rtpool.errors import PoisonTaskError, TaskTimeoutError

BOUND = 64 * 1024  # the worker's default --task-output-kb


def _expected(i: int, lines: int = 3) -> list:
    return (
        [("stdout", "".join(f"out {i}.{k}\n" for k in range(lines)))]
        + [("stderr", f"err {i}\n"), ("log", f"WARNING tests.chatty: log {i}")]
        + [("stdout", f"last {i}\n")]
    )


def test_prints_and_log_records_reach_the_client_in_order_with_their_task(workers, client_factory):
    workers.start(2)
    seen = []
    client = client_factory(task_output=lambda index, o: seen.append((index, o)))
    package = client.submit_many(out.chatty, range(12))
    assert [f.result(timeout=30) for f in package.futures] == [i * i for i in range(12)]
    for i, future in enumerate(package.futures):
        assert future.logs.records == _expected(i), i
        assert future.logs.dropped == 0
        assert future.logs.worker.endswith(("/0", "/1")), future.logs.worker
    # The callback saw each task once, by its index, with the same records.
    assert sorted(i for i, _ in seen) == list(range(12))
    assert all(o.records == _expected(i) for i, o in seen)
    # Both worker processes ran some (12 tasks of 3 prints each on two processes).
    quiet = client.submit(pow, 2, 10)
    assert quiet.result(timeout=30) == 1024 and quiet.logs is None  # nothing printed


def test_output_is_shown_on_the_clients_stderr_prefixed_by_task_and_worker(
    workers, client_factory, capsys
):
    workers.start(1)
    client = client_factory()  # the default: stderr
    assert client.submit(out.chatty, 4, 1).result(timeout=30) == 16
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("(task 0 @ worker ")]
    assert [line.split(") ", 1)[1] for line in lines] == [
        "out 4.0",
        "err 4",
        "WARNING tests.chatty: log 4",
        "last 4",
    ], err
    silent = client_factory(task_output=None)
    future = silent.submit(out.chatty, 5, 1)
    assert future.result(timeout=30) == 25 and future.logs.records == _expected(5, 1)
    assert "out 5.0" not in capsys.readouterr().err


def test_output_can_go_to_a_logger(workers, client_factory, caplog):
    workers.start(1)
    client = client_factory(task_output=logging.getLogger("tests.task_output"))
    with caplog.at_level(logging.INFO, logger="tests.task_output"):
        assert client.submit(out.chatty, 2, 1).result(timeout=30) == 4
    got = [(r.levelname, r.getMessage().split(") ", 1)[1]) for r in caplog.records]
    assert got == [
        ("INFO", "out 2.0"),
        ("WARNING", "err 2"),
        ("WARNING", "WARNING tests.chatty: log 2"),
        ("INFO", "last 2"),
    ]


def test_a_bad_task_output_option_is_refused_before_connecting():
    with pytest.raises(TypeError, match="task_output must be 'stderr', None, a logging.Logger"):
        rtpool.Client("127.0.0.1:1", "token", task_output=42)


def test_a_failed_or_timed_out_task_keeps_what_it_printed(workers, client_factory):
    workers.start(1)
    client = client_factory(task_output=None)
    failed = client.submit(out.print_then_fail, "before the error")
    with pytest.raises(ValueError, match="failed after printing"):
        failed.result(timeout=30)
    assert failed.logs.records == [("stdout", "before the error\n")]
    slow = client.options(timeout=0.5).submit(out.print_then_sleep, "before the kill", 30)
    with pytest.raises(TaskTimeoutError):
        slow.result(timeout=30)
    assert slow.logs.records == [("stdout", "before the kill\n")]


@pytest.mark.parametrize("connection", ["process", "host"])
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_task_that_crashes_its_process_still_delivers_what_it_printed(
    workers, client_factory, connection, how
):
    workers.start(1, "--connection", connection)
    client = client_factory(task_output=None)
    crashed = client.submit(out.print_then_crash, f"last words ({how})", how)
    with pytest.raises(PoisonTaskError):
        crashed.result(timeout=60)
    assert crashed.logs is not None, workers.log_text(0)
    assert crashed.logs.records == [("stdout", f"last words ({how})\n")]
    # The pool goes on, and the next task's output is its own.
    after = client.submit(out.chatty, 1, 1)
    assert after.result(timeout=30) == 1 and after.logs.records == _expected(1, 1)


def test_a_task_printing_100_mb_is_bounded(workers, client_factory):
    workers.start(1)
    client = client_factory(task_output=None)
    before = client.submit(out.peak_rss_kib).result(timeout=30)
    t0 = time.monotonic()
    loud = client.submit(out.print_megabytes, 100)
    peak = loud.result(timeout=120)
    elapsed = time.monotonic() - t0
    logs = loud.logs
    kept = sum(len(t.encode()) for _, t in logs.records)
    assert kept <= BOUND and logs.dropped > 0
    assert kept + logs.dropped + 5 * len(logs.records) >= 100 * 1024 * 1024
    assert logs.text.endswith(f"... {logs.dropped} bytes dropped\n")
    # Figures, not assertions on time: the worker process's peak RSS before and after.
    print(
        f"\n100 MiB printed in {elapsed:.2f} s; client got {kept} bytes + marker "
        f"({logs.dropped} dropped); worker peak RSS {before} KiB before, {peak} KiB after"
    )
    # And the master still answers at once: a no-op task after it.
    assert client.submit(pow, 3, 3).result(timeout=30) == 27
