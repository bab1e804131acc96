"""Named functions a worker serves (``--serve MODULE``, grid RPC: ``docs/rpc.md``).

The modules are imported once, in the parent before it forks (:func:`services_of`), so every
child inherits them and a module that does not load stops the worker with its name. Each
session announces them with ``SERVE`` (:func:`serve_frame`) before its first ``PULL``; the
calls themselves run in ``_executor.py`` like tasks.
"""

from __future__ import annotations

import argparse
import struct
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

from .. import _protocol as P
from ..errors import ServeError


class Service(NamedTuple):
    """One named function this worker serves."""

    #: Its position in the worker's list: the executor's key for it (see ``CALL_KEY``).
    index: int
    name: str
    version: str
    fn: Any
    interface: Any
    module: str


# A call run in the executor process travels as a task whose "function hash" is this prefix
# and the service's index (a code hash is a 32-byte digest: it never has this form).
CALL_KEY = b"\0rtpool-call\0"
CALL_INDEX = struct.Struct(">I")


def load_services(modules: Sequence[str]) -> List[Service]:
    """Import the ``--serve`` modules and collect the functions they mark with ``@remote``.

    Only this imports the interface machinery (and, through the modules, numpy): a worker
    that serves nothing never loads them.

    Args:
        modules: Importable module names, in the order given on the command line.

    Returns:
        The services, in module order.

    Raises:
        ServeError: A module fails to import or marks no function, or a name and version is
            served by two modules; the message names the module.
    """
    from ..rpc import remote

    services: List[Service] = []
    seen: Dict[Tuple[str, str], str] = {}
    for module_name in modules:
        try:
            # It imports the module; its errors name the module.
            found = remote.served_functions(module_name)
        except Exception as exc:
            hint = ""
            if isinstance(exc, ModuleNotFoundError):
                hint = "; install it, or put its directory on the worker's PYTHONPATH"
            raise ServeError(f"--serve {module_name}: {type(exc).__name__}: {exc}{hint}") from exc
        if not found:  # served_functions refuses that already; kept for the message
            raise ServeError(
                f"--serve {module_name}: module {module_name} serves no functions: mark them "
                "with @rtpool.remote"
            )
        for fn, iface in found:
            key = (iface.name, iface.version)
            if key in seen:
                raise ServeError(
                    f"--serve {module_name}: function {iface.name!r} version {iface.version!r} "
                    f"is also served by module {seen[key]!r}; give one of them another version"
                )
            seen[key] = module_name
            services.append(Service(len(services), key[0], key[1], fn, iface, module_name))
    return services


def services_of(args: argparse.Namespace) -> List[Service]:
    """The services of ``args.serve``, loaded once: by ``run`` before the fork (so every child
    inherits them in ``args.services``).

    Raises:
        ServeError: As :func:`load_services`.
    """
    services = getattr(args, "services", None)
    if services is None:
        services = args.services = load_services(args.serve)
    return services


def serve_frame(services: Sequence[Service]) -> bytes:
    """The ``SERVE`` frame of these services (sent at the start of every session)."""
    return P.encode(P.SERVE, [[s.name, s.version, s.interface.to_bytes()] for s in services])
