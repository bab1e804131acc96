"""Resources and labels end to end (issue 26): a real master, real ``rtpool worker``s with
different ``--resources`` and ``--label``, and clients asking with ``options(resources=,
labels=, unschedulable=)``. Tasks land only where they fit; a request no connected worker can
serve is refused at once (or waits, with a warning, until a matching worker joins); ``rtpool
status`` and ``/api/status`` show what each worker has and uses."""

from __future__ import annotations

import json
import time
import warnings

import pytest

import rtpool
import tasks.resources as rtasks
from helpers import wait_until


def _tagged(workers, tag: str, *extra: str, procs: int = 1):
    """Start a worker whose tasks see ``RTPOOL_TEST_WORKER_TAG=tag``; GPUs only if declared
    (none detected: an empty PATH entry for nvidia-smi is not enough, so hide them)."""
    env = {rtasks.TAG: tag, "CUDA_VISIBLE_DEVICES": ""}
    return workers.start(procs, *extra, env=env)


def _workers_up(client, n: int) -> list:
    return wait_until(
        lambda: len(ws := client.status()["workers"]) >= n and ws, timeout=30, interval=0.05
    )


def test_tasks_land_only_where_they_fit(workers, client_factory):
    _tagged(workers, "gpu-a", "--resources", "gpu=1,license_x=2", "--label", "zone=a")
    _tagged(workers, "plain-b", "--label", "zone=b")
    client = client_factory()
    up = _workers_up(client, 2)
    by_name = {w["name"]: w for w in up}
    gpu_worker = by_name["test-worker-0"]
    assert gpu_worker["resources"]["gpu"] == 1 and gpu_worker["resources"]["license_x"] == 2
    assert gpu_worker["labels"] == {"zone": "a"}
    assert by_name["test-worker-1"]["labels"] == {"zone": "b"}
    assert "gpu" not in by_name["test-worker-1"]["resources"]

    def tags(view, n=12):
        futures = [view.submit(rtasks.where) for _ in range(n)]
        return {f.result(timeout=30)[0] for f in futures}

    assert tags(client.options(resources={"gpu": 1})) == {"gpu-a"}
    assert tags(client.options(resources={"license_x": 2})) == {"gpu-a"}
    assert tags(client.options(labels={"zone": "b"})) == {"plain-b"}
    assert tags(client.options(labels={"zone": "a"}, resources={"gpu": 1})) == {"gpu-a"}
    # map and submit_many take the same options.
    view = client.options(labels={"zone": "b"})
    assert {t for t, _, _ in view.map(rtasks.where_of, range(8))} == {"plain-b"}
    package = view.submit_many(rtasks.where_of, [(i,) for i in range(8)])
    assert {t for t, _, _ in package.results(timeout=30)} == {"plain-b"}
    # The default class still runs everywhere it can (both workers take tasks).
    everywhere = {t for t, _, _ in client.map(rtasks.where_of, range(200))}
    assert everywhere <= {"gpu-a", "plain-b"} and everywhere


def test_unservable_request_errors_at_once(workers, client_factory):
    _tagged(workers, "gpu-a", "--resources", "gpu=2")
    client = client_factory()
    _workers_up(client, 1)
    started = time.monotonic()
    fut = client.options(resources={"gpu": 4}).submit(rtasks.where)
    with pytest.raises(rtpool.UnschedulableError) as err:
        fut.result(timeout=10)
    elapsed = time.monotonic() - started
    print(f"unservable gpu=4 request refused after {elapsed * 1000:.1f} ms")
    text = str(err.value)
    assert "gpu=4" in text and "gpu=2" in text and 'unschedulable="wait"' in text
    assert isinstance(err.value, rtpool.errors.SubmitRejected)
    fut = client.options(labels={"zone": "mars"}).submit(rtasks.where)
    with pytest.raises(rtpool.UnschedulableError, match="zone=mars"):
        fut.result(timeout=10)
    # The connection stays usable.
    assert client.submit(rtasks.where).result(timeout=30)[0] == "gpu-a"


def test_waiting_request_warns_then_runs_when_a_worker_joins(workers, client_factory):
    _tagged(workers, "small", "--resources", "gpu=1")
    client = client_factory()
    _workers_up(client, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fut = client.options(resources={"gpu": 2}, unschedulable="wait").submit(rtasks.where)
        wait_until(
            lambda: any(issubclass(w.category, rtpool.UnschedulableWarning) for w in caught),
            timeout=10,
        )
    notice = [str(w.message) for w in caught if issubclass(w.category, rtpool.UnschedulableWarning)]
    assert len(notice) == 1 and "gpu=2" in notice[0], notice
    classes = wait_until(lambda: client.status()["resource_classes"], timeout=10)
    stuck = [c for c in classes if c["resources"] == {"gpu": 2}]
    assert stuck and stuck[0]["unschedulable"] and stuck[0]["queued"] == 1, classes
    assert not fut.done()
    _tagged(workers, "big", "--resources", "gpu=2")
    assert fut.result(timeout=30)[0] == "big"

    def served() -> bool:  # (the snapshot may be a moment old)
        classes = client.status()["resource_classes"]
        return all(not c["unschedulable"] for c in classes if c["resources"] == {"gpu": 2})

    wait_until(served, timeout=10, interval=0.1)


def test_status_cli_shows_resources_and_classes(workers, client_factory, master):
    import subprocess
    import sys

    _tagged(workers, "gpu-a", "--resources", "gpu=2", "--label", "zone=a")
    client = client_factory()
    _workers_up(client, 1)
    fut = client.options(resources={"gpu": 3}, unschedulable="wait")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rtpool.UnschedulableWarning)
        waiting = fut.submit(rtasks.where)
        wait_until(lambda: client.status()["resource_classes"], timeout=10)
    env = {"RTPOOL_TOKEN": master.client_token, "COLUMNS": "250", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "rtpool", "status", "--master", master.address],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "gpu 0/2" in out.stdout and "zone=a" in out.stdout, out.stdout
    assert "gpu=3" in out.stdout and "unschedulable" in out.stdout, out.stdout
    waiting.cancel()


def test_metrics_and_api_status_show_resources_and_classes(tmp_path):
    from conftest import Workers, close_master, start_master
    from test_metrics import get, metric

    m = start_master(tmp_path, args=["--http", "127.0.0.1:0"])
    pool = Workers(m, tmp_path)
    client = rtpool.Client(m.address, m.client_token)
    try:
        _tagged(pool, "gpu-a", "--resources", "gpu=2", "--label", "zone=a")
        _workers_up(client, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rtpool.UnschedulableWarning)
            waiting = client.options(resources={"gpu": 3}, unschedulable="wait").submit(
                rtasks.where
            )
            # Its ACCEPTED (and the warning, in the reader thread) comes before this answer.
            wait_until(lambda: client.status()["resource_classes"], timeout=10)
        base = m.dashboard_url
        worker = 'worker="test-worker-0"'

        def series():  # (the snapshot behind /metrics is rebuilt about once a second)
            text = get(base + "metrics")[1]
            total = metric(text, f'rtpool_worker_resource_capacity{{{worker},resource="gpu"}}')
            stuck = metric(text, 'rtpool_class_unschedulable{class="gpu=3"}')
            queued = metric(text, 'rtpool_class_queued{class="gpu=3"}')
            return (total, stuck, queued) if total is not None and stuck else None

        assert wait_until(series, timeout=15, interval=0.2) == (2.0, 1.0, 1.0)
        api = json.loads(get(base + "api/status")[1])
        (w,) = api["workers"]
        assert w["resources"]["gpu"] == 2 and w["labels"] == {"zone": "a"}
        assert w["in_use"].get("gpu", 0) == 0
        waiting.cancel()
    finally:
        client.close()
        pool.stop_all()
        close_master(m)
