"""Hosts on a private network for multi-host tests and benches (``rtpool bench handshake``):
one network namespace per host, joined by veth pairs to a bridge in the master host's
namespace, and the test process (the root namespace) on the same bridge, so a client in the
test reaches every host.

Names are unique per run (a prefix with the test process's PID and a random suffix); every
namespace and link is removed by :meth:`Network.close`, also after a failed setup. Cutting a
host sets its bridge-side link down: to the host it looks like a cable pulled out (its own
interface stays up, packets go nowhere), as on a real network.

Needs root and iproute2; :func:`skip_reason` says why a test cannot run otherwise.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from typing import Dict, List


def skip_reason() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "multi-host tests need root to create network namespaces (ip netns); CI runs them"
    if shutil.which("ip") is None:
        return "multi-host tests need iproute2 (`ip`): apt-get install -y iproute2"
    probe = f"rtpprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace here: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


class Network:
    """A master host and worker hosts on one bridge (10.250.X.0/24, X random per run).

    Args:
        hosts: Names of the hosts besides ``master`` (e.g. ``["w1", "w2"]``).
    """

    def __init__(self, hosts: List[str]) -> None:
        tag = f"{os.getpid() % 100000}{random.randrange(36**2):02x}"
        self.prefix = f"rtp{tag}"  # at most 10 characters: interface names stay under 16
        subnet = random.randrange(1, 255)
        self.names = ["master", *hosts]
        #: Namespace of each host.
        self.ns: Dict[str, str] = {h: f"{self.prefix}-{h}" for h in self.names}
        #: IP address of each host, and of the test process (``here``).
        self.ip: Dict[str, str] = {"master": f"10.250.{subnet}.1", "here": f"10.250.{subnet}.100"}
        for i, h in enumerate(hosts):
            self.ip[h] = f"10.250.{subnet}.{11 + i}"
        self._made_ns: List[str] = []
        self._root_link = f"{self.prefix}h"
        try:
            self._build(hosts)
        except BaseException:
            self.close()
            raise

    def _build(self, hosts: List[str]) -> None:
        m = self.ns["master"]
        for h in self.names:
            _ip("netns", "add", self.ns[h])
            self._made_ns.append(self.ns[h])
            _ip("-n", self.ns[h], "link", "set", "lo", "up")
        _ip("-n", m, "link", "add", "br0", "type", "bridge")
        _ip("-n", m, "addr", "add", f"{self.ip['master']}/24", "dev", "br0")
        _ip("-n", m, "link", "set", "br0", "up")
        # The test process's own port on the bridge.
        _ip("link", "add", self._root_link, "type", "veth", "peer", "name", "ph", "netns", m)
        self._plug("ph")
        _ip("addr", "add", f"{self.ip['here']}/24", "dev", self._root_link)
        _ip("link", "set", self._root_link, "up")
        for h in hosts:
            _ip("-n", self.ns[h], "link", "add", "eth0", "type", "veth", "peer", "name",
                self._port(h), "netns", m)  # fmt: skip
            self._plug(self._port(h))
            _ip("-n", self.ns[h], "addr", "add", f"{self.ip[h]}/24", "dev", "eth0")
            _ip("-n", self.ns[h], "link", "set", "eth0", "up")

    @staticmethod
    def _port(host: str) -> str:
        return f"p-{host}"[:15]

    def _plug(self, port: str) -> None:
        m = self.ns["master"]
        _ip("-n", m, "link", "set", port, "master", "br0")
        _ip("-n", m, "link", "set", port, "up")

    def run(self, host: str, cmd: List[str]) -> List[str]:
        """``cmd`` run on ``host`` (``ip netns exec`` execs it: the PID is the command's)."""
        return ["ip", "netns", "exec", self.ns[host], *cmd]

    def netns_id(self, host: str) -> int:
        """The inode of ``host``'s network namespace: what ``/proc/self/ns/net`` shows a
        process running there (``tasks.logged_netns`` returns it)."""
        return os.stat(f"/run/netns/{self.ns[host]}").st_ino

    def cut(self, host: str) -> None:
        """Pull ``host``'s cable: its bridge port goes down."""
        _ip("-n", self.ns["master"], "link", "set", self._port(host), "down")

    def restore(self, host: str) -> None:
        """Plug ``host`` back in."""
        _ip("-n", self.ns["master"], "link", "set", self._port(host), "up")

    def close(self) -> None:
        """Remove every link and namespace this network made (idempotent, never raises)."""
        _ip("link", "del", self._root_link, check=False)
        for ns in reversed(self._made_ns):
            _ip("netns", "del", ns, check=False)
        self._made_ns = []
