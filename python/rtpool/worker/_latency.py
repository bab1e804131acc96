"""The round trip a worker child sees to the master, measured from its own credits: the delay
from sending a ``PULL`` to the ``ASSIGN`` that answers it.

That delay is the round trip plus the master's dispatch only when the master had tasks waiting
for the credits; otherwise it also holds however long the master waited for work (a client's
think time, the gap between packages), and in a sequential workload it is nothing but that:
the worker keeps ``1 + prefetch`` credits at the master, each task spends one, and a new
``PULL`` queues behind credits parked there for lack of work (a no-op round trip after another
measured 64 client round trips, ~0.1 s). So a ``PULL`` is a sample only when both of these say
the master had work for it:

* **Nothing of ours parked ahead of it.** When the ``PULL`` leaves, the oldest credit still
  unanswered is at most :data:`IN_FLIGHT_RTTS` round trips old (in flight, not parked), or
  there is none. The worker cannot see the master's queue, but it knows the age of its own
  credits: one older than a couple of round trips was parked, and credits are spent oldest
  first.
* **Answered in full.** The first ``ASSIGN`` that spends its credits spends all of them: a
  master with tasks waiting fills a ``PULL`` at once; one that hands out fewer was waiting for
  work (a sequential client submits one task at a time).

The estimate is the minimum over the last :data:`WINDOW` samples, which also drops a sample
that passed both checks by chance (a package arriving at a master that was idle when a whole
``PULL`` reached it). ``adaptive_prefetch`` (``_prefetch.py``) turns it into tasks queued ahead, so
a worker far from its master keeps working while its next credits travel (issue 13). Pure
bookkeeping: no socket, no clock of its own.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, List

#: Samples the minimum is taken over: long enough that a run of samples of an idle master
#: (a PULL answered only when a package arrives) is unlikely to fill it, short enough to follow
#: a path that got slower within a few dozen tasks.
WINDOW = 16
#: A credit unanswered for longer than this many round trips (the current estimate) was parked
#: at the master, not in flight: a PULL sent behind it is no sample. The slack covers jitter
#: (the estimate is a minimum); an estimate too high only admits more samples, which lower it.
IN_FLIGHT_RTTS = 2


class RoundTrip:
    """Windowed minimum of ``PULL`` -> ``ASSIGN`` delays, in nanoseconds, over the ``PULL``\\ s
    the master had work for (the module's docstring says how that is told)."""

    __slots__ = ("_pulls", "_samples", "_next", "rtt_ns")

    def __init__(self) -> None:
        # [sent_ns, credits not yet spent, to sample] per PULL in flight, oldest first.
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
        pulls = self._pulls
        # With no estimate yet, any credit still out counts as parked.
        behind_parked = bool(pulls) and sent_ns - pulls[0][0] > IN_FLIGHT_RTTS * self.rtt_ns
        pulls.append([sent_ns, credits, not behind_parked])

    def on_assign(self, n: int, received_ns: int) -> None:
        """``n`` tasks arrived at ``received_ns``: they spend the oldest credits first."""
        pulls = self._pulls
        while n > 0 and pulls:
            p = pulls[0]
            used = n if n < p[1] else p[1]
            if p[2]:
                p[2] = False  # its first answer, sampled only when it answered it in full
                if used == p[1]:
                    self._sample(received_ns - p[0])
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
