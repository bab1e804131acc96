"""Shared memory for payloads between processes of one host (``docs/protocol.md``,
"Shared-memory payloads").

A large payload's out-of-band buffers are copied once into a ``/dev/shm`` segment and only a
small envelope (tag ``0xB6``: the segment's name and generation, the buffer table and the
pickle stream) crosses TCP; the receiver maps the segment read-only, so a numpy argument is a
read-only view of shared memory. Segments are reused: each process keeps a pool of those it
writes and the mappings of those it read (``_shm_pool.py``, which also says who may rewrite
a segment when).

Lifetimes are explicit, and every file is named after the process that writes it (its pid
and start time, ``rtpool-<pid>-<start>-...``):

* an argument segment is lent by the client for its task: it is free again when the task's
  future resolves (a result, an error, a failure, a cancellation) **and** no worker holds a
  value made from it; the client removes its segments when its last ``Client`` closes, or at
  exit;
* a worker that got its arguments through shared memory writes its large result into a
  segment of its own pool, free again once that client has mapped the result and dropped the
  value (or died); the worker removes its segments when it exits;
* a file whose owner died (``kill -9``) is removed by :func:`sweep`, which the master runs
  every few seconds (``shm_sweep.rs``) and every client runs when it starts; a reader drops
  its mapping of a removed file within a second (:func:`tidy`), so its memory goes too.

Nothing here needs the master: it never reads these payloads.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import secrets
import struct
import sys
import threading
import time
from typing import Any, List, Tuple

from . import _shm_pool
from ._shm_pool import SHM_DIR, start_time


def _env_kib(name: str, default_kib: int) -> int:
    """A size knob from the environment, in KiB (the default when unset or unreadable)."""
    try:
        return max(0, int(os.environ.get(name, default_kib))) * 1024
    except ValueError:
        return default_kib * 1024


#: Prefix of every segment's name.
PREFIX = "rtpool-"
#: First byte of a shared-memory envelope.
SHM_TAG = 0xB6
#: First byte of a reference envelope: a result whose buffers lie in its task's argument
#: segment, sent as offsets into it (no copy).
SHM_REF_TAG = 0xB7
#: Smallest payload (sum of its out-of-band buffers) sent through shared memory; below it,
#: out-of-band buffers travel as TCP segments. ``RTPOOL_SHM_MIN_KB`` overrides it (read once,
#: per process: a client and its workers may differ, each decides what it sends).
#:
#: Measured for issue 25 (docs/benchmarks.md, "The payload curve against a minimal pool",
#: 2026-12-07): one client toggling its transport per round trip against one worker found
#: shared memory 1.04-1.05x faster than TCP segments at 64 KiB (1.13-1.20x at 128 KiB), but
#: ``rtpool bench payload --sizes 64K,1M`` (two workers, the comparators beside) with
#: ``RTPOOL_SHM_MIN_KB=64`` against 256, alternated four times each, was 1.3-1.5x slower at
#: 64 KiB every time. Until that is explained the default stays 256 KiB.
SHM_MIN_BYTES = _env_kib("RTPOOL_SHM_MIN_KB", 256)

#: Seconds between two tidy passes of a process.
TIDY_EVERY_S = 1.0

_HEAD = struct.Struct(">B3xIQHQ")
_NAME = re.compile(r"^rtpool-(\d+)-(\d+)-")
_seq = itertools.count()
_local = threading.local()
_enabled: bool | None = None


_OWNER: str | None = None


def owner() -> str:
    """This process's owner tag: ``<pid>-<start time>`` (stable for the process's life;
    forgotten in a forked child, see :func:`_after_fork`)."""
    global _OWNER
    tag = _OWNER
    if tag is None:
        pid = os.getpid()
        tag = _OWNER = f"{pid}-{start_time(pid) or 0}"
    return tag


def _new_name(owner_tag: str) -> str:
    """The name of a new segment (only a segment the pool creates needs one)."""
    return f"{PREFIX}{owner_tag}-{os.getpid()}.{next(_seq)}.{secrets.token_hex(4)}"


def available() -> bool:
    """Whether this host has a writable ``/dev/shm`` and ``RTPOOL_SHM`` does not say 0."""
    global _enabled
    if _enabled is None:
        flag = os.environ.get("RTPOOL_SHM", "auto").strip().lower()
        _enabled = flag not in ("0", "off", "no", "false") and os.access(SHM_DIR, os.W_OK)
    return _enabled


def set_result_owner(tag: str | None, arg_segment: Tuple[str, int] | None = None) -> None:
    """Record the client that owns the task now running on this thread (from its argument
    envelope): its large result goes to a file named after that client, or over TCP when
    None. ``arg_segment``: the ``(name, generation)`` of the task's argument segment, which
    a result may refer to instead of copying (:func:`refer`)."""
    _local.owner = tag
    _local.arg_segment = arg_segment


def result_owner() -> str | None:
    """The owner recorded by :func:`set_result_owner` on this thread, if any."""
    return getattr(_local, "owner", None)


_pool: _shm_pool.Pool | None = None
_maps: _shm_pool.Mappings | None = None
_attached = 0
_state_lock = threading.Lock()


def pool() -> _shm_pool.Pool:
    """This process's pool of segments it writes."""
    global _pool
    if _pool is None:
        with _state_lock:
            if _pool is None:
                _pool = _shm_pool.Pool()
    return _pool


def mappings() -> _shm_pool.Mappings:
    """This process's cache of the segments it read."""
    global _maps
    if _maps is None:
        with _state_lock:
            if _maps is None:
                _maps = _shm_pool.Mappings()
    return _maps


def write(
    raws: List[memoryview], stream: bytes, owner_tag: str, reader: str = ""
) -> Tuple[bytes, str]:
    """Write the buffers ``raws`` into a segment of this process's pool.

    Args:
        owner_tag: The owner the name of a new segment carries (this process).
        reader: For a result: the owner tag of the client that reads it (the segment is free
            again once that client claimed and dropped it, or died). "" for an argument: the
            caller frees it with :func:`release` when its task is done.

    Returns:
        ``(envelope, name)``: the small payload that crosses TCP, and the segment's name.
    """
    lens = [r.nbytes for r in raws]
    name, gen = pool().write(lambda: _new_name(owner_tag), raws, lens, reader)
    encoded = name.encode()
    head = _HEAD.pack(SHM_TAG, len(raws), len(stream), len(encoded), gen)
    table = struct.pack(f">{len(lens)}Q", *lens)
    return head + table + encoded + stream, name


def write_joined(parts: List[Any], owner_tag: str) -> Tuple[bytes, str]:
    """Write ``parts`` (bytes-like, C-contiguous) back to back as one buffer into a segment of
    this process's pool, for its writer to :func:`release`: a grid-RPC argument payload,
    whose msgpack must be contiguous. Returns ``(envelope, name)``; the envelope's pickle
    stream is empty and its one buffer is the joined parts."""
    lens = [memoryview(p).nbytes for p in parts]
    name, gen = pool().write(lambda: _new_name(owner_tag), parts, lens, "", align=1)
    encoded = name.encode()
    head = _HEAD.pack(SHM_TAG, 1, 0, len(encoded), gen)
    return head + struct.pack(">Q", sum(lens)) + encoded, name


def _address(raw: memoryview) -> int | None:
    """The address of a buffer's first byte (numpy's, when this process has numpy: a read-only
    buffer gives ctypes no address)."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    try:
        return np.frombuffer(raw, dtype=np.uint8).__array_interface__["data"][0]
    except (TypeError, ValueError):
        return None


def note_arguments(buffers: List[memoryview], offsets: List[int]) -> None:
    """Before a task's arguments are unpickled from its segment: where each buffer lies, so
    the ``bytes`` rebuilt from one (:func:`bytes_of`) is known to equal those bytes of the
    segment (a ``bytes`` owns its memory: it is a copy, not a view). Forgotten by
    :func:`forget_arguments`."""
    _local.arg_offsets = {id(b): off for b, off in zip(buffers, offsets)}
    _local.made = {}


def arguments_unpickled() -> None:
    """The arguments noted by :func:`note_arguments` are unpickled: their buffer views are
    gone, and their ids may be another object's from here on."""
    _local.arg_offsets = None


def forget_arguments() -> None:
    """The arguments' ``bytes`` of the task on this thread are no longer results to refer to
    (its result was serialized, or a new task's arguments arrive)."""
    _local.arg_offsets = None
    _local.made = None


def bytes_of(buf: Any) -> bytes:
    """Unpickling side of a top-level ``bytes`` sent out of band: its copy. When ``buf`` lies
    in the argument segment of the task on this thread, the copy is noted with its offset, so
    a result that is this very object refers to the segment (:func:`refer`) rather than being
    written again."""
    b = bytes(buf)
    offsets = getattr(_local, "arg_offsets", None)
    if offsets:
        off = offsets.get(id(buf))
        if off is not None:
            _local.made[id(b)] = (b, off)
    return b


def refer(raws: List[memoryview], stream: bytes) -> bytes | None:
    """A reference envelope for a result whose buffers all lie in the argument segment of the
    task running on this thread (a task that returns its argument, or a slice of it), or None.

    Nothing is copied: the envelope names the segment, its generation and each buffer's
    offset. That segment is the client's and stays lent until the task's future resolves, which
    is after the client has mapped the result (it holds the segment then, as for any value
    read from shared memory), so it cannot be rewritten under the reader.
    """
    seg = getattr(_local, "arg_segment", None)
    if seg is None or _maps is None:
        return None
    name, gen = seg
    made = getattr(_local, "made", None)
    spans = []
    for raw in raws:
        hit = made.get(id(raw.obj)) if made else None
        if hit is not None and hit[0] is raw.obj and raw.nbytes == len(hit[0]):
            off = hit[1]  # the argument's own bytes, copied out of this segment
        else:
            addr = _address(raw)
            off = None if addr is None else _maps.offset_of(name, addr, raw.nbytes)
        if off is None:
            return None
        spans.append(off)
        spans.append(raw.nbytes)
    encoded = name.encode()
    head = _HEAD.pack(SHM_REF_TAG, len(raws), len(stream), len(encoded), gen)
    return head + struct.pack(f">{len(spans)}Q", *spans) + encoded + stream


def _read_head(view: memoryview, words: int) -> Tuple[Tuple[int, ...], str, int, memoryview]:
    """The parts every shared-memory envelope (``0xB6``, ``0xB7``) starts with: ``(table,
    segment name, generation, pickle stream)``, where the table holds ``words`` u64 per
    buffer (1: its length; 2: its offset and length)."""
    try:
        _, nbuf, stream_len, name_len, gen = _HEAD.unpack_from(view, 0)
        pos = _HEAD.size
        table = struct.unpack_from(f">{words * nbuf}Q", view, pos)
    except struct.error as exc:
        raise ValueError(f"truncated shared-memory envelope: {exc}") from None
    pos += 8 * words * nbuf
    name = bytes(view[pos : pos + name_len]).decode()
    pos += name_len
    return table, name, gen, view[pos : pos + stream_len]


def read_refs(view: memoryview) -> Tuple[memoryview, List[memoryview]]:
    """The pickle stream and buffer views of a reference envelope (:func:`refer`): views of
    this process's own argument segment, held like any value read from shared memory.

    Raises:
        ValueError: The segment is not this process's, or a buffer lies outside it.
        FileNotFoundError: The segment is gone or was rewritten.
    """
    spans, name, gen, stream = _read_head(view, 2)
    if owner_of(name) != owner():
        raise ValueError(f"a result refers to shared-memory segment {name}, not one of ours")
    whole = _map(name, gen, claim=False)  # our own argument segment: freed by us
    buffers = []
    for off, n in zip(spans[::2], spans[1::2]):
        if off < _shm_pool.HEADER_BYTES or off + n > whole.nbytes:
            raise ValueError(f"a result refers to bytes {off}-{off + n} outside segment {name}")
        buffers.append(whole[off : off + n])
    return stream, buffers


def read_joined(view: memoryview) -> Tuple[memoryview, str]:
    """The one buffer of an envelope of :func:`write_joined`, a read-only view held until
    it and every value made from it are gone: ``(buffer, name)``."""
    lens, name, gen, stream = _read_head(view, 1)
    if len(lens) != 1 or stream.nbytes:
        raise ValueError("not a shared-memory envelope of one joined buffer")
    (length,) = lens
    whole = _map(name, gen, claim=False)  # arguments: their writer waits for no claim
    if _shm_pool.HEADER_BYTES + length > whole.nbytes:
        raise ValueError(f"shared-memory payload {name} is shorter than its envelope says")
    return whole[_shm_pool.HEADER_BYTES : _shm_pool.HEADER_BYTES + length], name


def read(
    view: memoryview, claim: bool = True
) -> Tuple[memoryview, List[memoryview], List[int], str, int]:
    """Map the segment a shared-memory envelope names, read-only (once per process: the
    mapping is kept), and hold it until every value made from it is gone.

    Args:
        claim: Write the generation into the segment's claimed word (a result: its writer
            waits for that); False for arguments, whose writer frees them itself.

    Returns:
        ``(pickle stream, buffer views, their offsets in the segment, name, generation)``.

    Raises:
        FileNotFoundError: with a message saying why a segment can be missing.
    """
    lens, name, gen, stream = _read_head(view, 1)
    whole = _map(name, gen, claim)
    offsets, end = _shm_pool.layout(list(lens))
    if end > whole.nbytes:
        raise ValueError(f"shared-memory payload {name} is shorter than its envelope says")
    buffers = [whole[off : off + n] for off, n in zip(offsets, lens)]
    return stream, buffers, offsets, name, gen


def _map(name: str, gen: int, claim: bool = True) -> memoryview:
    if "/" in name or not name.startswith(PREFIX):
        raise ValueError(f"bad shared-memory segment name {name!r}")
    tidy()
    try:
        return mappings().view(name, gen, claim)
    except FileNotFoundError as exc:
        if exc.filename is None:
            raise  # rewritten: the message says so
        raise FileNotFoundError(
            f"shared-memory payload {name} is not in {SHM_DIR} on this host: the sender is on "
            "another host (set RTPOOL_SHM=0 on clients whose workers are remote) or it was "
            "already released"
        ) from None


def release(name: str) -> None:
    """The task an argument segment was written for is done: its segment may be reused once
    its readers dropped it."""
    p = _pool
    if p is not None:
        p.release(name)


def attach() -> None:
    """A client of this process starts using shared memory."""
    global _attached
    with _state_lock:
        _attached += 1


def detach() -> None:
    """A client closes: the last one removes this process's segments."""
    global _attached
    with _state_lock:
        _attached = max(0, _attached - 1)
        last = _attached == 0
    if last and _pool is not None:
        _pool.clear()


_last_tidy = 0.0


def tidy() -> None:
    """Drop idle segments and the mappings of removed ones, at most once a second (heartbeat
    threads call it, and every read)."""
    global _last_tidy
    now = time.monotonic()
    if now - _last_tidy < TIDY_EVERY_S:
        return
    _last_tidy = now
    if _pool is not None:
        _pool.tidy()
    if _maps is not None:
        _maps.tidy()


def _after_fork() -> None:
    global _pool, _maps, _attached, _OWNER
    if _pool is not None:
        _pool.forget()
    if _maps is not None:
        _maps.forget()
    _pool = _maps = None
    _attached = 0
    _OWNER = None


def at_exit() -> None:
    """This process exits: remove its segments (but the results on their way to a reader).
    Processes that end with ``os._exit`` call it themselves."""
    if _pool is not None:
        _pool.clear(exiting=True)


os.register_at_fork(after_in_child=_after_fork)
atexit.register(at_exit)


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
        if start_time(pid) != start:
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
