"""The master addresses of a client or a worker, and the order to dial them in.

A client or worker may be given several masters (``"m1:7070,m2:7070"``, a list, or one DNS
name with several records): one is the leader, the others standbys that answer ``HELLO`` with
``ERROR not_leader ... (leader: HOST:PORT)`` (``docs/ha.md``). :class:`Masters` keeps the list
and what dialling learned: the address that worked last (the next pass starts there) and the
leader a standby or a deposed leader named (tried next). Opening the connection itself is
``_dial.connect``'s; this module does no I/O but name resolution.

It also holds the pacing every dialler shares (the client's reconnection, the worker's, the
dial's own retries; ``docs/reliability.md``): while a master answers (a standby's
``not_leader``: an election under way, and a standby is cheap to ask) the next pass comes
after :data:`LEADER_SEARCH_PAUSE_S`, not after a doubling backoff; with several addresses a
pass waits at most :data:`FIRST_PASS_TIMEOUT_S` per address (doubling while passes find no
master at all); and a session that ended in silence (a cut path) starts the next pass at the next
address, not at the silent one.
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
from typing import Callable, Dict, List, NamedTuple, Sequence, Tuple, Union

#: One master address: ``"host:port"`` or ``(host, port)``; or several: ``"h1:7070,h2:7070"``
#: or a list (or tuple) of addresses.
Address = Union[str, Tuple[str, int], Sequence[Union[str, Tuple[str, int]]]]

#: The environment variable a client (``Client(None)``) and the CLI read the addresses from.
MASTER_ENV = "RTPOOL_MASTER"

#: The pause before the next pass while a standby answers (drawn in ``[d/2, d]``): about a
#: tenth of the default HA lease, so the new leader is found within ~0.1 s of its takeover.
LEADER_SEARCH_PAUSE_S = 0.1
#: With several addresses, the most a pass waits for one address (TCP connect and handshake),
#: doubled by each pass in a row that found no master at all, up to the connect timeout: a
#: dead or cut address costs little, and a slow but live one still gets its time.
FIRST_PASS_TIMEOUT_S = 1.0

_LEADER = re.compile(r"\(leader: ([^()\s]+)\)\s*$")
_log = logging.getLogger("rtpool.client")


class Candidate(NamedTuple):
    """One address to dial: ``host`` (a name or an IP address) and ``port``; ``server_name``
    is the name TLS checks the certificate against (the configured name, also when ``host``
    is one of its resolved addresses); ``label`` is how messages name it."""

    host: str
    port: int
    server_name: str
    label: str


def parse_address(address: Union[str, Tuple[str, int]]) -> Tuple[str, int]:
    """Split ``"host:port"`` (or ``"[v6]:port"``) or pass a ``(host, port)`` tuple through.

    Raises:
        ValueError: The address has no valid port.
    """
    if isinstance(address, tuple):
        host, port = address
        if not str(host) or not 0 < int(port) < 65536:
            raise ValueError(f"master address must be (host, port), got {address!r}")
        return str(host), int(port)
    host, sep, port = str(address).strip().rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise ValueError(f"master address must be 'host:port', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _is_one(address: object) -> bool:
    """Whether ``address`` is a single ``(host, port)`` tuple (not a tuple of addresses)."""
    return (
        isinstance(address, tuple)
        and len(address) == 2
        and isinstance(address[1], int)
        and not isinstance(address[1], bool)
    )


def parse_addresses(address: Address | None) -> List[Tuple[str, int]]:
    """Every ``(host, port)`` of ``address``: ``"h1:7070,h2:7070"``, a list or tuple of
    addresses, or one; None: ``$RTPOOL_MASTER``. Blank entries (a trailing comma) are skipped.

    Raises:
        ValueError: No address, or an entry that is not ``host:port`` (the message names it).
    """
    if address is None:
        address = os.environ.get(MASTER_ENV, "")
        if not address.strip():
            raise ValueError(
                f"no master address: pass one (HOST:PORT, several separated by commas) or set "
                f"${MASTER_ENV}"
            )
    if _is_one(address):
        entries: List[object] = [address]
    elif isinstance(address, str):
        entries = [a for a in address.split(",") if a.strip()]
    elif isinstance(address, (list, tuple)):
        entries = list(address)
    else:
        raise ValueError(
            f"master address must be 'host:port', 'h1:port,h2:port' or a list of them, got "
            f"{address!r}"
        )
    if not entries:
        raise ValueError(f"no master address in {address!r}; pass HOST:PORT")
    out: List[Tuple[str, int]] = []
    for k, entry in enumerate(entries):
        try:
            if not isinstance(entry, str) and not _is_one(entry):
                raise ValueError
            hp = parse_address(entry)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            where = f"entry {k + 1} of {address!r} is {entry!r}, which" if len(entries) > 1 else ""
            raise ValueError(
                f"master address {where or repr(entry)} is not 'host:port' (like "
                "10.0.0.5:7070; several separated by commas)"
            ) from None
        if hp not in out:
            out.append(hp)
    return out


def leader_of(message: str) -> Tuple[str, int] | None:
    """The leader a ``not_leader`` message names (``... (leader: HOST:PORT)``), or None
    (``(leader: unknown)``, or no such ending)."""
    m = _LEADER.search(message or "")
    if m is None or m.group(1) == "unknown":
        return None
    try:
        return parse_address(m.group(1))
    except ValueError:
        return None


def _label(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _resolve(host: str, port: int) -> List[Candidate]:
    """``host:port`` as candidates: one per address when the name has several records (each
    is a master of its own: a standby among them must not hide the leader), else the name
    itself (the dial then reports a failure to resolve it)."""
    label = _label(host, port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return [Candidate(host, port, host, label)]
    ips: List[str] = []
    for info in infos:
        ip = str(info[4][0])
        if ip not in ips:
            ips.append(ip)
    if len(ips) <= 1 or host in ips:
        return [Candidate(host, port, host, label)]
    return [Candidate(ip, port, host, f"{label} ({ip})") for ip in ips]


class Masters:
    """The masters of one client or worker (see the module docstring).

    Args:
        address: As :func:`parse_addresses`.
        say: Where a switch of master is reported, one line each (default: a warning on the
            ``rtpool.client`` logger).

    Raises:
        ValueError: As :func:`parse_addresses`.
    """

    def __init__(self, address: Address | None, say: Callable[[str], None] | None = None):
        self.entries = parse_addresses(address)
        #: The addresses as given, for messages: ``"m1:7070,m2:7070"``.
        self.spec = ",".join(_label(h, p) for h, p in self.entries)
        #: The address of the current (or last) connection; the first one before any.
        self.current = _label(*self.entries[0])
        self._say = say or _log.warning
        self._last: Tuple[str, int] | None = None  # (host, port) dialled last with success
        self._leader: Tuple[str, int] | None = None  # named by a not_leader, to try first
        self._said: Dict[str, str] = {}  # label -> the standby line last said for it
        self._skip_last = False  # the last session ended in silence: start after it
        #: Passes in a row in which no master answered (every address refused, silent or
        #: unresolvable); 0 after a session or a pass in which one answered.
        self.unanswered_passes = 0
        #: Whether the last failed pass had a master answering (a standby): the leader is
        #: being elected, and the next pass should come soon.
        self.standby_answered = False

    def __len__(self) -> int:
        return len(self.entries)

    def hosts(self) -> List[str]:
        """The configured hosts (names or addresses, not resolved)."""
        return [h for h, _ in self.entries]

    def follow(self, message: str) -> None:
        """A session ended with ``ERROR not_leader``: dial the leader it names first."""
        self._leader = leader_of(message)

    def candidates(self) -> List[Candidate]:
        """One pass: every address (names resolved), from the one that worked last."""
        out: List[Candidate] = []
        for host, port in self.entries:
            out.extend(c for c in _resolve(host, port) if c not in out)
        first = self._leader or self._last
        skip = self._skip_last and self._leader is None and len(out) > 1
        self._leader = None
        self._skip_last = False
        if first is not None:
            at = [i for i, c in enumerate(out) if (c.host, c.port) == first]
            if at:
                start = (at[0] + 1) % len(out) if skip else at[0]
                out = out[start:] + out[:start]
            else:  # a leader outside the list (named by a standby): first, then the list
                out.insert(0, Candidate(first[0], first[1], first[0], _label(*first)))
        return out

    def place_leader(self, queue: List[Candidate], tried: set, leader: Tuple[str, int]) -> None:
        """Put the candidate(s) of ``leader`` at the front of ``queue`` (added when it is not in
        the list), unless already tried in this pass."""
        matching = [c for c in queue if (c.host, c.port) == leader or c.label == _label(*leader)]
        if not matching:
            matching = [Candidate(leader[0], leader[1], leader[0], _label(*leader))]
        for c in reversed(matching):
            if (c.host, c.port) in tried:
                continue
            if c in queue:
                queue.remove(c)
            queue.insert(0, c)

    def on_standby(self, cand: Candidate, leader: Tuple[str, int] | None) -> None:
        """Report that ``cand`` is a standby, once per change of what it says."""
        named = _label(*leader) if leader else "unknown"
        line = f"master {cand.label} is a standby; leader {named}"
        if self._said.get(cand.label) != line:
            self._said[cand.label] = line
            self._say(line)

    def on_failed(self, cand: Candidate) -> None:
        """``cand`` could not be dialled: a followed leader outside the list is forgotten (the
        next pass starts with the list again)."""
        if (cand.host, cand.port) == self._last and self._last not in self.entries:
            self._last = None

    def on_connected(self, cand: Candidate) -> None:
        """``cand`` gave a session: the next pass starts with it."""
        self._last = (cand.host, cand.port)
        self.current = cand.label
        self._said.clear()
        self.unanswered_passes = 0
        self.standby_answered = False

    def on_silent(self) -> None:
        """The last session ended in silence (no word past the silence check, or a TCP
        timeout): its path may be cut, so the next pass starts at the next address."""
        self._skip_last = True

    def on_pass_failed(self, answered: bool) -> None:
        """A pass found no leader; ``answered``: some master answered (a standby, busy)."""
        self.standby_answered = answered
        self.unanswered_passes = 0 if answered else self.unanswered_passes + 1

    def dial_timeout(self, timeout: float, addresses: int) -> float:
        """The wait per address in the next pass over ``addresses`` candidates: ``timeout``
        for one; for several :data:`FIRST_PASS_TIMEOUT_S`, doubled by each pass in a row that
        found no master at all (a slow but live one gets its time), up to ``timeout``."""
        if addresses > 1:
            return min(timeout, FIRST_PASS_TIMEOUT_S * 2 ** min(self.unanswered_passes, 16))
        return timeout

    def retry_pause(self, backoff: float) -> float:
        """The pause before the next pass, drawn in ``[d/2, d]``: ``d`` =
        :data:`LEADER_SEARCH_PAUSE_S` while a standby answered, else ``backoff`` (the
        caller's, doubling)."""
        d = min(backoff, LEADER_SEARCH_PAUSE_S) if self.standby_answered else backoff
        return random.uniform(d / 2, d)
