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

import contextlib
import os
import weakref
from typing import Any, Dict, Iterator

from ._cluster_status import StatusChannel
from ._connection import _Connection
from ._dial import Address, TlsOption, default_name
from ._future import DEFAULT_STALL_WARNING_S, Future
from ._output import sink_of
from ._package import Package
from ._realtime import DEFAULT_IO_PRIORITY
from ._realtime_client import ClientRealtime
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
        address: The master's ``"host:port"`` or ``(host, port)``; or several, a leader and
            its standbys (``"m1:7070,m2:7070"``, a list, or one DNS name with a record per
            master): the client dials them in turn, follows the leader a standby names, and
            after a failover re-attaches its packages on the new leader (``docs/ha.md``).
            None: ``$RTPOOL_MASTER``.
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
        realtime: Real-time mode of the client (Linux): this process's memory locked and the
            client's reader and heartbeat threads under ``SCHED_FIFO``, each as far as the OS
            permits (a refusal is logged once on the ``rtpool.client`` logger, that step stays
            normal, the client works). The application's threads are left alone; see
            :meth:`realtime_thread`. :attr:`realtime` reports what took effect. The memory
            stays locked until the client is closed (and any real-time master embedded in
            this process has stopped).
        rt_priority: ``SCHED_FIFO`` priority of those threads, 1-99; the default (51) is one
            above the workers' default, so the client's I/O preempts a task a real-time
            worker runs on the same CPU (``docs/realtime.md``).
        task_output: What to do with what tasks print and log on their workers (each
            future's ``logs`` holds it in any case): ``"stderr"`` (default) shows each line on
            this process's stderr as ``(task 12 @ worker host:pid/3) line``; ``None`` shows
            nothing; a ``logging.Logger`` gets one record per line; a callable is called with
            ``(task_index, rtpool.TaskOutput)`` in the client's reader thread (keep it short).
            See ``docs/logs.md``.
        stall_warning: Seconds a ``result()`` or ``exception()`` without a timeout waits
            before it asks the master whether anything can run its task (again every as
            many seconds until it warns); when nothing can (no worker connected, or none
            serves the function) it logs one warning on the ``rtpool.client`` logger saying
            so and what to start, and keeps waiting. Default 10; None: never ask.

    Raises:
        ValueError: ``address`` is not ``host:port`` (or a list of them); the message names
            the bad entry.
        ConnectError: The master cannot be reached (or the TLS handshake failed).
        AuthenticationError: The master refused the token (or none was given).
        ProtocolError: The master answered the handshake with something unexpected.
    """

    def __init__(
        self,
        address: Address | None,
        token: str | None = None,
        *,
        name: str | None = None,
        connect_timeout: float = 10.0,
        tls: TlsOption = False,
        ca_file: str | None = None,
        reconnect_timeout: float = 60.0,
        realtime: bool = False,
        rt_priority: int = DEFAULT_IO_PRIORITY,
        task_output: Any = "stderr",
        stall_warning: float | None = DEFAULT_STALL_WARNING_S,
    ) -> None:
        sink = sink_of(task_output)  # (a bad value raises before anything connects)
        if stall_warning is not None and (
            isinstance(stall_warning, bool)
            or not isinstance(stall_warning, (int, float))
            or not 0 < stall_warning < float("inf")
        ):
            raise ValueError(
                f"stall_warning must be a positive number of seconds or None, got {stall_warning!r}"
            )
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
        self._realtime: ClientRealtime | None = None
        if realtime:
            self._realtime = ClientRealtime(rt_priority, threads=2)
            self._realtime.start()
        try:
            self._conn = _Connection(
                address,
                token,
                name or default_name(),
                connect_timeout,
                tls,
                ca_file,
                reconnect_timeout,
                thread_start=None if self._realtime is None else self._realtime.enter_thread,
            )
        except BaseException:
            if self._realtime is not None:
                self._realtime.release()
            raise
        self._conn.task_output = sink
        self._conn.stall_warning_s = None if stall_warning is None else float(stall_warning)
        self._rpc = RpcChannel(self._conn)
        self._status = StatusChannel(self._conn)
        # A client dropped without shutdown() closes once its pending tasks are done.
        self._finalizer = weakref.finalize(self, self._conn.shutdown, False)

    def __repr__(self) -> str:
        state = " closed" if self._conn.closing else ""
        return f"<rtpool.Client {self._conn.address} session={self._conn.session}{state}>"

    @property
    def address(self) -> str:
        """The ``host:port`` of the master the client is (or was last) connected to: with
        several addresses, the leader's."""
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
    def closed(self) -> bool:
        """Whether :meth:`shutdown` or :meth:`close` was called."""
        return self._conn.closing

    @property
    def realtime(self) -> Dict[str, Any] | None:
        """What real-time mode achieved (None without ``realtime=True``): ``active`` (every
        step took effect), ``memory_locked``, ``priority``, ``fifo_threads`` (the client's
        threads under ``SCHED_FIFO`` now), ``threads`` (``reader``/``heartbeat`` -> under
        ``SCHED_FIFO``), ``user_threads`` (threads inside :meth:`realtime_thread` now) and
        ``warnings`` (each refusal, as logged)."""
        return None if self._realtime is None else self._realtime.report()

    @contextlib.contextmanager
    def realtime_thread(self, priority: int | None = None) -> Iterator[bool]:
        """Run the calling thread under ``SCHED_FIFO`` for the ``with`` block, then restore its
        policy: for the thread that submits and waits, which real-time mode otherwise leaves
        alone. Works on any client; a refusal is logged (``rtpool.client``) and the block runs
        at the thread's normal policy.

        Example::

            with client.realtime_thread():
                result = client.submit(step, x, deadline=0.05).result()

        Args:
            priority: 1-99; by default the client's ``rt_priority``.

        Yields:
            Whether the thread runs under ``SCHED_FIFO`` inside the block.
        """
        rt = self._realtime or ClientRealtime(DEFAULT_IO_PRIORITY, threads=0)
        with rt.user_thread(priority) as fifo:
            yield fifo

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
