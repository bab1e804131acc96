"""Segmented frames (protocol version 2): large payloads travel beside the msgpack head.

This module is the Python side of ``docs/protocol.md``, "Segmented frames": a payload of at
least :data:`SEGMENT_MIN_BYTES` (or any :class:`Payload`) is not packed into the msgpack body
but referenced from it (msgpack ext type 1, a big-endian ``u32`` segment index) and written
after the head, from where it lies, with ``sendmsg``. A receiver decodes the head and gets each
referenced payload as a ``memoryview`` of the frame buffer it read (no copy).
:mod:`rtpool._protocol` uses it to encode and decode; :func:`sendall` writes a frame of
either layout. It imports nothing of the package, so everything may import it.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, List, Sequence, Union

#: Top bit of the prefix: set for a segmented frame (low 31 bits: the head length).
SEGMENTED_FLAG = 0x80000000
#: Smallest payload sent as a segment; smaller ones stay inline in the head (the Rust
#: codec's ``SEGMENT_MIN_BYTES`` is the same; measured: ``_serialize.OOB_MIN_BYTES``).
SEGMENT_MIN_BYTES = 128 * 1024
#: Most segments one frame may carry.
MAX_SEGMENTS = 65535
#: msgpack ext type of a segment reference.
SEGMENT_EXT = 1

_U32 = struct.Struct(">I")
_REF = struct.Struct(">I")
_HEAD2 = struct.Struct(">II")


class Payload:
    """A payload made of several buffers sent back to back as one ``bin`` (one segment):
    what :func:`rtpool._serialize.dumps_args` returns for a large or out-of-band payload.

    ``len()`` is its size in bytes; ``bytes(p)`` joins it (a copy, for the rare caller that
    needs one object).
    """

    __slots__ = ("parts", "nbytes", "shm")

    def __init__(self, parts: Sequence[Any], nbytes: int | None = None, shm: str = "") -> None:
        #: The shared-memory segment this payload refers to ("" for none): its sender frees it.
        self.shm = shm
        self.parts = list(parts)
        self.nbytes = (
            nbytes if nbytes is not None else sum(memoryview(p).nbytes for p in self.parts)
        )

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Payload):
            other = bytes(other)
        try:
            return bytes(self) == bytes(other)  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Payload({len(self.parts)} parts, {self.nbytes} bytes)"


def as_payload(data: Any) -> Any:
    """``data`` as a :class:`Payload` when it is large enough to travel as a segment, else
    unchanged (small payloads stay ``bytes``: packed inline, as version 1 did)."""
    if type(data) is not Payload and len(data) >= SEGMENT_MIN_BYTES:
        return Payload((data,), len(data))
    return data


class Frame:
    """An encoded frame (or several) as a list of buffers, for :func:`sendall`.

    ``len()`` counts bytes; ``+`` with ``bytes`` or another ``Frame`` concatenates without
    copying the payloads.
    """

    __slots__ = ("parts", "nbytes")

    def __init__(self, parts: List[Any], nbytes: int) -> None:
        self.parts, self.nbytes = parts, nbytes

    def __len__(self) -> int:
        return self.nbytes

    def __add__(self, other: Any) -> Frame:
        if isinstance(other, Frame):
            return Frame(self.parts + other.parts, self.nbytes + other.nbytes)
        if not other:
            return self
        return Frame([*self.parts, other], self.nbytes + len(other))

    def __radd__(self, other: Any) -> Frame:
        if not other:
            return self
        return Frame([other, *self.parts], self.nbytes + len(other))

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


Encoded = Union[bytes, Frame]


def segmented(body: bytes, segments: List[Payload]) -> Frame:
    """The frame of a head ``body`` whose references point at ``segments``, in order."""
    n = len(segments)
    if n > MAX_SEGMENTS:
        raise ValueError(f"a frame may carry at most {MAX_SEGMENTS} payloads of 64 KiB or more")
    table = bytearray(_HEAD2.pack(SEGMENTED_FLAG | len(body), n))
    total = 8 + 4 * n + len(body)
    parts: List[Any] = [table, body]
    for seg in segments:
        table += _U32.pack(seg.nbytes)
        total += seg.nbytes
        parts.extend(seg.parts)
    return Frame(parts, total)


def join(frames: Iterable[Encoded]) -> Encoded:
    """Concatenate encoded frames (``bytes`` stay ``bytes`` when no frame is segmented)."""
    frames = list(frames)
    if all(type(f) is bytes for f in frames):
        return b"".join(frames)  # type: ignore[arg-type]
    out: Encoded = b""
    for f in frames:
        out = out + f
    return out


def sendall(sock: Any, data: Encoded) -> None:
    """Write ``data`` (bytes or a :class:`Frame`) to ``sock``: a frame's buffers go out with
    ``sendmsg`` (scatter/gather, no joining copy); sockets without it (TLS) get each part."""
    if type(data) is not Frame:
        sock.sendall(data)
        return
    sendmsg = getattr(sock, "sendmsg", None)
    views = [memoryview(p).cast("B") for p in data.parts if len(p)]
    while views:
        try:
            sent = sendmsg(views[:512]) if sendmsg is not None else -1
        except NotImplementedError:  # ssl.SSLSocket
            sent = -1
        if sent < 0:
            for view in views:
                sock.sendall(view)
            return
        while sent:
            n = views[0].nbytes
            if sent >= n:
                sent -= n
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def recv_some(sock: Any, buf: bytearray, flags: int = 0) -> memoryview:
    """What ``sock.recv(len(buf), flags)`` returns (empty at the end of the stream), as a view
    of ``buf``, a buffer the caller keeps and passes again: the view is valid until the next
    call (``FrameReader.feed`` copies whatever it keeps of it).

    ``recv(n)`` allocates ``n`` bytes per call and trims them to what came. At the 256 KiB the
    readers ask for, glibc takes those from ``mmap`` and returns them with ``munmap``: two page
    faults and three system calls per receive, and in a threaded process a TLB flush on every
    CPU running it. That was a quarter of a worker's and half of the client reader thread's
    CPU time per no-op task (issue 13).
    """
    n = sock.recv_into(buf, 0, flags)
    return memoryview(buf)[:n]


def recv_exact(sock: Any, n: int) -> bytearray | None:
    """Exactly ``n`` bytes from a blocking ``sock`` into one buffer (at most 16 MiB per
    ``recv_into``), or None at EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if k == 0:
            return None
        got += k
    return buf


def frame_size(buf: Any, pos: int) -> int:
    """Bytes the frame at ``buf[pos:]`` takes after its 4-byte prefix, or -1 while its
    segment table has not fully arrived. Limits are the caller's."""
    prefix = _U32.unpack_from(buf, pos)[0]
    if not prefix & SEGMENTED_FLAG:
        return prefix
    end = len(buf)
    if end - pos < 8:
        return -1
    count = _U32.unpack_from(buf, pos + 4)[0]
    if end - pos < 8 + 4 * count:
        return -1
    lens = struct.unpack_from(f">{count}I", buf, pos + 8)
    return 4 + 4 * count + (prefix & ~SEGMENTED_FLAG) + sum(lens)


def decode_segmented(frame: memoryview, unpackb: Any) -> Any:
    """Decode one whole segmented frame after its prefix (``frame`` starts at the segment
    count); payload fields come out as ``memoryview`` slices of ``frame``.

    Raises:
        ValueError: a malformed table, or a reference out of range, repeated or missing.
    """
    count = _U32.unpack_from(frame, 0)[0]
    if count == 0 or count > MAX_SEGMENTS:
        raise ValueError(f"segmented frame with {count} segments (1 to {MAX_SEGMENTS} allowed)")
    lens = struct.unpack_from(f">{count}I", frame, 4)
    head_at = 4 + 4 * count
    head_len = len(frame) - head_at - sum(lens)
    if head_len <= 0:
        raise ValueError("segmented frame with an empty head")
    segs = []
    pos = head_at + head_len
    for n in lens:
        segs.append(frame[pos : pos + n])
        pos += n
    used = [False] * count

    def ext_hook(code: int, data: bytes) -> Any:
        if code != SEGMENT_EXT or len(data) != 4:
            raise ValueError(f"ext type {code} where a bin or a segment reference belongs")
        i = _REF.unpack(data)[0]
        if i >= count or used[i]:
            raise ValueError(f"segment {i} referenced twice or out of range ({count} segments)")
        used[i] = True
        return segs[i]

    msg = unpackb(frame[head_at : head_at + head_len], raw=False, ext_hook=ext_hook)
    if not all(used):
        raise ValueError(f"segment {used.index(False)} is never referenced")
    return msg
