"""One source for every published figure: the README's Performance table and the summary at
the top of docs/benchmarks.md, written from one run.

    python benches/figures.py                                # run the benches, write both tables
    python benches/figures.py --save-json run.json --dry-run # run, keep the JSON, print only
    python benches/figures.py --from-json run.json           # write the tables from a saved run
    python benches/figures.py --from-json bench.json scale.json demo.json

A run is, one after another: ``rtpool bench latency``, ``throughput``, ``payload --sizes
1K,64K,1M,16M``, ``scale --workers 10000`` and ``rtpool demo``, each with ``--json`` (``--skip``
leaves sections out, ``--quick`` makes it a smoke run of seconds). The merged JSON records the
machine, the date (UTC), the commit (with ``+dirty`` if tracked files differ from it) and each
command. ``--from-json`` takes that file, or the saved ``--json`` output of the benches
themselves (``rtpool bench all --json``, ``rtpool bench scale --json``, ``rtpool demo --json``);
their commit is then the checkout's at write time unless ``--commit`` says otherwise.

Only the text between ``<!-- figures:begin -->`` and ``<!-- figures:end -->`` in each file
changes. Every bench run is bounded (``--timeout``) and its process group killed past it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _figures  # noqa: E402
from _bounded import run_json  # noqa: E402

CHECKOUT = Path(__file__).resolve().parent.parent

#: The command of each section (``python -m rtpool`` + these + ``--json``).
COMMANDS: Dict[str, List[str]] = {
    "latency": ["bench", "latency"],
    "throughput": ["bench", "throughput"],
    "payload": ["bench", "payload", "--sizes", "1K,64K,1M,16M"],
    "scale": ["bench", "scale", "--workers", "10000"],
    "demo": ["demo"],
}
#: ``--quick``: the same commands, seconds each (a smoke run, not figures to publish).
QUICK: Dict[str, List[str]] = {
    "latency": ["--count", "300", "--warmup", "50"],
    "throughput": ["--tasks", "20000", "--runs", "1"],
    "payload": ["--payload-seconds", "1"],
    "scale": ["--tasks", "2000", "--latency-count", "100", "--seconds", "10"],
    "demo": ["--tasks", "40", "--rounds", "1"],
}


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(CHECKOUT), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def checkout_commit() -> str:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it."""
    sha = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    return sha + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def run_one(python: str, argv: Sequence[str], timeout: float) -> dict:
    """One bench command's JSON; exits with a message if it fails or runs past ``timeout``."""
    shown = f"python -m rtpool {' '.join(argv)}"
    print(f"figures: {shown}", file=sys.stderr, flush=True)
    return run_json([python, "-m", "rtpool", *argv], f"figures: `{shown}`", timeout)


def run_all(python: str, sections: Sequence[str], quick: bool, timeout: float) -> dict:
    """Every section's command, one after another, merged into one run."""
    run: dict = {"commit": checkout_commit()}
    run["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    run["commands"] = {}
    outputs = []
    for name in sections:
        argv = [*COMMANDS[name], *(QUICK[name] if quick else ()), "--json"]
        outputs.append(run_one(python, argv, timeout))
        run["commands"][name] = "python -m rtpool " + " ".join(argv)
    merged = _figures.merge(outputs)
    return {**merged, **run, "quick": quick}


def write(path: Path, body: str, dry_run: bool) -> bool:
    """Put ``body`` between the markers of ``path``; True if the file changed."""
    text = path.read_text(encoding="utf-8")
    new = _figures.replace_between(text, body, str(path))
    if not dry_run and new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-json", nargs="+", metavar="FILE", help="saved run(s): no bench runs")
    ap.add_argument("--save-json", metavar="FILE", help="write the merged run here")
    ap.add_argument("--skip", default="", help=f"sections to leave out, of {','.join(COMMANDS)}")
    ap.add_argument("--quick", action="store_true", help="a smoke run of seconds per section")
    ap.add_argument("--commit", help="the commit the saved JSON was measured at")
    ap.add_argument("--python", default=sys.executable, help="interpreter running the benches")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per bench at most")
    ap.add_argument("--readme", default=str(CHECKOUT / "README.md"))
    ap.add_argument("--docs", default=str(CHECKOUT / "docs" / "benchmarks.md"))
    ap.add_argument("--dry-run", action="store_true", help="print the tables, write no file")
    return ap


def main(argv: Sequence[str]) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    skip = [s for s in args.skip.split(",") if s]
    unknown = [s for s in skip if s not in COMMANDS]
    if unknown:
        ap.error(f"--skip {','.join(unknown)}: no such section (of {','.join(COMMANDS)})")
    if args.timeout <= 0:
        ap.error("--timeout must be positive")
    if args.from_json:
        if args.quick or skip:
            ap.error("--quick and --skip choose what to run; --from-json runs nothing")
        try:
            files = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.from_json]
            run = _figures.merge(files)
        except (OSError, ValueError) as e:
            ap.error(f"--from-json: {e}")
        run.setdefault("commit", args.commit or checkout_commit())
        if args.commit:
            run["commit"] = args.commit
        if "date" not in run:
            mtime = os.path.getmtime(args.from_json[0])
            stamp = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc)
            run["date"] = stamp.strftime("%Y-%m-%d %H:%M UTC")
    else:
        sections = [s for s in COMMANDS if s not in skip]
        if not sections:
            ap.error("--skip leaves nothing to run")
        run = run_all(args.python, sections, args.quick, args.timeout)
    if args.save_json:
        Path(args.save_json).write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    readme, docs = _figures.readme_table(run), _figures.docs_summary(run)
    if args.dry_run:
        print(f"{readme}\n\n{docs}")
    try:
        for path, body in ((Path(args.readme), readme), (Path(args.docs), docs)):
            changed = write(path, body, args.dry_run)
            verb = "would change" if args.dry_run else "wrote"
            print(f"figures: {path}: {verb if changed else 'unchanged'}", file=sys.stderr)
    except (OSError, ValueError) as e:
        print(f"figures: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
