"""scripts/check-imports (run by `make lint`): it fails on an import circle in any crate or
Python package and on a non-test source file over 600 lines, shown on broken copies of real
trees, and passes on the repository itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check-imports"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_repository_passes():
    out = run()
    assert out.returncode == 0, out.stdout + out.stderr
    # Every crate is covered, not only the master.
    for crate in sorted(p.parent.name for p in (ROOT / "crates").glob("*/src")):
        assert f"crates/{crate}/src:" in out.stdout


def test_broken_copy_of_the_python_package_fails(tmp_path):
    pkg = tmp_path / "rtpool"
    shutil.copytree(ROOT / "python" / "rtpool", pkg, ignore=shutil.ignore_patterns("*.so"))
    # (The size limit is left out here: this test is about circles.)
    assert run("--max-lines", "100000", f"python:{pkg}").returncode == 0
    # errors.py is imported by nearly everything; make it import the client back.
    errors = pkg / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom .client import Client  # noqa\n")
    out = run("--max-lines", "100000", f"python:{pkg}")
    assert out.returncode == 1
    assert "import circle" in out.stdout and "errors.py" in out.stdout


def test_broken_copy_of_a_crate_fails(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "crates" / "rtpool-master" / "src", src)
    assert run("--max-lines", "100000", f"rust:{src}").returncode == 0
    lib = (src / "lib.rs").read_text()
    mods = sorted(p.stem for p in src.glob("*.rs") if p.stem not in ("lib", "main"))
    assert len(mods) >= 2, mods
    first, second = mods[0], mods[1]
    for a, b in ((first, second), (second, first)):
        f = src / f"{a}.rs"
        f.write_text(f.read_text() + f"\n#[allow(unused_imports)]\nuse crate::{b}::*;\n")
    out = run("--max-lines", "100000", f"rust:{src}")
    assert out.returncode == 1, out.stdout
    assert f"crate::{first}" in out.stdout and f"crate::{second}" in out.stdout
    assert lib  # lib.rs untouched


def test_a_file_over_the_limit_fails_and_test_files_are_exempt(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "big.py").write_text("x = 1\n" * 600)
    (pkg / "test_big.py").write_text("x = 1\n" * 900)
    (pkg / "tests" / "helpers.py").write_text("x = 1\n" * 900)
    assert run(f"python:{pkg}").returncode == 0
    (pkg / "big.py").write_text("x = 1\n" * 601)
    out = run(f"python:{pkg}")
    assert out.returncode == 1
    assert "big.py: 601 lines, over the 600-line limit" in out.stdout
    assert "test_big.py" not in out.stdout and "helpers.py" not in out.stdout
    # The limit is a knob; Rust files and bench trees are counted too.
    assert run("--max-lines", "700", f"python:{pkg}").returncode == 0
    benches = tmp_path / "benches"
    benches.mkdir()
    (benches / "worst.rs").write_text("// x\n" * 601)
    (benches / "tests.rs").write_text("// x\n" * 900)
    out = run(f"lines:{benches}")
    assert out.returncode == 1 and "worst.rs" in out.stdout and "tests.rs" not in out.stdout


def test_bad_arguments_are_refused():
    assert run("nonsense").returncode == 2
    assert run("--max-lines").returncode == 2
