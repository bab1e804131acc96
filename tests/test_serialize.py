"""Unit tests of what travels inside the protocol's bin fields (no master needed)."""

from __future__ import annotations

import functools
import hashlib
import pickle

import cloudpickle
import pytest

import tasks
from rtpool import _serialize as S
from rtpool.errors import RemoteTraceback, TaskFailed


def test_function_is_pickled_once_and_hashed():
    digest, code = S.serialize_function(tasks.square)
    assert digest == hashlib.sha256(code).digest()
    again = S.serialize_function(tasks.square)
    assert again[1] is code  # cached: the same bytes object
    assert pickle.loads(code) is tasks.square  # importable: pickled by reference


def test_lambda_and_main_closure_are_pickled_by_value():
    factor = 7
    fn = lambda x: x * factor  # noqa: E731
    _, code = S.serialize_function(fn)
    assert cloudpickle.loads(code)(6) == 42

    ns = {"__name__": "__main__"}
    exec("FACTOR = 3\ndef triple(x):\n    return x * FACTOR\n", ns)
    _, code = S.serialize_function(ns["triple"])
    assert pickle.loads(code)(5) == 15


def test_distinct_functions_get_distinct_hashes():
    assert S.serialize_function(tasks.square)[0] != S.serialize_function(tasks.add)[0]


def test_non_weakrefable_callable_is_cached_by_id():
    first = S.serialize_function(len)  # builtins take no weak reference
    assert S.serialize_function(len)[1] is first[1]
    assert pickle.loads(first[1]) is len


def test_partial_is_serializable():
    fn = functools.partial(tasks.add, 10)
    _, code = S.serialize_function(fn)
    assert pickle.loads(code)(5) == 15


def test_uncallable_raises_type_error():
    with pytest.raises(TypeError, match="callable"):
        S.serialize_function(42)


def test_args_roundtrip_and_cloudpickle_fallback():
    payload = S.dumps_args((1, "a", b"b"), {"k": [1, 2]})
    assert S.loads_args(payload) == ((1, "a", b"b"), {"k": [1, 2]})
    assert S.loads_args(S.dumps_args((), None)) == ((), None)
    payload = S.dumps_args((lambda x: x + 1,), None)
    args, kwargs = pickle.loads(payload)
    assert args[0](1) == 2 and kwargs is None


def test_unpicklable_args_raise_type_error():
    with pytest.raises(TypeError, match="cannot pickle the task's arguments"):
        S.dumps_args(((i for i in range(3)),), None)


def test_result_roundtrip():
    assert S.loads_result(S.dumps_result({"a": (1, 2)})) == {"a": (1, 2)}
    assert S.loads_result(S.dumps_result(lambda: 5))() == 5


def _raise(exc):
    try:
        raise exc
    except BaseException as e:
        return e


def test_error_report_rebuilds_the_original_exception_with_remote_traceback():
    exc = _raise(tasks.TaskError("boom"))
    rebuilt = S.error_from_report(S.dumps_error(exc))
    assert type(rebuilt) is tasks.TaskError
    assert str(rebuilt) == "boom"
    cause = rebuilt.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "TaskError: boom" in cause.tb
    assert "in _raise" in cause.tb
    assert '"""' in str(cause)


def test_error_report_of_unpicklable_exception_is_task_failed():
    exc = _raise(tasks.UnpicklableError(1, 2))
    report = pickle.loads(S.dumps_error(exc))
    assert report["exc"] is None
    assert report["type"] == "tasks.UnpicklableError"
    rebuilt = S.error_from_report(S.dumps_error(exc))
    assert isinstance(rebuilt, TaskFailed)
    assert rebuilt.type_name == "tasks.UnpicklableError"
    assert rebuilt.remote_message == "1/2"
    assert "UnpicklableError: 1/2" in rebuilt.remote_traceback
    assert "tasks.UnpicklableError: 1/2" in str(rebuilt)


def test_error_report_whose_exception_cannot_be_unpickled_on_the_client():
    report = {
        "type": "remote_only.Missing",
        "message": "gone",
        "traceback": "Traceback...\nremote_only.Missing: gone\n",
        "exc": b"\x80\x05cremote_only_module\nMissing\n.",  # refers to a module that is absent
    }
    rebuilt = S.error_from_report(pickle.dumps(report))
    assert isinstance(rebuilt, TaskFailed)
    assert "cannot be unpickled on the client" in str(rebuilt)
    assert rebuilt.remote_traceback.endswith("remote_only.Missing: gone\n")


def test_garbage_error_report_is_task_failed():
    assert isinstance(S.error_from_report(b"not a pickle"), TaskFailed)


def test_task_failed_pickles():
    err = TaskFailed("m", "t", "rm", "tb")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.type_name, back.remote_message, back.remote_traceback) == (
        "m",
        "t",
        "rm",
        "tb",
    )


def test_run_chunk():
    assert S.run_chunk(tasks.add, [(1, 2), (3, 4)]) == [3, 7]
