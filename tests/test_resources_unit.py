"""Resources and labels without the Rust side (issue 26): the checks of ``options()`` and of
``rtpool worker --resources/--label``, GPU detection (a fake ``nvidia-smi`` on PATH, the /proc
fallback, ``CUDA_VISIBLE_DEVICES``), the device pool, and a real ``rtpool worker`` against the
scripted fake master: what its ``HELLO`` declares, and which devices its tasks see."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import tasks.resources as rtasks
from fakemaster import FakeMaster
from helpers import stop_process, worker_env
from rtpool import _options
from rtpool import _protocol as P
from rtpool import _serialize as S
from rtpool._resources import check_labels, parse_labels, parse_resources
from rtpool.errors import ProtocolError
from rtpool.worker._devices import DevicePool, gpu_count
from rtpool.worker._inventory import detect_gpus, inventory
from rtpool.worker._task import queue_assignments, queue_calls

FAKE_SMI = """#!/bin/sh
echo "GPU 0: Fake T4 (UUID: GPU-aaaa-0000)"
echo "GPU 1: Fake T4 (UUID: GPU-bbbb-1111)"
echo "GPU 2: Fake T4 (UUID: GPU-cccc-2222)"
"""


@pytest.fixture
def fake_smi(tmp_path: Path) -> str:
    """A directory with a fake ``nvidia-smi`` (three GPUs), to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return str(bin_dir)


# -- options() -------------------------------------------------------------------------------


def test_options_encode_sorted_maps_at_the_end_without_zeros():
    opts, _ = _options.merge(
        {},
        None,
        {
            "labels": {"zone": "a", "cuda": "12.4"},
            "resources": {"mem_gb": 8, "gpu": 1, "x": 0},
            "priority": 3,
        },
    )
    opts = _options.with_key(opts)
    assert list(opts) == ["priority", "key", "resources", "labels"]
    assert list(opts["resources"].items()) == [("gpu", 1), ("mem_gb", 8)]
    assert list(opts["labels"].items()) == [("cuda", "12.4"), ("zone", "a")]
    # The default class sends nothing new.
    assert _options.merge({}, None, {"resources": {"gpu": 0}, "labels": {}})[0] == {}
    wait, _ = _options.merge({}, None, {"unschedulable": "wait"})
    assert wait == {"unschedulable": "wait"}
    _options.for_calls(opts)  # calls of named functions take them too


@pytest.mark.parametrize(
    "given, error, words",
    [
        ({"resources": {"GPU": 1}}, ValueError, "resource 'GPU' is not a valid name"),
        ({"resources": {"gpu": -1}}, ValueError, "'gpu' must be 0 or more"),
        ({"resources": {"gpu": 1.5}}, TypeError, "must be a whole number"),
        ({"resources": {"gpu": True}}, TypeError, "must be a whole number"),
        ({"resources": {"gpu": 2**64}}, ValueError, "must be 0 or more"),
        ({"resources": ["gpu"]}, TypeError, "must be a dict of resource name to count"),
        ({"resources": {f"r{i}": 1 for i in range(33)}}, ValueError, "at most 32"),
        ({"labels": {"zone": 1}}, TypeError, "must have a str value"),
        ({"labels": {"zone": "x" * 129}}, ValueError, "at most 128 UTF-8 bytes"),
        ({"labels": {"a" * 33: "x"}}, ValueError, "is not a valid name"),
        ({"unschedulable": "later"}, ValueError, "must be 'error' or 'wait'"),
    ],
)
def test_options_refuse_bad_requests_by_name(given, error, words):
    with pytest.raises(error, match=words):
        _options.merge({}, None, given)


# -- the worker's flags and detection ----------------------------------------------------------


def test_parse_resources_and_labels():
    assert parse_resources(["gpu=2,mem_gb=64", "license_x=1"]) == {
        "gpu": 2,
        "license_x": 1,
        "mem_gb": 64,
    }
    assert parse_labels(["zone=a", "cuda=12.4", "empty="]) == {
        "cuda": "12.4",
        "empty": "",
        "zone": "a",
    }
    for bad, words in [
        (["gpu"], "'gpu' is not NAME=COUNT"),
        (["gpu=-1"], "is not NAME=COUNT"),
        (["gpu=1,gpu=2"], "'gpu' is given twice"),
        (["Gpu=1"], "is not a valid name"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_resources(bad)
    with pytest.raises(ValueError, match="'zone' is not KEY=VALUE"):
        parse_labels(["zone"])
    with pytest.raises(TypeError):
        check_labels({"zone": b"a"})


def test_fake_nvidia_smi_is_detected_and_filtered(fake_smi, tmp_path):
    env = {"PATH": f"{fake_smi}:/usr/bin:/bin"}
    assert detect_gpus(env) == ["0", "1", "2"]
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": "2,0"}) == ["2", "0"]
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": "GPU-bbbb"}) == ["GPU-bbbb"]
    # As CUDA reads it: up to the first entry that names no device; empty or -1: none.
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": "1,7,0"}) == ["1"]
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": ""}) == []
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": "-1"}) == []
    # No nvidia-smi: the driver's /proc entries.
    proc = tmp_path / "gpus"
    proc.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (proc / bus).mkdir()
    assert detect_gpus({"PATH": "/nonexistent"}, str(proc)) == ["0", "1"]
    assert detect_gpus({"PATH": "/nonexistent"}, str(tmp_path / "none")) == []


def test_declared_values_override_detection(fake_smi, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_smi}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = inventory(4, {}, {"zone": "a"})
    assert inv.resources["gpu"] == 3 and inv.resources["cpu"] == 4
    assert inv.resources["mem_gb"] >= 0 and inv.gpu_ids == ("0", "1", "2")
    assert inv.has_host_resources()
    share = inv.resources["mem_gb"] // 4
    assert inv.per_process(4) == {"cpu": 1, **({"mem_gb": share} if share else {})}
    off = inventory(4, {"gpu": 0}, {})
    assert "gpu" not in off.resources and off.gpu_ids == () and not off.has_host_resources()
    more = inventory(2, {"gpu": 5, "cpu": 8, "license_x": 1}, {})
    assert more.resources["gpu"] == 5 and more.resources["cpu"] == 8
    assert more.gpu_ids == ("0", "1", "2", "3", "4")
    assert "gpu=5 (declared)" in more.describe()


def test_device_pool_gives_distinct_devices_and_prefers_the_last():
    pool = DevicePool(["0", "1", "2"])
    a = pool.take("a", 1, owner=0)
    b = pool.take("b", 2, owner=1)
    assert len(set(a) | set(b)) == 3 and pool.free_count() == 0
    pool.free("a")
    pool.free("b")
    assert pool.take("c", 1, owner=1) == (b[0],)  # what slot 1 had last
    assert pool.free_count() == 2
    pool.clear()
    assert pool.free_count() == 3
    assert gpu_count({"gpu": 2, "mem_gb": 8}) == 2 and gpu_count(None) == 0


def test_assignments_carry_res_and_relay_devices():
    got = []
    codes = {}
    args = pickle.dumps(((), None), 5)
    entries = [
        [1, 1, b"h", b"c", args, 0],
        [2, 1, b"h", None, args, 0, [], {"gpu": 1}],
        [3, 1, b"h", None, args, 0, [], {"gpu": 2}, ["1", "0"]],
    ]
    queue_assignments(entries, codes, 0, got.append)
    assert [(t.res, t.devices) for t in got] == [
        (None, None),
        ({"gpu": 1}, None),
        ({"gpu": 2}, ("1", "0")),
    ]
    assert got[1].args == args  # inputs [] stand for none


def test_calls_carry_res_and_relay_devices():
    got = []
    entries = [
        [1, 1, "f", "1", b"a", [], 0],
        [2, 1, "f", "1", b"a", [], 0, True],
        [3, 1, "f", "1", b"a", [b"i"], 0, False, {"gpu": 1}],
        [4, 1, "f", "1", b"a", [], 0, True, {"gpu": 2}, ["1", "0"]],
    ]
    queue_calls(entries, 0, got.append)
    assert [(t.keep, t.res, t.devices, t.inputs) for t in got] == [
        (False, None, None, []),
        (True, None, None, []),
        (False, {"gpu": 1}, None, [b"i"]),
        (True, {"gpu": 2}, ("1", "0"), []),
    ]
    with pytest.raises(ProtocolError, match=r"timeout_ms\[, keep\[, res\]\]"):
        queue_calls([[5, 1, "f", "1", b"a", [], 0, False, "not a map"]], 0, got.append)


# -- a real worker against the fake master -----------------------------------------------------


def _start_worker(fake, tmp_path, fake_smi, *extra, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rtpool", "worker", "--master", fake.address, *extra]
    full = {**worker_env("tok"), "PATH": f"{fake_smi}:{os.environ['PATH']}", **(env or {})}
    full.pop("CUDA_VISIBLE_DEVICES", None)
    full.update(env or {})
    with open(tmp_path / "worker.log", "wb") as log:
        return subprocess.Popen(
            cmd, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _run_gpu_tasks(conn, count: int, gpus: int = 1) -> list:
    """Send ``count`` tasks asking ``gpus`` GPUs each, holding them all at once (each waits
    for the others in the shared directory); return their results."""
    fn_hash, code = S.serialize_function(rtasks.where)
    entries = [
        [i, 1, fn_hash, code if i == 0 else None, pickle.dumps(((), None), 5), 0, [], {"gpu": 1}]
        for i in range(count)
    ]
    conn.send(P.ASSIGN, entries)
    results = {}
    while len(results) < count:
        msg = conn.recv_kind(P.RESULT, timeout=20, skip=(P.HEARTBEAT, P.PULL))
        for r in msg[1]:
            assert r[2] == P.STATUS_OK, r
            results[r[0]] = S.loads_result(r[3])
    return [results[i] for i in range(count)]


def test_worker_hello_declares_resources_and_labels(fake_smi, tmp_path):
    with FakeMaster() as fake:
        proc = _start_worker(
            fake, tmp_path, fake_smi, "--procs", "2", "--label", "zone=a",
            "--resources", "license_x=1",
        )  # fmt: skip
        try:
            conn = fake.accept(timeout=20)
            hello = conn.hello
            # [HELLO, version, role, token, name, slots, identity, resources, labels]
            assert hello[4 + 1] == 2 and len(hello) == 9, hello
            assert hello[7] == {"cpu": 2, "gpu": 3, "license_x": 1, "mem_gb": hello[7]["mem_gb"]}
            assert list(hello[7]) == sorted(hello[7]) and hello[8] == {"zone": "a"}
            log = (tmp_path / "worker.log").read_text()
            assert "(--connection host)" in log and "gpu=3" in log and "zone=a" in log
        finally:
            stop_process(proc, group=True)


def test_host_relay_gives_each_task_its_own_device(fake_smi, tmp_path):
    # Three GPUs, hidden to two by the worker's own CUDA_VISIBLE_DEVICES; two processes.
    with FakeMaster() as fake:
        proc = _start_worker(
            fake, tmp_path, fake_smi, "--procs", "2", env={"CUDA_VISIBLE_DEVICES": "2,1"}
        )
        try:
            conn = fake.accept(timeout=20)
            assert conn.hello[7]["gpu"] == 2
            conn.recv_kind(P.PULL, timeout=20, skip=(P.HEARTBEAT,))
            seen = _run_gpu_tasks(conn, 2)
            devices = sorted(d for _, d, _ in seen)
            assert devices == ["1", "2"], seen  # one device each, from the visible ones
        finally:
            stop_process(proc, group=True)


def test_single_process_picks_devices_itself(fake_smi, tmp_path):
    with FakeMaster() as fake:
        proc = _start_worker(fake, tmp_path, fake_smi, "--procs", "1")
        try:
            conn = fake.accept(timeout=20)
            assert conn.hello[7]["gpu"] == 3 and conn.hello[5] == 1
            conn.recv_kind(P.PULL, timeout=20, skip=(P.HEARTBEAT,))
            seen = _run_gpu_tasks(conn, 2)
            # One at a time (one slot): each gets a single device of the host; the worker's
            # own environment is left as it was for the tasks without a request.
            assert all(d in ("0", "1", "2") for _, d, _ in seen), seen
        finally:
            stop_process(proc, group=True)


def test_process_connection_with_a_gpu_is_refused(fake_smi, tmp_path):
    with FakeMaster() as fake:
        proc = _start_worker(fake, tmp_path, fake_smi, "--procs", "2", "--connection", "process")
        assert proc.wait(timeout=20) == 2
    log = (tmp_path / "worker.log").read_text()
    assert "--connection process with --procs 2 cannot share this host's gpu" in log
    assert "use --connection host or auto" in log
