"""A package's futures carry as few objects as the cyclic GC has to track (issue 25), and
still behave as ``concurrent.futures`` futures: wait(), as_completed(), callbacks, result()."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import threading

from rtpool._future import Future


def _package(n: int) -> list:
    cond = threading.Condition()
    return [Future(None, i, cond) for i in range(n)]


def test_a_package_future_holds_no_tracked_containers_until_used():
    fut = _package(1)[0]
    tracked = [o for o in gc.get_referents(fut) if gc.is_tracked(o)]
    # Only the package's shared condition (and the class): no per-future waiter or callback
    # lists for the collector to walk and promote.
    assert all(type(o) in (threading.Condition, type) for o in tracked), tracked
    assert "_waiters" not in vars(fut) and "_w" not in vars(fut)
    assert "_done_callbacks" not in vars(fut)


def test_wait_as_completed_and_callbacks_still_work():
    futs = _package(3)
    seen = []
    futs[0].add_done_callback(lambda f: seen.append(f.result()))
    done_early = cf.Future()
    done_early.set_result(None)

    def finish():
        for i, f in enumerate(futs):
            f.set_result(i * 10)

    t = threading.Timer(0.01, finish)
    t.start()
    try:
        done, not_done = cf.wait(futs, timeout=10)
        assert len(done) == 3 and not not_done
        assert sorted(f.result() for f in cf.as_completed(futs, timeout=10)) == [0, 10, 20]
    finally:
        t.join()
    assert seen == [0]
    # A callback added after the result runs at once, as in concurrent.futures.
    late = []
    futs[1].add_done_callback(lambda f: late.append(f.result()))
    assert late == [10]
    assert [f._entry for f in futs] == [None, None, None]


def test_result_fast_path_and_exceptions():
    ok, bad = _package(2)
    ok.set_result("v")
    assert ok.result() == "v" and ok.result(timeout=0) == "v"
    bad.set_exception(ValueError("boom"))
    try:
        bad.result(timeout=0)
    except ValueError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("the exception was not raised")
    pending = _package(1)[0]
    try:
        pending.result(timeout=0.001)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a pending future returned")
