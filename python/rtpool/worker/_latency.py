"""The round trip a worker child sees to the master, measured from its own credits: the delay
from sending a ``PULL`` to the first ``ASSIGN`` that spends it.

That delay is the round trip plus the master's dispatch, plus however long the master had no
task to give: the estimate is the minimum over the last :data:`WINDOW` samples, which is the
round trip as soon as one of them found tasks waiting. ``adaptive_prefetch`` (``_loop.py``)
turns it into tasks queued ahead, so a worker far from its master keeps working while its next
credits travel (issue 13). Pure bookkeeping: no socket, no clock of its own.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, List

#: Samples the minimum is taken over: long enough that a run of samples of an idle master
#: (a PULL answered only when a package arrives) is unlikely to fill it, short enough to follow
#: a path that got slower within a few dozen tasks.
WINDOW = 16


class RoundTrip:
    """Windowed minimum of ``PULL`` -> first ``ASSIGN`` delays, in nanoseconds."""

    __slots__ = ("_pulls", "_samples", "_next", "rtt_ns")

    def __init__(self) -> None:
        # [sent_ns, credits not yet spent, sampled] per PULL in flight, oldest first.
        self._pulls: Deque[List] = deque()
        self._samples: List[int] = []
        self._next = 0
        #: The estimate: 0 until the first sample.
        self.rtt_ns = 0

    def reset(self) -> None:
        """A new session: the path (and the master) may be another."""
        self._pulls.clear()
        self._samples = []
        self._next = 0
        self.rtt_ns = 0

    def withdraw(self) -> None:
        """The credits in flight were withdrawn (``RETURN``) or lost with the session."""
        self._pulls.clear()

    def on_pull(self, credits: int, sent_ns: int) -> None:
        """A ``PULL`` of ``credits`` was written at ``sent_ns`` (perf_counter_ns)."""
        self._pulls.append([sent_ns, credits, False])

    def on_assign(self, n: int, received_ns: int) -> None:
        """``n`` tasks arrived at ``received_ns``: they spend the oldest credits first."""
        pulls = self._pulls
        while n > 0 and pulls:
            p = pulls[0]
            if not p[2]:
                p[2] = True
                self._sample(received_ns - p[0])
            used = min(n, p[1])
            p[1] -= used
            n -= used
            if p[1] <= 0:
                pulls.popleft()

    def _sample(self, delay_ns: int) -> None:
        if delay_ns < 0:
            return
        samples = self._samples
        if len(samples) < WINDOW:
            samples.append(delay_ns)
        else:
            samples[self._next] = delay_ns
            self._next = (self._next + 1) % WINDOW
        self.rtt_ns = min(samples)
