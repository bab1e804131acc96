"""The rtpool wire protocol, version 2 (see ``docs/protocol.md``, which is authoritative).

A frame is a 4-byte big-endian body length followed by one msgpack array whose first element
is the message kind, or a segmented frame whose large payloads travel beside the msgpack head
(:mod:`rtpool._frame` owns that layout). This module only turns messages into bytes and back;
sockets belong to the client and the worker. It sits on the hot path of every task, so it
avoids per-message allocations beyond what msgpack itself needs.
"""

from __future__ import annotations

import struct
import threading
from typing import Any, List, Tuple, Union

import msgpack

from . import _frame
from ._frame import (
    SEGMENTED_FLAG,
    Encoded,
    Frame,
    Payload,
    frame_size,
    join,
    recv_some,
    sendall,
)
from .errors import ProtocolError

__all__ = ["Encoded", "Frame", "Payload", "join", "recv_some", "sendall"]

PROTOCOL_VERSION = 2
#: Largest frame body accepted before the handshake authenticated the peer.
PRE_AUTH_MAX_FRAME = 8192
#: The master's default ``max_frame_bytes`` (256 MiB).
DEFAULT_MAX_FRAME = 256 << 20

# Message kinds (first array element).
HELLO = 1
WELCOME = 2
ERROR = 3
SUBMIT = 10
ACCEPTED = 11
RESULTS = 12
CANCEL = 13
STATUS = 14
STATUS_REPLY = 15
ATTACH = 16
ACK = 17
CALL = 18
FUNCTIONS = 19
PULL = 20
ASSIGN = 21
RESULT = 22
RETURN = 23
HEARTBEAT = 24
DRAIN = 25
ABORT = 26
SERVE = 27
ASSIGN_CALLS = 28
FUNCTIONS_REPLY = 29
CLUSTER_STATUS = 30
CLUSTER_STATUS_REPLY = 31
RELEASE = 32
DROP = 33

KIND_NAMES = {
    HELLO: "HELLO",
    WELCOME: "WELCOME",
    ERROR: "ERROR",
    SUBMIT: "SUBMIT",
    ACCEPTED: "ACCEPTED",
    RESULTS: "RESULTS",
    CANCEL: "CANCEL",
    STATUS: "STATUS",
    STATUS_REPLY: "STATUS_REPLY",
    ATTACH: "ATTACH",
    ACK: "ACK",
    CALL: "CALL",
    FUNCTIONS: "FUNCTIONS",
    PULL: "PULL",
    ASSIGN: "ASSIGN",
    RESULT: "RESULT",
    RETURN: "RETURN",
    HEARTBEAT: "HEARTBEAT",
    DRAIN: "DRAIN",
    ABORT: "ABORT",
    SERVE: "SERVE",
    ASSIGN_CALLS: "ASSIGN_CALLS",
    FUNCTIONS_REPLY: "FUNCTIONS_REPLY",
    CLUSTER_STATUS: "CLUSTER_STATUS",
    CLUSTER_STATUS_REPLY: "CLUSTER_STATUS_REPLY",
    RELEASE: "RELEASE",
    DROP: "DROP",
}

# Task status codes (TaskResult.status, WorkerResult.status).
STATUS_OK = 0
STATUS_ERROR = 1
STATUS_CANCELLED = 2
STATUS_FAILED = 3
STATUS_TIMEOUT = 4
STATUS_LOST = 5
STATUS_QUOTA = 6
STATUS_MISSED = 7
STATUS_DISAGREE = 8
# From a worker only, for a call whose kept input could not be read: u32 BE position + message;
# the master makes the input again and runs the call again (never sent to a client).
STATUS_INPUT_LOST = 9

# ERROR codes; the fatal ones close the connection.
ERR_VERSION = "version"
ERR_AUTH = "auth"
ERR_TOO_LARGE = "too_large"
ERR_MALFORMED = "malformed"
ERR_UNKNOWN_KIND = "unknown_kind"
ERR_REJECTED = "rejected"
ERR_UNKNOWN_PACKAGE = "unknown_package"
ERR_SHUTDOWN = "shutdown"
ERR_QUOTA = "quota"
ERR_UNKNOWN_FUNCTION = "unknown_function"
ERR_SERVE_CONFLICT = "serve_conflict"
ERR_ADMISSION = "admission"
ERR_TIMEOUT = "timeout"
ERR_LEASE_EXPIRED = "lease_expired"
ERR_IDLE = "idle"
ERR_BUSY = "busy"
ERR_SLOW_CONSUMER = "slow_consumer"
ERR_QUEUE_LIMIT = "queue_limit"
ERR_UNACKED_LIMIT = "unacked_limit"
ERR_UNKNOWN_DEPENDENCY = "unknown_dependency"
ERR_UNSCHEDULABLE = "unschedulable"
ERR_NOT_LEADER = "not_leader"
NON_FATAL_ERRORS = frozenset(
    {
        ERR_REJECTED,
        ERR_UNKNOWN_PACKAGE,
        ERR_QUOTA,
        ERR_UNKNOWN_FUNCTION,
        ERR_SERVE_CONFLICT,
        ERR_ADMISSION,
        ERR_QUEUE_LIMIT,
        ERR_UNKNOWN_DEPENDENCY,
        ERR_UNSCHEDULABLE,
    }
)

# Named functions (grid RPC): limits the master enforces (longer is malformed, a fatal error).
#: Longest function name, in UTF-8 bytes (a name has at least one).
MAX_FUNCTION_NAME_BYTES = 128
#: Longest function version, in UTF-8 bytes (empty means the newest in a CALL).
MAX_FUNCTION_VERSION_BYTES = 64
#: Largest interface blob in a SERVE.
MAX_INTERFACE_BYTES = 64 << 10
#: Most functions one SERVE may declare.
MAX_SERVE_FUNCTIONS = 4096

_LEN = struct.Struct(">I")
_unpack_len = _LEN.unpack_from
_pack_len = _LEN.pack
_unpackb = msgpack.unpackb
# A msgpack Packer is about twice as fast as msgpack.packb (which builds a Packer per call),
# but it is not safe to share between threads: one per thread.
_local = threading.local()

# Frames whose body is at least this large are decoded from a memoryview instead of a slice,
# so a big SUBMIT/ASSIGN payload is not copied once more before msgpack copies it out.
_VIEW_THRESHOLD = 1 << 16

Buffer = Union[bytes, bytearray, memoryview]


def decode_disagreement(data: Buffer) -> Tuple[str, List[Tuple[str, int, bytes]]]:
    """Decode the ``data`` of a ``TaskResult`` with status 8 (disagree).

    Args:
        data: msgpack ``[message: str, [[worker: str, status: u8, data: bin], ...]]``.

    Returns:
        ``(message, [(worker, status, data), ...])``, one entry per copy of the task.

    Raises:
        ProtocolError: ``data`` does not have that form.
    """
    try:
        msg = _unpackb(data, raw=False)
    except Exception as exc:
        raise ProtocolError(f"malformed disagreement report: not valid msgpack ({exc})") from None
    if type(msg) is not list or len(msg) != 2 or type(msg[0]) is not str:
        raise ProtocolError(f"malformed disagreement report: {msg!r:.80}")
    copies = []
    for entry in msg[1] if type(msg[1]) is list else (None,):
        if (
            type(entry) is not list
            or len(entry) != 3
            or type(entry[0]) is not str
            or type(entry[1]) is not int
            or type(entry[2]) is not bytes
        ):
            raise ProtocolError(f"malformed copy in a disagreement report: {entry!r:.80}")
        copies.append((entry[0], entry[1], entry[2]))
    return msg[0], copies


def _packer() -> Tuple[Any, List[Payload]]:
    # One Packer and one list of segments per thread, looked up together (the hot path).
    segs: List[Payload] = []

    def segment_ref(obj: Any) -> Any:
        # msgpack's hook for types it does not know: a Payload becomes a segment reference.
        if type(obj) is Payload:
            segs.append(obj)
            return msgpack.ExtType(_frame.SEGMENT_EXT, _frame._REF.pack(len(segs) - 1))
        raise TypeError(f"cannot serialize {type(obj).__name__!r} object")

    packer = msgpack.Packer(use_bin_type=True, default=segment_ref)
    _local.ps = ps = (packer.pack, segs)
    return ps


def _segmented(body: bytes, segs: List[Payload]) -> Frame:
    frame = _frame.segmented(body, segs[:])
    segs.clear()
    return frame


def encode(kind: int, *fields: Any) -> Encoded:
    """Encode one message as a whole frame (length prefix included).

    Args:
        kind: The message kind (``HELLO``, ``SUBMIT``, ...).
        *fields: The message's fields in spec order. ``bytes`` become msgpack bin, ``str``
            msgpack str, a :class:`~rtpool._frame.Payload` a segment. A ``SUBMIT``/``CALL``
            opts map is written as given: ``_options`` makes it (spec order, defaults left
            out).

    Returns:
        The frame: ``bytes`` (a plain frame), or a :class:`~rtpool._frame.Frame` when a
        payload travels as a segment; :func:`sendall` writes either.
    """
    return _encode_message([kind, *fields])


def encode_submit(req_id: int, fn_hash: bytes, fn_code: bytes, opts: dict, tasks: list) -> Encoded:
    """Encode a ``SUBMIT`` frame, as :func:`encode` does, without its varargs (the submission
    path)."""
    return _encode_message([SUBMIT, req_id, fn_hash, fn_code, opts, tasks])


def _encode_message(message: list) -> Encoded:
    """The frame of one message (the list of its kind and fields): :func:`encode`."""
    try:
        pack, segs = _local.ps
    except AttributeError:
        pack, segs = _packer()
    try:
        body = pack(message)
    except BaseException:
        segs.clear()
        raise
    if segs:
        return _segmented(body, segs)
    return _pack_len(len(body)) + body


def _decode_body(body: Buffer) -> list:
    try:
        msg = _unpackb(body, raw=False)
    except Exception as exc:
        raise ProtocolError(f"malformed frame: the body is not valid msgpack ({exc})") from None
    if type(msg) is not list or not msg or type(msg[0]) is not int:
        raise ProtocolError(
            f"malformed frame: expected an array starting with a message kind, got {msg!r:.80}"
        )
    return msg


def decode(frame: Union[Buffer, Frame], max_frame: int = DEFAULT_MAX_FRAME) -> list:
    """Decode exactly one whole frame (length prefix included).

    Args:
        frame: The frame bytes.
        max_frame: Largest body length accepted.

    Returns:
        The message as a list ``[kind, field, ...]``; bin fields are ``bytes``, str fields
        ``str``, nil is ``None``.

    Raises:
        ProtocolError: The frame is truncated, has trailing bytes, is too large or is not a
            msgpack array starting with a kind.
    """
    if type(frame) is Frame:
        frame = bytes(frame)  # what encode() gave, joined (tests and tools)
    reader = FrameReader(max_frame)
    msgs = reader.feed(frame)
    if len(msgs) != 1 or reader.buffered:
        raise ProtocolError(
            f"expected exactly one frame, got {len(msgs)} and {reader.buffered} extra bytes"
        )
    return msgs[0]


class FrameReader:
    """Accumulates bytes from a stream and decodes the complete frames in them.

    ``feed()`` returns the messages completed by the new bytes and keeps any partial frame for
    the next call. A length prefix of 0 or above ``max_frame`` raises :class:`ProtocolError`
    as soon as the 4 prefix bytes are there, before the body is buffered.

    Args:
        max_frame: Largest body length accepted; raise it after the handshake with the
            ``max_frame_bytes`` of ``WELCOME``.
    """

    __slots__ = ("_buf", "_need", "max_frame", "big", "_filled")

    def __init__(self, max_frame: int = PRE_AUTH_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf: Buffer = b""
        # While a large frame is incomplete: the buffer length at which it will be complete,
        # so each chunk is appended without rescanning.
        self._need = 0
        # A large frame whose size is known is read into one buffer of its final size
        # (``recv_into`` through :meth:`want`), filled up to ``_filled``. Public: a reader of
        # the socket checks it (one attribute, on the path of every receive) before ``want``.
        self.big: bytearray | None = None
        self._filled = 0

    @property
    def buffered(self) -> int:
        """Number of bytes of an incomplete frame held for the next ``feed()``."""
        if self.big is not None:
            return self._filled
        return len(self._buf)

    def want(self) -> memoryview | None:
        """Where the rest of a large incomplete frame goes, for ``sock.recv_into``; follow
        with :meth:`got`. ``None`` when no large frame is under way (use ``feed``)."""
        big = self.big
        if big is None:
            return None
        return memoryview(big)[self._filled :]

    def got(self, n: int) -> List[list]:
        """``n`` bytes were received into the buffer :meth:`want` gave; returns the message
        when it completed the frame."""
        self._filled += n
        big = self.big
        if big is None or self._filled < len(big):
            return []
        self.big = None
        return [self._decode_whole(memoryview(big), 0, len(big))]

    def feed(self, data: Buffer) -> List[list]:
        """Add bytes from the stream.

        Args:
            data: The bytes just received (any length, possibly empty): ``bytes``, or a
                ``memoryview`` of a buffer the caller reuses (:func:`recv_some`), of which
                nothing returned or kept refers to it (what is kept is copied).

        Returns:
            The decoded messages completed by these bytes, in stream order (often empty).

        Raises:
            ProtocolError: A length prefix is 0 or above ``max_frame``, or a body does not
                decode. The stream cannot be resynchronised after that: close it.
        """
        big = self.big
        if big is not None:
            room = len(big) - self._filled
            if len(data) <= room:
                big[self._filled : self._filled + len(data)] = data
                return self.got(len(data))
            with memoryview(data) as view:
                big[self._filled :] = view[:room]
                msgs = self.got(room)
                rest = bytes(view[room:])
            return msgs + self.feed(rest)
        buf = self._buf
        if buf:
            if type(buf) is bytearray:
                buf += data
                if len(buf) < self._need:
                    return []
            else:
                buf = buf + data
        else:
            buf = data
        msgs = []
        pos = 0
        end = len(buf)
        max_frame = self.max_frame
        while end - pos >= 4:
            n = _unpack_len(buf, pos)[0]
            if n & SEGMENTED_FLAG:
                n = frame_size(buf, pos)
                if n < 0:
                    break
                if n > max_frame:
                    self._buf = b""
                    raise ProtocolError(
                        f"frame of {n} bytes is above the limit of {max_frame} bytes"
                    )
            elif n == 0 or n > max_frame:
                self._buf = b""
                if n == 0:
                    raise ProtocolError("malformed frame: length prefix 0")
                raise ProtocolError(f"frame of {n} bytes is above the limit of {max_frame} bytes")
            stop = pos + 4 + n
            if stop > end:
                break
            if n >= _VIEW_THRESHOLD or buf[pos] & 0x80:
                if type(buf) is memoryview and buf[pos] & 0x80:
                    # A segmented frame's payloads are views of what they are decoded
                    # from: not of a buffer the caller reuses.
                    msgs.append(self._decode_whole(bytes(buf[pos:stop]), 0, stop - pos))
                else:
                    msgs.append(self._decode_whole(buf, pos, stop))
            else:
                msgs.append(_decode_body(buf[pos + 4 : stop]))
            pos = stop
        self._keep(buf, pos, end)
        return msgs

    @staticmethod
    def _decode_whole(buf: Buffer, pos: int, stop: int) -> list:
        if _unpack_len(buf, pos)[0] & SEGMENTED_FLAG:
            view = memoryview(buf)[pos + 4 : stop]
            try:
                msg = _frame.decode_segmented(view, _unpackb)
            except Exception as exc:
                raise ProtocolError(f"malformed segmented frame: {exc}") from None
            if type(msg) is not list or not msg or type(msg[0]) is not int:
                raise ProtocolError(
                    f"malformed frame: expected an array starting with a message kind, "
                    f"got {msg!r:.80}"
                )
            return msg
        if stop - pos < _VIEW_THRESHOLD:
            return _decode_body(buf[pos + 4 : stop])
        with memoryview(buf) as view:
            return _decode_body(view[pos + 4 : stop])

    def _keep(self, buf: Buffer, pos: int, end: int) -> None:
        if pos == end:
            self._buf = b""
            self._need = 0
            return
        if end - pos >= 4:
            size = frame_size(buf, pos)
            need = 4 + size
            if size >= 0 and need >= _VIEW_THRESHOLD:
                # A large frame is arriving in pieces: one buffer of its final size.
                big = bytearray(need)
                big[: end - pos] = memoryview(buf)[pos:end]
                self.big, self._filled = big, end - pos
                self._buf, self._need = b"", 0
                return
        self._buf = bytes(buf[pos:])
        self._need = 0
