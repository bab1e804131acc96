"""Small helpers for messages people read: counts with the right plural."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, word: str, words: str | None = None) -> str:
    """``count`` and ``word`` in the right number: ``1 package``, ``2 packages``, ``0 packages``.

    Args:
        count: How many.
        word: The singular.
        words: The plural, when it is not ``word + "s"`` (``"processes"``).
    """
    if count == 1:
        return f"1 {word}"
    return f"{count:,} {words or word + 's'}"
