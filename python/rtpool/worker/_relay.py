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
  one write, at most one such write per millisecond while the children hold other tasks
  (more results are coming: they join the batch). When they hold none (the last result of a
  package, one task at a time), it goes at once: no latency is added where no batch could
  form. That half of the relay, the master connection itself, is ``_upstream.py``.
* **Returns.** A child's ``RETURN`` is forwarded (in the same batch); since the master
  withdraws all of a connection's credits on ``RETURN``, the relay asks again, in the same
  write, for the other children's.
* **Devices.** A task or call whose entry asks for GPUs (its ``res``) gets that many free
  device ids of the host (``_devices.py``: those its child had last, if free), appended to the
  entry after ``res`` for the child (``_task.py``), and held until its result, return or loss
  passes here.
* **ABORT** goes to the child holding the task, ``DROP`` (kept values released) to every
  child (each ignores the keys it does not hold); a child's heartbeats are answered here.
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
(``docs/reliability.md``, "One connection per host"; figures: ``rtpool bench procs``).
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections import deque
from typing import Any, Deque, Dict, List, Tuple

from .. import _protocol as P
from ..errors import ProtocolError
from ._common import log, perf_ns
from ._devices import DevicePool, gpu_count
from ._relayed import ERR_HOST_LOST
from ._upstream import _HEARTBEAT, _MAX_ORPHANS, Lost, Upstream, flat

Key = Tuple[int, int]  # (task, attempt)


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


class Relay(Upstream):
    """The host's master connection (:class:`Upstream`) and its children's links (see the
    module docstring). Arguments as :class:`Upstream`."""

    def __init__(self, args: Any, token: str, name: str, serve: bytes) -> None:
        super().__init__(args, token, name, serve)
        self.links: Dict[int, Link] = {}
        self.hungry: Deque[Link] = deque()
        self.owner: Dict[Key, int] = {}  # task -> slot holding it
        self.codes: Dict[bytes, bytes] = {}  # function code the master sent this session
        self.check_links_at = 0.0
        #: Tasks handed to the children so far (the closing line counts them).
        self.relayed = 0
        inv = getattr(args, "inventory", None)
        #: The host's GPUs, given to the tasks that ask for them (None: it has none).
        self.devices = DevicePool(inv.gpu_ids) if inv is not None and inv.gpu_ids else None

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
            if self.devices is not None:
                self.devices.free((lost[0], lost[1]))
            self.add_results([lost])
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
        data = flat(data)
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
            data = P.recv_some(link.sock, self.recv_buf)
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
            log(f"bad frame from worker process (slot {link.slot}): {exc}", logging.ERROR)
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
                owner, held, devices = self.owner, link.held, self.devices
                for r in msg[1]:
                    key = (r[0], r[1])
                    if key in held:
                        del held[key]
                        owner.pop(key, None)
                        if devices is not None:
                            devices.free(key)
                self.add_results(msg[1])
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
            self.add_results(results)
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
            if self.devices is not None:
                self.devices.free(k)
        if keys and self.sock is not None:
            self._return_up(keys)

    def _return_up(self, keys: List[Key]) -> None:
        """``RETURN`` to the master, which withdraws every credit of the connection: ask
        again at once for what the children still want."""
        self._seal_results()
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
            # res is an ASSIGN entry's eighth field, an ASSIGN_CALLS entry's ninth.
            res_at = 7 if kind == P.ASSIGN else 8
            if len(e) == res_at + 1 and self.devices is not None:
                count = gpu_count(e[res_at])
                if count:  # its devices, for the child (the field after res: _task.py)
                    e.append(list(self.devices.take(key, count, owner=link.slot)))
            owner[key] = link.slot
            link.held[key] = None
            self.relayed += 1
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
            elif kind == P.DROP:
                # Kept values the client released: the relay does not know which child keeps
                # which (a child ignores keys it does not hold), so every child hears it.
                drop = flat(P.encode(P.DROP, msg[1]))
                for link in self.links.values():
                    if link.ready:
                        self._send_link(link, drop)
            elif kind == P.HEARTBEAT:
                self.master_answers = True
            elif kind == P.ERROR:
                self._on_error(msg[1], msg[2])
            else:
                raise Lost(f"unexpected message kind {kind} from the master")

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
                now = time.monotonic()
                self._check_links(now)
                self._keep_alive(now)
        except Lost as lost:
            self._drop_master(str(lost))
        due = self._flush_due_ns()
        if due is not None and due <= perf_ns():
            self.flush()

    def _check_links(self, now: float) -> None:
        if now >= self.check_links_at:
            self.check_links_at = now + self.heartbeat_s
            for link in self.links.values():
                if link.ready and now - link.heard > self.lease_s:
                    self._expire(link, now - link.heard)

    def _expire(self, link: Link, silent_s: float) -> None:
        why = (
            f"worker process (slot {link.slot}) was silent for {silent_s:.1f} s, past the "
            f"master's lease of {self.lease_s:g} s (stopped?)"
        )
        log(f"{why}; its {len(link.held)} tasks go back to the master", logging.WARNING)
        self._give_back(link, list(link.held))
        link.ready = False
        link.codes.clear()
        self._send_link(link, P.encode(P.ERROR, ERR_HOST_LOST, why))

    def close(self) -> None:
        """Once the children are gone: close the master connection and the links."""
        self.close_master()
        if self.ever_connected:
            log(
                f"closed the connection to the master at {self.address}: it carried "
                f"{self.relayed} tasks to {self.slots} worker processes in {self.writes} "
                "writes of results and credits"
            )
        for link in self.links.values():
            self._close_link(link)
        self.selector.close()

    # -- the master connection's hooks --------------------------------------------------------

    def _holding(self) -> bool:
        return bool(self.owner)

    def _on_session(self) -> None:
        self.codes.clear()
        now = time.monotonic()
        for link in self.links.values():
            link.heard = max(link.heard, now)  # (its silence while the host had no master)
            if link.hello and not link.closed:
                self._welcome(link)

    def _on_master_lost(self, why: str) -> None:
        error = flat(P.encode(P.ERROR, ERR_HOST_LOST, why))
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
        if self.devices is not None:
            self.devices.clear()
