"""The schema of call values on the wire (``docs/rpc.md``, "Values"): the msgpack extension
types and what they carry.

Arguments and results are msgpack, never pickle, with three extension types:

* ext 1, an array: ``u8 len`` + ``dtype.str`` (``b"<f8"``) + ``u8 ndim`` + ``ndim`` x ``u64``
  little-endian dimensions + the raw bytes in C order (``encoding.py``, ``decoding.py``);
* ext 2, a reference to another call's result (transactions): msgpack ``[input, output]``,
  a :class:`Ref`;
* ext 3, a whole result blob kept on the worker that made it (a transaction's intermediate
  result): msgpack ``[host, port, key, size, pid, session]``, read from that worker's data port
  by the worker of the call that takes it as an input (:func:`input_blob`).

A complex scalar has no msgpack form: it travels as a 0-d ``complex128`` array (ext 1).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

__all__ = ["EXT_ARRAY", "EXT_KEPT", "EXT_REF", "FEED_BYTES", "Ref", "input_blob", "kept_blob"]

EXT_ARRAY = 1
EXT_REF = 2
EXT_KEPT = 3
# msgpack's ext headers (fixext 1-16, ext 8/16/32): a result blob is an array, never these.
_EXT_MARKERS = frozenset((0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8))


def kept_blob(ref: Any) -> bytes:
    """The result blob that stands for a result kept on this worker (ext 3)."""
    fields = [ref.host, ref.port, ref.key, ref.size_bytes, ref.pid, ref.session]
    return msgpack.packb(msgpack.ExtType(EXT_KEPT, msgpack.packb(fields, use_bin_type=True)))


def input_blob(blob: Any) -> Any:
    """A call's input as the call reads it: a kept result (ext 3) fetched from the worker that
    keeps it, any other blob as it is.

    Raises:
        KeptResultLost: The kept result's worker is gone or evicted it.
    """
    if not blob or blob[0] not in _EXT_MARKERS:
        return blob
    ext = msgpack.unpackb(blob)
    if not isinstance(ext, msgpack.ExtType) or ext.code != EXT_KEPT:
        return blob
    from .._kept import KeptRef, fetch  # _kept is the client's and the worker's

    host, port, key, size, pid, session = msgpack.unpackb(ext.data, raw=False)
    return fetch(KeptRef(host, port, key, size, pid, session))


# How much of a payload a decoder hands msgpack's C decoder in one go: a payload this small is
# decoded at once; in a larger one, an element that is a list or map is fed from this much,
# doubling until it is complete (this bounds the bytes copied past its end).
FEED_BYTES = 64 * 1024


class Ref(NamedTuple):
    """A reference to an input of a call (ext 2): the ``input``-th dependency blob of the
    assignment and its ``output``-th value (-1: the whole result list)."""

    input: int
    output: int
