"""What a new user tripped over on the command line (issue 14, item 7): the master's option
checks and Ctrl-C, `rtpool token`, `rtpool bench`, messages, remote tracebacks and `make demo`.
Each test runs the real command as a subprocess where the behaviour is the command's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import stop_process
from rtpool import _protocol as P
from rtpool._connection.outcomes import task_error
from rtpool._text import plural
from rtpool._token_cli import _seconds, format_table

ROOT = Path(__file__).resolve().parent.parent


def rtpool(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rtpool", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        **kwargs,
    )


# -- rtpool master ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--fsync", "sometimes"], "use always, batch, batch:<ms> or off"),
        (["--log-level", "loud"], '"loud" is not a log level; use error, warn, info, debug'),
        (["--listen", "7070"], '"7070" is not HOST:PORT; write HOST:PORT, e.g. 127.0.0.1:7070'),
        (["--log-format", "xml"], "[possible values: text, json]"),
    ],
)
def test_master_refuses_bad_options_with_a_clean_error(tmp_path: Path, args, expected):
    proc = rtpool("master", "--data-dir", str(tmp_path / "d"), *args, timeout=20)
    assert proc.returncode == 2, proc
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "is another master running" not in proc.stderr
    assert not (tmp_path / "d").exists(), "refused before it touched the data dir"


def _start_master(tmp_path: Path, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(tmp_path / "data"), *args]
    # Not start_new_session: Ctrl-C reaches the master as the terminal's SIGINT would.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = proc.stdout.readline()
    while line and not line.startswith("listening on "):
        line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    return proc


def test_ctrl_c_stops_the_master_cleanly_like_sigterm(tmp_path: Path):
    proc = _start_master(tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "signal received, shutting down" in err


def test_master_log_has_no_colours_in_a_file_and_json_lines_on_request(tmp_path: Path):
    import json

    for fmt in ("text", "json"):
        log = tmp_path / f"{fmt}.log"
        with open(log, "w") as f:
            proc = _start_master(tmp_path, "--log-format", fmt, stderr=f)
        try:
            # Right after "listening on": the master must already handle the signal.
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            stop_process(proc)
            proc.stdout.close()
        text = log.read_text()
        assert "shutting down" in text
        assert "\x1b[" not in text, f"ANSI escapes in a log file: {text[:200]!r}"
        if fmt == "json":
            lines = [json.loads(line) for line in text.splitlines()]
            assert {"timestamp", "level", "fields", "target"} <= set(lines[0])
            assert any("shutting down" in line["fields"]["message"] for line in lines)


# -- rtpool token --------------------------------------------------------------------------


def test_token_seconds_are_written_for_people():
    assert _seconds(1) == "1 µs"
    assert _seconds(0) == "0 s"
    assert _seconds(1500) == "0.002 s"
    assert _seconds(2_500_000) == "2.5 s"
    assert _seconds(3_600_000_000) == "3,600 s"
    assert _seconds(None) == "unlimited"
    table = format_table([], {"default": {"user": "default", "quota_us": None, "used_us": 1}})
    assert "1e-06" not in table and "1 µs" in table
    assert "default (built-in tokens)" in table


def test_token_list_does_not_create_a_data_dir(tmp_path: Path):
    data = tmp_path / "nowhere"
    proc = rtpool("token", "list", "--data-dir", str(data))
    assert proc.returncode == 1
    assert f"the data dir {data} does not exist" in proc.stderr
    assert "rtpool token create" in proc.stderr
    assert not data.exists()
    data.mkdir()
    proc = rtpool("token", "revoke", "abcdef", "--data-dir", str(data))
    assert proc.returncode == 1 and "there is no user store" in proc.stderr
    assert os.listdir(data) == []


def test_token_revoke_twice_says_so_and_fails(tmp_path: Path):
    where = ["--data-dir", str(tmp_path / "data")]
    created = rtpool("token", "create", "--user", "ann", "--role", "client", *where)
    assert created.returncode == 0, created.stderr
    token_id = created.stderr.split(" token ")[1].split()[0]
    first = rtpool("token", "revoke", token_id, *where)
    assert first.returncode == 0 and "revoked client token" in first.stdout
    again = rtpool("token", "revoke", token_id[:8], *where)
    assert again.returncode == 1
    assert f"client token {token_id} of user ann was already revoked" in again.stderr


def test_token_quota_takes_the_same_option_as_create(tmp_path: Path):
    where = ["--data-dir", str(tmp_path / "data")]
    out = rtpool("token", "quota", "--user", "bo", "--quota-seconds", "90", *where)
    assert out.returncode == 0 and "quota of user bo: 90 s" in out.stdout
    old = rtpool("token", "quota", "--user", "bo", "--seconds", "30", *where)
    assert old.returncode == 0 and "quota of user bo: 30 s" in old.stdout
    help_text = rtpool("token", "quota", "--help").stdout
    assert "--quota-seconds" in help_text and "--seconds" not in help_text.replace(
        "--quota-seconds", ""
    )
    assert "the user whose quota to set" in help_text
    create_help = rtpool("token", "create", "--help").stdout
    assert "client: submits packages" in create_help and "worker: runs tasks" in create_help


# -- rtpool bench --------------------------------------------------------------------------

BENCHES = "latency, throughput, payload, all, deadline, hedge, realtime, recovery, journal, ninf"


def test_bench_unknown_name_lists_every_bench():
    pytest.importorskip("rich")
    proc = rtpool("bench", "nosuch")
    assert proc.returncode == 2
    assert f"unknown benchmark 'nosuch'; choose from {BENCHES}" in proc.stderr
    assert "which" not in proc.stderr


def test_bench_recovery_help_has_no_markup():
    pytest.importorskip("rich")
    proc = rtpool("bench", "recovery", "--help")
    assert proc.returncode == 0
    assert "``" not in proc.stdout
    assert "recovery worker-loss" in proc.stdout


def test_bench_ninf_json_is_a_flag_and_the_old_path_form_still_works(tmp_path: Path, capsys):
    from rtpool_bench.ninf import cli

    ap = cli.build_parser()

    def parse(*argv):
        args = ap.parse_args(list(argv))
        cli._json_compat(args)
        return args

    args = parse("--json")
    assert (args.json, args.json_file, args.sections) == ("-", None, [])
    args = parse("--json", "linpack", "ep")
    assert (args.json, args.sections) == ("-", ["linpack", "ep"])
    args = parse("--json-file", str(tmp_path / "f.json"))
    assert (args.json, args.json_file) == (None, str(tmp_path / "f.json"))
    args = parse("--json", str(tmp_path / "old.json"))
    assert (args.json, args.json_file) == (None, str(tmp_path / "old.json"))
    assert "is deprecated (--json is now a flag" in capsys.readouterr().err


# -- messages ------------------------------------------------------------------------------


def test_poison_message_says_it_once():
    master_text = "poison task: its worker was lost (crashed, killed or cut off) while running it"
    exc = task_error(P.STATUS_LOST, master_text.encode())
    assert str(exc).count("poison task") == 1, str(exc)
    assert "?" not in str(exc)


def test_counts_take_the_right_number():
    assert plural(1, "package") == "1 package"
    assert plural(0, "package") == "0 packages"
    assert plural(1234, "task") == "1,234 tasks"
    assert plural(2, "process", "processes") == "2 processes"


def test_quota_refusal_names_the_quota_once():
    import rtpool
    from fakemaster import FakeMaster
    from rtpool.errors import QuotaExceededError

    # The master's own text (crates/rtpool-core/src/event.rs, RejectReason::QuotaExhausted).
    said = (
        "user's compute-time quota is used up (12 us over); ask an admin for more "
        "(`rtpool token quota`)"
    )
    with FakeMaster() as fake, rtpool.Client(fake.address, "tok", name="unit") as client:
        fut = client.submit(abs, -1)
        conn = fake.accept()
        msg = conn.recv_kind(P.SUBMIT)
        conn.send(P.ERROR, "quota", said, msg[1])
        exc = fut.exception(timeout=5)
    assert isinstance(exc, QuotaExceededError)
    text = str(exc)
    assert text.count("quota is used up") == 1, text
    assert text.endswith(said)


# -- remote tracebacks ---------------------------------------------------------------------


def test_remote_traceback_names_the_functions_file_and_line(tmp_path: Path):
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """\
            import rtpool

            def boom(x):
                y = x + 1
                raise ValueError(f"boom {y}")

            if __name__ == "__main__":
                with rtpool.LocalCluster(workers=1) as cluster, cluster.client() as c:
                    exc = c.submit(boom, 1).exception(timeout=60)
                    print(exc.__cause__)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "<dynamic-code>" not in proc.stdout
    assert f'File "{script}", line 5, in boom' in proc.stdout, proc.stdout
    assert 'raise ValueError(f"boom {y}")' in proc.stdout


# -- make demo -----------------------------------------------------------------------------


def test_make_demo_says_what_it_does_and_how_long_the_build_takes():
    if subprocess.run(["make", "--version"], capture_output=True).returncode != 0:
        pytest.skip("make is not installed")
    # -n: print the commands only; a fresh venv path so the install step is listed too.
    proc = subprocess.run(
        ["make", "-n", "demo", "VENV=/nonexistent-venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert "builds the Rust core" in proc.stdout and "3-5 minutes" in proc.stdout
    assert "rtpool demo: a LocalCluster" in proc.stdout


# -- Future.cancel() and repr --------------------------------------------------------------


def test_future_repr_says_what_the_client_knows(master, workers, client_factory):
    import tasks

    client = client_factory()
    fut = client.submit(tasks.square, 4)
    assert "state=pending (queued or running at the master)" in repr(fut)
    assert "pending>" not in repr(fut)
    assert fut.cancel() is True
    assert repr(fut).endswith("state=cancelled>")
    assert fut.cancel() is True, "cancel() of a cancelled future is True, as in concurrent.futures"
    workers.start(1)
    done = client.submit(tasks.square, 5)
    assert done.result(timeout=30) == 25
    assert "state=finished returned int>" in repr(done)
    assert done.cancel() is False
    failed = client.submit(tasks.fail, "x")
    failed.exception(timeout=30)
    assert "state=finished raised TaskError>" in repr(failed)
