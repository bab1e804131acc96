"""The master's journal end to end: what a restart recovers, and what it refuses to start on.

Byte-level truncation at every offset and corruption at every field are tested in the journal's
own Rust tests (``crates/rtpool-master/src/journal/tests.rs``); here a real master process
writes the journal, and a real master process (or the embedded one) reads it back.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rtpool
from rtpool import _native
from rtpool.errors import RtpoolError

_MAGIC = b"RTJ1"
# [magic u32][len u32][crc u32][lsn u64][payload]: all little-endian after the magic.
_HEADER = 4 + 4 + 4 + 8


def _records(path: Path) -> list:
    """(offset, total length) of every record in a journal file, by walking the frames."""
    data = path.read_bytes()
    out, off = [], 0
    while off + _HEADER <= len(data):
        assert data[off : off + 4] == _MAGIC, f"no record at offset {off}"
        (length,) = struct.unpack_from("<I", data, off + 4)
        total = _HEADER + length
        out.append((off, total))
        off += total
    assert off == len(data), f"{len(data) - off} trailing bytes"
    return out


def _fill(data_dir: Path, packages: int, fsync: str = "always") -> list:
    """Journal `packages` packages of 3 queued tasks each (no workers), cleanly stopped."""
    m = _native.Master(data_dir=str(data_dir), options={"fsync": fsync})
    ids = []
    try:
        # Not `with Client`: its exit waits for the futures, and no worker runs them. When the
        # master stops, the connection drops and the packages stay in the journal, detached;
        # with reconnection off the futures then fail at once.
        c = rtpool.Client(m.address, m.client_token, reconnect_timeout=0)
        for i in range(packages):
            pkg = c.submit_many(pow, [(i, 2), (i, 3), (i, 4)], star=True)
            ids.append(pkg.id)
        c.shutdown(wait=False)
    finally:
        m.stop()
    return ids


def test_restart_restores_queued_packages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ids = _fill(data, 5)
    assert len(set(ids)) == 5
    m = _native.Master(data_dir=str(data))
    try:
        s = m.stats()
        assert s["replay_packages"] == 5, s
        assert s["packages"] == 5 and s["queued"] == 15, s
        assert s["replay_records"] >= 5
    finally:
        m.stop()


def test_corruption_in_the_middle_refuses_to_start_and_names_the_offset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _fill(data, 6)
    journal = data / "journal.log"
    records = _records(journal)
    assert len(records) >= 7  # meta + 6 packages
    off, total = records[3]
    raw = bytearray(journal.read_bytes())
    raw[off + _HEADER + total // 3] ^= 0x5A  # a payload byte of a record with more after it
    journal.write_bytes(bytes(raw))
    before = journal.read_bytes()
    with pytest.raises(RtpoolError, match=rf"offset {off}\b"):
        _native.Master(data_dir=str(data))
    assert journal.read_bytes() == before, "a refused journal must not be modified"
    # The command-line master exits non-zero with the same message.
    proc = subprocess.run(
        [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
        + ["--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"offset {off}" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("cut", [1, 5, 17, -1])
def test_torn_tail_is_cut_back_to_the_last_whole_record(tmp_path: Path, cut: int) -> None:
    data = tmp_path / "data"
    _fill(data, 4)
    journal = data / "journal.log"
    records = _records(journal)
    last_off, last_len = records[-1]
    keep = last_off + (cut if cut > 0 else last_len - 1)
    with open(journal, "r+b") as f:
        f.truncate(keep)
    m = _native.Master(data_dir=str(data))
    try:
        s = m.stats()
        # The torn record (the last package, or its end) is gone; the others are back.
        assert s["replay_packages"] in (3, 4), s
        assert s["packages"] == s["replay_packages"]
    finally:
        m.stop()
    assert journal.stat().st_size >= last_off
    _records(journal)  # whole records only, again


def test_no_journal_option_keeps_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    m = _native.Master(data_dir=str(data), options={"journal": False})
    try:
        assert "journal_records" not in m.stats()
    finally:
        m.stop()
    assert not (data / "journal.log").exists()


def test_fsync_always_acknowledges_after_the_record_is_on_disk(tmp_path: Path) -> None:
    data = tmp_path / "data"
    m = _native.Master(data_dir=str(data), options={"fsync": "always"})
    try:
        c = rtpool.Client(m.address, m.client_token, reconnect_timeout=0)  # see _fill()
        before = m.stats()["journal_fsyncs"]
        t0 = time.monotonic()
        pkg = c.submit_many(pow, [(2, 3)], star=True)
        assert pkg.id is not None
        assert time.monotonic() - t0 < 30
        # The package id is known only after ACCEPTED, sent after its fsync.
        assert m.stats()["journal_fsyncs"] > before
        c.shutdown(wait=False)
    finally:
        m.stop()


def test_local_cluster_passes_data_dir_and_master_options(tmp_path: Path) -> None:
    with rtpool.LocalCluster(
        workers=1, data_dir=tmp_path / "d", master_options={"fsync": "always"}
    ) as cluster:
        with cluster.client() as c:
            assert c.submit(pow, 2, 5).result(timeout=60) == 32
        assert cluster._master.stats()["journal_fsyncs"] >= 1
    assert (tmp_path / "d" / "journal.log").stat().st_size > 0
    with pytest.raises(
        ValueError, match="unknown master option 'bogus'|unknown master option \"bogus\""
    ):
        rtpool.LocalCluster(workers=0, master_options={"bogus": 1})
