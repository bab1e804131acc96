"""The slot board: a page of memory the worker parent shares with its children, so that it
knows what a child was doing when it died or stopped answering.

Each child writes into its slot's record: the task it runs in its own process (set before the
call, cleared after: two ``struct.pack_into`` per task, no system call), the master instance and
lease of its session, and a heartbeat stamp its heartbeat thread refreshes. The parent reads
the record

* when the child dies: a death while a task ran is that task's (the parent logs the task and
  the signal, and the replacement child reports it to the master, which blames the task). The
  parent also puts the task in the board's *suspect ring*: its retries, on any child of this
  worker, run in an executor process, where a crash costs a fork rather than a child;
* while the child lives: a task running for longer than the lease while the heartbeat stamp
  is that old means the task holds the GIL (the heartbeat thread cannot run). The parent kills
  the child before the master's lease expires and says so, instead of a bare "worker lost".

The record is written by the child only (the parent only reads it) and read by the parent
when the child is dead or, for the heartbeat check, where a torn read costs at most one late
check. An anonymous ``MAP_SHARED`` mapping is inherited by ``fork``.
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import NamedTuple

# task id, attempt, state (2 * tasks completed in the child's own process, + 1 while one runs
# there), started_ns, lease_ms, instance, beat_ns (the heartbeat thread's last round). The
# fields a task start writes are adjacent: one ``pack_into`` per task start, one per end.
# Stamps are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC: the same clock in every process).
_RECORD = struct.Struct("<QIIqI4xQq")
_START = struct.Struct("<QIIq")  # task, attempt, state, started_ns: one write when a task starts
_TASK = struct.Struct("<QII")
_BUSY = struct.Struct("<I")
_BUSY_OFFSET = 12
_SESSION = struct.Struct("<I4xQ")  # lease_ms, instance
_SESSION_OFFSET = 24
_BEAT = struct.Struct("<q")
_BEAT_OFFSET = 40


class SlotState(NamedTuple):
    """A copy of one slot's record."""

    #: The task running in the child's own process (valid when ``busy``).
    task_id: int
    attempt: int
    #: Whether a task runs in the child's own process now.
    busy: bool
    #: Tasks the child completed in its own process (it did useful work: not a crash loop).
    completed: int
    #: The lease of the child's session (0: not connected yet).
    lease_ms: int
    #: The master instance of the child's session.
    instance: int
    #: ``time.perf_counter_ns()`` of the heartbeat thread's last round (0: none yet).
    beat_ns: int
    #: ``time.perf_counter_ns()`` of when the running task started.
    started_ns: int


#: Tasks that killed a child of this worker, remembered (the latest) so that their retries run
#: in an executor process wherever they land among this worker's children.
SUSPECTS = 256
_SUSPECTS = struct.Struct(f"<{SUSPECTS}Q")
_INDEX = struct.Struct("<Q")


class SlotBoard:
    """The parent's board of ``slots`` records and the suspect ring (see the module
    docstring)."""

    def __init__(self, slots: int) -> None:
        self._slots = max(1, slots)
        self._suspects_at = self._slots * _RECORD.size
        self._map = mmap.mmap(-1, self._suspects_at + _INDEX.size + _SUSPECTS.size)
        # This process's copy of the suspect ring as of the ring's count (is_suspect).
        self._ring: set = set()
        self._ring_count = 0

    def slot(self, index: int) -> Slot:
        """The writer handle a child uses for its record."""
        return Slot(self._map, index * _RECORD.size, self)

    def add_suspect(self, task_id: int) -> None:
        """Remember a task that killed a child (the parent is the only writer)."""
        (n,) = _INDEX.unpack_from(self._map, self._suspects_at)
        at = self._suspects_at + _INDEX.size + (n % SUSPECTS) * 8
        _INDEX.pack_into(self._map, at, (task_id + 1) % 2**64)  # 0 is an empty entry
        _INDEX.pack_into(self._map, self._suspects_at, n + 1)

    def is_suspect(self, task_id: int) -> bool:
        """Whether ``task_id`` killed a child of this worker lately.

        Also true while a slot's record still shows the task running: its child died with it
        (or lost it) and the parent has not reaped it yet. The master requeues the task as soon
        as the connection drops, so its retry can reach a sibling before the parent notices.

        Asked for every task assigned more than once, which includes each task a worker gave
        back and got again (often, under a prefetch of no-op tasks): the ring is unpacked
        (10 us) only when its count moved since this process last looked, else a set answers.
        """
        (count,) = _INDEX.unpack_from(self._map, self._suspects_at)
        if count != self._ring_count:
            # add_suspect writes the entry before the count: a count read here covers it.
            ring = set(_SUSPECTS.unpack_from(self._map, self._suspects_at + _INDEX.size))
            ring.discard(0)  # empty entries
            self._ring, self._ring_count = ring, count
        if (task_id + 1) % 2**64 in self._ring:
            return True
        for index in range(self._slots):
            task, _, state = _TASK.unpack_from(self._map, index * _RECORD.size)
            if state & 1 and task == task_id:
                return True
        return False

    def read(self, index: int) -> SlotState:
        """A copy of slot ``index``'s record."""
        fields = _RECORD.unpack_from(self._map, index * _RECORD.size)
        task, attempt, state, started_ns, lease_ms, instance, beat_ns = fields
        busy, completed = bool(state & 1), state >> 1
        return SlotState(task, attempt, busy, completed, lease_ms, instance, beat_ns, started_ns)

    def clear(self, index: int) -> None:
        """Zero slot ``index``'s record (before its child is started)."""
        off = index * _RECORD.size
        self._map[off : off + _RECORD.size] = bytes(_RECORD.size)


class Slot:
    """A child's writer handle on its record."""

    __slots__ = ("_buf", "_off", "board", "_state")

    def __init__(self, buf: mmap.mmap, offset: int, board: SlotBoard) -> None:
        self._buf = buf
        self._off = offset
        #: The whole board (the child reads the suspect ring).
        self.board = board
        self._state = 0  # 2 * tasks completed here

    def task_started(self, task_id: int, attempt: int, now_ns: int) -> None:
        """A task starts running in this process at ``now_ns`` (``time.perf_counter_ns()``)."""
        _START.pack_into(self._buf, self._off, task_id, attempt, self._state + 1, now_ns)

    def task_ended(self) -> None:
        """The task that ran in this process returned."""
        self._state = (self._state + 2) & 0xFFFFFFFE  # (wraps after 2^31 tasks)
        _BUSY.pack_into(self._buf, self._off + _BUSY_OFFSET, self._state)

    def session(self, lease_ms: int, instance: int) -> None:
        """A session started with this lease, at this master instance."""
        _SESSION.pack_into(self._buf, self._off + _SESSION_OFFSET, lease_ms, instance)

    def beat(self) -> None:
        """The heartbeat thread ran."""
        _BEAT.pack_into(self._buf, self._off + _BEAT_OFFSET, time.perf_counter_ns())
