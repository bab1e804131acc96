"""Unit tests of the frame codec (no master needed)."""

from __future__ import annotations

import struct

import msgpack
import pytest

from rtpool import _protocol as P
from rtpool.errors import ProtocolError


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_encode_is_length_prefixed_msgpack_array():
    data = P.encode(P.PULL, 5)
    assert data == b"\x00\x00\x00\x03" + bytes([0x92, 20, 5])


def test_encode_bytes_as_bin_and_str_as_str():
    data = P.encode(P.HELLO, 1, "client", "tok", "name", 0)
    assert msgpack.unpackb(data[4:], raw=True) == [1, 1, b"client", b"tok", b"name", 0]
    body = P.encode(P.RESULT, [[1, 1, 0, b"\x80", 0, 0, 0]])[4:]
    assert b"\xc4\x01\x80" in body  # bin8 of one byte


def test_encode_writes_the_opts_map_as_given():
    # The client's options table makes the map (tests/test_options.py); encode() only encodes.
    opts = {"priority": 2, "timeout_ms": 1500, "key": "k" * 32}
    args = (9, b"h" * 32, b"code", opts, [b"a", b"b"])
    assert P.encode_submit(*args) == P.encode(P.SUBMIT, *args)
    assert list(P.decode(P.encode_submit(*args))[4]) == ["priority", "timeout_ms", "key"]
    assert P.decode(P.encode(P.SUBMIT, 1, b"h" * 32, b"c", {"priority": 0}, [b"a"]))[4] == {
        "priority": 0
    }


def test_reader_one_byte_at_a_time():
    stream = P.encode(P.ACCEPTED, 7, 9) + P.encode(P.HEARTBEAT) + P.encode(P.PULL, 3)
    reader = P.FrameReader()
    msgs = []
    for i in range(len(stream)):
        msgs += reader.feed(stream[i : i + 1])
    assert msgs == [[P.ACCEPTED, 7, 9], [P.HEARTBEAT], [P.PULL, 3]]
    assert reader.buffered == 0


def test_reader_many_frames_in_one_chunk_and_a_partial_one():
    stream = b"".join(P.encode(P.PULL, i) for i in range(100))
    tail = P.encode(P.PULL, 100)
    reader = P.FrameReader()
    assert reader.feed(stream + tail[:3]) == [[P.PULL, i] for i in range(100)]
    assert reader.buffered == 3
    assert reader.feed(tail[3:]) == [[P.PULL, 100]]


def test_reader_large_frame_in_pieces():
    payload = bytes(range(256)) * 8192  # 2 MiB
    data = P.encode(P.ASSIGN, [[1, 1, b"h" * 32, None, payload]]) + P.encode(P.PULL, 1)
    reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
    msgs = []
    for i in range(0, len(data), 65536 - 7):
        msgs += reader.feed(data[i : i + 65536 - 7])
    assert len(msgs) == 2
    assert msgs[0][1][0][4] == payload
    assert msgs[0][1][0][3] is None
    assert msgs[1] == [P.PULL, 1]


def test_reader_rejects_zero_length():
    with pytest.raises(ProtocolError, match="length prefix 0"):
        P.FrameReader().feed(b"\x00\x00\x00\x00")


def test_reader_rejects_oversized_prefix_before_the_body():
    reader = P.FrameReader(P.PRE_AUTH_MAX_FRAME)
    with pytest.raises(ProtocolError, match="above the limit of 8192"):
        reader.feed(struct.pack(">I", P.PRE_AUTH_MAX_FRAME + 1))


def test_reader_accepts_exactly_the_limit():
    body = msgpack.packb([P.PULL, 1])
    reader = P.FrameReader(len(body))
    assert reader.feed(frame(body)) == [[P.PULL, 1]]
    reader.max_frame = len(body) - 1
    with pytest.raises(ProtocolError):
        reader.feed(frame(body))


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb({"a": 1}),  # not an array
        msgpack.packb([]),  # no kind
        msgpack.packb(["x", 1]),  # kind not an int
        msgpack.packb([1]) + b"\x01",  # trailing bytes after the array
    ],
)
def test_reader_rejects_malformed_bodies(body):
    with pytest.raises(ProtocolError, match="malformed"):
        P.FrameReader().feed(frame(body))


def test_decode_rejects_trailing_bytes():
    with pytest.raises(ProtocolError, match="exactly one frame"):
        P.decode(P.encode(P.PULL, 1) + b"\x00")


def test_results_decode_to_lists_of_lists():
    results = [[i, 0, b"x", 1, 2, 3, 4, 5] for i in range(64)]
    (msg,) = P.FrameReader(P.DEFAULT_MAX_FRAME).feed(P.encode(P.RESULTS, 9, results))
    assert msg == [P.RESULTS, 9, results]


def test_rpc_errors_are_not_fatal():
    assert P.ERR_UNKNOWN_FUNCTION == "unknown_function"
    assert P.ERR_SERVE_CONFLICT == "serve_conflict"
    assert {P.ERR_UNKNOWN_FUNCTION, P.ERR_SERVE_CONFLICT} <= P.NON_FATAL_ERRORS
    assert {P.SERVE, P.ASSIGN_CALLS, P.CALL, P.FUNCTIONS, P.FUNCTIONS_REPLY} == {27, 28, 18, 19, 29}


# --- segmented frames (protocol version 2, issue 16) ------------------------------------------


def test_small_payloads_stay_plain_frames_and_large_ones_become_segments():
    from rtpool._frame import SEGMENT_MIN_BYTES, Frame, Payload

    small = P.encode(P.RESULT, [[1, 1, 0, b"x" * 1024, 0, 0, 0]])
    assert type(small) is bytes and not small[0] & 0x80
    big = b"y" * SEGMENT_MIN_BYTES
    frame = P.encode(P.RESULT, [[1, 1, 0, Payload((big[:10], big[10:])), 0, 0, 0]])
    assert type(frame) is Frame and len(frame) == len(bytes(frame))
    data = bytes(frame)
    head_len = struct.unpack(">I", data[:4])[0] & 0x7FFFFFFF
    count, seg_len = struct.unpack(">II", data[4:12])
    assert data[0] & 0x80 and count == 1 and seg_len == SEGMENT_MIN_BYTES
    head = data[12 : 12 + head_len]
    assert b"\xd6\x01\x00\x00\x00\x00" in head  # fixext 4, type 1, segment 0
    assert data[12 + head_len :] == big
    [msg] = P.FrameReader(1 << 20).feed(data)
    assert type(msg[1][0][3]) is memoryview and bytes(msg[1][0][3]) == big


def test_large_frame_is_received_into_one_buffer_in_pieces():
    from rtpool._frame import Payload

    payloads = [Payload((bytes([i]) * (100_000 + i),)) for i in range(3)]
    data = bytes(P.encode(P.SUBMIT, 1, b"h" * 32, b"c", {}, [b"small", *payloads]))
    data += P.encode(P.PULL, 2)  # the next frame right behind it
    reader = P.FrameReader(1 << 20)
    msgs = reader.feed(data[:7])  # not even the whole segment table
    pos = 7
    while reader.want() is not None:
        view = reader.want()
        n = min(len(view), 50_000)
        view[:n] = data[pos : pos + n]
        pos += n
        msgs += reader.got(n)
    msgs += reader.feed(data[pos:])
    assert [m[0] for m in msgs] == [P.SUBMIT, P.PULL]
    tasks = msgs[0][5]
    assert tasks[0] == b"small" and [bytes(t) for t in tasks[1:]] == [bytes(p) for p in payloads]


@pytest.mark.parametrize(
    "ref, segs, error",
    [
        (b"\xd6\x01\x00\x00\x00\x01", [b"x"], "out of range"),
        (b"\xd6\x02\x00\x00\x00\x00", [b"x"], "ext type 2"),
        (b"\xd6\x01\x00\x00\x00\x00", [b"x", b"y"], "never referenced"),
    ],
)
def test_bad_segment_references_are_protocol_errors(ref, segs, error):
    head = bytes([0x92, P.RESULT, 0x91, 0x97, 1, 1, 0]) + ref + bytes([0, 0, 0])
    frame = struct.pack(">II", 0x80000000 | len(head), len(segs))
    frame += b"".join(struct.pack(">I", len(s)) for s in segs) + head + b"".join(segs)
    with pytest.raises(ProtocolError, match=error):
        P.FrameReader(1 << 20).feed(frame)


def test_segmented_frame_over_the_limit_is_refused_from_its_table():
    from rtpool._frame import Payload

    data = bytes(P.encode(P.RESULT, [[1, 1, 0, Payload((b"z" * (1 << 20),)), 0, 0, 0]]))
    with pytest.raises(ProtocolError, match="above the limit"):
        P.FrameReader(1 << 19).feed(data[:12])


def test_feeding_a_reused_buffer_keeps_nothing_that_points_into_it():
    from rtpool._frame import Payload

    big = bytes(range(256)) * 400  # a segment: decoded as a view of what it is decoded from
    seg_frame = bytes(P.encode(P.RESULT, [[1, 1, 0, Payload((big,)), 0, 0, 0]]))
    small = bytes(P.encode(P.ASSIGN, [[5, 1, b"h" * 32, b"args"]]))
    buf = bytearray(len(seg_frame) + len(small) + 3)
    data = seg_frame + small + small[:3]  # two whole frames and the start of a third
    buf[: len(data)] = data
    reader = P.FrameReader(1 << 20)
    msgs = reader.feed(memoryview(buf)[: len(data)])
    buf[:] = b"\xee" * len(buf)  # the caller's next receive overwrites it
    msgs += reader.feed(memoryview(small)[3:])
    assert bytes(msgs[0][1][0][3]) == big
    assert msgs[1] == msgs[2] == [P.ASSIGN, [[5, 1, b"h" * 32, b"args"]]]


def test_recv_some_reads_through_one_buffer():
    import socket

    a, b = socket.socketpair()
    with a, b:
        buf = bytearray(1 << 16)
        reader = P.FrameReader(1 << 20)
        frame = bytes(P.encode(P.PULL, 7))
        a.sendall(frame * 3)
        msgs: list = []
        while len(msgs) < 3:
            msgs += reader.feed(P.recv_some(b, buf))
        assert msgs == [[P.PULL, 7]] * 3
        a.shutdown(socket.SHUT_WR)
        assert not P.recv_some(b, buf)  # the end of the stream, as recv gives it
