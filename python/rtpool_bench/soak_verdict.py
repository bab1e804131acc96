"""The two checks of ``rtpool bench soak``: every owed result, and flat series.

* :class:`Ledger` records each task the harness submitted (its tag and the value it is owed),
  each result that came back and each error, from any thread; :meth:`Ledger.check` says at the
  end which owed results are missing, wrong, or came more than once.
* :func:`flatness` is the verdict rule on one sampled series: after the warm-up (the first
  quarter of the samples), the median of the last quarter may exceed the median of the second
  quarter by at most 10 % plus a small absolute allowance per series (:data:`ALLOWANCES`), for
  values so small that one more descriptor or thread is already 10 %.
"""

from __future__ import annotations

import statistics
import threading
from collections import Counter
from typing import Any, Dict, List, Sequence

#: Growth allowed between the second quarter's median and the last quarter's, as a fraction.
GROWTH_LIMIT = 0.10

#: Absolute growth allowed on top of :data:`GROWTH_LIMIT`, per series, and why:
ALLOWANCES: Dict[str, float] = {
    # the allocator's arenas and one 1 MiB payload in flight more or less at the sample moment
    "master_rss_mb": 4.0,
    # clients and workers come and go: at a sample a few more may be connected (one
    # descriptor each), and the journal may hold one more segment open
    "master_fds": 8.0,
    # tokio's blocking pool starts and retires threads on demand (journal writes, DNS)
    "master_threads": 4.0,
    # the journal file is a sawtooth: it grows by up to the compaction threshold (64 MiB,
    # rtpool-master's DEFAULT_COMPACT_MIN_BYTES) before a compaction cuts it back to the live
    # records, so two medians of a few samples differ by up to that much with no growth
    "journal_mb": 64.0,
    # tables hold what is in flight at the sample moment: a round of the harness's packages
    "packages": 16.0,
    "tasks": 256.0,
    "functions": 8.0,
    "retained": 256.0,
    # per worker process: one payload buffer more or less
    "workers_rss_mb": 8.0,
}


def flatness(name: str, values: Sequence[float]) -> Dict[str, Any]:
    """The verdict on one series.

    Returns:
        ``{"series", "q2_median", "q4_median", "limit", "flat", "why"}``; ``flat`` is None when
        there are fewer than 4 samples (no quarters to compare).
    """
    allowance = ALLOWANCES.get(name, 0.0)
    out: Dict[str, Any] = {"series": name, "allowance": allowance}
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 4:
        return {
            **out,
            "q2_median": None,
            "q4_median": None,
            "limit": None,
            "flat": None,
            "why": f"{len(vals)} samples: too few for quarters",
        }
    n = len(vals)
    q2 = vals[n // 4 : n // 2]
    q4 = vals[n - max(1, n // 4) :]
    m2, m4 = statistics.median(q2), statistics.median(q4)
    limit = m2 * (1 + GROWTH_LIMIT) + allowance
    flat = m4 <= limit
    why = f"last-quarter median {m4:g} {'<=' if flat else '>'} {m2:g} * 1.10 + {allowance:g}"
    return {**out, "q2_median": m2, "q4_median": m4, "limit": limit, "flat": flat, "why": why}


def verdict(samples: List[Dict[str, float]], names: Sequence[str]) -> Dict[str, Any]:
    """:func:`flatness` of every series in ``names`` over ``samples`` (one dict per sample).

    Returns:
        ``{"rule", "series": [...], "flat"}``: ``flat`` is True when every series with enough
        samples is flat, None when none had enough.
    """
    rows = [flatness(n, [s.get(n) for s in samples]) for n in names]
    judged = [r["flat"] for r in rows if r["flat"] is not None]
    return {
        "rule": "after the warm-up (first quarter of the samples), the last quarter's median "
        "<= the second quarter's median * 1.10 + a per-series allowance",
        "series": rows,
        "flat": all(judged) if judged else None,
    }


class Ledger:
    """Every submitted task and what came back for it (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owed: Dict[int, Any] = {}  # tag -> expected value, or an exception class name
        self.kinds: Dict[int, str] = {}
        self.got: Dict[int, List[Any]] = {}
        self.not_owed = Counter()  # reasons a task was never owed (refused at submit, ...)

    def submitted(self, tag: int, kind: str, expected: Any) -> None:
        """``tag`` was submitted and is owed ``expected`` (a value, or ``"!ErrorName"``)."""
        with self._lock:
            self.owed[tag] = expected
            self.kinds[tag] = kind

    def refused(self, reason: str) -> None:
        """A submission that raised at once: nothing is owed for it."""
        with self._lock:
            self.not_owed[reason] += 1

    def refused_later(self, tag: int, reason: str) -> None:
        """The master refused ``tag``'s package at submission, answering after ``submit``
        returned (a call re-sent to a restarted master before any worker serves its
        function again): a refusal, so nothing is owed."""
        with self._lock:
            self.owed.pop(tag, None)
            kind = self.kinds.pop(tag, "?")
            self.not_owed[f"{kind}: {reason} (answered later)"] += 1

    def delivered(self, tag: int, value: Any) -> None:
        """A result (or ``"!ErrorName"`` for an error) came back for ``tag``."""
        with self._lock:
            self.got.setdefault(tag, []).append(value)

    def check(self) -> Dict[str, Any]:
        """Owed results missing, wrong or delivered twice, with counts per kind."""
        with self._lock:
            missing = [t for t in self.owed if t not in self.got]
            twice = [t for t, v in self.got.items() if len(v) > 1]
            wrong = [t for t, v in self.got.items() if t in self.owed and v[0] != self.owed[t]]
            unknown = [t for t in self.got if t not in self.owed]
            per_kind = Counter(self.kinds.values())
            return {
                "owed": len(self.owed),
                "delivered": sum(len(v) for v in self.got.values()),
                "per_kind": dict(sorted(per_kind.items())),
                "missing": len(missing),
                "wrong": len(wrong),
                "twice": len(twice),
                "unknown": len(unknown),
                "examples": {
                    "missing": [(t, self.kinds[t]) for t in missing[:5]],
                    "wrong": [(t, self.kinds[t], repr(self.got[t][0])[:80]) for t in wrong[:5]],
                },
                "not_owed": dict(self.not_owed),
                "ok": not (missing or twice or wrong or unknown),
            }
