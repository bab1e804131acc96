"""Build a base commit's ``python/`` with its native module beside this checkout, once.

``build(rev)`` makes ``<cache>/<sha>/python``: the commit's tree from ``git archive`` (never a
checkout of this worktree), its ``rtpool-py`` crate built by ``cargo build --release --locked``
into a target directory shared by every base (``<cache>/target``: third-party crates are built
once; each base's own crates sit at their own path, so bases do not rebuild each other), and
the cdylib copied to where maturin would put it (``module-name`` of the commit's
``pyproject.toml``, ``rtpool._native`` -> ``rtpool/_native.abi3.so``). A finished build leaves
``<cache>/<sha>/BUILT``; the next run reuses it. A lock file serializes two runs building the
same base.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

#: The stamp of a finished build: the directory is complete and reusable.
STAMP = "BUILT"


class BuildError(Exception):
    """The base could not be resolved, extracted or built; the message says which and why."""


def resolve(repo: Path, rev: str) -> str:
    """The full commit id of ``rev`` in ``repo``.

    Raises:
        BuildError: not a commit there.
    """
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"{rev!r} is not a commit of {repo}; give a rev such as HEAD~1 or f5cd257")
    return proc.stdout.strip()


def maturin_layout(src: Path) -> Dict[str, str]:
    """manifest-path, python-source and module-name from ``src/pyproject.toml``'s
    ``[tool.maturin]`` (read as text: the commit may predate any key we would need tomllib
    for, and Python 3.9 has no tomllib).

    Raises:
        BuildError: no pyproject.toml or no ``module-name`` in it.
    """
    try:
        text = (src / "pyproject.toml").read_text(encoding="utf-8")
    except OSError as e:
        raise BuildError(f"the base has no pyproject.toml ({e})") from None
    if "[tool.maturin]" not in text:
        raise BuildError("the base's pyproject.toml has no [tool.maturin] section")
    section = text.split("[tool.maturin]", 1)[1].split("\n[", 1)[0]
    out: Dict[str, str] = {"manifest-path": "Cargo.toml", "python-source": "."}
    for key in ("manifest-path", "python-source", "module-name"):
        m = re.search(rf'^{key}\s*=\s*"([^"]+)"', section, re.M)
        if m:
            out[key] = m.group(1)
    if "module-name" not in out:
        raise BuildError("the base's pyproject.toml names no [tool.maturin] module-name")
    return out


def lib_name(manifest: Path) -> str:
    """The ``[lib] name`` of the crate (the cdylib is ``lib<name>.so``)."""
    text = manifest.read_text(encoding="utf-8")
    lib = re.split(r"^\[lib\]", text, maxsplit=1, flags=re.M)
    if len(lib) == 2:
        m = re.search(r'^name\s*=\s*"([^"]+)"', re.split(r"^\[", lib[1], flags=re.M)[0], re.M)
        if m:
            return m.group(1)
    m = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise BuildError(f"{manifest} names no crate")
    return m.group(1).replace("-", "_")


def _extract(repo: Path, sha: str, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or tar.returncode != 0:
        raise BuildError(f"git archive {sha} | tar -x -C {dest} failed")


def _cargo(manifest: Path, target: Path, python: str, timeout_s: float, log) -> None:
    env = {**os.environ, "CARGO_TARGET_DIR": str(target), "PYO3_PYTHON": python}
    cmd = ["nice", "-n", "10", "cargo", "build", "--release", "--locked", "--lib"]
    cmd += ["--manifest-path", str(manifest)]
    print(f"building the base: {' '.join(cmd)} (CARGO_TARGET_DIR={target})", file=log, flush=True)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise BuildError(f"cargo build of the base ran past {timeout_s:g} s; stopped") from None
    if code != 0:
        raise BuildError(f"cargo build of the base failed (exit {code}); its output is above")


def build(
    repo: Path,
    rev: str,
    cache: Path,
    python: str = sys.executable,
    timeout_s: float = 3600.0,
    seed_target: Path | None = None,
    log=sys.stderr,
) -> Path:
    """The ``python/`` directory of ``rev`` with its native module, built if not cached.

    Args:
        repo: The git repository holding ``rev``.
        cache: Where bases are built (``.bench-base`` of the checkout).
        python: The interpreter pyo3 builds for (the one that will run the benches).
        seed_target: A target directory copied as the shared one when there is none yet
            (this checkout's ``target/``: its third-party crates are then not built again).

    Raises:
        BuildError: the rev, the tree or the build, with the reason.
    """
    sha = resolve(repo, rev)
    base = cache / sha
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{sha}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        layout_python = base / "python"
        if (base / STAMP).exists():
            print(f"base {rev} = {sha[:12]}: reusing {layout_python}", file=log, flush=True)
            return layout_python
        src = base / "src"
        _extract(repo, sha, src)
        layout = maturin_layout(src)
        manifest = src / layout["manifest-path"]
        target = cache / "target"
        if not target.exists() and seed_target is not None and (seed_target / "release").is_dir():
            print(f"seeding {target} from {seed_target}", file=log, flush=True)
            shutil.copytree(seed_target / "release", target / "release", symlinks=True)
        _cargo(manifest, target, python, timeout_s, log)
        built = target / "release" / f"lib{lib_name(manifest)}.so"
        if not built.exists():
            raise BuildError(f"cargo finished but {built} is not there")
        if layout_python.exists():
            shutil.rmtree(layout_python)
        shutil.copytree(src / layout["python-source"], layout_python, symlinks=True)
        package, _, module = layout["module-name"].rpartition(".")
        dest = layout_python.joinpath(*package.split(".")) / f"{module}.abi3.so"
        shutil.copy2(built, dest)
        (base / STAMP).write_text(f"{sha}\n", encoding="utf-8")
        print(f"base {rev} = {sha[:12]}: built {layout_python}", file=log, flush=True)
        return layout_python
