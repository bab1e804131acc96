"""One ``SUBMIT`` or ``CALL`` frame's tasks on the client: a master package and its futures."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

from .._future import Future
from .._options import has_deadline

__all__ = ["ALL", "_Segment"]

# "The whole package" for on_local_cancel() and _Segment.pending_cancel: on the wire, CANCEL
# with no indices.
ALL = ()
_NO_OPTS: dict = {}


class _Segment:
    """The tasks of one SUBMIT frame: one master package.

    A :class:`Package` is usually one segment; it has several when it does not fit in one frame.
    The reader thread counts results, the cancelling thread (under the connection lock) counts
    local cancellations; the segment is done when the two add up to its size.
    """

    __slots__ = (
        "conn",
        "decode",
        "error",
        "frame",
        "futures",
        "n",
        "n_cancelled",
        "n_results",
        "opts",
        "package",
        "pending_cancel",
        "req_id",
        "retry",
        "rx",
        "serialize_us",
        "t0_ns",
        "ack_may_wait",
    )

    def __init__(self, conn: Any, req_id: int, n: int, t0_ns: int, serialize_us: float):
        # conn: the _Connection (typed Any: connection.py imports this module).
        self.conn = conn
        self.req_id = req_id
        self.package: int | None = None
        self.error: BaseException | None = None
        self.futures: List[Future] | None = None
        # The package's opts map as sent (wire form; shared, never changed).
        self.opts: dict = _NO_OPTS
        # The SUBMIT frame, kept until ACCEPTED so a reconnect re-sends the very same bytes.
        self.frame: bytes | None = None
        self.n = n
        self.n_results = 0
        self.n_cancelled = 0
        # TaskResult entries received on this connection since ACCEPTED: the ACK count.
        self.rx = 0
        # Complete and small: its ACK may wait for the next frame sent (_send_acks).
        self.ack_may_wait = False
        self.t0_ns = t0_ns
        self.serialize_us = serialize_us
        # Cancellations made before ACCEPTED gave the package id: indices, or ALL.
        self.pending_cancel: tuple | None = None
        # Call packages: (index, status, data) -> (value, error), instead of unpickling.
        self.decode: Callable[[int, int, Any], Tuple[Any, BaseException | None]] | None = None
        # The owner's way to rebuild and send the request again once, after the master
        # refused it with an ERROR the owner handles (rtpool.rpc: a call package whose
        # interfaces came from the cache, on ERROR unknown_function). The connection never
        # calls it; see _Connection.take_refused and resend.
        self.retry: Callable[[_Segment, str], None] | None = None

    @property
    def has_deadline(self) -> bool:
        """Whether the package has a deadline (its futures then report their lateness)."""
        return has_deadline(self.opts)
