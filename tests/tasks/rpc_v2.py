"""Version 2 of ``add`` (``--serve tasks.rpc_v2``), to test version selection."""

from rtpool import remote


@remote("add", version="2")
def add(a: int, b: int) -> int:
    """add returns a + b + 1000 (version 2)."""
    return a + b + 1000
