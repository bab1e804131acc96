"""Frames above the master's limit (issue 12, item 6): the client knows ``max_frame_bytes``
from the handshake, so an oversized argument fails only that call, before anything is sent, and
the connection keeps serving later calls; an oversized result fails only its task, and the
worker keeps its connection. Against a real master started with ``--max-frame-mb 1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tasks.hostile
from conftest import Workers, close_master, start_master

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _tcp_only(monkeypatch):
    # Payloads in shared memory (issue 16) do not cross TCP, so no frame limit applies to them:
    # these tests are about frames.
    from rtpool import _shm

    monkeypatch.setattr(_shm, "_enabled", False)


@pytest.fixture
def small_frames(tmp_path: Path):
    m = start_master(tmp_path, args=["--max-frame-mb", "1"])
    try:
        yield m
    finally:
        close_master(m)


def test_an_oversized_argument_fails_only_that_call(small_frames, tmp_path: Path) -> None:
    import rtpool

    workers = Workers(small_frames, tmp_path)
    client = rtpool.Client(small_frames.address, small_frames.client_token)
    try:
        workers.start(1)
        assert client.max_frame_bytes == MIB
        before = client.submit(tasks.hostile.sleep_then, 0.5, 1)  # in flight meanwhile
        with pytest.raises(ValueError) as info:
            client.submit(len, b"x" * (2 * MIB))
        text = str(info.value)
        assert "above the master's frame limit of 1048576 bytes" in text, text
        assert "nothing was sent" in text and "--max-frame-mb" in text, text
        size = int(text.split(" pickle to ")[1].split()[0])
        assert 2 * MIB < size < 2 * MIB + 4096, text
        # The same through map() of one item, and submit_many() of one item.
        with pytest.raises(ValueError, match="frame limit"):
            client.submit_many(len, [b"x" * (2 * MIB)])
        # The connection was not touched: the call in flight and later ones complete.
        assert before.result(timeout=30) == 1
        assert client.submit(len, b"x" * (MIB // 2)).result(timeout=30) == MIB // 2
        assert list(client.map(pow, [2, 3], [10, 2], timeout=30)) == [1024, 9]
        assert client.reconnects == 0
    finally:
        client.close()
        workers.stop_all()


def test_an_oversized_result_fails_only_its_task(small_frames, tmp_path: Path) -> None:
    import rtpool

    workers = Workers(small_frames, tmp_path)
    client = rtpool.Client(small_frames.address, small_frames.client_token)
    try:
        workers.start(1)
        pids = {client.submit(tasks.pid_of, 0).result(timeout=30)[1]}
        futures = client.submit_many(tasks.hostile.blob, [100, 2 * MIB, 200]).futures
        assert futures[0].result(timeout=30) == b"x" * 100
        with pytest.raises(ValueError) as info:
            futures[1].result(timeout=30)
        text = str(info.value)
        assert "result pickles to" in text and "frame limit of" in text, text
        assert futures[2].result(timeout=30) == b"x" * 200
        pids.add(client.submit(tasks.pid_of, 1).result(timeout=30)[1])
        assert len(pids) == 1, "the worker process kept its connection"
        log = workers.log_text(0)
        assert "reconnect" not in log, log
    finally:
        client.close()
        workers.stop_all()
