"""The history checker of issue 28 (``rtpool_bench.history_check``) must be able to fail: fed
synthetic histories with one lost task, a duplicate, a wrong value or a phantom, it names each;
a clean history (with unacknowledged submissions, which may or may not complete) is valid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from rtpool_bench.history import expected_value, history_path
from rtpool_bench.history_check import check, check_dir, main, render


def _run(clients: int = 2, packages: int = 3, n: int = 4) -> List[dict]:
    """A complete, correct history: every package acknowledged, every task once and right."""
    events, t = [], 0.0
    for c in range(clients):
        events.append({"t": t, "type": "start", "c": c})
        for p in range(packages):
            events.append({"t": t, "type": "invoke", "c": c, "p": p, "n": n})
            events.append({"t": t, "type": "ack", "c": c, "p": p, "id": 100 * c + p})
            for i in range(n):
                t += 0.001
                value = expected_value(c, p, i)
                events.append({"t": t, "type": "result", "c": c, "p": p, "i": i, "value": value})
        events.append({"t": t, "type": "end", "c": c})
    return events


def _drop_result(events: List[dict], c: int, p: int, i: int) -> List[dict]:
    keep = [
        e for e in events if not (e["type"] == "result" and (e["c"], e["p"], e["i"]) == (c, p, i))
    ]
    assert len(keep) == len(events) - 1
    return keep


def _bad_only(v, **expected) -> None:
    counts = {k: getattr(v, k) for k in ("lost", "duplicated", "wrong", "phantom")}
    assert counts == {**dict.fromkeys(counts, 0), **expected}
    assert not v.valid


def test_a_clean_history_is_valid():
    v = check(_run())
    assert v.valid
    assert (v.clients, v.packages, v.acknowledged_packages, v.owed, v.ok) == (2, 6, 6, 24, 24)
    assert "VALID" in render(v)


def test_a_lost_task_is_caught_and_named():
    v = check(_drop_result(_run(), 1, 2, 3))
    _bad_only(v, lost=1)
    assert v.examples["lost"] == [[1, 2, 3]]
    assert v.lost_packages == [[1, 2]]
    assert v.lost_errors == {"no result and no error": 1}
    assert "LOST" in render(v) and "INVALID" in render(v)


def test_a_task_whose_future_failed_is_lost_with_its_error():
    events = _drop_result(_run(), 0, 1, 0)
    events.append({"t": 9.0, "type": "fail", "c": 0, "p": 1, "i": 0, "error": "ResultsLost: x"})
    v = check(events)
    _bad_only(v, lost=1)
    assert v.lost_errors == {"ResultsLost": 1}


def test_a_duplicate_is_caught_and_named():
    events = _run()
    events.append(
        {"t": 9.0, "type": "result", "c": 0, "p": 0, "i": 2, "value": expected_value(0, 0, 2)}
    )
    v = check(events)
    _bad_only(v, duplicated=1)
    assert v.examples["duplicated"] == [[0, 0, 2, 2]]
    assert v.ok == v.owed - 1


def test_another_tasks_value_is_caught_as_wrong():
    events = _run()
    for e in events:
        if e["type"] == "result" and (e["c"], e["p"], e["i"]) == (1, 0, 1):
            e["value"] = expected_value(0, 0, 1)  # client 0's value delivered to client 1
    v = check(events)
    _bad_only(v, wrong=1)
    assert v.examples["wrong"] == [[1, 0, 1, "c0.p0.i1"]]


@pytest.mark.parametrize(
    "phantom",
    [
        {"c": 0, "p": 7, "i": 0},  # a package never invoked
        {"c": 1, "p": 0, "i": 4},  # an index past the package's 4 tasks
        {"c": 5, "p": 0, "i": 0},  # a client that never ran
    ],
)
def test_a_result_never_submitted_is_caught_as_phantom(phantom):
    events = _run()
    value = expected_value(phantom["c"], phantom["p"], phantom["i"])
    events.append({"t": 9.0, "type": "result", **phantom, "value": value})
    v = check(events)
    counts = (v.lost, v.duplicated, v.wrong, v.phantom)
    assert counts == (0, 0, 0, 1)
    assert v.examples["phantom"] == [[phantom["c"], phantom["p"], phantom["i"], value]]
    assert not v.valid


def test_unacknowledged_submissions_are_counted_apart_and_allowed_either_way():
    events = _run()
    # Package 3 of client 0: submitted, never acknowledged, completed anyway.
    events.append({"t": 9.0, "type": "invoke", "c": 0, "p": 3, "n": 2})
    events.append({"t": 9.0, "type": "submit_error", "c": 0, "p": 3, "error": "TimeoutError: x"})
    for i in range(2):
        events.append(
            {"t": 9.1, "type": "result", "c": 0, "p": 3, "i": i, "value": expected_value(0, 3, i)}
        )
    # Package 3 of client 1: submitted, never acknowledged, never completed.
    events.append({"t": 9.0, "type": "invoke", "c": 1, "p": 3, "n": 3})
    v = check(events)
    assert v.valid
    assert (v.indeterminate_done, v.indeterminate_not_done) == (2, 3)
    assert v.owed == 24 and v.acknowledged_packages == 6


def test_a_history_without_its_end_is_invalid():
    events = [e for e in _run() if not (e["type"] == "end" and e["c"] == 1)]
    v = check(events)
    assert (v.lost, v.duplicated, v.wrong, v.phantom) == (0, 0, 0, 0)
    assert v.unfinished_clients == [1]
    assert not v.valid


def _write(directory: Path, events: List[dict]) -> None:
    directory.mkdir(exist_ok=True)
    for e in events:
        with open(history_path(directory, e["c"]), "a") as f:
            f.write(json.dumps(e) + "\n")


def test_the_cli_exit_code_and_table_name_the_verdict(tmp_path, capsys):
    _write(tmp_path / "good", _run())
    _write(tmp_path / "bad", _drop_result(_run(), 0, 0, 0))
    assert check_dir(tmp_path / "good").valid
    assert main(["check", str(tmp_path / "good")]) == 0
    assert "VALID" in capsys.readouterr().out
    assert main([str(tmp_path / "bad"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["valid"], out["lost"], out["lost_packages"]) == (False, 1, [[0, 0]])


def test_unreadable_histories_are_refused_naming_the_file_and_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no client-*.jsonl history" in capsys.readouterr().err
    history_path(tmp_path, 0).write_text('{"t": 0, "type": "start", "c": 0}\nnot json\n')
    assert main([str(tmp_path)]) == 2
    assert "client-0.jsonl:2: not a history event" in capsys.readouterr().err
