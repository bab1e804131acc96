"""The client side of ``CLUSTER_STATUS`` (``docs/protocol.md``): ask the master for its status
snapshot (workers, queues, rates, latencies, deadlines, users), the very map that the master's
``GET /api/status`` serves as JSON (schema in ``docs/operations.md``).

Like :mod:`rtpool.rpc.channel`, it plugs into the connection through its generic hooks (a
handler for ``CLUSTER_STATUS_REPLY``, requests sent again after a reconnection), so the
connection knows nothing of it.
"""

from __future__ import annotations

from typing import Any, Dict, List

from . import _protocol as P
from ._connection import _Connection

__all__ = ["StatusChannel"]


class StatusChannel:
    """``CLUSTER_STATUS`` requests over one client connection.

    Args:
        conn: The connection; the channel registers its hooks on it.
    """

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        # req_id -> [snapshot or None, answered], under the connection's lock.
        self._waiters: Dict[int, list] = {}
        conn.on_message(P.CLUSTER_STATUS_REPLY, self._on_reply)
        conn.on_reconnect(self._requests_to_resend)
        conn.on_pending(lambda: bool(self._waiters))

    def status(self, timeout: float) -> Dict[str, Any]:
        """Ask the master for its snapshot; survives a reconnection (the request is re-sent).

        Raises:
            TimeoutError: No answer within ``timeout`` seconds.
            ConnectionLost: The connection is gone for good.
            RuntimeError: The client was shut down.
        """
        conn = self.conn
        waiter: list = [None, False]
        req_id, gen = conn.open_request(
            lambda req_id: self._waiters.__setitem__(req_id, waiter),
            "ask the master for its status",
        )
        try:
            conn.send(P.encode(P.CLUSTER_STATUS, req_id), gen=gen)
            answered = conn.wait(lambda: waiter[1], timeout)
        finally:
            conn.notify(lambda: self._waiters.pop(req_id, None))
        if answered:
            return waiter[0]
        conn.raise_if_lost()
        raise TimeoutError(
            f"the master at {conn.address} did not answer CLUSTER_STATUS within {timeout:g} s"
        )

    def _on_reply(self, msg: list) -> None:
        def answer() -> None:
            waiter = self._waiters.get(msg[1])
            if waiter is not None:
                waiter[0] = msg[2]
                waiter[1] = True

        self.conn.notify(answer)

    def _requests_to_resend(self) -> List[bytes]:
        # With the connection's lock held, after a reconnection.
        return [
            P.encode(P.CLUSTER_STATUS, req_id)
            for req_id, waiter in self._waiters.items()
            if not waiter[1]
        ]
