"""How deep a worker child prefetches: the work it keeps queued ahead of the running task.

About 2 ms of work plus :data:`RTT_FACTOR` round trips to the master (``_latency.py``
measures them, at most :data:`RTT_CAP_NS`), in tasks of the time an EMA of the observed time
per task gives (``_loop.py`` updates it after each task): no-op tasks get a deep pipeline
(throughput), 10 ms tasks on a near master keep one queued (load balance at the end of a
package), 20 ms tasks 100 ms away keep about 11 (the worker does not idle while its credits
travel).
"""

from __future__ import annotations

__all__ = [
    "EMA_ALPHA",
    "PREFETCH_TARGET_NS",
    "RTT_CAP_NS",
    "RTT_FACTOR",
    "adaptive_prefetch",
    "prefetch_target_ns",
]

#: Prefetch aims at this much queued work per child, plus RTT_FACTOR round trips.
PREFETCH_TARGET_NS = 2_000_000
#: Round trips of work queued ahead: one hides the credit's trip, the other absorbs the jitter
#: the windowed minimum does not see (with 1.5 a worker 50 ms away ran at 79 % of ideal against
#: 89 % at 0 ms on a loaded VM).
RTT_FACTOR = 2.0
#: The measured round trip counts up to this much: a bound on what a worker holds when its
#: estimate is high (an idle master answers PULLs late), so it never hoards more than ~1 s
#: of work a faster peer could run (and never more than ``--prefetch`` tasks).
RTT_CAP_NS = 500_000_000
#: Weight of the newest task's time in the EMA of the time per task.
EMA_ALPHA = 0.2


def prefetch_target_ns(rtt_ns: int) -> float:
    """Work to hold queued: about 2 ms plus ``RTT_FACTOR`` round trips (at most
    ``RTT_CAP_NS``)."""
    return PREFETCH_TARGET_NS + RTT_FACTOR * min(rtt_ns, RTT_CAP_NS)


def adaptive_prefetch(task_ns: float, max_prefetch: int, rtt_ns: int = 0) -> int:
    """Tasks to queue ahead: :func:`prefetch_target_ns` of tasks of ``task_ns`` each, from 1 to
    ``max_prefetch``."""
    return min(max_prefetch, max(1, int(prefetch_target_ns(rtt_ns) / (task_ns + 1))))
