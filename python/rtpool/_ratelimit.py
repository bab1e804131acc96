"""Rate-limited log lines: at most one line per key (a peer, a function, a reason) per window,
with a count of the lines held back, so a flood of the same event costs one readable line per
window. The Python twin of the master's ``ratelimit::LogLimiter`` (same rules, same note).

A plain object without a clock or a lock of its own: the caller passes ``now`` (a monotonic
time in seconds) and keeps it where its lines are written. At most :attr:`LogLimiter.MAX_KEYS`
keys are remembered; when more show up, keys idle for a whole window are forgotten, and if
every key is recent the newcomers share one overflow slot.
"""

from __future__ import annotations

from typing import Dict, Hashable, List

__all__ = ["LogLimiter", "suppressed_note"]

_OVERFLOW = object()


class LogLimiter:
    """Decides which log lines of a repeated kind are written (see the module docstring).

    Args:
        window_s: Seconds between two lines of the same key.
    """

    #: Keys remembered at most.
    MAX_KEYS = 1024

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # key -> [time of the last line written, lines held back since]
        self._slots: Dict[Hashable, List[float]] = {}

    def check(self, key: Hashable, now: float) -> int | None:
        """Whether to write a line for ``key`` at ``now``: the number of lines held back for
        it since the last one written (0 for none), or None to hold this one back."""
        slots = self._slots
        if key not in slots and len(slots) >= self.MAX_KEYS:
            horizon = now - self.window_s
            for k in [k for k, s in slots.items() if s[0] <= horizon and k is not _OVERFLOW]:
                del slots[k]
            if len(slots) >= self.MAX_KEYS:
                key = _OVERFLOW
        slot = slots.get(key)
        if slot is None:
            slots[key] = [now, 0]
            return 0
        if now - slot[0] >= self.window_s:
            held, slot[0], slot[1] = slot[1], now, 0
            return int(held)
        slot[1] += 1
        return None

    def __len__(self) -> int:
        return len(self._slots)


def suppressed_note(held: int, window_s: float) -> str:
    """``" (3 more lines like it held back in the last 10 s)"``, or ``""`` for none."""
    if not held:
        return ""
    lines = "line" if held == 1 else "lines"
    return f" ({held} more {lines} like it held back in the last {window_s:g} s)"
