"""The package options table (``rtpool/_options.py``): user keywords to the wire opts map of
``SUBMIT`` and ``CALL``, checked before anything is sent. No master needed; the options as
the fake master receives them are in ``test_deadlines.py``."""

from __future__ import annotations

import datetime as dt

import pytest

import rtpool
from rtpool import _options
from rtpool import _protocol as P
from rtpool._options import OPTIONS, VALID_OPTIONS, WIRE_DEFAULTS


def merged(**opts):
    out, deadline_at = _options.merge({}, None, opts)
    assert deadline_at is None
    return out


def test_the_table_lists_the_wire_keys_in_spec_order():
    assert list(WIRE_DEFAULTS) == [
        "priority",
        "timeout_ms",
        "key",
        "deadline_ms",
        "on_miss",
        "admit",
        "replicas",
        "quorum",
        "max_copies",
        "hedge",
        "max_attempts",
        "near",
        "after",
        "after_index",
        "resources",
        "labels",
        "unschedulable",
    ]
    assert "key" not in VALID_OPTIONS  # drawn per package, never set by users
    assert "near" not in VALID_OPTIONS  # set by the SDK for kept inputs (docs/data.md)
    assert "after" not in VALID_OPTIONS  # set by the SDK for held dependencies
    hidden = ("key", "near", "after", "after_index")
    assert VALID_OPTIONS == tuple(o.name for o in OPTIONS if o.wire not in hidden)


def test_the_wire_keys_are_the_ones_rust_declares():
    # crates/rtpool-proto/src/options.rs is the Rust side's one list, read from the native
    # module: the two languages cannot drift apart.
    from rtpool import _native

    assert list(WIRE_DEFAULTS) == list(_native.PACKAGE_OPTION_KEYS)


def test_a_submission_has_a_deadline_when_its_map_carries_one():
    assert not _options.has_deadline(merged(priority=2, timeout=1))
    assert _options.has_deadline(merged(deadline=0.5))
    at = dt.datetime.now() + dt.timedelta(seconds=100)
    opts, deadline_at = _options.merge({}, None, {"deadline": at, "admit": True})
    assert opts == {"admit": True}  # an absolute deadline satisfies admit's need of one
    assert not _options.has_deadline(opts)
    assert _options.has_deadline(_options.for_submission(opts, deadline_at))


def test_defaults_are_left_out_and_keys_are_in_spec_order():
    assert merged(priority=0, hedge=False, max_attempts=None) == {}
    out = merged(max_attempts=2, timeout=0.05, priority=3)
    assert list(out) == ["priority", "timeout_ms", "max_attempts"]
    assert out == {"priority": 3, "timeout_ms": 50, "max_attempts": 2}
    # None resets an option a base view set.
    again, _ = _options.merge(out, None, {"priority": None, "max_attempts": None})
    assert again == {"timeout_ms": 50}


def test_with_key_puts_a_fresh_key_in_its_spec_position():
    plain = _options.with_key({"priority": 3, "timeout_ms": 50})
    assert list(plain) == ["priority", "timeout_ms", "key"] and len(plain["key"]) == 32
    late = _options.with_key({"priority": 1, "deadline_ms": 5, "max_attempts": 2})
    assert list(late) == ["priority", "key", "deadline_ms", "max_attempts"]
    assert late["key"] != _options.with_key({})["key"]


def test_a_submit_frame_carries_the_map_as_the_table_made_it():
    opts = _options.with_key(merged(deadline=2, replicas=2, max_attempts=5))
    frame = P.encode(P.SUBMIT, 1, b"h" * 32, b"code", opts, [b"a"])
    assert list(P.decode(frame)[4]) == ["key", "deadline_ms", "replicas", "max_attempts"]
    call = P.decode(P.encode(P.CALL, 2, merged(priority=3, max_attempts=1), []))
    assert call[2] == {"priority": 3, "max_attempts": 1}


@pytest.mark.parametrize("value", [1, 2, 3, 255])
def test_max_attempts_goes_on_the_wire(value):
    assert merged(max_attempts=value) == {"max_attempts": value}


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "option 'max_attempts' must be between 1 and 255, got 0"),
        (-1, ValueError, "option 'max_attempts' must be between 1 and 255, got -1"),
        (256, ValueError, "option 'max_attempts' must be between 1 and 255, got 256"),
        ("3", TypeError, "option 'max_attempts' must be an int, got str"),
        (3.0, TypeError, "option 'max_attempts' must be an int, got float"),
        (True, TypeError, "option 'max_attempts' must be an int, got bool"),
    ],
)
def test_bad_max_attempts_is_refused_naming_the_option(value, error, message):
    with pytest.raises(error) as info:
        merged(max_attempts=value)
    assert str(info.value).startswith(message)


def test_calls_take_the_options_that_apply_to_them():
    _options.for_calls(merged(priority=1, timeout=2, deadline=3, on_miss="run", max_attempts=2))
    for opts, name in [
        ({"replicas": 2}, "'replicas'"),
        ({"replicas": 2, "quorum": 2}, "'replicas'"),
        ({"max_copies": 3}, "'max_copies'"),
        ({"hedge": True}, "'hedge'"),
        ({"deadline": 1, "admit": True}, "'admit'"),
        ({"deadline": 1, "on_miss": "drop"}, "on_miss='drop'"),
    ]:
        with pytest.raises(ValueError) as info:
            _options.for_calls(merged(**opts))
        assert str(info.value) == (
            f"option {name} is for shipped-code tasks (submit, map); calls of named functions "
            "do not take it"
        )


def test_an_absolute_deadline_is_resolved_at_each_submission():
    at = dt.datetime.now() + dt.timedelta(seconds=100)
    opts, deadline_at = _options.merge({}, None, {"deadline": at, "max_attempts": 2})
    assert opts == {"max_attempts": 2} and deadline_at == pytest.approx(at.timestamp())
    now = _options.for_submission(opts, deadline_at)
    assert list(now) == ["deadline_ms", "max_attempts"]
    assert 99_000 < now["deadline_ms"] <= 100_000
    assert _options.for_submission(opts, None) is opts


def test_the_options_docstring_comes_from_the_table():
    doc = rtpool.Client.options.__doc__
    for name in VALID_OPTIONS:
        assert f"* ``{name}``" in doc
    assert "{options}" not in doc
