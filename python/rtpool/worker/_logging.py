"""How the worker writes its own log: every line goes through the ``rtpool.worker`` logger to
one handler, which writes each record to stderr as whole lines in a single ``write(2)``.

``--log-level`` and ``--log-format`` choose the level and the format as the master's options
of the same names do: ``text`` (``2026-12-06T23:41:07.123Z  INFO rtpool worker[4441]:
connected ...``) or ``json`` (one object per line: ``timestamp``, ``level``, ``target``,
``fields`` with ``message`` and ``pid``, as the master's ``--log-format json``). Several
processes share one stderr (``--procs N`` forks children that inherit it): one write per
record keeps their lines whole, as the kernel does not split a write to a pipe of up to
``PIPE_BUF`` (4 KiB) bytes nor interleave writes to one open file. Task code's own output is
not this module's.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

__all__ = ["LEVELS", "LOG_FORMATS", "configure", "ensure_configured", "logger"]

#: ``--log-level`` values, as the master takes them (``trace`` is ``debug`` here).
LEVELS = {
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": logging.DEBUG,
    "off": logging.CRITICAL + 10,
}
#: ``--log-format`` values.
LOG_FORMATS = ("text", "json")
# The master's level words (tracing's): WARN, not WARNING.
_LEVEL_WORDS = {logging.WARNING: "WARN", logging.CRITICAL: "ERROR"}

logger = logging.getLogger("rtpool.worker")


def _timestamp(created: float) -> str:
    """RFC 3339 in UTC with milliseconds: ``2026-12-06T23:41:07.123Z``."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class _LineHandler(logging.Handler):
    """Writes each record as whole lines in one ``os.write`` on stderr's file descriptor (no
    Python buffer that could flush half a line, as ``print`` does under
    ``PYTHONUNBUFFERED``, and no lock shared with forked children)."""

    def __init__(self, json_lines: bool) -> None:
        super().__init__()
        self.json_lines = json_lines

    def line(self, record: logging.LogRecord) -> str:
        """The record as it is written, without the final newline."""
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        level = _LEVEL_WORDS.get(record.levelno, record.levelname)
        if self.json_lines:
            return json.dumps(
                {
                    "timestamp": _timestamp(record.created),
                    "level": level,
                    "target": record.name,
                    "fields": {"message": message, "pid": record.process},
                },
                ensure_ascii=False,
            )
        # Continuation lines of a multi-line message are indented: still one record, one write.
        text = message.replace("\n", "\n    ")
        return f"{_timestamp(record.created)} {level:>5} rtpool worker[{record.process}]: {text}"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.line(record) + "\n"
            stream = sys.stderr  # looked up now: whatever stands for stderr at the time
            try:
                fd = stream.fileno()
            except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
                stream.write(text)
                stream.flush()
                return
            stream.flush()  # anything a print() left in its buffer goes first
            data = text.encode("utf-8", "replace")
            while data:
                data = data[os.write(fd, data) :]
        except Exception:
            self.handleError(record)


def configure(level: str = "info", log_format: str = "text") -> None:
    """Send the ``rtpool.worker`` logger's records at ``level`` and above to stderr in
    ``log_format``, replacing any earlier configuration (the logger does not propagate to
    the root logger, which task code may configure as it likes).

    Raises:
        ValueError: An unknown level or format (the message lists the valid ones).
    """
    if level.lower() not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, not {level!r}")
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format must be text or json, not {log_format!r}")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.addHandler(_LineHandler(log_format == "json"))
    logger.setLevel(LEVELS[level.lower()])
    logger.propagate = False


def ensure_configured() -> None:
    """The defaults (``info``, ``text``) unless :func:`configure` ran: for a worker started
    without the command line (tests, embedders)."""
    if not logger.handlers:
        configure()
