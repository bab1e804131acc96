"""One master connection for all the worker processes of a host (``--connection host``).

The parent of ``rtpool worker --procs N`` holds one connection with ``slots=N`` and relays
between it and its children, one socket pair each (``_relayed.py`` is the child's end). The
master then sees one worker of N slots: a round of work is one ``ASSIGN`` frame to the host
and one ``RESULT`` and ``PULL`` back, not one of each per process (issue 13: with one frame
per task and process, 10,000 slots cost the master most of its time in ``sendto``).

What the relay does, in one single-threaded loop (:meth:`Relay.poll`, called by the
supervisor between its checks of the children):

* **Credits.** A child's ``PULL`` adds to its credits and to the host's next ``PULL``. An
  ``ASSIGN`` from the master is split among the children in the order they asked, each up to
  its credits; a task no child asked for goes to the live child holding the fewest, or back to
  the master (``RETURN``) while the host drains or has no live child.
* **Code.** The master sends a function's code once per connection: the relay keeps it and
  adds it to the first task of that function each child gets.
* **Results.** What the children sent goes up in one ``RESULT`` frame and one ``PULL``, in
  one write, at most one such write per :data:`FLUSH_INTERVAL_NS` while the children hold
  other tasks (more results are coming: they join the batch). When they hold none (the last
  result of a package, one task at a time), it goes at once: no latency is added where no
  batch could form.
* **Returns.** A child's ``RETURN`` is forwarded; since the master withdraws all of a
  connection's credits on ``RETURN``, the relay asks again at once for the other children's.
* **ABORT** goes to the child holding the task; a child's heartbeats are answered here.
* **A child that dies** (:meth:`Relay.release`, from the supervisor once it reaped it): its
  running task (the slot board's) is reported lost (status 5, so the master blames the task,
  as for a child with its own connection) and every other task it held is returned.
* **A silent child** (stopped, SIGSTOP) past the master's lease is treated as the master
  would treat its own connection: what it held goes back (``RETURN``) and its session ends
  (an ``ERROR``, read when it resumes; it says ``HELLO`` again).
* **A lost master connection**: each child is told (an ``ERROR``; it ends its session as if
  its own connection had dropped) and the relay reconnects with backoff within
  ``--reconnect-timeout``, then answers the children's new ``HELLO``.
* **Shutdown**: ``DRAIN`` goes up at once; the children's results and returns follow as they
  drain; the connection is closed once the last child has exited.

Costs: one more hop each way (a socket pair and this loop), which is why ``--connection auto``
keeps one connection per process below :data:`HOST_CONNECTION_MIN_PROCS` processes
(``docs/workers.md`` has the figures).
"""

from __future__ import annotations

import random
import selectors
import socket
import time
from collections import deque
from typing import Any, Deque, Dict, List, Tuple

from .. import _dial
from .. import _protocol as P
from .._frame import Frame
from ..errors import AuthenticationError, ConnectError, MasterBusy, ProtocolError, RtpoolError
from ._common import EXIT_CONFIG, EXIT_LOST, log, perf_ns
from ._relayed import ERR_HOST_LOST
from ._session import RECV_BYTES

#: At most one write of results and credits to the master per this long while the children
#: run other tasks: under load the master gets a few frames per host per millisecond, not
#: three per task. The same bound a child puts on holding its own results for company
#: (``_loop.FLUSH_AFTER_NS``).
FLUSH_INTERVAL_NS = 1_000_000
#: ... or when this many results wait.
FLUSH_RESULTS = 256
_HEARTBEAT = P.encode(P.HEARTBEAT)
_RECONNECT_FIRST_S = 0.1
_RECONNECT_MAX_S = 5.0
_ATTEMPT_TIMEOUT_S = 5.0
_CONFIG_ERRORS = frozenset({P.ERR_AUTH, P.ERR_VERSION})
_MAX_ORPHANS = 65536

Key = Tuple[int, int]  # (task, attempt)


def _flat(data: Any) -> bytes:
    """An encoded frame as one ``bytes`` (the socket pair is written without ``sendmsg``)."""
    if type(data) is Frame:
        return b"".join(bytes(p) for p in data.parts)
    return data


class Link:
    """The relay's end of one child's socket pair, and what that child holds."""

    __slots__ = ("slot", "sock", "reader", "ready", "hello", "draining", "credits", "held")
    __slots__ += ("codes", "out", "closed", "hungry", "heard", "instance")

    def __init__(self, slot: int, sock: socket.socket) -> None:
        self.slot = slot
        self.sock = sock
        self.reader = P.FrameReader(P.DEFAULT_MAX_FRAME)
        #: It has a session: its HELLO was answered with the master's WELCOME.
        self.ready = False
        #: Its HELLO waits for the master connection.
        self.hello = False
        self.draining = False
        #: Tasks it asked for and was not given yet.
        self.credits = 0
        #: The tasks it holds, in the order it got them (a dict as an ordered set).
        self.held: Dict[Key, None] = {}
        #: Functions whose code it was sent this session.
        self.codes: set = set()
        #: Bytes not written yet (the child is not reading).
        self.out = bytearray()
        self.closed = False
        #: It is in the relay's queue of children with credits.
        self.hungry = False
        #: time.monotonic() of the last bytes from it (it heartbeats while a task runs).
        self.heard = time.monotonic()
        #: The master instance of its session.
        self.instance: int | None = None


class Relay:
    """The host's master connection and its children's links (see the module docstring).

    Args:
        args: The parsed ``rtpool worker`` options (address, TLS, reconnection, procs).
        token: The worker token.
        name: The host's name in the master's ``HELLO``.
        serve: The ``SERVE`` frame of ``--serve`` (b"": none), sent in every session.
    """

    def __init__(self, args: Any, token: str, name: str, serve: bytes) -> None:
        self.address = args.master
        self.token = token
        self.name = name
        self.slots = args.procs
        self.reconnect_timeout = args.reconnect_timeout
        self.tls = _dial.tls_context(args.tls, args.ca_file)
        self.serve = serve
        self.selector = selectors.DefaultSelector()
        self.links: Dict[int, Link] = {}
        self.hungry: Deque[Link] = deque()
        self.owner: Dict[Key, int] = {}  # task -> slot holding it
        self.codes: Dict[bytes, bytes] = {}  # function code the master sent this session
        self.sock: Any = None  # the master connection (None: not connected)
        self.reader: Any = None
        self.welcome_frame = b""
        self.instance: int | None = None
        self.results: List[list] = []  # for the next RESULT frame
        self.frames: List[Any] = []  # for the master, before the results and the PULL
        self.pull = 0  # credits for the next PULL
        self.written_ns = 0  # perf_counter_ns() of the last write to the master
        #: Results of a lost session, sent to the same master instance when it is back (it
        #: counts them stale, as it does a child's own ``unsent``).
        self.orphans: List[list] = []
        self.draining = False
        #: Set when the relay gives up (a refused token, no master within the timeout).
        self.exit_code: int | None = None
        self.ever_connected = False
        self.lost_at = time.monotonic()
        self.attempt = 0
        self.next_attempt = 0.0

    # -- children's links ---------------------------------------------------------------------

    def attach(self, slot: int) -> socket.socket:
        """A socket pair for a new child in ``slot``; returns the child's end."""
        mine, theirs = socket.socketpair()
        mine.setblocking(False)
        self.links[slot] = link = Link(slot, mine)
        self.selector.register(mine, selectors.EVENT_READ, link)
        return theirs

    def fds(self) -> List[Any]:
        """What a forked child must close: the links, the master connection, the selector."""
        out: List[Any] = [link.sock for link in self.links.values() if not link.closed]
        if self.sock is not None:
            out.append(self.sock)
        return out

    def close_in_child(self) -> None:
        """In a freshly forked child: close the parent's descriptors, without a word to their
        peers and without touching the selector's registrations (shared with the parent)."""
        for sock in self.fds():
            try:
                sock.close()
            except OSError:
                pass
        self.selector.close()

    def release(self, slot: int, lost: list | None) -> None:
        """The child of ``slot`` exited: report its running task lost (``lost``, a RESULT
        entry from the slot board, if it ran one) and return everything else it held."""
        link = self.links.pop(slot, None)
        if link is None:
            return
        self._close_link(link)
        if lost is not None and (lost[0], lost[1]) in link.held:
            del link.held[(lost[0], lost[1])]
            self.owner.pop((lost[0], lost[1]), None)
            self.results.append(lost)
        self._give_back(link, list(link.held))
        self.flush()

    def _close_link(self, link: Link) -> None:
        if not link.closed:
            link.closed = True
            self.selector.unregister(link.sock)
            link.sock.close()
        link.ready = False
        link.credits = 0

    def _send_link(self, link: Link, data: Any) -> None:
        if link.closed:
            return
        data = _flat(data)
        if not link.out:
            try:
                n = link.sock.send(data)
            except BlockingIOError:
                n = 0
            except OSError:
                return  # it died: its EOF comes, then the supervisor's release()
            if n == len(data):
                return
            data = data[n:]
            self.selector.modify(link.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, link)
        link.out += data

    def _write_link(self, link: Link) -> None:
        try:
            n = link.sock.send(link.out)
        except BlockingIOError:
            return
        except OSError:
            link.out.clear()
            n = 0
        del link.out[:n]
        if not link.out and not link.closed:
            self.selector.modify(link.sock, selectors.EVENT_READ, link)

    def _read_link(self, link: Link) -> None:
        try:
            data = link.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        link.heard = time.monotonic()
        if not data:
            # It exited (or shut down its end, draining): what it held is returned when the
            # supervisor reaps it (release), which also knows the task it died running.
            self._close_link(link)
            return
        try:
            msgs = link.reader.feed(data)
        except ProtocolError as exc:
            log(f"bad frame from worker process (slot {link.slot}): {exc}")
            self._close_link(link)
            return
        self._from_child(link, msgs)

    def _from_child(self, link: Link, msgs: List[list]) -> None:
        for msg in msgs:
            kind = msg[0]
            if kind == P.HELLO:
                self._hello(link)
            elif not link.ready:
                if kind == P.RESULT:
                    self._orphans(link, msg[1])
                continue  # the rest of an old session
            elif kind == P.RESULT:
                owner, held = self.owner, link.held
                for r in msg[1]:
                    key = (r[0], r[1])
                    if key in held:
                        del held[key]
                        owner.pop(key, None)
                self.results.extend(msg[1])
            elif kind == P.PULL:
                if not link.draining:
                    link.credits += msg[1]
                    self.pull += msg[1]
                    if not link.hungry:
                        link.hungry = True
                        self.hungry.append(link)
            elif kind == P.HEARTBEAT:
                self._send_link(link, _HEARTBEAT)
            elif kind == P.RETURN:
                self._give_back(link, [(e[0], e[1]) for e in msg[1]])
            elif kind == P.DRAIN:
                link.draining = True
                link.credits = 0
            # SERVE: the host announces its functions itself, once per session.

    def _orphans(self, link: Link, results: List[list]) -> None:
        """Results of a session that ended (the master connection dropped, or the child was
        silent): for the master instance they belong to, which counts them stale (as it does
        a child's own ``unsent``); dropped if another instance answers now."""
        if link.instance != self.instance:
            return
        if self.sock is not None:
            self.results.extend(results)
        elif len(self.orphans) < _MAX_ORPHANS:
            self.orphans.extend(results)

    def _hello(self, link: Link) -> None:
        if link.ready:  # a new session of a child that saw its old one fail
            self._give_back(link, list(link.held))
            link.codes.clear()
            link.draining = False
        link.ready = False
        link.hello = True
        if self.sock is not None:
            self._welcome(link)

    def _welcome(self, link: Link) -> None:
        link.hello = False
        link.ready = True
        link.instance = self.instance
        self._send_link(link, self.welcome_frame)

    def _give_back(self, link: Link, keys: List[Key]) -> None:
        """Return ``keys`` (held by ``link``) to the master; withdraw ``link``'s credits."""
        link.credits = 0
        keys = [k for k in keys if k in link.held]
        for k in keys:
            del link.held[k]
            self.owner.pop(k, None)
        if keys and self.sock is not None:
            self._return_up(keys)

    def _return_up(self, keys: List[Key]) -> None:
        """``RETURN`` to the master, which withdraws every credit of the connection: ask
        again at once for what the children still want."""
        if self.results:
            self.frames.append(P.encode(P.RESULT, self.results))
            self.results = []
        self.frames.append(P.encode(P.RETURN, [list(k) for k in keys]))
        self.pull = sum(x.credits for x in self.links.values() if x.ready and not x.draining)

    # -- tasks from the master ------------------------------------------------------------------

    def _pick(self) -> Link | None:
        """The child to give the next task: the first that asked, else the live child with
        the fewest tasks, else None (the task goes back)."""
        if self.draining:
            return None
        hungry = self.hungry
        while hungry:
            link = hungry[0]
            if link.credits > 0 and link.ready and not link.draining:
                link.credits -= 1
                if not link.credits:
                    link.hungry = False
                    hungry.popleft()
                return link
            link.hungry = False
            hungry.popleft()
        live = [x for x in self.links.values() if x.ready and not x.draining]
        return min(live, key=lambda x: len(x.held)) if live else None

    def _hand_out(self, kind: int, entries: List[list]) -> None:
        per: Dict[int, List[list]] = {}
        back: List[Key] = []
        codes, owner, links = self.codes, self.owner, self.links
        for e in entries:
            link = self._pick()
            key = (e[0], e[1])
            if link is None:
                back.append(key)
                continue
            if kind == P.ASSIGN:
                fn_hash, code = e[2], e[3]
                if code is not None:
                    codes[fn_hash] = code
                if fn_hash in link.codes:
                    e[3] = None
                else:
                    e[3] = codes.get(fn_hash)
                    link.codes.add(fn_hash)
            owner[key] = link.slot
            link.held[key] = None
            per.setdefault(link.slot, []).append(e)
        for slot, mine in per.items():
            self._send_link(links[slot], P.encode(kind, mine))
        if back:
            self._return_up(back)

    def _route_abort(self, entries: List[list]) -> None:
        per: Dict[int, List[list]] = {}
        for e in entries:
            slot = self.owner.get((e[0], e[1]))
            if slot is not None:
                per.setdefault(slot, []).append(e)
        for slot, mine in per.items():
            self._send_link(self.links[slot], P.encode(P.ABORT, mine))

    def _from_master(self, msgs: List[list]) -> None:
        for msg in msgs:
            kind = msg[0]
            if kind == P.ASSIGN or kind == P.ASSIGN_CALLS:
                self._hand_out(kind, msg[1])
            elif kind == P.ABORT:
                self._route_abort(msg[1])
            elif kind == P.HEARTBEAT:
                self.master_answers = True
            elif kind == P.ERROR:
                self._on_error(msg[1], msg[2])
            else:
                raise _Lost(f"unexpected message kind {kind} from the master")

    def _on_error(self, code: str, message: str) -> None:
        if code == P.ERR_SERVE_CONFLICT:
            log(f"warning: the master refused to serve a function: {message}")
        elif code in P.NON_FATAL_ERRORS:
            log(f"master reported {code}: {message}")
        elif code in _CONFIG_ERRORS:
            self._give_up(EXIT_CONFIG, f"the master reported {code}: {message}; exiting")
        else:
            raise _Lost(f"the master reported {code}: {message}")

    # -- the master connection --------------------------------------------------------------

    def _connect(self) -> None:
        """One attempt at the master connection (when due), with backoff between attempts."""
        now = time.monotonic()
        if self.sock is not None or self.exit_code is not None or now < self.next_attempt:
            return
        limit = self.reconnect_timeout
        again = "re" if self.ever_connected else ""
        if self.attempt and limit and now - self.lost_at > limit:
            self._give_up(
                EXIT_LOST,
                f"could not {again}connect to the master at {self.address} within {limit:g} s "
                "(--reconnect-timeout); exiting",
            )
            return
        self.attempt += 1
        try:
            sock, welcome, reader, early = _dial.connect(
                self.address,
                role="worker",
                token=self.token,
                name=self.name,
                slots=self.slots,
                timeout=_ATTEMPT_TIMEOUT_S,
                tls=self.tls or False,
                busy_timeout=0,
            )
        except AuthenticationError as exc:
            self._give_up(EXIT_CONFIG, f"{exc}; exiting")
            return
        except (ConnectError, MasterBusy, OSError) as exc:
            self._retry_later(exc)
            return
        except (RtpoolError, ValueError) as exc:  # a protocol version the master refuses
            self._give_up(EXIT_CONFIG, str(exc))
            return
        self._start(sock, welcome, reader, early)

    def _retry_later(self, exc: Exception) -> None:
        if self.reconnect_timeout is None:
            code = EXIT_LOST if self.ever_connected else EXIT_CONFIG
            self._give_up(code, str(exc))
            return
        attempt = self.attempt
        if attempt == 1 and not self.ever_connected:
            limit = self.reconnect_timeout
            within = f"for up to {limit:g} s" if limit else "until it is up"
            log(f"{exc}; waiting for the master {within} (--reconnect-timeout)")
        elif attempt & (attempt - 1) == 0:
            again = "re" if self.ever_connected else ""
            log(f"{again}connection attempt {attempt} failed: {exc}")
        delay = min(_RECONNECT_MAX_S, _RECONNECT_FIRST_S * 2 ** min(attempt - 1, 10))
        self.next_attempt = time.monotonic() + delay * random.uniform(0.5, 1.0)

    def _give_up(self, code: int, message: str) -> None:
        log(message)
        self.exit_code = code
        self._drop_master(None)

    def _start(self, sock: Any, welcome: _dial.Welcome, reader: Any, early: List[list]) -> None:
        restarted = self.instance is not None and welcome.instance != self.instance
        self.sock, self.reader = sock, reader
        self.instance = welcome.instance
        self.codes.clear()
        self.master_answers = False
        self.last_send = self.last_recv = time.monotonic()
        heartbeat_ms = max(welcome.heartbeat_ms, 1)
        if welcome.lease_ms:
            heartbeat_ms = min(heartbeat_ms, max(welcome.lease_ms // 3, 1))
        self.heartbeat_s = heartbeat_ms / 1000
        self.silence_s = 3 * (welcome.lease_ms or 3 * heartbeat_ms) / 1000 + self.heartbeat_s
        self.lease_s = (welcome.lease_ms or 3 * heartbeat_ms) / 1000
        self.check_links_at = 0.0
        self.beat_at = 0.0
        now = time.monotonic()
        for link in self.links.values():
            link.heard = max(link.heard, now)  # (its silence while the host had no master)
        try:
            host = sock.getsockname()[0]
        except OSError:
            host = ""
        self.welcome_frame = _flat(P.encode(P.WELCOME, *welcome, host))
        self.selector.register(sock, selectors.EVENT_READ, None)
        again = "re" if self.ever_connected else ""
        after = f" after {self.attempt} attempts" if self.attempt > 1 else ""
        note = "; it restarted" if restarted else ""
        log(
            f"{again}connected to the master at {self.address} as {self.name} (session "
            f"{welcome.session}, one connection for {self.slots} worker processes){after}{note}"
        )
        self.ever_connected = True
        self.attempt = 0
        self.frames = [self.serve] if self.serve else []
        if self.orphans and not restarted:
            self.frames.append(P.encode(P.RESULT, self.orphans))
        self.orphans = []
        self.frames.append(_HEARTBEAT)  # its answer shows the master answers (a cut is seen)
        if self.draining:
            self.frames.append(P.encode(P.DRAIN))
        for link in self.links.values():
            if link.hello and not link.closed:
                self._welcome(link)
        if early:
            self._from_master(early)

    def _drop_master(self, why: str | None) -> None:
        """The master connection is gone: tell every child, forget what it held."""
        if self.sock is not None:
            self.selector.unregister(self.sock)
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
            self.lost_at = time.monotonic()
            self.next_attempt = self.lost_at + _RECONNECT_FIRST_S * random.uniform(0.5, 1.0)
            if why is not None and self.exit_code is None:
                log(f"{why}; reconnecting (master {self.address})")
        error = _flat(P.encode(P.ERROR, ERR_HOST_LOST, why or "the worker is stopping"))
        for link in self.links.values():
            if link.ready:
                self._send_link(link, error)
            link.ready = False
            link.credits = 0
            link.held.clear()
            link.codes.clear()
            link.hungry = False
        self.hungry.clear()
        self.owner.clear()
        self.codes.clear()
        self.orphans += self.results
        self.results = []
        self.frames = []
        self.pull = 0

    def _read_master(self) -> None:
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise _Lost(f"connection error: {exc.strerror or exc}") from None
        if not data:
            raise _Lost("the master closed the connection")
        self.last_recv = time.monotonic()
        try:
            msgs = self.reader.feed(data)
        except ProtocolError as exc:
            raise _Lost(f"bad frame from the master: {exc}") from None
        self._from_master(msgs)

    def _flush_due_ns(self) -> int | None:
        """When the pending results and credits must go (perf_counter_ns), None if nothing
        is pending: at once, or :data:`FLUSH_INTERVAL_NS` after the last write while the
        children hold more tasks (their results join this batch)."""
        if self.frames:
            return 0
        if not self.results and not self.pull:
            return None
        if not self.owner or len(self.results) >= FLUSH_RESULTS:
            return 0
        return self.written_ns + FLUSH_INTERVAL_NS

    def flush(self) -> None:
        """Write what the children sent since the last flush: one write to the master."""
        if self.sock is None:
            return
        out = self.frames
        if self.results:
            out.append(P.encode(P.RESULT, self.results))
            self.results = []
        if self.pull > 0 and not self.draining:
            out.append(P.encode(P.PULL, self.pull))
        self.pull = 0
        if not out:
            return
        self.frames = []
        try:
            P.sendall(self.sock, P.join(out))
        except OSError as exc:
            self._drop_master(f"sending to the master failed: {exc.strerror or exc}")
            return
        self.last_send = time.monotonic()
        self.written_ns = perf_ns()

    # -- the loop -------------------------------------------------------------------------------

    def poll(self, timeout: float) -> None:
        """Connect if due, then move frames both ways for up to ``timeout`` seconds."""
        self._connect()
        master = self.sock
        if master is not None and getattr(master, "is_tls", False) and master.pending():
            timeout = 0  # decrypted bytes select() does not see
        due = self._flush_due_ns()
        if due is not None:
            timeout = min(timeout, max(0, due - perf_ns()) / 1e9)
        try:
            events = self.selector.select(timeout)
        except InterruptedError:
            events = []
        try:
            for key, mask in events:
                link = key.data
                if link is None:
                    self._read_master()
                    while self.sock is not None and getattr(self.sock, "is_tls", False):
                        if not self.sock.pending():
                            break
                        self._read_master()
                    continue
                if mask & selectors.EVENT_WRITE:
                    self._write_link(link)
                if mask & selectors.EVENT_READ and not link.closed:
                    self._read_link(link)
            if self.sock is not None:  # (after reading: a stalled loop blames no child)
                self._keep_alive()
        except _Lost as lost:
            self._drop_master(str(lost))
        due = self._flush_due_ns()
        if due is not None and due <= perf_ns():
            self.flush()

    def _keep_alive(self) -> None:
        now = time.monotonic()
        if now >= self.check_links_at:
            self.check_links_at = now + self.heartbeat_s
            for link in self.links.values():
                if link.ready and now - link.heard > self.lease_s:
                    self._expire(link, now - link.heard)
        quiet = self.heartbeat_s * 0.9
        # Idle, or hearing nothing (ask for the master's answer): once per heartbeat period.
        if now - self.beat_at >= quiet and (
            now - self.last_send >= quiet or now - self.last_recv >= quiet
        ):
            self.beat_at = now
            self.frames.append(_HEARTBEAT)
        if self.master_answers and now - self.last_recv > self.silence_s:
            raise _Lost(
                f"no word from the master for {self.silence_s:g} s (it answers heartbeats); "
                "the path to it may be cut"
            )

    def _expire(self, link: Link, silent_s: float) -> None:
        why = (
            f"worker process (slot {link.slot}) was silent for {silent_s:.1f} s, past the "
            f"master's lease of {self.lease_s:g} s (stopped?)"
        )
        log(f"{why}; its {len(link.held)} tasks go back to the master")
        self._give_back(link, list(link.held))
        link.ready = False
        link.codes.clear()
        self._send_link(link, P.encode(P.ERROR, ERR_HOST_LOST, why))

    def drain(self) -> None:
        """Graceful shutdown: ask the master for no more work; the children drain."""
        if self.draining:
            return
        self.draining = True
        if self.sock is not None:
            self.frames.append(P.encode(P.DRAIN))
            self.flush()

    def close(self) -> None:
        """Once the children are gone: send what is left, close, wait for the master's
        close (closing with unread data would reset the connection and lose the frames)."""
        sock = self.sock
        if sock is not None:
            self.flush()
            self.selector.unregister(sock)
            try:
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(2.0)
                while sock.recv(RECV_BYTES):
                    pass
            except OSError:
                pass
            sock.close()
            self.sock = None
        for link in self.links.values():
            self._close_link(link)
        self.selector.close()


class _Lost(Exception):
    """The master connection is unusable (the message says why)."""
