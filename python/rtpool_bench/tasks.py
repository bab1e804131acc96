"""Task functions of the benchmarks, importable by workers.

This module imports nothing, so a worker that receives one of these functions by reference
(cloudpickle pickles module-level functions of an importable module by name) loads it in
microseconds and the first measured task does not pay for an import.
"""


def noop(*args, **kwargs):
    """Do nothing and return ``None``: the task of the latency and throughput benchmarks."""
    return None


def echo(payload):
    """Return ``payload`` unchanged: the task of the payload benchmark.

    Args:
        payload: Any picklable value (the benchmark sends ``bytes``).

    Returns:
        ``payload`` itself.
    """
    return payload


def echo_copy(arr):
    """Return a new array equal to ``arr`` (a numpy array): the payload benchmark's task whose
    result cannot be its argument's bytes (``echo`` of an array in shared memory sends its
    result as offsets into the argument's segment, without a copy)."""
    return arr.copy()


def spin(ms):
    """Busy-loop for ``ms`` milliseconds of this thread's CPU time: the task of the deadline
    and hedge benchmarks.

    CPU time rather than wall time, so the task models CPU work: on a machine whose cores are
    shared it takes longer in wall time, as real work would (a ``time.sleep`` would not).

    Args:
        ms: Milliseconds of CPU time to burn.

    Returns:
        ``ms`` (so a caller can tell a slowed-down run by its result).
    """
    import time

    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass
    return ms


def _slowdown():
    import os

    try:
        return max(1.0, float(os.environ.get("RTPOOL_BENCH_SLOWDOWN", "1")))
    except ValueError:
        return 1.0


def spin_maybe_slow(ms, slow):
    """:func:`spin` for ``ms``, times ``$RTPOOL_BENCH_SLOWDOWN`` when ``slow`` is true.

    Only the hedge benchmark's slow worker has ``RTPOOL_BENCH_SLOWDOWN`` in its environment,
    so with ``slow`` a task is slow there and normal everywhere else; without it, it is normal
    everywhere (the warm-up, which gives the master a fast execution-time estimate).

    Returns:
        The milliseconds actually spun (``ms`` times the slowdown on the slow worker).
    """
    return spin(ms * _slowdown() if slow else ms)


def spin_maybe_slow_hedged(ms, slow):
    """The same as :func:`spin_maybe_slow`; a function of its own so the master keeps its own
    execution-time estimate for the hedged configuration (it learns one per function)."""
    return spin(ms * _slowdown() if slow else ms)


def sleep_maybe_slow(ms, slow):
    """Sleep ``ms`` milliseconds, times ``$RTPOOL_BENCH_SLOWDOWN`` when ``slow`` is true: the
    task of ``rtpool bench hedge --one-at-a-time`` (the issue's case: one worker sleeps 200 ms
    per task, the other 20 ms). Sleeping, not spinning, so the run costs the shared machine
    little CPU.

    Returns:
        The milliseconds slept.
    """
    import time

    ms = ms * _slowdown() if slow else ms
    time.sleep(ms / 1000)
    return ms


def sleep_maybe_slow_hedged(ms, slow):
    """The same as :func:`sleep_maybe_slow`; a function of its own so the master keeps its own
    estimate and paces for the hedged configuration."""
    import time

    ms = ms * _slowdown() if slow else ms
    time.sleep(ms / 1000)
    return ms


def sleep_ms(ms):
    """Sleep ``ms`` milliseconds: the short task of ``rtpool bench procs`` (a worker process
    alone sends its result at once; a host relays several)."""
    import time

    time.sleep(ms / 1000)
