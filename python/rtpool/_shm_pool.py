"""Reused shared-memory segments: the writer's pool and the reader's cache of mappings.

Writing 16 MiB into a fresh ``/dev/shm`` file costs a tmpfs page allocation per 4 KiB (15-25 ms
here), and mapping it costs a page-table entry per 4 KiB (1-2 ms); copying into pages that are
already there and mapped costs about 0.7 ms. So each process keeps the segments it wrote
(:class:`Pool`) and the mappings of the segments it read (:class:`Mappings`), and a segment is
written again only when nobody reads it any more.

Who may rewrite a segment is decided by ``flock``, which the kernel releases with the process:

* a reader takes ``LOCK_SH`` on its own open file of the segment before it reads, and drops it
  when the last value made from it is garbage collected (a read-only view hands out a ctypes
  object whose finalizer counts the uses); a reader killed with ``kill -9`` drops it too;
* the writer rewrites a segment only under ``LOCK_EX | LOCK_NB``, so never under a reader;
* a reader also writes the segment's generation into its ``claimed`` word, so the writer knows
  a result was picked up (before that, an unlocked segment is not free: its reader has not come
  yet); a result never claimed is taken back when its reader process is gone or after
  :data:`UNCLAIMED_S`;
* each write bumps the segment's generation, which the envelope carries: a reader that comes
  after a rewrite (a second copy of a task whose first copy already finished) gets an error
  instead of someone else's data.

Segment file layout: a 64-byte header (magic, generation, claimed generation; native byte
order, both ends are on one host), then the buffers, each at a multiple of 64.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Tuple

#: Directory of the segments (tmpfs on Linux).
SHM_DIR = "/dev/shm"
#: Bytes before the first buffer of a segment.
HEADER_BYTES = 64
_MAGIC = b"rtpoolS2"
_GEN = struct.Struct("=Q")
#: Smallest segment (bytes); larger ones come in 8 sizes per doubling (at most 1/8 unused).
MIN_SEGMENT_BYTES = 1 << 20
#: A free segment unused this long is removed (seconds).
POOL_IDLE_S = 30.0
#: A result segment its reader never claimed is taken back after this long (seconds): the
#: master's default result TTL, past which the result cannot be delivered anyway.
UNCLAIMED_S = 600.0
#: A cached mapping unused this long is dropped (seconds).
MAP_IDLE_S = 60.0
#: Free bytes a pool keeps at most (``RTPOOL_SHM_POOL_MB``, default 512): above it, a segment
#: is removed when it is freed.
DEFAULT_POOL_MB = 512

_FREE, _LENT_ARG, _LENT_RESULT = 0, 1, 2

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def segment_bytes(need: int) -> int:
    """The size of the segment that holds ``need`` bytes (header included)."""
    if need <= MIN_SEGMENT_BYTES:
        return MIN_SEGMENT_BYTES
    step = 1 << ((need - 1).bit_length() - 3)
    return -(-need // step) * step


def layout(lens: List[int], align: int = 64) -> Tuple[List[int], int]:
    """``(offsets, end)`` of buffers of ``lens`` bytes in a segment, each at a multiple of
    ``align`` (1: back to back)."""
    offsets, pos = [], HEADER_BYTES
    for n in lens:
        pos += -pos % align
        offsets.append(pos)
        pos += n
    return offsets, pos


def _pool_cap_bytes() -> int:
    try:
        return max(0, int(os.environ.get("RTPOOL_SHM_POOL_MB", DEFAULT_POOL_MB))) << 20
    except ValueError:
        return DEFAULT_POOL_MB << 20


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def _alive(owner_tag: str) -> bool:
    pid, _, start = owner_tag.partition("-")
    try:
        return start_time(int(pid)) == int(start)
    except ValueError:
        return False


class _Segment:
    """One segment of a :class:`Pool`: its file, writable mapping and state."""

    __slots__ = ("name", "fd", "map", "size", "gen", "state", "reader", "since")

    def __init__(self, name: str, fd: int, mapped: mmap.mmap, size: int) -> None:
        self.name, self.fd, self.map, self.size = name, fd, mapped, size
        self.gen = 0
        self.state = _FREE
        self.reader = ""  # the owner tag of a result's reader
        self.since = time.monotonic()

    def claimed(self) -> int:
        return _GEN.unpack_from(self.map, 16)[0]

    def close(self, unlink: bool) -> None:
        if unlink:
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass
        self.map.close()
        os.close(self.fd)


class Pool:
    """The segments one process writes, by size, reused once their readers are gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_size: Dict[int, List[_Segment]] = {}
        self._by_name: Dict[str, _Segment] = {}
        self._cap = _pool_cap_bytes()
        #: Segments created and writes into reused ones (for tests and the bench).
        self.created = 0
        self.reused = 0

    def _reusable(self, seg: _Segment, now: float) -> bool:
        state = seg.state
        if state == _LENT_ARG:
            return False  # its task is not done
        if state == _LENT_RESULT and seg.claimed() != seg.gen:
            if now - seg.since < UNCLAIMED_S and (not seg.reader or _alive(seg.reader)):
                return False  # its reader may still come
        try:
            fcntl.flock(seg.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a reader still holds a value made from it
        return True

    def write(
        self,
        name_for: Callable[[], str],
        raws: List[Any],
        lens: List[int],
        reader: str,
        align: int = 64,
    ) -> Tuple[str, int]:
        """Write ``raws`` into a free segment (or a new one); returns ``(name, generation)``.

        Args:
            name_for: Makes the name of a new segment (called only when one is created: a
                reused segment costs no name, no random bytes).
            reader: The owner tag of the reader of a result ("" for an argument, which its
                writer frees with :meth:`release`).
            align: Each buffer starts at a multiple of this (1: one contiguous buffer).
        """
        offsets, end = layout(lens, align)
        size = segment_bytes(end)
        now = time.monotonic()
        with self._lock:
            seg = None
            for cand in self._by_size.get(size, ()):
                if self._reusable(cand, now):
                    seg = cand
                    self.reused += 1
                    break
            if seg is None:
                seg = self._create(name_for(), size)
            seg.gen += 1
            seg.state = _LENT_RESULT if reader else _LENT_ARG
            seg.reader = reader
            seg.since = now
        try:
            mapped = seg.map
            for raw, off, n in zip(raws, offsets, lens):
                mapped[off : off + n] = raw
            _GEN.pack_into(mapped, 8, seg.gen)
        finally:
            fcntl.flock(seg.fd, fcntl.LOCK_UN)
        return seg.name, seg.gen

    def _create(self, name: str, size: int) -> _Segment:
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED | _POPULATE)
            mapped[: len(_MAGIC)] = _MAGIC
        except BaseException:
            os.unlink(path)
            os.close(fd)
            raise
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else has it open
        seg = _Segment(name, fd, mapped, size)
        self._by_size.setdefault(size, []).append(seg)
        self._by_name[name] = seg
        self.created += 1
        return seg

    def release(self, name: str) -> None:
        """The writer is done with an argument segment (its task's future resolved): free it
        for reuse once its readers drop it; above the pool's cap, remove it."""
        with self._lock:
            seg = self._by_name.get(name)
            if seg is None:
                return
            seg.state = _FREE
            seg.since = time.monotonic()
            if self._free_bytes() > self._cap:
                self._drop(seg)

    def _free_bytes(self) -> int:
        return sum(s.size for s in self._by_name.values() if s.state == _FREE)

    def _drop(self, seg: _Segment) -> None:
        self._by_size[seg.size].remove(seg)
        del self._by_name[seg.name]
        seg.close(unlink=True)

    def tidy(self) -> None:
        """Remove the free segments unused for :data:`POOL_IDLE_S`."""
        now = time.monotonic()
        with self._lock:
            for seg in list(self._by_name.values()):
                if seg.state == _LENT_ARG or now - seg.since < POOL_IDLE_S:
                    continue
                if seg.state == _LENT_RESULT:
                    if not self._reusable(seg, now):
                        continue
                    fcntl.flock(seg.fd, fcntl.LOCK_UN)
                self._drop(seg)

    def names(self) -> List[str]:
        """Names of the pool's segments."""
        with self._lock:
            return sorted(self._by_name)

    def lent(self) -> List[str]:
        """Names of the segments lent to readers (arguments not yet released, results not yet
        free): for tests."""
        now = time.monotonic()
        with self._lock:
            out = []
            for seg in self._by_name.values():
                if seg.state == _FREE or (seg.state == _LENT_RESULT and self._reusable(seg, now)):
                    if seg.state == _LENT_RESULT:
                        fcntl.flock(seg.fd, fcntl.LOCK_UN)
                    continue
                out.append(seg.name)
            return sorted(out)

    def clear(self, exiting: bool = False) -> None:
        """Remove every segment (a reader keeps its mapping; a new one finds none).

        Args:
            exiting: The process exits: a result its reader did not claim yet keeps its file
                (the reader may still be on its way to it); the master's sweep removes it
                once this process is gone.
        """
        now = time.monotonic()
        with self._lock:
            for seg in self._by_name.values():
                keep = (
                    exiting
                    and seg.state == _LENT_RESULT
                    and seg.claimed() != seg.gen
                    and now - seg.since < UNCLAIMED_S
                )
                seg.close(unlink=not keep)
            self._by_size.clear()
            self._by_name.clear()

    def forget(self) -> None:
        """After ``fork()`` in the child: the segments are the parent's."""
        for seg in self._by_name.values():
            os.close(seg.fd)
        self._by_size.clear()
        self._by_name.clear()


class _Mapping:
    """A reader's mapping of one segment: its own open file (the ``LOCK_SH`` is on it), the
    read-only mapping's address and the uses that hold the lock."""

    __slots__ = ("name", "fd", "addr", "size", "users", "last", "export", "__weakref__")

    def __init__(self, name: str, fd: int, addr: int, size: int) -> None:
        self.name, self.fd, self.addr, self.size = name, fd, addr, size
        self.users = 0
        self.last = time.monotonic()
        self.export = _export_type(size)


_export_types: Dict[int, type] = {}


def _export_type(size: int) -> type:
    """A ctypes array type of ``size`` bytes that takes weak references (its instances are
    the buffer exporters whose finalizers count a mapping's uses)."""
    cls = _export_types.get(size)
    if cls is None:
        cls = type(f"SharedBytes{size}", (ctypes.c_char * size,), {})
        _export_types[size] = cls
    return cls


class Mappings:
    """The segments one process reads, mapped once and kept while their files exist."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # finalizers may run inside a locked section (GC)
        self._maps: Dict[str, _Mapping] = {}

    def view(self, name: str, gen: int, claim: bool = True) -> memoryview:
        """A read-only view of the whole segment ``name`` at generation ``gen``; the segment
        is held (``LOCK_SH``) until the view and every view or value made from it are gone.
        With ``claim``, the generation is written into the segment's claimed word (a result's
        writer reuses it only once claimed; an argument's writer needs no claim: one syscall
        less per argument).

        Raises:
            FileNotFoundError: The segment is gone or was rewritten (its writer freed it).
        """
        with self._lock:
            m = self._maps.get(name)
            if m is None:
                m = self._open(name)
            if m.users == 0:
                fcntl.flock(m.fd, fcntl.LOCK_SH)
            m.users += 1
            m.last = time.monotonic()
        try:
            now = ctypes.c_uint64.from_address(m.addr + 8).value
            if now != gen:
                raise FileNotFoundError(
                    f"shared-memory payload {name} was released by its writer (generation "
                    f"{now}, not {gen}): its task already ended"
                )
            if claim and ctypes.c_uint64.from_address(m.addr + 16).value != gen:
                os.pwrite(m.fd, _GEN.pack(gen), 16)  # claimed: its writer may reuse it later
            exporter = m.export.from_address(m.addr)
            weakref.finalize(exporter, self._unuse, m)
        except BaseException:
            self._unuse(m)
            raise
        return memoryview(exporter).cast("B").toreadonly()

    def offset_of(self, name: str, addr: int, nbytes: int) -> int | None:
        """Where ``nbytes`` at address ``addr`` lie in this process's mapping of ``name``,
        while a value made from it holds it; None if they are not all in it."""
        with self._lock:
            m = self._maps.get(name)
            if m is None or not m.users:
                return None
            off = addr - m.addr
            if off < HEADER_BYTES or off + nbytes > m.size:
                return None
            return off

    def _open(self, name: str) -> _Mapping:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise ValueError(f"shared-memory segment {name} is too short ({size} bytes)")
            addr = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | _POPULATE, fd, 0)
            if addr in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise OSError(err, f"mmap of {name}: {os.strerror(err)}")
        except BaseException:
            os.close(fd)
            raise
        m = _Mapping(name, fd, addr, size)
        self._maps[name] = m
        return m

    def _unuse(self, m: _Mapping) -> None:
        with self._lock:
            m.users -= 1
            if m.users == 0:
                try:
                    fcntl.flock(m.fd, fcntl.LOCK_UN)
                except OSError:
                    pass  # closed by forget() after a fork

    def tidy(self) -> None:
        """Drop the unused mappings of removed segments, and those idle for
        :data:`MAP_IDLE_S` (a removed segment's memory lives as long as a mapping of it)."""
        now = time.monotonic()
        with self._lock:
            for m in list(self._maps.values()):
                if m.users:
                    continue
                try:
                    gone = os.fstat(m.fd).st_nlink == 0
                except OSError:
                    gone = True
                if gone or now - m.last > MAP_IDLE_S:
                    self._close(m)

    def _close(self, m: _Mapping) -> None:
        del self._maps[m.name]
        _munmap(m.addr, m.size)
        os.close(m.fd)

    def names(self) -> List[str]:
        """Names of the mapped segments: for tests."""
        with self._lock:
            return sorted(self._maps)

    def forget(self) -> None:
        """After ``fork()`` in the child: keep the mappings (values may use them), drop the
        files, whose locks are the parent's."""
        for m in self._maps.values():
            os.close(m.fd)
            m.fd = -1
        self._maps = {}
