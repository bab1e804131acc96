"""A file system that can lose power, for the power-loss runs (``rtpool bench powerloss``,
``tests/test_power_loss.py``): the FUSE layer ``powerfs.c`` beside this file, built here with
gcc against libfuse3, mounted over a backing directory, and told to cut the power.

What the layer keeps and drops is described at the top of ``powerfs.c``: writes and directory
changes not yet fsynced are taken back at a cut, so the backing directory then holds what a disk
holds after a power loss. Building needs gcc, pkg-config and libfuse3's headers; as root with
apt-get, Debian's ``libfuse3-dev`` (and ``fuse3``, for ``fusermount3``) are installed when
missing, as ``scripts/pg-test-server`` does for PostgreSQL. Mounting needs ``/dev/fuse`` and
root (or ``fusermount3``). :func:`unavailable` says why it cannot run here, or None.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("powerfs.c")
#: The control file at the mount's root: write ``cut``, read the counters.
CONTROL = ".powerfs"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rtpool"


def _has_headers() -> bool:
    if shutil.which("pkg-config") is None:
        return False
    probe = subprocess.run(["pkg-config", "--exists", "fuse3"], capture_output=True)
    return probe.returncode == 0


def _install_libfuse() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, capture_output=True)
    packages = ["libfuse3-dev", "fuse3", "pkg-config", "gcc"]
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        env=env,
        check=True,
        capture_output=True,
    )


def unavailable() -> str | None:
    """Why powerfs cannot run on this machine (a sentence), or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return (
            "/dev/fuse is missing (load the fuse module: modprobe fuse; in a container, "
            "pass --device /dev/fuse)"
        )
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 (Debian: apt-get install fuse3)"
    if not _has_headers() or shutil.which("gcc") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            return (
                "libfuse3's headers or gcc are missing "
                "(Debian: apt-get install libfuse3-dev gcc pkg-config)"
            )
    return None


def build() -> Path:
    """The powerfs binary, compiled once per version of ``powerfs.c`` into the user's cache
    (``~/.cache/rtpool``); installs libfuse3-dev first when it is missing and we are root.

    Raises:
        RuntimeError: gcc failed (its output is in the message).
    """
    source = SOURCE.read_bytes()
    binary = _cache_dir() / f"powerfs-{hashlib.sha256(source).hexdigest()[:16]}"
    if binary.exists():
        return binary
    if not _has_headers() or shutil.which("gcc") is None:
        _install_libfuse()
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True, check=True
    ).stdout.split()
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(f".tmp{os.getpid()}")
    cc = subprocess.run(
        ["gcc", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), *flags],
        capture_output=True,
        text=True,
    )
    if cc.returncode != 0:
        raise RuntimeError(f"building powerfs failed: {cc.stderr.strip()}")
    os.replace(tmp, binary)
    return binary


class PowerFS:
    """``powerfs`` mounted at ``mount`` over ``backing`` (both made if missing); a context
    manager that unmounts it and stops the process (by PID) on exit.

    Args:
        backing: Where the data really lives.
        mount: The mount point the program under test writes to.
        log: Where powerfs's stderr goes.
    """

    def __init__(self, backing: Path, mount: Path, log: Path):
        self.backing, self.mount = backing, mount
        backing.mkdir(parents=True, exist_ok=True)
        mount.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [str(build()), str(backing), str(mount), "-f"],
                stdout=err,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        end = time.monotonic() + 10
        while not os.path.ismount(mount):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.close()
                raise RuntimeError(f"powerfs did not mount {mount}: {log.read_text()[-1000:]}")
            time.sleep(0.01)

    def __enter__(self) -> PowerFS:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cut(self) -> dict:
        """Cut the power: every write and directory change not fsynced is taken back. Stop
        every writer first. Returns :meth:`counters` after the cut."""
        with open(self.mount / CONTROL, "w") as ctl:
            ctl.write("cut")
        return self.counters()

    def counters(self) -> dict:
        """The layer's counters: ``cuts``, ``dropped_bytes``, ``dropped_files``,
        ``dropped_entries`` (all cuts so far) and ``pending_files`` (unsynced now)."""
        text = (self.mount / CONTROL).read_text()
        return {k: int(v) for k, v in (item.split("=") for item in text.split())}

    def sync_dir(self, path: Path) -> None:
        """fsync the directory ``path`` (on the mount): its entries become durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmount and stop powerfs (by PID); idempotent."""
        if os.path.ismount(self.mount):
            subprocess.run(["umount", str(self.mount)], capture_output=True)
            if os.path.ismount(self.mount):  # still busy: detach it
                subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
        if self.proc.poll() is None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
