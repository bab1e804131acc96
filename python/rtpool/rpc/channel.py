"""The grid-RPC state of one client connection (``docs/rpc.md``): the interface cache,
``FUNCTIONS`` requests (sent again after a reconnection), ``CALL`` frames, and sending a call
package again after ``ERROR unknown_function`` when its interfaces came from the cache.

The connection (``rtpool._connection``) knows nothing of this: :class:`RpcChannel` plugs in
through its generic hooks (a handler for ``FUNCTIONS_REPLY``, one for ``ERROR
unknown_function``, frames to send after a reconnection, requests that need the connection).
A call package is an ordinary segment of the connection, so ``ACCEPTED``, ``RESULTS``, ``ACK``,
``ATTACH``, ``CANCEL`` and re-sending a ``CALL`` not yet accepted after a reconnection work as
for ``SUBMIT``.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Sequence, Tuple

from .. import _protocol as P
from .._connection import _Connection, _Segment
from .._frame import SEGMENT_MIN_BYTES, as_payload
from .._options import with_key
from ..errors import UnknownFunctionError
from .interface import Interface

__all__ = ["RpcChannel"]

_encode = P.encode
# A FUNCTIONS request waits at least this long (also across a reconnection).
_FUNCTIONS_TIMEOUT_S = 30.0


def _with_segments(calls: list) -> list:
    """``calls`` with each argument blob of 64 KiB or more as a :class:`Payload`: it travels
    as a segment of the frame (issue 16), not copied into the msgpack body."""
    if not any(len(c[2]) >= SEGMENT_MIN_BYTES for c in calls):
        return calls
    return [[c[0], c[1], as_payload(c[2]), *c[3:]] for c in calls]


class RpcChannel:
    """Grid-RPC requests over one client connection; shared by a client and its views.

    Args:
        conn: The connection; the channel registers its hooks on it.
    """

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        #: Interfaces by (name, version asked for): one FUNCTIONS round trip per function and
        #: client, shared by its options() views.
        self.interfaces: Dict[Tuple[str, str | None], Interface] = {}
        # req_id -> [name, functions or None, answered]: FUNCTIONS requests in flight, under
        # the connection's lock.
        self._waiters: Dict[int, list] = {}
        conn.on_message(P.FUNCTIONS_REPLY, self._on_functions_reply)
        conn.on_error(P.ERR_UNKNOWN_FUNCTION, self._on_unknown_function)
        conn.on_reconnect(self._requests_to_resend)
        conn.on_pending(lambda: bool(self._waiters))

    # -- FUNCTIONS --------------------------------------------------------------------------

    def functions(self, name: str, timeout: float) -> list:
        """Ask the master which functions are served (``FUNCTIONS``): ``name``'s versions,
        or everything for ``""``. Survives a reconnection (the request is sent again).

        Returns:
            ``[[name, version, servers, interface], ...]`` as ``FUNCTIONS_REPLY`` lists them.

        Raises:
            TimeoutError: No answer within ``timeout`` seconds.
            ConnectionLost: The connection is gone for good.
            RuntimeError: The client was shut down.
        """
        conn = self.conn
        waiter = [name, None, False]
        req_id, gen = conn.open_request(
            lambda req_id: self._waiters.__setitem__(req_id, waiter),
            "ask the master for functions",
        )
        try:
            conn.send(_encode(P.FUNCTIONS, req_id, name), gen=gen)
            answered = conn.wait(lambda: waiter[2], timeout)
        finally:
            conn.notify(lambda: self._waiters.pop(req_id, None))
        if answered:
            return waiter[1]
        conn.raise_if_lost()
        raise TimeoutError(
            f"the master at {conn.address} did not answer FUNCTIONS within {timeout:g} s"
        )

    def _on_functions_reply(self, msg: list) -> None:
        def answer() -> None:
            waiter = self._waiters.get(msg[1])
            if waiter is not None:
                waiter[1] = msg[2]
                waiter[2] = True

        self.conn.notify(answer)

    def _requests_to_resend(self) -> List[bytes]:
        # With the connection's lock held, after a reconnection.
        return [
            _encode(P.FUNCTIONS, req_id, waiter[0])
            for req_id, waiter in self._waiters.items()
            if not waiter[2]
        ]

    def fetch_interfaces(self, name: str, timeout: float | None = None) -> List[Interface]:
        """The interfaces the master lists for ``name`` (newest version first), or for every
        served function when ``name`` is ``""``, with their ``servers`` filled in."""
        if timeout is None:
            timeout = max(
                _FUNCTIONS_TIMEOUT_S, self.conn.reconnect_timeout + self.conn.connect_timeout
            )
        reply = self.functions(name, timeout)
        return [Interface.from_bytes(blob, servers) for _, _, servers, blob in reply]

    def lookup(self, name: str, version: str | None, timeout: float | None = None) -> Interface:
        """The interface of ``name`` (``version``, or the newest), fresh from the master.

        Raises:
            UnknownFunctionError: No worker serves it; the message lists what is served.
        """
        _check_name(name, version)
        ifaces = self.fetch_interfaces(name, timeout)
        if version is None:
            if ifaces:
                return ifaces[0]
        else:
            for iface in ifaces:
                if iface.version == version:
                    return iface
        what = f"'{name}'" if version is None else f"'{name}' version {version}"
        served = _describe_served(self.fetch_interfaces(""))
        raise UnknownFunctionError(f"no worker serves {what}; served: {served}")

    def interface(
        self, name: str, version: str | None, timeout: float | None = None
    ) -> Tuple[Interface, bool]:
        """``(interface, cached)``: from the cache, else fetched and cached."""
        iface = self.interfaces.get((name, version))
        if iface is not None:
            return iface, True
        iface = self.lookup(name, version, timeout)
        self.interfaces[(name, version)] = iface
        return iface, False

    def forget(self, name: str, version: str | None, iface: Interface) -> None:
        """Drop a cached interface (the master said it is no longer served)."""
        if self.interfaces.get((name, version)) is iface:
            del self.interfaces[(name, version)]

    # -- CALL -------------------------------------------------------------------------------

    def new_segment(self, n: int, t0_ns: int, opts: Dict[str, Any]) -> _Segment:
        """A segment for a package of ``n`` calls; the caller sets its ``futures``,
        ``decode`` (and ``retry``), then sends it with :meth:`send_calls`."""
        return self.conn.new_segment(n, t0_ns, opts)

    def send_calls(self, seg: _Segment, opts: Dict[str, Any], calls: list) -> None:
        """Send a ``CALL`` frame: ``calls`` are ``[name, version, args, deps, fetch]``.

        Raises:
            ValueError: The frame is above the master's frame limit (a package of calls is
                never split: its dependencies are indices within the frame).
        """
        calls = _with_segments(calls)
        frame = _encode(P.CALL, seg.req_id, with_key(opts), calls)
        self._check_size(frame, len(calls))
        self.conn.send_segment(seg, frame)

    def resend_calls(self, seg: _Segment, opts: Dict[str, Any], calls: list) -> None:
        """Send a call segment again under a new request id (a ``retry``'s way back, after
        ``ERROR unknown_function``); nothing if its futures failed meanwhile."""
        opts = with_key(opts)
        calls = _with_segments(calls)
        try:
            self._check_size(_encode(P.CALL, 0, opts, calls), len(calls))
        except ValueError as exc:
            self.conn.fail_unsent(seg, exc)
            return
        self.conn.resend(seg, lambda req_id: _encode(P.CALL, req_id, opts, calls))

    def fail_unsent(self, seg: _Segment, exc: BaseException) -> None:
        """Fail the futures of a call segment whose ``retry`` could not rebuild its calls."""
        self.conn.fail_unsent(seg, exc)

    def _check_size(self, frame: bytes, n: int) -> None:
        limit = self.conn.max_frame_bytes
        if len(frame) - 4 > limit:
            what = "the call's arguments" if n == 1 else f"the {n} calls' arguments"
            raise ValueError(
                f"{what} take {len(frame) - 4} bytes, above the master's frame limit of "
                f"{limit} bytes; send less data per call, or start the master with a larger "
                "--max-frame-mb"
            )

    def _on_unknown_function(self, message: str, ref: int) -> None:
        """``ERROR unknown_function`` for the ``CALL`` with request id ``ref``: retry it once
        if its interfaces came from the cache, else fail its futures."""
        seg = self.conn.take_refused(ref)
        if seg is None:
            return
        retry, seg.retry = seg.retry, None
        if retry is None:
            self.conn.fail_unsent(seg, UnknownFunctionError(message))
            return
        # It asks the master for the interfaces again: not on the reader thread.
        threading.Thread(
            target=retry, args=(seg, message), name="rtpool-call-retry", daemon=True
        ).start()


def _check_name(name: Any, version: Any) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a function name is a non-empty str, got {name!r}")
    if version is not None and not isinstance(version, str):
        raise TypeError(f'version must be a str (like "1") or None, got {version!r}')


def _describe_served(ifaces: Sequence[Interface]) -> str:
    """``add (2, 1), noop (1)``, as the master writes it, or ``nothing``."""
    versions: Dict[str, List[str]] = {}
    for iface in ifaces:
        versions.setdefault(iface.name, []).append(iface.version or '""')
    if not versions:
        return "nothing"
    return ", ".join(f"{name} ({', '.join(v)})" for name, v in sorted(versions.items()))
