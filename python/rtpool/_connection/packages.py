"""Packages on a client connection: splitting a submission into ``SUBMIT`` frames, sending
them, cancelling tasks locally, and waiting for ``ACCEPTED`` or a ``STATUS_REPLY``.

A mixin of :class:`~rtpool._connection.connection._Connection` (the state is there).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

from .. import _protocol as P
from .._future import DEFAULT_STALL_WARNING_S, Future
from .._options import with_key
from ..errors import ConnectionLost, SubmitRejected
from .segment import ALL, _Segment

_encode_submit = P.encode_submit

# Bytes of a SUBMIT frame besides the function code and the payloads (prefix, array header,
# kind, req_id, fn_hash, and the opts map: 203 bytes with every option set to its widest value
# and the key), rounded up; and per payload (bin32 header).
_SUBMIT_OVERHEAD = 256
_PAYLOAD_OVERHEAD = 5
_MAX_TASKS_PER_FRAME = 2**32 - 1
# Segments finished by local cancellation may still get late results (tasks that were running):
# they stay countable for ACK, up to this many (the oldest are forgotten first).
_LATE_MAX = 1024


def _submit_frame(req_id: int, digest: bytes, code: bytes, opts: dict, tasks: list) -> bytes:
    # ``opts`` are in wire form (Client.options() made them so), with a fresh idempotency key.
    return _encode_submit(req_id, digest, code, with_key(opts), tasks)


class _Packages:
    """Submitting, cancelling and waiting on packages."""

    #: Seconds a ``result()`` without a timeout waits before it asks the master whether
    #: anything can run its task, and warns once if nothing can (None: never); the client's
    #: ``stall_warning``.
    stall_warning_s: float | None = DEFAULT_STALL_WARNING_S
    _thread: threading.Thread

    def is_reader_thread(self) -> bool:
        """Whether the caller is this connection's reader thread, which must not wait for a
        reply it would have to read itself."""
        return threading.current_thread() is self._thread

    def _check_frame(self, frame: bytes) -> None:
        """Refuse a one-task ``SUBMIT`` frame above the master's limit before it is sent: the
        master would close the connection (``ERROR too_large``), failing every other call on
        it. Only this call fails; the connection stays as it is."""
        size = len(frame) - 4  # the length prefix is not part of the frame body
        if size > self.max_frame_bytes:
            raise ValueError(
                f"the task's function and arguments pickle to {size} bytes, above the master's "
                f"frame limit of {self.max_frame_bytes} bytes (max_frame_bytes); nothing was "
                "sent. Pass less data per task (split it, or put it in a file or store the "
                "workers can read and pass its name), or start the master with a larger "
                "--max-frame-mb"
            )

    def _split(self, payloads: List[bytes], code_len: int) -> List[Tuple[int, int]]:
        n = len(payloads)
        limit = self.max_frame_bytes - _SUBMIT_OVERHEAD - code_len
        if limit <= 0:
            raise ValueError(
                f"the pickled task function is {code_len} bytes, above the master's frame "
                f"limit of {self.max_frame_bytes} bytes; pass large data as arguments or "
                "start the master with a larger --max-frame-mb"
            )
        if sum(map(len, payloads)) + _PAYLOAD_OVERHEAD * n <= limit and n <= _MAX_TASKS_PER_FRAME:
            return [(0, n)]
        bounds = []
        lo = 0
        size = 0
        for i, payload in enumerate(payloads):
            item = len(payload) + _PAYLOAD_OVERHEAD
            if item > limit:
                raise ValueError(
                    f"task {i}'s arguments pickle to {len(payload)} bytes, above the master's "
                    f"frame limit of {self.max_frame_bytes} bytes; start the master with a "
                    "larger --max-frame-mb or send the data another way"
                )
            if size + item > limit or i - lo >= _MAX_TASKS_PER_FRAME:
                bounds.append((lo, i))
                lo = i
                size = 0
            size += item
        bounds.append((lo, n))
        return bounds

    def _register(self, segments: List[_Segment]) -> int:
        """Make segments (frames set) known to the reader; return the connection generation."""
        with self._lock:
            if self.closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._lost is not None:
                raise self._lost
            for seg in segments:
                self._by_req[seg.req_id] = seg
            if self.sock is None:
                self._cond.notify_all()  # a reader waiting for work reconnects
            return self._gen

    def submit(
        self,
        digest: bytes,
        code: bytes,
        opts: Dict[str, Any],
        payloads: List[bytes],
        t0_ns: int,
        serialize_ns: int,
    ) -> Tuple[List[Future], List[_Segment]]:
        """Send one package; return its futures (input order) and segments."""
        n = len(payloads)
        bounds = self._split(payloads, len(code)) if n > 1 else [(0, 1)]
        serialize_us = serialize_ns / 1000 / n
        futures: List[Future] = []
        segments: List[_Segment] = []
        single = len(bounds) == 1
        for lo, hi in bounds:
            seg = _Segment(self, next(self._ids), hi - lo, t0_ns, serialize_us)
            seg.opts = opts
            cond = threading.Condition()
            seg.futures = [Future(seg, i, cond) for i in range(hi - lo)]
            tasks = payloads if single else payloads[lo:hi]
            seg.frame = _submit_frame(seg.req_id, digest, code, opts, tasks)
            if n == 1:  # _split checked larger packages item by item
                self._check_frame(seg.frame)
            futures.extend(seg.futures)
            segments.append(seg)
        gen = self._register(segments)
        for seg in segments:
            frame = seg.frame
            if frame is not None:  # None: already answered
                self._send(frame, gen=gen)
        return futures, segments

    def submit_one(
        self,
        digest: bytes,
        code: bytes,
        opts: Dict[str, Any],
        payload: bytes,
        t0_ns: int,
        serialize_ns: int,
    ) -> Tuple[Future, _Segment]:
        """:meth:`submit` for one task: the latency path, kept short."""
        req_id = next(self._ids)  # itertools.count: atomic under the GIL
        seg = _Segment(self, req_id, 1, t0_ns, serialize_ns / 1000)
        seg.opts = opts
        fut = Future(seg, 0)
        seg.futures = [fut]
        seg.frame = frame = _submit_frame(req_id, digest, code, opts, [payload])
        if len(frame) > self.max_frame_bytes:  # the common case costs one comparison
            self._check_frame(frame)
        self._send(frame, gen=self._register([seg]))
        return fut, seg

    def on_local_cancel(self, seg: _Segment, indices: tuple, count: int = 1) -> None:
        """Account for futures of ``seg`` cancelled here and tell the master."""
        with self._lock:
            seg.n_cancelled += count
            package = seg.package
            if package is None:
                if indices is ALL or seg.pending_cancel is ALL:
                    seg.pending_cancel = ALL
                else:
                    seg.pending_cancel = (seg.pending_cancel or ()) + indices
            elif seg.n_results + seg.n_cancelled >= seg.n:
                self._finish(seg)
        if package is not None and self._lost is None:
            self._send(P.encode(P.CANCEL, package, list(indices)), quiet=True)
        if self.closing:
            self.close_if_idle()

    def _finish(self, seg: _Segment) -> None:
        # Called with self._lock held.
        if self._segments.pop(seg.package, None) is not None and seg.n_cancelled:
            self._keep_late(seg)
        seg.futures = None

    def _keep_late(self, seg: _Segment) -> None:
        # With self._lock held: results of tasks that ran before the CANCEL reached the master
        # may still come for this package; count them for ACK so the master can free it.
        late = self._late
        late[seg.package] = seg
        if len(late) > _LATE_MAX:
            del late[next(iter(late))]

    def wait_accepted(self, seg: _Segment, timeout: float) -> int:
        """Wait for the ``ACCEPTED`` of a segment; return its package id."""
        with self._cond:
            if seg.package is None:
                self._waiting += 1
                try:
                    self._cond.wait_for(
                        lambda: (
                            seg.package is not None
                            or seg.req_id not in self._by_req
                            or self._lost is not None
                        ),
                        timeout,
                    )
                finally:
                    self._waiting -= 1
            if seg.package is not None:
                return seg.package
            if self._lost is not None:
                raise self._lost
            if seg.req_id in self._by_req:
                raise TimeoutError(
                    f"the master at {self.address} did not accept the package within {timeout:g} s"
                )
        raise seg.error or SubmitRejected(f"the master at {self.address} rejected the package")

    def status(self, seg: _Segment, timeout: float) -> tuple | None:
        """``(total, queued, running, done, cancelled, met, missed)``, or None if the master
        freed the package."""
        return self.status_and_workers(seg, timeout)[0]

    def status_and_workers(self, seg: _Segment, timeout: float) -> Tuple[tuple | None, int | None]:
        """:meth:`status`, and how many workers can run the package's tasks now (the workers
        connected, or for calls those serving the function; None from an older master)."""
        waiter = [seg.package, None, False, None, None]
        with self._lock:
            if self._lost is not None:
                raise self._lost
            if self.sock is None:
                raise ConnectionLost(
                    f"the connection to the master at {self.address} is down and the client "
                    "is reconnecting; ask for the status again later"
                )
            req_id = next(self._ids)
            self._status[req_id] = waiter
        self._send(P.encode(P.STATUS, req_id, seg.package))
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: waiter[2] or self._lost is not None, timeout)
            finally:
                self._waiting -= 1
                self._status.pop(req_id, None)
        if waiter[3] is not None:
            raise waiter[3]
        if waiter[2]:
            return waiter[1], waiter[4]
        if self._lost is not None:
            raise self._lost
        raise TimeoutError(
            f"the master at {self.address} did not answer STATUS within {timeout:g} s"
        )
