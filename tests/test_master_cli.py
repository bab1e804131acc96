"""`rtpool master`'s command line is the Rust master's (crates/rtpool-master/src/config/args.rs):
the same options as the `rtpool-master` binary, and the options dict of an embedded master
read by the same parser."""

import re
import subprocess
import sys

import pytest

from rtpool import _native


def _master(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rtpool", "master", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_help_lists_the_options_the_binary_used_to_lack() -> None:
    out = _master("--help")
    assert out.returncode == 0, out
    for flag in (
        "--fsync",
        "--no-journal",
        "--store",
        "--result-ttl",
        "--max-attempts",
        "--max-task-seconds",
        "--timeout-grace",
        "--hedge-factor",
        "--service-grace",
    ):
        assert flag in out.stdout, flag
    assert "rtpool master --listen 0.0.0.0:7070" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "unexpected argument '--bogus'"),
        (["--hedge-factor", "1"], "must be a number above 1"),
        (["--result-ttl", "-1"], "must be a number of seconds >= 0"),
        (["--max-attempts", "-1"], "-1 is not in 0.."),
        (["--fsync", "sometimes"], "sometimes"),
        (["--tls-cert", "c.pem"], "--tls-key"),
    ],
)
def test_a_bad_command_line_exits_2_naming_what_is_wrong(args, message) -> None:
    out = _master(*args)
    assert out.returncode == 2, out
    assert message in out.stderr, out.stderr
    assert "try '--help'" in out.stderr


def test_the_options_dict_takes_every_command_line_option_but_the_log_level() -> None:
    keys = set(_native.MASTER_OPTIONS)
    assert {"lease_ms", "result_ttl_s", "timeout_grace_s", "journal", "fsync"} <= keys
    assert {"max_connections", "client_timeout_ms", "store", "hedge_factor"} <= keys
    assert "log_level" not in keys
    with _native.Master(options={"max_connections": 1, "journal": True, "cpus": None}) as m:
        assert m.stats()["connections"] == 0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"hedge_factor": 1}, "hedge_factor: invalid value '1' for '--hedge-factor"),
        ({"lease_ms": "soon"}, "--lease-ms"),
        ({"journal": "no"}, "journal: takes True or False"),
        ({"lease_ms": True}, "takes a value as --lease-ms does"),
        ({"log_level": "debug"}, 'unknown master option "log_level"'),
    ],
)
def test_the_options_dict_is_checked_like_the_command_line(options, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _native.Master(options=options)
