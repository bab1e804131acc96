"""The ACK of a small complete package waits for the client's next frame and rides in front
of it, in the same write (``_connection/acks.py``); closing sends what waits."""

from __future__ import annotations

import pickle
import select

import pytest

import rtpool
import tasks
from fakemaster import FakeMaster
from helpers import wait_until
from rtpool import _protocol as P


def _entry(index, value):
    return [index, P.STATUS_OK, pickle.dumps(value, 5), 0, 0, 0, 0, 0, 0]


@pytest.fixture
def fake():
    # A long heartbeat: no HEARTBEAT frames, and the heartbeat thread's tick (1 s) sends
    # deferred ACKs only after they have waited that long.
    with FakeMaster(heartbeat_ms=60000) as m:
        yield m


def _one_result(fake, client, value):
    fut = client.submit(tasks.square, value)
    conn = fake.accept()
    submit = conn.recv_kind(P.SUBMIT)
    conn.send(P.ACCEPTED, submit[1], 7)
    conn.send(P.RESULTS, 7, [_entry(0, value * value)])
    assert fut.result(5) == value * value
    return conn


def test_the_ack_of_a_small_package_rides_in_front_of_the_next_submit(fake):
    client = rtpool.Client(fake.address, "tok")
    try:
        conn = _one_result(fake, client, 3)
        # The reader keeps the ACK back, and nothing went out on the wire meanwhile.
        wait_until(lambda: 7 in client._conn._ack_later)
        assert select.select([conn.sock], [], [], 0)[0] == []
        client.submit(tasks.square, 4)
        assert conn.recv() == [P.ACK, 7, 1]
        # Both frames came in one read: the SUBMIT is already parsed, not read again.
        assert conn._msgs and conn._msgs[0][0] == P.SUBMIT
    finally:
        client.close()


def test_closing_sends_the_acks_that_wait(fake):
    client = rtpool.Client(fake.address, "tok")
    conn = _one_result(fake, client, 5)
    client.close()
    seen = []
    while (msg := conn.recv()) is not None:
        seen.append(msg)
    assert [P.ACK, 7, 1] in seen
