"""A task's captured output (its prints and log records) as it travels inside its result's
data: the format both the worker (which wraps it) and the client (which unwraps and shows
it) use; the master passes it on unread (``docs/protocol.md``, "Task output").

A result's data with output starts with :data:`OUTPUT_TAG` (a plain pickle starts with
``0x80``, the other SDK formats with ``0xB5`` to ``0xB7``)::

    0xB8 | 3 zero bytes | section_len: u32 BE | section | zero padding | the data itself

``section`` is msgpack ``[worker, dropped_bytes, [[stream, text], ...]]`` (stream 0: stdout,
1: stderr, 2: a ``logging`` record); the padding makes the data itself start a multiple of
64 bytes from the first byte, so the buffers of an envelope keep their alignment. A task that
printed nothing has no section: its data is exactly what it was without this module.
"""

from __future__ import annotations

import struct
import sys
from typing import Any, Callable, List, NamedTuple, Tuple

import msgpack

from ._frame import Payload

__all__ = [
    "OUTPUT_TAG",
    "STREAMS",
    "TaskOutput",
    "decode_section",
    "encode_section",
    "split",
    "wrap",
]

OUTPUT_TAG = 0xB8
_HEAD = struct.Struct(">B3xI")
_ALIGN = 64
_ZEROS = bytes(_ALIGN)
#: The names of the streams, by their number in a section.
STREAMS = ("stdout", "stderr", "log")


class TaskOutput(NamedTuple):
    """What one task printed and logged, as ``future.logs`` holds it."""

    #: The worker that ran the task (its ``rtpool worker --name``, or host-slot).
    worker: str
    #: ``(stream, text)`` in the order written; stream is ``"stdout"``, ``"stderr"`` or
    #: ``"log"`` (one formatted ``logging`` record, ``LEVEL logger: message``).
    records: List[Tuple[str, str]]
    #: Bytes the worker dropped past its bound (``rtpool worker --task-output-kb``) or its rate.
    dropped: int

    @property
    def text(self) -> str:
        """Every record joined, as a terminal would have shown it."""
        joined = "".join(t if t.endswith("\n") or s != "log" else t + "\n" for s, t in self.records)
        if self.dropped:
            joined += ("" if joined.endswith("\n") or not joined else "\n") + (
                f"... {self.dropped} bytes dropped\n"
            )
        return joined

    def lines(self) -> List[Tuple[str, str]]:
        """``(stream, line)`` per line (without its newline), then the drop marker if any."""
        out = [(s, line) for s, t in self.records for line in t.splitlines()]
        if self.dropped:
            out.append(("stderr", f"... {self.dropped} bytes dropped"))
        return out


def encode_section(worker: str, dropped: int, records: List[list]) -> bytes:
    """The head and section of a task's output (everything before its data, padding included)."""
    section = msgpack.packb([worker, dropped, records], use_bin_type=True)
    head = _HEAD.pack(OUTPUT_TAG, len(section))
    return head + section + _ZEROS[: -(len(head) + len(section)) % _ALIGN]


def wrap(prefix: bytes, data: Any) -> Any:
    """``data`` (bytes or a :class:`~rtpool._frame.Payload`) behind an output ``prefix``
    (:func:`encode_section`), without joining a Payload's parts."""
    if not prefix:
        return data
    if type(data) is Payload:
        return Payload((prefix, *data.parts), len(prefix) + data.nbytes, data.shm)
    return prefix + bytes(data)


def split(data: Any) -> Tuple[bytes | None, Any]:
    """``(section, data itself)`` of a result's data; ``(None, data)`` when it has none.

    Raises:
        ValueError: The data starts with the tag but its section does not fit in it.
    """
    if not data or data[0] != OUTPUT_TAG:
        return None, data
    view = memoryview(data)
    if view.nbytes < _HEAD.size:
        raise ValueError(f"task output head truncated ({view.nbytes} bytes)")
    _, size = _HEAD.unpack_from(view)
    end = _HEAD.size + size
    start = end + (-end % _ALIGN)
    if start > view.nbytes:
        raise ValueError(f"task output section of {size} bytes overruns its data")
    rest = view[start:]
    return bytes(view[_HEAD.size : end]), rest if type(data) is memoryview else bytes(rest)


def decode_section(section: bytes) -> TaskOutput:
    """The :class:`TaskOutput` of a section (a malformed one becomes a record saying so)."""
    try:
        worker, dropped, records = msgpack.unpackb(section, raw=False)
        return TaskOutput(
            str(worker), [(STREAMS[int(s)], str(t)) for s, t in records], int(dropped)
        )
    except Exception as exc:
        return TaskOutput("?", [("stderr", f"(unreadable task output: {exc!r})\n")], 0)


def stderr_sink(task: int, output: TaskOutput) -> None:
    """The default display: each line on this process's stderr, prefixed by task and worker:
    ``(task 12 @ worker host1-3) line``."""
    prefix = f"(task {task} @ worker {output.worker}) "
    text = "".join(f"{prefix}{line}\n" for _, line in output.lines())
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # a closed or missing stderr: the output stays in future.logs


#: What a client does with a task's output (``Client(task_output=...)``).
Sink = Callable[[int, TaskOutput], None]


def sink_of(option: Any) -> Sink | None:
    """The sink of ``Client(task_output=...)``: ``"stderr"`` (default), ``None`` or False (not
    shown; ``future.logs`` still holds it), a ``logging.Logger`` (one INFO record per line,
    stderr and log lines at WARNING) or a callable ``(task_index, TaskOutput)``.

    Raises:
        TypeError: Anything else.
    """
    import logging

    if option is None or option is False:
        return None
    if option == "stderr":
        return stderr_sink
    if isinstance(option, logging.Logger):
        logger = option

        def to_logger(task: int, output: TaskOutput) -> None:
            for stream, line in output.lines():
                level = logging.INFO if stream == "stdout" else logging.WARNING
                logger.log(level, "(task %d @ worker %s) %s", task, output.worker, line)

        return to_logger
    if callable(option):
        return option
    raise TypeError(
        "task_output must be 'stderr', None, a logging.Logger or a callable "
        f"(task_index, TaskOutput), got {type(option).__name__}"
    )
