"""Deadlines, hedging and quorum in the SDK: option validation and wire form.

Against the scripted fake master.
"""

from __future__ import annotations

import datetime as dt
import pickle
import time

import pytest

import rtpool
import tasks
from fakemaster import FakeMaster
from rtpool import _protocol as P

SPEC_ORDER = list(P.SUBMIT_OPTION_DEFAULTS)


def recv(conn, kind):
    """The next message of ``kind``, skipping heartbeats and ACKs."""
    return conn.recv_kind(kind, skip=(P.HEARTBEAT, P.ACK))


@pytest.fixture
def fake():
    with FakeMaster() as m:
        yield m


@pytest.fixture
def client(fake):
    c = rtpool.Client(fake.address, "tok", name="unit")
    yield c
    c.close()


# -- options: validation and wire form ---------------------------------------------------------


def test_every_option_goes_on_the_wire_in_spec_order(fake, client):
    view = client.options(
        hedge=True,
        max_copies=5,
        quorum=2,
        replicas=3,
        admit=True,
        on_miss="drop",
        deadline=1.5,
        timeout=3,
        priority=2,
    )
    view.submit(tasks.square, 2)
    opts = fake.accept().recv_kind(P.SUBMIT)[4]
    assert list(opts) == SPEC_ORDER  # "key" in its place, after timeout_ms
    assert {k: v for k, v in opts.items() if k != "key"} == {
        "priority": 2,
        "timeout_ms": 3000,
        "deadline_ms": 1500,
        "on_miss": "drop",
        "admit": True,
        "replicas": 3,
        "quorum": 2,
        "max_copies": 5,
        "hedge": True,
    }
    assert len(opts["key"]) == 32


def test_the_frame_is_canonical_wire_form(fake, client):
    client.options(deadline=2, replicas=2).submit_many(tasks.square, [1, 2])
    conn = fake.accept()
    conn.sock.settimeout(5)
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        data += conn.sock.recv(1 << 16)
    frame = data[: 4 + int.from_bytes(data[:4], "big")]
    msg = P.decode(frame)
    assert list(msg[4]) == ["key", "deadline_ms", "replicas"]
    assert msg[4]["deadline_ms"] == 2000 and msg[4]["replicas"] == 2
    # Byte-exact: encode() normalises opts with submit_opts (spec order, defaults left out)
    # and gives the very same frame.
    assert P.encode(*msg) == frame


def test_defaults_are_left_out(client):
    view = client.options(
        deadline=None, on_miss="run", admit=False, replicas=1, quorum=1, max_copies=0, hedge=False
    )
    assert view._opts == {}
    assert client.options(replicas=None, quorum=None, max_copies=None)._opts == {}


@pytest.mark.parametrize(
    ("seconds", "ms"), [(2, 2000), (0.0101, 11), (1e-7, 1), (0.5, 500), (4_000_000, 4_000_000_000)]
)
def test_relative_deadline_is_rounded_up_to_ms(client, seconds, ms):
    assert client.options(deadline=seconds)._opts == {"deadline_ms": ms}


def test_absolute_deadline_is_converted_at_each_submission(fake, client, monkeypatch):
    now = time.time()
    at = dt.datetime.fromtimestamp(now + 100, dt.timezone.utc)  # aware
    view = client.options(deadline=at)
    assert view._opts == {}  # nothing fixed yet
    monkeypatch.setattr(time, "time", lambda: now + 60)
    view.submit(tasks.square, 1)
    conn = fake.accept()
    ms = conn.recv_kind(P.SUBMIT)[4]["deadline_ms"]
    assert 39_000 < ms <= 40_001
    monkeypatch.setattr(time, "time", lambda: now + 90)
    view.submit_many(tasks.square, [1, 2])
    ms = recv(conn, P.SUBMIT)[4]["deadline_ms"]
    assert 9_000 < ms <= 10_001


def test_naive_datetime_is_local_time(fake, client):
    client.options(deadline=dt.datetime.now() + dt.timedelta(seconds=30)).submit(tasks.noop)
    ms = fake.accept().recv_kind(P.SUBMIT)[4]["deadline_ms"]
    assert 25_000 < ms <= 30_000


def test_absolute_deadline_in_the_past(fake, client, monkeypatch):
    with pytest.raises(ValueError, match="option 'deadline' is in the past"):
        client.options(deadline=dt.datetime.now() - dt.timedelta(seconds=1))
    now = time.time()
    view = client.options(deadline=dt.datetime.fromtimestamp(now + 5))
    monkeypatch.setattr(time, "time", lambda: now + 6)
    with pytest.raises(ValueError, match="in the past"):
        view.submit(tasks.square, 1)
    with pytest.raises(ValueError, match="in the past"):
        view.submit_many(tasks.square, [1])
    monkeypatch.undo()
    client.submit(tasks.square, 3)  # nothing of the refused ones was sent
    assert fake.accept().recv_kind(P.SUBMIT)[5] == [pickle.dumps(((3,), None), 5)]


@pytest.mark.parametrize(
    ("opts", "error", "match"),
    [
        ({"deadline": 0}, ValueError, "option 'deadline' must be a positive number"),
        ({"deadline": -1.0}, ValueError, "option 'deadline' must be a positive"),
        ({"deadline": float("nan")}, ValueError, "option 'deadline'"),
        ({"deadline": float("inf")}, ValueError, "option 'deadline'"),
        ({"deadline": 2**32}, ValueError, "option 'deadline' must be at most"),
        ({"deadline": "5"}, TypeError, "option 'deadline' must be a number of seconds or a dat"),
        ({"deadline": True}, TypeError, "option 'deadline'"),
        ({"deadline": dt.date.today()}, TypeError, "option 'deadline'"),
        ({"on_miss": "skip"}, ValueError, "option 'on_miss' must be 'run' or 'drop'"),
        ({"on_miss": 1}, TypeError, "option 'on_miss' must be a str"),
        ({"replicas": 0}, ValueError, "option 'replicas' must be between 1 and 16, got 0"),
        ({"replicas": 17}, ValueError, "option 'replicas' must be between 1 and 16"),
        ({"replicas": 2.0}, TypeError, "option 'replicas' must be an int"),
        ({"quorum": 0}, ValueError, "option 'quorum' must be between 1 and 16"),
        ({"quorum": 2}, ValueError, r"option 'quorum' \(2\) must be at most 'replicas' \(1\)"),
        ({"replicas": 2, "quorum": 3}, ValueError, "option 'quorum'"),
        ({"max_copies": 17}, ValueError, "option 'max_copies' must be between 0 and 16"),
        ({"max_copies": -1}, ValueError, "option 'max_copies'"),
        ({"replicas": 3, "max_copies": 2}, ValueError, "option 'max_copies' .2. must be at lea"),
        ({"hedge": 1}, TypeError, "option 'hedge' must be True or False"),
        ({"admit": "yes"}, TypeError, "option 'admit' must be True or False"),
        ({"admit": True}, ValueError, "option 'admit' needs a deadline"),
        ({"priority": True}, TypeError, "option 'priority' must be an int"),
    ],
)
def test_bad_option_values_name_the_option(client, opts, error, match):
    with pytest.raises(error, match=match):
        client.options(**opts)


def test_unknown_option_lists_every_valid_one(client):
    with pytest.raises(TypeError) as info:
        client.options(dedline=3)
    assert str(info.value) == (
        "unknown option 'dedline'; valid options: priority, timeout, deadline, on_miss, admit, "
        "replicas, quorum, max_copies, hedge"
    )


def test_options_merge_across_views_and_are_checked_together(client):
    assert client.options(replicas=3).options(quorum=2)._opts == {"replicas": 3, "quorum": 2}
    assert client.options(deadline=5).options(admit=True)._opts == {
        "deadline_ms": 5000,
        "admit": True,
    }
    with pytest.raises(ValueError, match="'quorum' .3. must be at most 'replicas' .2."):
        client.options(replicas=3, quorum=3).options(replicas=2)
    with pytest.raises(ValueError, match="'admit' needs a deadline"):
        client.options(deadline=5, admit=True).options(deadline=None)
    future = dt.datetime.now() + dt.timedelta(hours=1)
    absolute = client.options(deadline=future, admit=True)
    assert absolute._deadline_at is not None and absolute._opts == {"admit": True}
    relative = absolute.options(deadline=2)
    assert relative._deadline_at is None
    assert relative._opts == {"deadline_ms": 2000, "admit": True}
