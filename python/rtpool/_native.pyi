"""Type stubs of the native module (PyO3, crates/rtpool-py)."""

from os import PathLike
from typing import Any, Dict, List, Tuple, Union

__version__: str

class Master:
    """An rtpool master running in background threads of this process.

    Args:
        listen: Address to bind; port 0 picks a free one.
        client_token: Token clients present; generated when None.
        worker_token: Token workers present; generated when None.
        data_dir: Directory for persistent state.
        max_frame_bytes: Largest frame accepted after the handshake (default 256 MiB).
        heartbeat_ms: How often idle workers should send HEARTBEAT.
        tls_cert: PEM certificate chain to serve TLS with (with ``tls_key``).
        tls_key: PEM private key of ``tls_cert``.
        tls_self_signed: Serve TLS with a self-signed certificate generated into
            ``data_dir/tls/`` (needs ``data_dir``); see :attr:`tls_cert`.
        max_connections: Authenticated connections served at once; more get ``ERROR busy``
            (default: from the open-file limit, which the master raises to its hard limit).
        max_buffered_bytes: Outbound bytes that may wait for one peer to read them before it
            is closed as a slow consumer (default: ``max_frame_bytes`` plus 64 MiB; at least
            ``max_frame_bytes``).
        lease_ms: A worker silent this long is closed and its tasks requeued (default 3000;
            0: never).
        client_timeout_ms: A client silent this long is closed (default 30000; 0: never).
        realtime: Real-time mode: lock this process's memory (mlockall), run the master's
            threads under SCHED_FIFO ``rt_priority`` and pin them to ``cpus``, each as far as
            the OS permits (a refused step is logged once and stays normal; see
            ``stats()["realtime"]``). The lock covers the whole process, this interpreter
            included, until the master stops.
        rt_priority: SCHED_FIFO priority, 1-99 (default 50).
        cpus: CPUs to pin the master's threads to: a list of ints or ``"0,1"``/``"0-3"``
            (default: no pinning).
        options: Any other ``rtpool master`` option (see :data:`MASTER_OPTIONS` and
            ``rtpool master --help``), keyed by its name with underscores: ``lease_ms``,
            ``store``, ``result_ttl_s`` (``--result-ttl``), ``max_attempts``, ``hedge_factor``,
            ``max_task_seconds``, ``timeout_grace_s`` (``--timeout-grace``), ``service_grace_s``
            (``--service-grace``), ``fsync`` (``"always"``, ``"batch:10"``, ``"off"``),
            ``journal`` (False: ``--no-journal``), ... Values are what the option takes (a
            bool for a flag); ``None`` values are skipped. The command line's parser checks
            them, so the dict and ``rtpool master`` cannot drift apart.

    Raises:
        rtpool.errors.RtpoolError: The address cannot be bound or the data dir used.
        ValueError: An unknown key in ``options`` (the message lists the known ones) or a value
            the option refuses.
    """

    def __init__(
        self,
        listen: str = "127.0.0.1:0",
        client_token: str | None = None,
        worker_token: str | None = None,
        data_dir: Union[str, PathLike[str]] | None = None,
        max_frame_bytes: int | None = None,
        heartbeat_ms: int | None = None,
        *,
        tls_cert: Union[str, PathLike[str]] | None = None,
        tls_key: Union[str, PathLike[str]] | None = None,
        tls_self_signed: bool = False,
        max_connections: int | None = None,
        max_buffered_bytes: int | None = None,
        lease_ms: int | None = None,
        client_timeout_ms: int | None = None,
        options: Dict[str, Any] | None = None,
        realtime: bool = False,
        rt_priority: int = 50,
        cpus: Union[str, List[int]] | None = None,
    ) -> None: ...
    @property
    def address(self) -> str:
        """``host:port`` the master listens on."""
    @property
    def tls_cert(self) -> str | None:
        """The certificate the master serves TLS with (a self-signed master's is the clients'
        ``ca_file``), or None without TLS."""
    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's URL (``http://HOST:PORT/``), or None without an HTTP listener
        (``options={"http": "127.0.0.1:0"}`` starts one)."""
    @property
    def client_token(self) -> str:
        """Token clients must present."""
    @property
    def worker_token(self) -> str:
        """Token workers must present."""
    def stats(self) -> Dict[str, Any]:
        """Gauges and counters (connections, tasks, packages, queued, running, workers,
        ``functions``: function codes held, ``services``: named functions registered as
        (name, version) entries, ...); empty once stopped. In real-time mode also
        ``realtime``: a dict of ``active`` (every step took effect), ``memory_locked``,
        ``priority``, ``fifo_threads`` (threads under SCHED_FIFO now), ``cpus`` (pinned to;
        [] = not pinned), ``pinned_threads`` and ``warnings`` (one per refused step)."""
    def stop(self) -> None:
        """Stop serving and close every connection. Idempotent."""
    def __enter__(self) -> Master: ...
    def __exit__(self, *exc_info: object) -> None: ...

class MemoryLock:
    """A hold on this process's memory lock (``mlockall``), counted with the embedded
    real-time masters' holds: the memory is unlocked when the last holder lets go."""

    @property
    def held(self) -> bool:
        """Whether this hold is still held."""
    def release(self) -> None:
        """Let go of this hold. Idempotent."""

def lock_memory() -> MemoryLock:
    """Lock this process's memory (or count one more holder of the lock).

    Raises:
        RtpoolError: The OS refused; the message says what failed and how to permit it.
    """

MASTER_OPTIONS: List[str]
"""The keys ``Master(options=...)`` takes: every ``rtpool master`` option but ``log_level``."""

PACKAGE_OPTION_KEYS: List[str]
"""The wire keys of the package options map (``SUBMIT.opts``, ``CALL.opts``) in spec order, as
``crates/rtpool-proto/src/options.rs`` declares them: ``rtpool/_options.py``'s table must list
the same (``tests/test_options.py``)."""

def master_main(argv: List[str]) -> int:
    """``rtpool master ARGS``: the master's command line, the one the ``rtpool-master`` binary
    parses too (``crates/rtpool-master/src/config/args.rs``).

    Parses ``argv`` (without the program name); prints the help, the version or a refused
    command line (clap's message) and returns 0 or 2 for them. Otherwise runs the master in the
    foreground until SIGINT/SIGTERM with the GIL released: on first start it writes the tokens
    to ``DATA_DIR/client.token`` and ``DATA_DIR/worker.token`` and prints them, then prints
    ``listening on HOST:PORT`` once ready (and, with TLS, the certificate path).

    Returns:
        The exit code: 0 after a signal, 1 when the master cannot start or fails (the reason on
        stderr, after ``rtpool master:``), 2 for a bad command line.
    """

# Users, tokens and quotas (`rtpool token`). Each opens the store: ``store`` None or "sqlite"
# is ``data_dir/rtpool.db``; "sqlite:///abs/path.db" or "postgres://user@host:port/db" another.
# Token dicts: id (str, public: 12 hex chars of the SHA-256), user, role ("client"|"worker"),
# created_unix (int), revoked (bool). Quota dicts: user, quota_us (int | None = unlimited),
# used_us (int), max_priority (int | None = no ceiling). Every function raises
# rtpool.errors.RtpoolError with a message that says what to do (bad user name or quota,
# unknown or ambiguous id, store unreachable, ...).

def token_create(
    data_dir: Union[str, PathLike[str]],
    user: str,
    role: str,
    quota_seconds: float | None = None,
    store: str | None = None,
    max_priority: int | None = None,
) -> Tuple[str, Dict[str, Any]]:
    """Create a token; returns ``(token, info)``. Only its SHA-256 is stored, so the token
    cannot be shown again. With ``quota_seconds``, also set the user's quota; with
    ``max_priority``, the user's priority ceiling."""

def token_list(
    data_dir: Union[str, PathLike[str]], store: str | None = None
) -> List[Dict[str, Any]]:
    """Every token's info (no secrets), oldest first, revoked ones included."""

def token_revoke(
    data_dir: Union[str, PathLike[str]], id: str, store: str | None = None
) -> Dict[str, Any]:
    """Revoke the token with this id or unique id prefix (6+ hex chars); returns its info."""

def token_set_quota(
    data_dir: Union[str, PathLike[str]],
    user: str,
    quota_seconds: float | None,
    store: str | None = None,
) -> None:
    """Set a user's quota of execution seconds (None: unlimited); usage so far is kept."""

def token_set_max_priority(
    data_dir: Union[str, PathLike[str]],
    user: str,
    max_priority: int | None,
    store: str | None = None,
) -> None:
    """Set a user's priority ceiling (None: none); a client of the user asking for a higher
    priority is refused."""

def token_quotas(
    data_dir: Union[str, PathLike[str]], store: str | None = None
) -> List[Dict[str, Any]]:
    """Every user's quota and usage in microseconds, by name."""

class ScaleSim:
    """Simulated worker connections speaking the real protocol to a master, on threads of
    their own (``rtpool bench scale``). Each answers its tasks at once with a pickled ``None``,
    retries ``busy`` with a jittered backoff, heartbeats when idle and connects again after a
    lost lease.

    Args:
        address: The master's ``host:port``.
        token: The master's worker token.
        workers: Connections to open.
        slots: Slots each connection announces (1: one ``rtpool worker`` process).
        prefetch: Credits asked beyond ``slots``.
        handshake_concurrency: Handshakes in flight at once.
        max_attempts: Connection attempts per worker before it gives up.
        connect_timeout_s: Time allowed for one connect plus handshake.
        threads: Threads running the connections (connection ``i`` on thread ``i % threads``).
    """

    def __init__(
        self,
        address: str,
        token: str,
        workers: int,
        *,
        slots: int = 1,
        prefetch: int = 1,
        handshake_concurrency: int = 64,
        max_attempts: int = 20,
        connect_timeout_s: float = 10.0,
        threads: int = 1,
    ) -> None: ...
    def stats(self) -> Dict[str, Any]:
        """Counters now: ``connected``, ``open``, ``busy``, ``refused``, ``gave_up``,
        ``connect_errors``, ``tasks``, ``assign_frames``, ``lease_lost``, ``closed_by_master``,
        ``disconnected``, ``reconnected``, ``first_error``; and the simulator's own lateness:
        ``max_silence_ms`` (the longest time one connection sent nothing), ``silent_past_lease``
        (sessions silent for their lease or longer), ``lease_lost_late`` (the lost leases of
        such sessions: the simulator's loss, not the master's) and ``max_heartbeat_lag_ms`` (how
        late a heartbeat timer fired)."""
    def stop(self) -> Dict[str, Any]:
        """Close every connection and join the thread; the final counters. Idempotent."""
