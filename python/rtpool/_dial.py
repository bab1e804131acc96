"""Opening an authenticated connection to the master (shared by the client and the worker).

Connect over TCP with ``TCP_NODELAY`` (every frame is a complete message the peer waits for),
optionally wrap the socket in TLS, send ``HELLO``, wait for ``WELCOME``, and turn each way this
can fail into an error that says what failed, where, and what to try. The client's live
connection built on it (reader thread, reconnection) is ``_connection/``.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import ssl
import time
from typing import Any, Callable, Dict, List, NamedTuple, Set, Tuple, Union

from . import _protocol as P
from ._masters import LEADER_SEARCH_PAUSE_S, Address, Candidate, Masters, leader_of
from ._tls_socket import LockedTlsSocket
from .errors import AuthenticationError, ConnectError, MasterBusy, ProtocolError

#: ``False``: plain TCP; ``True``: TLS checked against the system's trust store (or ``ca_file``);
#: an ``ssl.SSLContext``: TLS with that context.
TlsOption = Union[bool, ssl.SSLContext]

_NAME_MAX_BYTES = 256

#: How long :func:`connect` keeps retrying a master that answers ``busy`` (its connection
#: limits are reached) before it raises :class:`~rtpool.errors.MasterBusy`.
BUSY_TIMEOUT_S = 60.0
#: First and longest pause between two attempts against a busy master (each pause is drawn
#: between half and all of the current one, so peers refused together do not return together).
BUSY_FIRST_PAUSE_S = 0.1
BUSY_MAX_PAUSE_S = 5.0


class Welcome(NamedTuple):
    """The master's ``WELCOME`` fields."""

    version: int
    session: int
    max_frame_bytes: int
    heartbeat_ms: int
    lease_ms: int = 0
    instance: int = 0
    #: How often this worker heartbeats while it holds no task (only to a worker whose
    #: ``HELLO`` had :data:`FEATURE_IDLE_HEARTBEAT`); 0: every ``heartbeat_ms``.
    idle_heartbeat_ms: int = 0


#: ``HELLO.features`` bit: this worker heartbeats at ``WELCOME.idle_heartbeat_ms`` while it
#: holds no task, at ``heartbeat_ms`` from the moment it receives one (issue 25).
FEATURE_IDLE_HEARTBEAT = 1


def default_name() -> str:
    """``hostname:pid``, the informational peer name sent in ``HELLO``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_identity(slot: int | None = None, pid: int | None = None) -> str:
    """``hostname:pid``, or ``hostname:pid/slot`` for one slot of a supervised worker (``pid``
    is then the supervisor's): the stable identity a worker sends in ``HELLO``, which survives
    its reconnects and, under a supervisor, the restarts of its child process."""
    pid = os.getpid() if pid is None else pid
    base = f"{socket.gethostname()}:{pid}"
    return base if slot is None else f"{base}/{slot}"


def _clip_name(name: str) -> str:
    data = name.encode("utf-8")
    if len(data) <= _NAME_MAX_BYTES:
        return name
    return data[:_NAME_MAX_BYTES].decode("utf-8", "ignore")


class MasterUnreachable(ConnectError):
    """No TCP connection to the master's address (refused, unresolvable, timed out): the
    master may not be up yet. A worker waits for it (``--reconnect-timeout``); everything
    else sees a :class:`~rtpool.errors.ConnectError`."""


class NotLeader(MasterUnreachable):
    """The master is a standby (or a leader that lost its lease): it answered ``HELLO`` with
    ``ERROR not_leader``. ``leader`` is the ``(host, port)`` it named, or None (unknown)."""

    def __init__(self, message: str, leader: Tuple[str, int] | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class HandshakeTimeout(MasterUnreachable):
    """The connection was accepted but ``WELCOME`` never came within the timeout: a silent
    address, as one that does not accept (an overloaded master, or a path that stalls)."""


def _open_socket(host: str, port: int, timeout: float, where: str) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:
        raise MasterUnreachable(
            f"cannot reach master at {where} (cannot resolve host {host!r}: {exc.strerror}); "
            "check the address"
        ) from None
    except ConnectionRefusedError:
        raise MasterUnreachable(
            f"cannot reach master at {where} (connection refused); is `rtpool master` running?"
        ) from None
    except socket.timeout:
        raise MasterUnreachable(
            f"cannot reach master at {where} (no answer within {timeout:g} s); "
            "is the address right and the port open?"
        ) from None
    except OSError as exc:
        raise MasterUnreachable(
            f"cannot reach master at {where} ({exc.strerror or exc}); "
            "is `rtpool master` running and reachable?"
        ) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _enable_keepalive(sock)
    return sock


#: TCP keepalive of every connection to the master: first probe after 5 s of silence, then one
#: a second, dropped after 3 unanswered (the master's side does the same).
_KEEPALIVE = (
    ("TCP_KEEPIDLE", 5),
    ("TCP_KEEPINTVL", 1),
    ("TCP_KEEPCNT", 3),
)


def _enable_keepalive(sock: socket.socket) -> None:
    # Best effort: an option this OS lacks stays at its default.
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _KEEPALIVE:
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        pass


def _set_user_timeout(sock: socket.socket, lease_ms: int) -> None:
    """Give up on data the master does not acknowledge within its lease (10 s without one),
    instead of the kernel's ~15 minutes of retransmissions."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, max(lease_ms or 10_000, 1000))
    except OSError:
        pass


def tls_context(tls: TlsOption, ca_file: str | None = None) -> ssl.SSLContext | None:
    """The TLS context for ``tls`` and ``ca_file``, or None for plain TCP.

    ``ca_file`` alone implies ``tls=True``: it is the trust root (for a self-signed master, the
    certificate it printed), instead of the system's trust store.

    Raises:
        ValueError: ``ca_file`` was given with a ready ``ssl.SSLContext``.
        ConnectError: ``ca_file`` cannot be read as PEM certificates.
    """
    if isinstance(tls, ssl.SSLContext):
        if ca_file is not None:
            raise ValueError("pass ca_file or an ssl.SSLContext, not both")
        return tls
    if not tls and ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConnectError(
            f"cannot use {ca_file!r} as the CA file ({exc}); pass the master's certificate "
            "(a self-signed master prints its path)"
        ) from None


def _wrap_tls(sock: socket.socket, context: ssl.SSLContext, host: str, where: str) -> socket.socket:
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ConnectError(
            f"the TLS certificate of master at {where} is not trusted ({exc.verify_message}); "
            "for a self-signed master pass ca_file= (worker: --ca-file) with its certificate"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        detail = "no answer" if isinstance(exc, socket.timeout) else str(exc)
        raise ConnectError(
            f"TLS handshake with master at {where} failed ({detail}); does the master serve "
            "TLS (--tls-cert/--tls-key or --tls-self-signed)?"
        ) from None


def _handshake_error(msg: list, where: str, role: str) -> Exception:
    code, message = (msg[1], msg[2]) if len(msg) >= 3 else ("?", repr(msg))
    if code == P.ERR_AUTH:
        env = "RTPOOL_TOKEN" if role == "client" else "RTPOOL_WORKER_TOKEN"
        # The master's message already says which token to use; add where a client finds it.
        return AuthenticationError(
            f"master at {where} refused the {role} token: {message}; or set ${env}"
        )
    if code == P.ERR_VERSION:
        return ProtocolError(
            f"master at {where} does not speak protocol version {P.PROTOCOL_VERSION} "
            f"({message}); the master speaks an older protocol: upgrade rtpool on the "
            "master (or use the same rtpool release on both sides)"
        )
    if code == P.ERR_BUSY:
        return MasterBusy(f"master at {where} is busy: {message}")
    if code == P.ERR_NOT_LEADER:
        return NotLeader(f"master at {where} is not the leader ({message})", leader_of(message))
    if code == P.ERR_SHUTDOWN:
        return ConnectError(f"master at {where} is shutting down ({message}); try again later")
    refused = ProtocolError(f"master at {where} refused the handshake: {code}: {message}")
    refused.code = code  # type: ignore[attr-defined]  # connect() falls back on "malformed"
    return refused


def connect(
    address: Address | Masters,
    *,
    role: str,
    token: str,
    name: str,
    slots: int,
    timeout: float,
    tls: TlsOption = False,
    ca_file: str | None = None,
    busy_timeout: float | None = None,
    identity: str | None = None,
    resources: Dict[str, int] | None = None,
    labels: Dict[str, str] | None = None,
    features: int = 0,
) -> Tuple[socket.socket, Welcome, P.FrameReader, List[list]]:
    """Open a connection to the master (the leader, of several) and complete the handshake.

    One pass tries every address once, from the one that worked last (see
    :class:`~rtpool._masters.Masters`): a refused or silent address gives way to the next at
    once; a standby's ``not_leader`` to the leader it names, then the rest. With several
    addresses each waits at most ``FIRST_PASS_TIMEOUT_S`` (1 s), doubled by each pass in a
    row that found no master at all. A pass in which a master answered ``busy`` (its
    connection limits are reached) is tried again after a jittered pause, 0.1 s doubling up to
    5 s, for up to ``busy_timeout`` seconds; one in which a standby answered but no leader (an
    election under way) after 0.05-0.1 s, for up to ``timeout`` seconds.

    Args:
        address: ``"host:port"``, ``(host, port)``, several (``"h1:7070,h2:7070"`` or a
            list), or a :class:`~rtpool._masters.Masters` that keeps what dialling learned.
        role: ``"client"`` or ``"worker"``.
        token: The master's token for that role.
        name: Informational peer name (clipped to 256 bytes).
        slots: Tasks run at once (workers), 0 for clients.
        timeout: Seconds to wait for the connection, the TLS handshake and ``WELCOME`` (per
            address; with several, 1 s at first: ``Masters.dial_timeout``).
        tls: ``False`` for plain TCP, ``True`` for TLS checked against the system trust store
            (or ``ca_file``), or a ready ``ssl.SSLContext``. The certificate is checked
            against each address's configured host name.
        ca_file: PEM file of the certificates to trust (implies TLS).
        busy_timeout: Seconds to keep retrying a busy master (0: do not retry; default
            :data:`BUSY_TIMEOUT_S`).
        identity: A worker's stable identity (``HELLO.identity``, clipped to 256 bytes): the
            same across its reconnects and the restarts of its process, so the master still
            knows how fast it is (see :func:`worker_identity`). None: not sent.
        resources: A worker's resources (``HELLO``'s 7th field, ``{name: total}``, sorted),
            needs ``identity``; None or empty with no labels: not sent.
        labels: A worker's labels (``HELLO``'s 8th field, sorted); None or empty: not sent.
        features: A worker's ``HELLO.features`` (9th field, :data:`FEATURE_IDLE_HEARTBEAT`);
            0: not sent.

    Returns:
        ``(socket, welcome, reader, extra)``: a blocking socket with ``TCP_NODELAY`` (with
        TLS a :class:`~rtpool._tls_socket.LockedTlsSocket`, safe for a reader thread and
        writer threads at once), the
        ``WELCOME`` fields, the frame reader (its limit raised to ``max_frame_bytes``) and any
        messages that arrived right after ``WELCOME``. ``Masters.current`` names the address.

    Raises:
        ValueError: ``address`` is not an address or a list of them.
        ConnectError: No master can be reached, or each closed the connection.
        NotLeader: Every master reached is a standby (none leads, or the leader is down).
        MasterBusy: The master was still busy after ``busy_timeout`` seconds.
        AuthenticationError: The master refused the token.
        ProtocolError: The master answered something that is not a ``WELCOME``.
    """
    masters = address if isinstance(address, Masters) else Masters(address)
    if busy_timeout is None:
        busy_timeout = BUSY_TIMEOUT_S
    # HELLO's optional trailing fields after identity (docs/resources.md).
    extra: list = []
    if identity and (resources or labels):
        extra = [dict(resources or {})] + ([dict(labels)] if labels else [])
    # Without the features: what a master older than HELLO.features is sent after it refused
    # them as malformed (an upgrade of the workers before their master).
    plain = (identity, extra)
    if features:
        identity = identity or ""
        extra = [dict(resources or {}), dict(labels or {}), features]
    context = tls_context(tls, ca_file)
    started = time.monotonic()
    pause = BUSY_FIRST_PAUSE_S
    attempts = 0
    while True:
        attempts += 1
        try:
            return _connect_pass(
                masters,
                timeout,
                lambda cand, wait: _connect_once_or_plain(
                    cand, role, token, name, slots, wait, context, (identity, extra), plain
                ),
            )
        except MasterBusy as exc:
            waited = time.monotonic() - started
            if waited + pause / 2 > busy_timeout:
                raise MasterBusy(
                    f"{exc} (gave up after {attempts} attempts in {waited:.1f} s); retry later, "
                    "or ask the master's operator to raise --max-connections"
                ) from None
        except NotLeader as exc:
            waited = time.monotonic() - started
            if waited + LEADER_SEARCH_PAUSE_S / 2 > min(busy_timeout, timeout):
                raise NotLeader(
                    f"{exc} (no leader after {attempts} passes in {waited:.1f} s); is a master "
                    "leading (see the masters' logs)?",
                    exc.leader,
                ) from None
            # A standby answered: an election is under way; ask again soon, not later.
            time.sleep(masters.retry_pause(pause))
            continue
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, BUSY_MAX_PAUSE_S)


_Dialled = Tuple[socket.socket, Welcome, P.FrameReader, List[list]]


def _connect_once_or_plain(
    cand: Candidate,
    role: str,
    token: str,
    name: str,
    slots: int,
    wait: float,
    context: ssl.SSLContext | None,
    hello: Tuple[str | None, list],
    plain: Tuple[str | None, list],
) -> _Dialled:
    """:func:`_connect_once` with ``hello``'s trailing fields; if the master refuses them as
    malformed and they carry more than ``plain`` (``HELLO.features``, which masters before it
    refuse), once more with ``plain``: such a master then judges the worker as before."""
    try:
        return _connect_once(cand, role, token, name, slots, wait, context, *hello)
    except ProtocolError as exc:
        if hello == plain or getattr(exc, "code", None) != P.ERR_MALFORMED:
            raise
    logging.getLogger(__name__).info(
        "master at %s refused HELLO.features (an older master): connecting without", cand.label
    )
    return _connect_once(cand, role, token, name, slots, wait, context, *plain)


def _connect_pass(
    masters: Masters, timeout: float, attempt: Callable[[Candidate, float], _Dialled]
) -> _Dialled:
    """Try each address of ``masters`` once (a named leader first), each for at most
    ``masters.dial_timeout(timeout)``; the first session."""
    queue = masters.candidates()
    wait = masters.dial_timeout(timeout, len(queue))
    tried: Set[Tuple[str, int]] = set()
    errors: List[ConnectError] = []
    while queue:
        cand = queue.pop(0)
        if (cand.host, cand.port) in tried:
            continue
        tried.add((cand.host, cand.port))
        try:
            dialled = attempt(cand, wait)
        except NotLeader as exc:
            masters.on_standby(cand, exc.leader)
            if exc.leader is not None:
                masters.place_leader(queue, tried, exc.leader)
            errors.append(exc)
            continue
        except ConnectError as exc:  # refused, silent, busy, shutting down, TLS: the next one
            masters.on_failed(cand)
            errors.append(exc)
            continue
        masters.on_connected(cand)
        return dialled
    # Answered: a master spoke (a standby, busy, shutting down), not only the network.
    masters.on_pass_failed(any(_answered(e) for e in errors))
    raise _pass_error(masters, errors)


def _answered(error: ConnectError) -> bool:
    """Whether a master (not only the network) gave ``error``: a standby, busy, shutting down."""
    return isinstance(error, NotLeader) or not isinstance(error, MasterUnreachable)


def _pass_error(masters: Masters, errors: List[ConnectError]) -> ConnectError:
    """One error for a pass in which every address failed: the error itself when there was
    one address; else the most telling kind (busy, then no leader, then unreachable) with
    every address's reason."""
    if len(errors) == 1:
        return errors[0]
    kinds = [type(e) for e in errors]
    kind: type = ConnectError
    if MasterBusy in kinds:
        kind = MasterBusy
    elif NotLeader in kinds and all(issubclass(k, MasterUnreachable) for k in kinds):
        kind = NotLeader
    elif all(issubclass(k, MasterUnreachable) for k in kinds):
        kind = MasterUnreachable
    message = f"no master of {masters.spec} took the connection: " + " | ".join(map(str, errors))
    if kind is NotLeader:
        leaders = [e.leader for e in errors if isinstance(e, NotLeader) and e.leader]
        return NotLeader(message, leaders[-1] if leaders else None)
    return kind(message)


def _connect_once(
    cand: Candidate,
    role: str,
    token: str,
    name: str,
    slots: int,
    timeout: float,
    context: ssl.SSLContext | None,
    identity: str | None = None,
    extra: List[Any] | None = None,
) -> _Dialled:
    """One attempt of :func:`connect` at one address; ``extra``: HELLO's fields after
    ``identity``."""
    where = cand.label
    sock = _open_socket(cand.host, cand.port, timeout, where)
    if context is not None:
        sock = _wrap_tls(sock, context, cand.server_name, where)
    try:
        hello = [P.PROTOCOL_VERSION, role, token, _clip_name(name), slots]
        if identity or extra:
            hello.append(_clip_name(identity or ""))
            hello += extra or ()
        sock.sendall(P.encode(P.HELLO, *hello))
        reader = P.FrameReader(P.PRE_AUTH_MAX_FRAME)
        msgs: List[list] = []
        while not msgs:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                raise HandshakeTimeout(
                    f"master at {where} did not answer the handshake within {timeout:g} s; "
                    "is it an rtpool master?"
                ) from None
            except ssl.SSLError as exc:
                raise ConnectError(
                    f"TLS connection to master at {where} failed during the handshake ({exc}); "
                    "does the master serve TLS?"
                ) from None
            except OSError as exc:
                raise ConnectError(
                    f"connection to master at {where} failed during the handshake "
                    f"({exc.strerror or exc})"
                ) from None
            if not data:
                raise ConnectError(
                    f"master at {where} closed the connection during the handshake; "
                    "see the master's log"
                )
            msgs = reader.feed(data)
        first = msgs[0]
        if first[0] == P.ERROR:
            raise _handshake_error(first, where, role)
        # 5: before lease_ms/instance; 8: with idle_heartbeat_ms
        if first[0] != P.WELCOME or len(first) not in (5, 7, 8):
            raise ProtocolError(f"master at {where} answered HELLO with {first!r:.100}")
        welcome = Welcome(*first[1:])
        _set_user_timeout(sock, welcome.lease_ms)
        reader.max_frame = welcome.max_frame_bytes
        sock.settimeout(None)
        if context is not None:
            # Threads share the connection: OpenSSL allows one call on it at a time.
            sock = LockedTlsSocket(sock)  # type: ignore[assignment]
        return sock, welcome, reader, msgs[1:]
    except BaseException:
        sock.close()
        raise
