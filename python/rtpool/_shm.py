"""Shared memory for payloads between processes of one host (``docs/protocol.md``,
"Shared-memory payloads").

A large payload's out-of-band buffers are written once into a ``/dev/shm`` file and only a
small envelope (tag ``0xB6``: the file's name, the buffer table and the pickle stream) crosses
TCP; the receiver maps the file read-only, so a numpy argument is a read-only view of shared
memory.

Lifetimes are explicit, and every file is named after the process that owns it (its pid and
start time, ``rtpool-<pid>-<start>-...``):

* an argument file belongs to the client that submitted the task; the client removes it when
  the task's future resolves (a result, an error, a failure, a cancellation);
* a result file is named after that same client (the worker reads the owner from the argument
  envelope) and the client removes it as soon as it mapped it (it is the only reader);
* a file whose owner died (``kill -9`` of a client) is removed by :func:`sweep`, which the
  master runs every few seconds (``shm_sweep.rs``) and every client runs when it starts.

Nothing here needs the master: it never reads these payloads.
"""

from __future__ import annotations

import itertools
import mmap
import os
import re
import secrets
import struct
import threading
from typing import List, Tuple

#: Directory of the segments (tmpfs on Linux).
SHM_DIR = "/dev/shm"
#: Prefix of every segment's name.
PREFIX = "rtpool-"
#: First byte of a shared-memory envelope.
SHM_TAG = 0xB6
#: Smallest payload (sum of its out-of-band buffers) sent through shared memory.
SHM_MIN_BYTES = 256 * 1024
#: Buffers start at multiples of this many bytes in the file.
ALIGN = 64

_HEAD = struct.Struct(">B3xIQH")
_NAME = re.compile(r"^rtpool-(\d+)-(\d+)-")
_seq = itertools.count()
_local = threading.local()
_enabled: bool | None = None


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


_OWNER: str | None = None


def owner() -> str:
    """This process's owner tag: ``<pid>-<start time>`` (stable for the process's life)."""
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or not _OWNER.startswith(f"{pid}-"):
        _OWNER = f"{pid}-{_start_time(pid) or 0}"
    return _OWNER


def available() -> bool:
    """Whether this host has a writable ``/dev/shm`` and ``RTPOOL_SHM`` does not say 0."""
    global _enabled
    if _enabled is None:
        flag = os.environ.get("RTPOOL_SHM", "auto").strip().lower()
        _enabled = flag not in ("0", "off", "no", "false") and os.access(SHM_DIR, os.W_OK)
    return _enabled


def set_result_owner(tag: str | None) -> None:
    """Record the client that owns the task now running on this thread (from its argument
    envelope): its large result goes to a file named after that client, or over TCP when
    None."""
    _local.owner = tag


def result_owner() -> str | None:
    """The owner recorded by :func:`set_result_owner` on this thread, if any."""
    return getattr(_local, "owner", None)


def write(raws: List[memoryview], stream: bytes, owner_tag: str) -> Tuple[bytes, str]:
    """Write the buffers ``raws`` into a new segment owned by ``owner_tag``.

    Returns:
        ``(envelope, name)``: the small payload that crosses TCP, and the segment's name.
    """
    name = f"{PREFIX}{owner_tag}-{os.getpid()}.{next(_seq)}.{secrets.token_hex(4)}"
    lens = [r.nbytes for r in raws]
    offsets, pos = [], 0
    for n in lens:
        pos += -pos % ALIGN
        offsets.append(pos)
        pos += n
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, max(pos, 1))
        for raw, off in zip(raws, offsets):
            view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], off + done)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    encoded = name.encode()
    head = _HEAD.pack(SHM_TAG, len(raws), len(stream), len(encoded))
    table = struct.pack(f">{len(lens)}Q", *lens)
    return head + table + encoded + stream, name


def read(view: memoryview) -> Tuple[memoryview, List[memoryview], str]:
    """Map the segment a shared-memory envelope names, read-only.

    Returns:
        ``(pickle stream, buffer views, name)``.

    Raises:
        FileNotFoundError: with a message saying why a segment can be missing.
    """
    _, nbuf, stream_len, name_len = _HEAD.unpack_from(view, 0)
    pos = _HEAD.size
    lens = struct.unpack_from(f">{nbuf}Q", view, pos)
    pos += 8 * nbuf
    name = bytes(view[pos : pos + name_len]).decode()
    pos += name_len
    stream = view[pos : pos + stream_len]
    if "/" in name or not name.startswith(PREFIX):
        raise ValueError(f"bad shared-memory segment name {name!r}")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shared-memory payload {name} is not in {SHM_DIR} on this host: the sender is on "
            "another host (set RTPOOL_SHM=0 on clients whose workers are remote) or it was "
            "already released"
        ) from None
    try:
        size = os.fstat(fd).st_size
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    whole = memoryview(mapped)
    buffers, off = [], 0
    for n in lens:
        off += -off % ALIGN
        buffers.append(whole[off : off + n])
        off += n
    return stream, buffers, name


def owner_of(name: str) -> str | None:
    """The ``<pid>-<start>`` owner tag in a segment's name."""
    m = _NAME.match(name)
    return f"{m.group(1)}-{m.group(2)}" if m else None


def unlink(name: str) -> None:
    """Remove a segment (mappings stay valid until released); a missing one is fine."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def sweep() -> int:
    """Remove every segment whose owner process is gone; returns how many."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        m = _NAME.match(name)
        if m is None:
            continue
        pid, start = int(m.group(1)), int(m.group(2))
        if _start_time(pid) != start:
            unlink(name)
            removed += 1
    return removed


def leftovers(owner_tag: str | None = None) -> List[str]:
    """Names of the segments in ``/dev/shm`` (of one owner, when given): for tests."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    want = PREFIX + (f"{owner_tag}-" if owner_tag else "")
    return sorted(n for n in names if n.startswith(want))
