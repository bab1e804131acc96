"""Type stubs of the native module (PyO3, crates/rtpool-py)."""

from os import PathLike
from typing import Dict, Union

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

    Raises:
        rtpool.errors.RtpoolError: The address cannot be bound or the data dir used.
    """

    def __init__(
        self,
        listen: str = "127.0.0.1:0",
        client_token: str | None = None,
        worker_token: str | None = None,
        data_dir: Union[str, PathLike[str]] | None = None,
        max_frame_bytes: int | None = None,
        heartbeat_ms: int | None = None,
    ) -> None: ...
    @property
    def address(self) -> str:
        """``host:port`` the master listens on."""
    @property
    def client_token(self) -> str:
        """Token clients must present."""
    @property
    def worker_token(self) -> str:
        """Token workers must present."""
    def stats(self) -> Dict[str, int]:
        """Gauges and counters (connections, tasks, packages, queued, running, workers, ...);
        empty once stopped."""
    def stop(self) -> None:
        """Stop serving and close every connection. Idempotent."""
    def __enter__(self) -> Master: ...
    def __exit__(self, *exc_info: object) -> None: ...

def run_master(
    listen: str = "127.0.0.1:7070",
    data_dir: Union[str, PathLike[str]] | None = None,
    max_frame_bytes: int | None = None,
    heartbeat_ms: int | None = None,
    log_level: str = "info",
) -> None:
    """Run a master in the foreground until SIGINT/SIGTERM (the GIL is released meanwhile).

    Writes the tokens to ``data_dir/client.token`` and ``data_dir/worker.token`` on first
    start and prints ``listening on HOST:PORT`` once ready.

    Raises:
        rtpool.errors.RtpoolError: The address cannot be bound or the data dir used.
    """
