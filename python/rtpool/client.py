"""The rtpool client: :class:`Client`, a ``concurrent.futures.Executor`` backed by an rtpool
master.

What the client shares with its :meth:`~Client.options` views (submitting, ``map``,
``gather``, options, calls) is in ``_submitter.py``; :class:`Package` in ``_package.py``; the
live connection (socket, reader thread, routing of the master's answers, reconnection) in
``_connection/``, opening it in ``_dial.py``; the futures in ``_future.py``; package options in
``_options.py``; calls of named functions (:meth:`~Client.call`, :meth:`~Client.transaction`)
in ``rpc/``.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Dict

from ._cluster_status import StatusChannel
from ._connection import _Connection
from ._dial import Address, TlsOption, default_name
from ._future import Future
from ._package import Package
from ._submitter import ClientView, _Submitter
from .errors import AuthenticationError
from .rpc.calls import CallFuture
from .rpc.channel import RpcChannel
from .rpc.transaction import Transaction

__all__ = ["CallFuture", "Client", "ClientView", "Future", "Package", "Transaction"]


class Client(_Submitter):
    """A connection to an rtpool master, usable as a ``concurrent.futures.Executor``.

    Example::

        with rtpool.Client("127.0.0.1:7070", token) as client:
            print(list(client.map(pow, range(10), range(10))))

    Args:
        address: The master's ``"host:port"`` or ``(host, port)``.
        token: The master's client token; by default ``$RTPOOL_TOKEN``.
        name: Name shown in the master's log and status (default ``hostname:pid``).
        connect_timeout: Seconds to wait for the connection and the handshake.
        tls: ``True`` to connect with TLS (checked against the system trust store, or
            ``ca_file``), or a ready ``ssl.SSLContext``; ``False`` (default): plain TCP.
        ca_file: PEM certificate(s) to trust, e.g. the ``cert.pem`` a master started with
            ``--tls-self-signed`` prints; implies ``tls=True``.
        reconnect_timeout: When the connection drops with tasks pending, seconds to keep
            trying to reconnect (backoff from 0.05 s doubling to 5 s, with jitter); packages
            are then re-attached and no result is lost or delivered twice. 0 disables it:
            pending futures fail with :class:`~rtpool.errors.ConnectionLost` at once.

    Raises:
        ConnectError: The master cannot be reached (or the TLS handshake failed).
        AuthenticationError: The master refused the token (or none was given).
        ProtocolError: The master answered the handshake with something unexpected.
    """

    def __init__(
        self,
        address: Address,
        token: str | None = None,
        *,
        name: str | None = None,
        connect_timeout: float = 10.0,
        tls: TlsOption = False,
        ca_file: str | None = None,
        reconnect_timeout: float = 60.0,
    ) -> None:
        if not reconnect_timeout >= 0:
            raise ValueError(f"reconnect_timeout must be >= 0 seconds, got {reconnect_timeout!r}")
        if token is None:
            token = os.environ.get("RTPOOL_TOKEN")
        if not token:
            raise AuthenticationError(
                "no client token: pass token= or set RTPOOL_TOKEN (the master prints it on "
                "first start and keeps it in its data dir as client.token)"
            )
        self._opts = {}
        self._conn = _Connection(
            address,
            token,
            name or default_name(),
            connect_timeout,
            tls,
            ca_file,
            reconnect_timeout,
        )
        self._rpc = RpcChannel(self._conn)
        self._status = StatusChannel(self._conn)
        # A client dropped without shutdown() closes once its pending tasks are done.
        self._finalizer = weakref.finalize(self, self._conn.shutdown, False)

    def __repr__(self) -> str:
        state = " closed" if self._conn.closing else ""
        return f"<rtpool.Client {self._conn.address} session={self._conn.session}{state}>"

    @property
    def address(self) -> str:
        """The master's ``host:port``."""
        return self._conn.address

    @property
    def session(self) -> int:
        """The session id the master gave this connection."""
        return self._conn.session

    @property
    def reconnects(self) -> int:
        """How many times the client reconnected to the master after losing the connection."""
        return self._conn.reconnects

    @property
    def overload_notices(self) -> int:
        """How many packages with a deadline the master accepted while overloaded (each
        with a notice; see :class:`rtpool.OverloadWarning`)."""
        return self._conn.overload_notices

    def status(self, timeout: float = 10.0) -> Dict[str, Any]:
        """The master's status snapshot: what ``rtpool status`` and the dashboard show.

        One ``CLUSTER_STATUS`` round trip; the same map the master's ``GET /api/status``
        serves as JSON. Keys: ``master``, ``totals``, ``rates``, ``latency``, ``deadlines``,
        ``workers``, ``packages``, ``users`` (schema in ``docs/operations.md``). With a
        per-user token, the ``packages`` and ``users`` rows are this user's only.

        Args:
            timeout: Seconds to wait for the answer.

        Raises:
            TimeoutError: The master did not answer in time.
            ConnectionLost: The connection is gone for good.
        """
        return self._status.status(timeout)

    @property
    def max_frame_bytes(self) -> int:
        """The master's frame limit; larger packages are split into several frames."""
        return self._conn.max_frame_bytes

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks and close the connection when nothing is pending.

        Args:
            wait: Block until every pending task has a result, then close (across
                reconnections).
            cancel_futures: First cancel every task that has no result yet (the master is
                told with one ``CANCEL`` per package).
        """
        self._conn.shutdown(wait, cancel_futures)

    def close(self) -> None:
        """Cancel every pending task and close the connection now. Idempotent."""
        self._conn.shutdown(wait=True, cancel_futures=True)
