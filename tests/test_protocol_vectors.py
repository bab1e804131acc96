"""The Python codec against the byte-exact vectors shared with the Rust codec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtpool import _protocol as P
from rtpool._options import WIRE_DEFAULTS

VECTORS = Path(__file__).parent / "vectors" / "vectors.json"


def _from_json(value):
    """JSON form of the vectors -> Python values (``{"bin": hex}`` -> bytes)."""
    if isinstance(value, dict):
        if set(value) == {"bin"} and isinstance(value["bin"], str):
            return bytes.fromhex(value["bin"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


# Committed, written by rtpool-proto's tests: a missing file is an error, not a skip.
_VECTORS = json.loads(VECTORS.read_text())


def test_vectors_file_present():
    assert len(_VECTORS) > 0
    kinds = {v["value"][0] for v in _VECTORS}
    # Every message kind of version 1 should be pinned by at least one vector.
    assert set(P.KIND_NAMES) <= kinds, f"kinds without a vector: {set(P.KIND_NAMES) - kinds}"


@pytest.mark.parametrize("vector", _VECTORS, ids=[v["name"] for v in _VECTORS])
def test_decode_vector(vector):
    frame = bytes.fromhex(vector["hex"])
    assert P.decode(frame) == _from_json(vector["value"])


def _in_spec_order(value: list) -> list:
    """The message with its SUBMIT/CALL opts map in spec order, as the client's options table
    writes it (JSON key order carries no meaning; ``encode()`` writes a map as given)."""
    at = {P.SUBMIT: 4, P.CALL: 2}.get(value[0])
    if at is not None:
        opts = value[at]
        value = list(value)
        value[at] = {k: opts[k] for k in WIRE_DEFAULTS if k in opts}
        assert len(value[at]) == len(opts), f"unknown option in {opts}"
    return value


@pytest.mark.parametrize("vector", _VECTORS, ids=[v["name"] for v in _VECTORS])
def test_encode_vector(vector):
    value = _in_spec_order(_from_json(vector["value"]))
    assert P.encode(*value).hex() == vector["hex"]
    assert P.encode(*P.decode(bytes.fromhex(vector["hex"]))).hex() == vector["hex"]


@pytest.mark.parametrize("vector", _VECTORS, ids=[v["name"] for v in _VECTORS])
def test_vector_split_at_every_byte(vector):
    """A frame arriving in two pieces, split anywhere, decodes the same."""
    frame = bytes.fromhex(vector["hex"])
    expected = _from_json(vector["value"])
    for cut in range(len(frame) + 1):
        reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
        msgs = reader.feed(frame[:cut]) + reader.feed(frame[cut:])
        assert msgs == [expected]
