"""The worker's own log (issue 26, item 7): records through ``logging`` with time and level,
``--log-level`` and ``--log-format json`` as the master's, whole lines from many processes.
Real ``rtpool worker`` processes, and forked processes writing through the real handler."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

import tasks
from helpers import wait_until
from rtpool.worker import _logging

TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (ERROR| WARN| INFO|DEBUG) rtpool worker\[\d+\]: \S"
)


def test_json_lines_parse_with_time_level_and_message(master, workers):
    workers.start(2, "--log-format", "json", "--connection", "process")
    wait_until(lambda: workers.log_text(0).count("connected to the master at") >= 2, timeout=30)
    records = [json.loads(line) for line in workers.log_text(0).splitlines()]
    connected = [r for r in records if "connected to the master at" in r["fields"]["message"]]
    assert len(connected) == 2
    for r in records:
        assert set(r) == {"timestamp", "level", "target", "fields"}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["timestamp"])
        assert r["target"] == "rtpool.worker"
    assert {r["level"] for r in connected} == {"INFO"}
    assert len({r["fields"]["pid"] for r in connected}) == 2


def test_log_level_filters_info_and_keeps_warnings(master, workers, client_factory):
    workers.start(1, "--log-level", "warn")
    client = client_factory()
    with pytest.raises(Exception, match="on purpose"):
        client.submit(tasks.fail, "on purpose").result(timeout=30)
    line = wait_until(
        lambda: [x for x in workers.log_text(0).splitlines() if " of fail failed: " in x],
        timeout=10,
    )[0]
    assert TEXT_LINE.match(line) and " WARN " in line, line
    # The connect line (info) came before the task ran, in the same process: filtered out.
    assert "connected to the master" not in workers.log_text(0)


def test_text_lines_have_time_and_level(master, workers):
    workers.start(3, "--connection", "process")
    wait_until(lambda: workers.log_text(0).count("connected to the master at") >= 3, timeout=30)
    lines = workers.log_text(0).splitlines()
    assert lines and all(TEXT_LINE.match(x) for x in lines), lines


def test_bad_log_options_are_refused(master, workers):
    proc = workers.start(1, "--log-level", "loud")
    assert proc.wait(timeout=30) == 2
    assert "--log-level must be one of error, warn" in workers.log_text(0)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_many_processes_write_whole_lines(tmp_path, log_format):
    # 8 forked processes log 300 long records each at once to one shared pipe, as the worker's
    # children share their parent's stderr: every line read back is one whole record.
    procs, per_proc = 8, 300
    out = tmp_path / "log"
    read_fd, write_fd = os.pipe()
    pids = []
    for n in range(procs):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.dup2(write_fd, 2)
                sys.stderr = open(2, "w", closefd=False)  # not pytest's capture
                _logging.configure("info", log_format)
                for i in range(per_proc):
                    _logging.logger.info("proc %d record %d %s end", n, i, "x" * (200 + n * 97))
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(write_fd)
    with open(out, "wb") as f:
        while chunk := os.read(read_fd, 65536):
            f.write(chunk)
    os.close(read_fd)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    lines = out.read_text().splitlines()
    assert len(lines) == procs * per_proc
    seen = set()
    for line in lines:
        message = json.loads(line)["fields"]["message"] if log_format == "json" else line
        m = re.search(r"proc (\d+) record (\d+) (x+) end$", message)
        assert m and len(m.group(3)) == 200 + int(m.group(1)) * 97, line[:120]
        seen.add((int(m.group(1)), int(m.group(2))))
    assert len(seen) == procs * per_proc
