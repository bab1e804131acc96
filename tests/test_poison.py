"""Poison isolation (issue 12, item 1): tasks that crash the process running them
(SIGKILL, ``os._exit(3)``, a segfault) in a package of ordinary ones, on ``rtpool worker`` with
2 processes. The worker parent keeps both slots alive, the master blames the tasks (retried
within ``max_attempts``, then ``PoisonTaskError`` saying what happened) and every other task
completes with its result.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time

import pytest

import tasks.hostile
from rtpool.errors import PoisonTaskError

# Index -> how the task crashes its process; the others return their index.
POISON = {17: "sigkill", 60: "exit3", 99: "segv", 140: "sigkill", 181: "exit3"}
TOTAL = 200


def _run_mix(client, poison: dict) -> tuple:
    hows = [poison.get(i, "none") for i in range(TOTAL)]
    t0 = time.monotonic()
    package = client.submit_many(tasks.hostile.crash, zip(hows, range(TOTAL)), star=True)
    done, not_done = cf.wait(package.futures, timeout=90)
    return package, time.monotonic() - t0, not_done


def test_poison_tasks_fail_alone_and_the_worker_keeps_its_slots(
    master, workers, client_factory
) -> None:
    worker = workers.start(2)
    client = client_factory()
    package, elapsed, not_done = _run_mix(client, POISON)
    assert not not_done, f"{len(not_done)} of {TOTAL} tasks never finished; {workers.log_text(0)}"
    for i, future in enumerate(package.futures):
        if i not in POISON:
            assert future.result() == i
            continue
        with pytest.raises(PoisonTaskError) as info:
            future.result()
        text = str(info.value)
        if POISON[i] == "sigkill":
            assert "killed by signal 9 (SIGKILL)" in text, text
        elif POISON[i] == "segv":
            assert "killed by signal 11 (SIGSEGV)" in text, text
        else:
            assert "exited with code 3" in text, text
        assert re.search(r"while running it [34] times \(attempt \d+ on worker-\d+: ", text), text
    # The worker is still there and serves a second package (both slots).
    assert worker.poll() is None, workers.log_text(0)
    log = workers.log_text(0)
    assert "not restarting" not in log, log
    # Each death (of a worker process, or of the executor process a retry runs in) is logged
    # with the task that caused it and how. A poison task dies up to max_attempts (3) times;
    # once more when the report of a worker process's death reaches the master while the
    # task's next attempt runs, once less when the master blamed it for a neighbour's crash
    # and it reached the cap before the report moved the blame.
    # (The worker's one line per failed task quotes the same words: not a death of its own.)
    death_lines = "\n".join(line for line in log.splitlines() if " failed: " not in line)
    deaths = re.findall(
        r"(?:killed by signal \d+ \(SIG[A-Z]+\)|exited with code 3) while running task (\d+)",
        death_lines,
    )
    per_task = {task: deaths.count(task) for task in set(deaths)}
    assert len(per_task) == len(POISON), log
    assert all(1 <= n <= 4 for n in per_task.values()), (per_task, log)
    assert len(deaths) >= 2 * len(POISON), (per_task, log)
    again = client.map(tasks.hostile.crash, ["none"] * 20, range(20), timeout=60)
    assert list(again) == list(range(20))


@pytest.mark.slow
def test_poison_mix_completion_time_against_no_poison(master, workers, client_factory) -> None:
    """Prints the completion time of 200 tasks with and without 5 poison ones, alternated
    3 times in one run (the figure for the issue's note; not an assertion on speed)."""
    workers.start(2)
    client = client_factory()
    clean, mixed = [], []
    for _ in range(3):
        package, elapsed, not_done = _run_mix(client, {})
        assert not not_done and [f.result() for f in package.futures] == list(range(TOTAL))
        clean.append(elapsed)
        package, elapsed, not_done = _run_mix(client, POISON)
        assert not not_done
        assert sum(isinstance(f.exception(), PoisonTaskError) for f in package.futures) == 5
        mixed.append(elapsed)
    print(
        "\npoison mix (200 tasks, 2 worker processes): no poison "
        + ", ".join(f"{t:.3f}" for t in clean)
        + " s; 5 poison in 200 "
        + ", ".join(f"{t:.3f}" for t in mixed)
        + " s"
    )


# -- the parent's restart policy, without processes ---------------------------------------------


def _supervisor():
    import argparse

    from rtpool.worker._supervisor import Supervisor

    return Supervisor(argparse.Namespace(procs=1), "token")


def test_a_slot_is_restarted_however_often_it_dies_with_a_capped_backoff() -> None:
    sup = _supervisor()
    delays = []
    for pid in range(100, 130):  # 30 deaths of one slot within a second, before any task
        sup._on_exit(pid, 0, 9)  # waitpid status of a SIGKILL
        delays.append(sup.due.pop(0) - time.monotonic())
    assert all(d <= 2.0 for d in delays), delays
    assert delays[0] <= 0.1 and delays[-1] >= 1.5, delays
    assert sup.exit_code == 0
    # A child that completed a task before dying (a poison task among good ones) is not a
    # crash loop: the count starts again.
    slot = sup.board.slot(0)
    slot.task_started(1, 1, time.perf_counter_ns())
    slot.task_ended()
    sup._on_exit(131, 0, 9)
    assert sup.due.pop(0) - time.monotonic() <= 0.1


def test_a_tasks_exit_code_is_the_tasks_crash_not_the_childs_verdict() -> None:
    sup = _supervisor()
    slot = sup.board.slot(0)
    slot.session(3000, 77)
    slot.task_started(5, 1, time.perf_counter_ns())
    sup._on_exit(200, 0, 3 << 8)  # os._exit(3) inside task 5: EXIT_LOST's value
    assert sup.due.pop(0), "the slot is restarted"
    ((instance, entry),) = sup.reports[0]
    assert instance == 77 and entry[:3] == [5, 1, 5]
    assert entry[3] == b"worker process exited with code 3 while running task 5"
    # The same exit code from an idle child is its own verdict (master unreachable): not
    # restarted; nor is a bad token (2). A retired child (4) is replaced at once.
    sup.board.clear(0)
    sup._on_exit(201, 0, 3 << 8)
    assert 0 not in sup.due and sup.exit_code == 3
    sup._on_exit(202, 0, 4 << 8)
    assert sup.due.pop(0) <= time.monotonic()


def test_a_slot_record_reads_back_every_field_its_child_wrote() -> None:
    from rtpool.worker._board import SlotBoard

    board = SlotBoard(3)
    slot = board.slot(1)
    slot.session(3000, 2**63 + 5)
    slot.beat()
    slot.task_started(2**64 - 1, 7, 123_456_789)
    state = board.read(1)
    assert (state.task_id, state.attempt, state.busy, state.completed) == (2**64 - 1, 7, True, 0)
    assert (state.lease_ms, state.instance, state.started_ns) == (3000, 2**63 + 5, 123_456_789)
    assert 0 < state.beat_ns <= time.perf_counter_ns()
    slot.task_ended()
    slot.task_started(9, 1, 5)
    slot.task_ended()
    state = board.read(1)
    assert (state.task_id, state.busy, state.completed, state.lease_ms) == (9, False, 2, 3000)
    assert board.read(0) == board.read(2) == (0, 0, False, 0, 0, 0, 0, 0), "neighbours untouched"


def test_the_suspect_ring_remembers_the_latest_tasks_that_killed_a_child() -> None:
    from rtpool.worker._board import SUSPECTS, SlotBoard

    board = SlotBoard(2)
    assert not board.is_suspect(0), "an empty ring names no task, not even task 0"
    board.add_suspect(0)
    board.add_suspect(2**64 - 2)
    assert board.slot(1).board.is_suspect(0) and board.is_suspect(2**64 - 2)
    for task in range(1, SUSPECTS + 1):
        board.add_suspect(task)
    assert not board.is_suspect(0) and board.is_suspect(SUSPECTS)  # the oldest went first
    # Entries 1 << 32 and 2 (stored + 1) lie side by side: their bytes hold those of
    # (2 << 32) + 1 across the boundary, which is not an entry.
    board = SlotBoard(1)
    board.add_suspect((1 << 32) - 1)
    board.add_suspect(1)
    assert board.is_suspect((1 << 32) - 1) and board.is_suspect(1)
    assert not board.is_suspect(2 << 32)


def test_a_task_a_sibling_died_running_is_suspect_before_the_parent_reaps_it() -> None:
    from rtpool.worker._board import SlotBoard

    board = SlotBoard(2)
    board.slot(0).task_started(41, 1, 7)  # then slot 0's child dies: its record stays
    assert board.slot(1).board.is_suspect(41) and not board.is_suspect(42)
    board.slot(0).task_ended()
    assert not board.is_suspect(41)
