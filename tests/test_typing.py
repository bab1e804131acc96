"""The typed client API (issue 26, item 7): ``submit`` gives a ``Future[T]``, ``map`` an
``Iterator[T]``, ``options()`` takes typed keywords. mypy runs on a correct example (no error)
and a wrong one (exactly the marked errors), both in ``tests/typecheck/``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import rtpool
from rtpool._options import VALID_OPTIONS, PackageOptions

TYPING_DIR = Path(__file__).parent / "typecheck"
PYTHON_DIR = Path(rtpool.__file__).resolve().parent.parent


def test_typed_options_are_the_options_table():
    # One declaration of every option (_options.OPTIONS); the TypedDict follows it, plus the
    # two client-side ones.
    assert tuple(PackageOptions.__annotations__) == (*VALID_OPTIONS, "keep", "keep_bytes")


def test_py_typed_marker_ships():
    assert (PYTHON_DIR / "rtpool" / "py.typed").is_file()


def _expected(path: Path):
    marks = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# E: ([a-z-]+)$", line)
        if m:
            marks.add((n, m.group(1)))
    return marks


def test_mypy_accepts_the_correct_example_and_flags_each_wrong_line(tmp_path):
    ok, wrong = TYPING_DIR / "typed_ok.py", TYPING_DIR / "typed_wrong.py"
    cmd = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--show-error-codes"]
    cmd += ["--no-error-summary", "--cache-dir", str(tmp_path / "cache"), str(ok), str(wrong)]
    env = {"MYPYPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    errors = re.findall(r"^(.*?):(\d+): error: .*\[([a-z-]+)\]$", out.stdout, re.M)
    assert out.returncode == 1, out.stdout + out.stderr
    assert [e for e in errors if Path(e[0]).name == ok.name] == [], out.stdout
    got = {(int(n), code) for f, n, code in errors if Path(f).name == wrong.name}
    expected = _expected(wrong)
    assert len(expected) == 9
    assert got == expected, out.stdout
