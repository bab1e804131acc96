"""Capturing what a task prints and logs, per task, in memory its worker's parent can read.

A worker child replaces ``sys.stdout`` and ``sys.stderr`` once, with streams that append to
the running task's **output area** (and pass through to the real streams between tasks, and
for the worker's own threads), and puts a handler on the root logger that does the same with
``logging`` records. The loop marks a task as running (:attr:`Capture.active`) and, after
it, asks :meth:`Capture.take` for the output only if the task wrote any (``Capture.started``):
a task that prints nothing costs two attribute stores and one test.

The area is a slice of an anonymous shared mapping the parent made before forking
(:class:`OutputBoard`), so that

* the **executor process** (a fork of the child) writes where the child reads it, after the
  task answered, timed out or died;
* the **parent** reads what a child wrote before it crashed (``os._exit``, a signal) and
  sends it with the task's ``LOST`` report (:meth:`OutputBoard.take`).

Bounds: at most ``--task-output-kb`` per task (the rest is counted, and shown as ``... N
bytes dropped``), and at most ``--task-output-rate-kb`` per second per process over the tasks
(a bucket as deep as one second or one task's bound): a task printing 100 MB costs an encode
and a length test per write past its bound, no memory and nothing on the wire. A write never
blocks. Only Python-level writes are captured; what C code or a subprocess writes to the file
descriptors themselves still goes to the worker's stdout.

Area layout: a header ``task: u64, attempt: u32, used: u32, dropped: u64`` (little-endian),
then records ``stream: u8, length: u32, UTF-8 text``; consecutive writes to one stream extend
one record.
"""

from __future__ import annotations

import io
import logging
import mmap
import struct
import sys
import threading
import time
from typing import Any, List, Tuple

from .._output import encode_section

__all__ = ["DEFAULT_OUTPUT_KB", "DEFAULT_RATE_KB", "MAX_OUTPUT_KB", "Capture", "OutputBoard"]

#: Default bound of one task's captured output (``--task-output-kb``).
DEFAULT_OUTPUT_KB = 64
#: Default rate of captured output per worker process (``--task-output-rate-kb``, per second).
DEFAULT_RATE_KB = 1024
#: Most ``--task-output-kb`` (a record's length is a u32; a result must fit in a frame).
MAX_OUTPUT_KB = 16 * 1024
_HEAD = struct.Struct("<QIIQ")
_IDS = struct.Struct("<QI")
_COUNTS = struct.Struct("<IQ")
_COUNTS_AT = 12
_REC = struct.Struct("<BI")
STDOUT, STDERR, LOG = 0, 1, 2


def capture_of(args: Any, area: Tuple[Any, int, int] | None) -> Capture | None:
    """The capture of a worker child with these options (None with ``--task-output-kb 0``)."""
    kb = getattr(args, "task_output_kb", DEFAULT_OUTPUT_KB)
    if not kb:
        return None
    rate = getattr(args, "task_output_rate_kb", DEFAULT_RATE_KB) << 10
    return Capture(area, kb << 10, rate)


def board_of(args: Any) -> OutputBoard | None:
    """The parent's output board for its children (None with ``--task-output-kb 0``)."""
    kb = getattr(args, "task_output_kb", DEFAULT_OUTPUT_KB)
    return OutputBoard(args.procs, kb << 10) if kb else None


class OutputBoard:
    """The output areas of ``slots`` worker children, made by the parent before it forks."""

    def __init__(self, slots: int, capacity: int) -> None:
        self.capacity = capacity
        self.stride = _HEAD.size + capacity
        self.map = mmap.mmap(-1, max(1, slots) * self.stride)

    def area(self, slot: int) -> Tuple[mmap.mmap, int, int]:
        """``(mapping, offset, capacity)`` of ``slot``'s area, for its child's :class:`Capture`."""
        return self.map, slot * self.stride, self.capacity

    def take(self, slot: int, task_id: int, attempt: int, worker: str) -> bytes:
        """What ``slot``'s dead child wrote for ``(task_id, attempt)``, as an output prefix
        (``rtpool._output``), or b"" if it wrote nothing for that task."""
        return read_area(self.map, slot * self.stride, self.capacity, worker, (task_id, attempt))


def read_area(
    buf: Any, base: int, capacity: int, worker: str, ids: Tuple[int, int] | None = None
) -> bytes:
    """The output prefix of an area's records (b"" if none, or not of task ``ids``)."""
    task_id, attempt, used, dropped = _HEAD.unpack_from(buf, base)
    if ids is not None and (task_id, attempt) != ids:
        return b""
    used = min(used, capacity)
    if not used and not dropped:
        return b""
    records: List[list] = []
    pos, end = base + _HEAD.size, base + _HEAD.size + used
    while pos + _REC.size <= end:
        stream, n = _REC.unpack_from(buf, pos)
        pos += _REC.size
        records.append([stream, bytes(buf[pos : min(pos + n, end)]).decode("utf-8", "replace")])
        pos += n
    return encode_section(worker, dropped, records)


class Capture:
    """One process's capture of task output (see the module docstring)."""

    def __init__(self, area: Tuple[Any, int, int] | None, capacity: int, rate: int) -> None:
        if area is None:
            area = (mmap.mmap(-1, _HEAD.size + capacity), 0, capacity)
        self.buf, self.base, self.capacity = area
        #: The running task (a ``Task``, or True in the executor process); None between tasks.
        self.active: Any = None
        #: Whether the running task wrote anything (then :meth:`take` has its output).
        self.started = False
        self._used = 0
        self._dropped = 0
        self._budget = 0
        self._last = -1  # stream of the last record
        self._last_at = 0  # offset of its length field
        self._lock = threading.Lock()
        self._rate = rate
        self._depth = max(rate, capacity)
        self._tokens = float(self._depth)
        self._refilled = time.monotonic()
        self.real_stdout = sys.stdout
        self.real_stderr = sys.stderr

    def install(self) -> None:
        """Put the capturing streams and log handler in place (once per process)."""
        sys.stdout = _Stream(self, STDOUT, self.real_stdout)
        sys.stderr = _Stream(self, STDERR, self.real_stderr)
        logging.getLogger().addHandler(_Handler(self))

    def mark(self, task_id: int, attempt: int) -> None:
        """Name the task the next writes are for, and empty the area (before the executor
        process runs it: the child reads the area afterwards)."""
        _HEAD.pack_into(self.buf, self.base, task_id, attempt, 0, 0)

    def write(self, stream: int, text: str) -> None:
        data = text.encode("utf-8", "replace")
        n = len(data)
        with self._lock:
            if not self.started:
                self._start()
            room = self._budget - self._used
            new = stream != self._last or stream == LOG  # a log record is a record of its own
            if new:
                room -= _REC.size
            take = n if n <= room else max(0, room)
            if take:
                buf, at = self.buf, self.base + _HEAD.size + self._used
                if new:
                    _REC.pack_into(buf, at, stream, take)
                    self._last, self._last_at = stream, at
                    at += _REC.size
                    self._used += _REC.size
                else:
                    (length,) = struct.unpack_from("<I", buf, self._last_at + 1)
                    struct.pack_into("<I", buf, self._last_at + 1, length + take)
                buf[at : at + take] = data[:take]
                self._used += take
            self._dropped += n - take
            _COUNTS.pack_into(self.buf, self.base + _COUNTS_AT, self._used, self._dropped)

    def _start(self) -> None:
        """The running task's first write: its ids in the header, its budget from the rate."""
        self.started = True
        task = self.active
        if task is not True:
            _IDS.pack_into(self.buf, self.base, task.task_id, task.attempt)
        now = time.monotonic()
        self._tokens = min(self._depth, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        self._budget = int(min(self.capacity, self._tokens))

    def take(self, worker: str) -> bytes:
        """The running task's output prefix (``rtpool._output``); the area is emptied."""
        with self._lock:
            prefix = read_area(self.buf, self.base, self.capacity, worker)
            self._tokens -= self._used
            self.reset()
        return prefix

    def take_area(self, worker: str) -> bytes:
        """What the executor process wrote in the area for the last task (its output prefix)."""
        return read_area(self.buf, self.base, self.capacity, worker)

    def reset(self) -> None:
        self.started = False
        self._used = self._dropped = 0
        self._last = -1
        _COUNTS.pack_into(self.buf, self.base + _COUNTS_AT, 0, 0)


def _is_worker_thread() -> bool:
    # The worker's own threads (heartbeats) log between and during tasks: not the task's.
    return threading.current_thread().name.startswith("rtpool-")


class _Stream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` of a worker child: to the running task's area, else
    to the real stream."""

    def __init__(self, capture: Capture, stream: int, real: Any) -> None:
        self._capture = capture
        self._stream = stream
        self._real = real

    def write(self, text: str) -> int:
        capture = self._capture
        if capture.active is None or _is_worker_thread():
            return self._real.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        capture.write(self._stream, text)
        return len(text)

    def flush(self) -> None:
        if self._capture.active is None:
            try:
                self._real.flush()
            except (OSError, ValueError, AttributeError):
                pass

    def fileno(self) -> int:
        return self._real.fileno()  # writes to the descriptor itself are not captured

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def buffer(self) -> Any:
        return _Binary(self)


class _Binary(io.RawIOBase):
    """``sys.stdout.buffer``: bytes decoded as UTF-8 into the text stream."""

    def __init__(self, text: _Stream) -> None:
        self._text = text

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._text.write(bytes(view).decode("utf-8", "replace"))
        return view.nbytes

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._text.flush()


class _Handler(logging.Handler):
    """The root logger's handler in a worker child: a running task's records go to its area
    (when the task did not configure handlers of its own, whose output the streams capture);
    other records are shown as Python's last-resort handler would."""

    def __init__(self, capture: Capture) -> None:
        super().__init__(logging.NOTSET)
        self._capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        capture = self._capture
        alone = logging.getLogger().handlers == [self]
        if capture.active is None or _is_worker_thread() or not alone:
            last = logging.lastResort
            if alone and last is not None and record.levelno >= last.level:
                last.handle(record)
            return
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
        except Exception as exc:
            text = f"{record.levelname} {record.name}: (unformattable record: {exc!r})"
        capture.write(LOG, text)
