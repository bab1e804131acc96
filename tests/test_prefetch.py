"""Latency-aware prefetch (issue 13): a worker far from its master queues enough tasks to keep
working while its credits travel, and no more than its bound allows.

The end-to-end figure (rate against ideal at 0/50/100 ms of added round trip) is a benchmark,
``rtpool bench prefetch``; these tests check the mechanism, against a scripted master that
answers each ``PULL`` 100 ms late (a far master) and counts how many tasks the worker holds.
"""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest

import tasks
from fakemaster import FakeMaster
from rtpool import _protocol as P
from rtpool import _serialize as S
from rtpool.worker import WorkerConnection, adaptive_prefetch
from rtpool.worker._latency import WINDOW, RoundTrip
from rtpool.worker._prefetch import RTT_CAP_NS

SLEEP = S.serialize_function(tasks.sleep_return)[1]
HASH = b"\x02" * 32


def test_prefetch_covers_the_round_trip_within_its_bounds():
    ms = 1_000_000
    assert adaptive_prefetch(20 * ms, 64) == 1  # near master: one queued, for balance
    assert adaptive_prefetch(20 * ms, 64, 50 * ms) == 5  # (2 + 100) ms of 20 ms tasks
    assert adaptive_prefetch(20 * ms, 64, 100 * ms) == 10
    assert adaptive_prefetch(20 * ms, 4, 100 * ms) == 4  # --prefetch still caps it
    # A high estimate counts up to RTT_CAP_NS: at most ~1 s of work held.
    far = adaptive_prefetch(20 * ms, 1000, 10_000 * ms)
    assert far == adaptive_prefetch(20 * ms, 1000, RTT_CAP_NS) == 50


def test_round_trip_is_the_windowed_minimum_of_pull_to_first_assign():
    rt = RoundTrip()
    rt.on_pull(3, 0)
    rt.on_assign(3, 5_000)  # a PULL answered in full: a sample
    assert rt.rtt_ns == 5_000
    rt.on_pull(3, 6_000)
    rt.on_assign(1, 7_000)  # answered in part (the master ran out of work): no sample
    rt.on_assign(2, 9_000)  # the rest of its credits: no sample either
    assert rt.rtt_ns == 5_000
    rt.on_pull(1, 10_000)
    rt.on_assign(1, 900_000)  # an idle master answered late: the minimum holds
    assert rt.rtt_ns == 5_000
    for i in range(WINDOW):  # the path got slower: the old sample leaves the window
        rt.on_pull(1, i * 1_000_000)
        rt.on_assign(1, i * 1_000_000 + 40_000)
    assert rt.rtt_ns == 40_000
    rt.on_pull(2, 0)
    rt.withdraw()  # RETURN: credits withdrawn, nothing to sample
    rt.on_assign(1, 10**9)
    assert rt.rtt_ns == 40_000
    rt.reset()
    assert rt.rtt_ns == 0


def test_credits_parked_at_an_idle_master_are_no_sample():
    # A sequential client: the worker keeps 3 credits at the master, each task spends one,
    # and each PULL after a task queues behind the 2 left parked there. Its delay is the
    # client's think time (50 ms), not the path's 0.2 ms.
    rt = RoundTrip()
    ms = 1_000_000
    rt.on_pull(3, 0)
    rt.on_assign(3, ms // 5)  # tasks were waiting: a sample of the path
    assert rt.rtt_ns == ms // 5
    rt.on_pull(3, ms)  # after them: the master has none left, the credits park
    for i in range(1, 3 * WINDOW):
        now = i * 50 * ms
        rt.on_assign(1, now)  # the client's next task
        rt.on_pull(1, now + ms)  # its result, with a credit behind the 2 parked ones
    assert rt.rtt_ns == ms // 5


def test_sequential_tasks_with_think_time_do_not_raise_the_round_trip(master, client_factory):
    """Against a real master: a package (tasks waiting) measures the path; then one task at a
    time with 50 ms between them, for more than a window of PULLs, must not raise it (with the
    PULL -> first ASSIGN delay of every PULL it rose to ~100 ms, 2 think times)."""
    worker = WorkerConnection(
        master.address, master.worker_token, "seq-worker", max_prefetch=2, reconnect_timeout=None
    )
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    client = client_factory()
    try:
        assert list(client.map(tasks.add, range(300), range(300))) == [2 * i for i in range(300)]
        measured = worker.round_trip.rtt_ns
        assert measured > 0, "a package with tasks waiting gave no sample"
        for i in range(2 * WINDOW):
            assert client.submit(tasks.add, i, 1).result(timeout=10) == i + 1
            time.sleep(0.05)  # the client's think time: the workload, not a wait for a state
        assert worker.round_trip.rtt_ns <= measured, (
            f"{worker.round_trip.rtt_ns / 1e6:.1f} ms after think time, "
            f"{measured / 1e6:.1f} ms measured with tasks waiting"
        )
    finally:
        worker.stopping = True
        os.write(worker._wake_w, b"\0")
        thread.join(10)


class FarMaster:
    """Answers each PULL with that many 20 ms tasks, 100 ms later (a master 100 ms away),
    and tracks how many tasks the worker holds (assigned, no result yet)."""

    def __init__(self, conn, total: int) -> None:
        self.conn = conn
        self.total = total
        self.next_task = 1
        self.held = 0
        self.most_held = 0
        self.results = 0
        self.lock = threading.Lock()
        self.timers = []
        self.returned: list = []
        self.gen = 0

    def _assign(self, n: int, timer_gen: int) -> None:
        with self.lock:
            if timer_gen != self.gen:
                return  # credits withdrawn by a RETURN meanwhile
            ids = self.returned[:n]
            del self.returned[:n]
            fresh = min(n - len(ids), self.total + 1 - self.next_task)
            ids += range(self.next_task, self.next_task + fresh)
            self.next_task += fresh
            if not ids:
                return
            self.held += len(ids)
            self.most_held = max(self.most_held, self.held)
            args = pickle.dumps(((0, 0.02), None), 5)
            self.conn.send(P.ASSIGN, [[t, 1, HASH, SLEEP, args, 0] for t in ids])

    def serve(self, deadline: float) -> None:
        while self.results < self.total and time.monotonic() < deadline:
            msg = self.conn.recv(10)
            assert msg is not None, "the worker closed its connection"
            if msg[0] == P.PULL:
                timer = threading.Timer(0.1, self._assign, (msg[1], self.gen))
                timer.start()
                self.timers.append(timer)
            elif msg[0] == P.RETURN:  # unstarted tasks back, and the credits withdrawn
                with self.lock:
                    self.held -= len(msg[1])
                    self.returned += [t for t, _ in msg[1]]
                    self.gen += 1
            elif msg[0] == P.RESULT:
                with self.lock:
                    self.held -= len(msg[1])
                    self.results += len(msg[1])
        for timer in self.timers:
            timer.cancel()


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


def test_a_worker_100_ms_away_queues_enough_20_ms_tasks_to_hide_the_round_trip(fake):
    worker = WorkerConnection(fake.address, "tok", "far-worker", reconnect_timeout=None)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    conn = fake.accept()
    master = FarMaster(conn, total=40)
    try:
        master.serve(deadline=time.monotonic() + 30)
        assert master.results == 40
        # Without the round trip it holds 2 (one running, one queued) and idles ~80 ms of
        # every 100; covering 2 round trips of 20 ms tasks takes 1 + 10.
        assert master.most_held >= 6, f"held at most {master.most_held} tasks"
        assert master.most_held <= 1 + adaptive_prefetch(20_000_000, 64, RTT_CAP_NS)
        assert 80_000_000 <= worker.round_trip.rtt_ns < 1_000_000_000
    finally:
        conn.close()
        thread.join(10)
