"""Values of named remote calls on the wire (``docs/rpc.md``, "Values"), and running a call:
the one import for what the codec offers, made of four modules with one job each.

* ``schema.py``: the extension types (ext 1 array, ext 2 :class:`Ref`, ext 3 kept result),
  :func:`kept_blob` and :func:`input_blob`;
* ``encoding.py``: :func:`encode_args`, :func:`encode_results`, :func:`encode_error`;
* ``decoding.py``: :func:`decode_args`, :func:`decode_results`, :func:`decode_error`;
* ``invocation.py``: :func:`invoke` (a worker runs a call) and :func:`deliver` (the client
  turns its result into what the call returns).

Arguments and results are msgpack, never pickle; each module's docstring says what it copies.
numpy is imported only to encode or decode an array: these modules import without it.
"""

from __future__ import annotations

from .decoding import decode_args, decode_error, decode_results
from .encoding import encode_args, encode_error, encode_results
from .invocation import deliver, invoke
from .schema import EXT_ARRAY, EXT_KEPT, EXT_REF, Ref, input_blob, kept_blob

__all__ = [
    "EXT_ARRAY",
    "EXT_KEPT",
    "EXT_REF",
    "Ref",
    "decode_args",
    "decode_error",
    "decode_results",
    "deliver",
    "encode_args",
    "encode_error",
    "encode_results",
    "input_blob",
    "invoke",
    "kept_blob",
]
