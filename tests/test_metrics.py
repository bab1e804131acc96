"""The master's HTTP listener end to end (``docs/operations.md``): a real ``rtpool master``
subprocess with ``--http 127.0.0.1:0``, real worker processes and a client; ``/metrics``,
``/api/status`` and ``/api/events`` follow the work, including a deadline miss the test
causes; a non-loopback ``--http`` without TLS or a token is refused at start-up; an embedded
master's ``LocalCluster(http=...)``; and Prometheus itself scraping the master.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import rtpool
import tasks
from conftest import Workers, close_master, start_master
from helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
PROMETHEUS_SCRIPT = REPO / "scripts" / "prometheus-test-server"


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET ``url``: the status code and the body."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def status(base: str) -> dict:
    code, body = get(base + "api/status")
    assert code == 200, body
    return json.loads(body)


def metric(text: str, series: str) -> float | None:
    """The value of ``series`` (a name with its labels) in a ``/metrics`` text."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return None


@pytest.fixture
def http_master(tmp_path):
    m = start_master(tmp_path, args=["--http", "127.0.0.1:0"])
    try:
        yield m
    finally:
        close_master(m)


def test_metrics_status_and_events_follow_the_work_and_a_deadline_miss(http_master, tmp_path):
    base = http_master.dashboard_url
    assert base and base.startswith("http://127.0.0.1:"), http_master.stdout_lines
    assert get(base + "healthz") == (200, "ok")
    code, page = get(base)
    assert code == 200 and "<html" in page
    _, before = get(base + "metrics")
    assert metric(before, "rtpool_workers") == 0, before
    assert metric(before, 'rtpool_deadlines_total{outcome="missed"}') == 0, before

    workers = Workers(http_master, tmp_path)
    try:
        workers.start(procs=2)
        wait_until(lambda: status(base)["totals"]["workers"] == 2, timeout=30, interval=0.2)
        client = rtpool.Client(http_master.address, http_master.client_token)
        try:
            # Asking for a slot's cpu (each worker process announces cpu=1) makes a resource
            # class, so its series are on /metrics too.
            view = client.options(resources={"cpu": 1})
            assert view.submit_many(tasks.square, range(20)).results(60) == [
                x * x for x in range(20)
            ]
            # A 0.1 s deadline on a 0.5 s task: a miss this test causes (on_miss="run" keeps
            # the late result).
            late = client.options(deadline=0.1).submit(tasks.sleep_return, "late", 0.5)
            assert late.result(60) == "late"
            # The snapshot is published once a second.
            snap = wait_until(
                lambda: (s := status(base))["totals"]["done"] == 21 and s, timeout=10, interval=0.2
            )
        finally:
            client.close()
    finally:
        workers.stop_all()

    assert snap["deadlines"]["missed"] == 1, snap["deadlines"]
    assert sum(b["count"] for b in snap["deadlines"]["lateness"]) == 1
    names = sorted(w["name"] for w in snap["workers"])
    assert names == ["test-worker-0-0", "test-worker-0-1"], names
    assert sum(w["done"] for w in snap["workers"]) == 21
    assert all(w["host"] == "127.0.0.1" and w["slots"] >= 1 for w in snap["workers"])
    assert snap["latency"]["assign_to_result"]["p99_us"] >= 500_000 * 0.875
    assert snap["master"]["address"] == http_master.address
    assert snap["master"]["pid"] == http_master.proc.pid
    assert snap["users"] == [{**snap["users"][0], "user": "default", "done": 21}], snap["users"]

    _, after = get(base + "metrics")
    assert metric(after, 'rtpool_deadlines_total{outcome="missed"}') == 1, after
    assert metric(after, 'rtpool_tasks_done_total{priority="0",user="default"}') == 21
    assert metric(after, "rtpool_assign_to_result_seconds_count") == 21
    assert metric(after, 'rtpool_worker_slots{worker="test-worker-0-0"}') is not None
    assert metric(after, "rtpool_journal_bytes") > 0
    assert metric(after, "rtpool_journal_fsync_seconds_count") >= 1

    # Every metric the Grafana dashboard and docs/operations.md name is one the master renders
    # (a quota gauge only exists for users with a quota; the ha gauges only with --ha, which
    # tests/test_ha.py checks).
    rendered = {line.split()[2] for line in after.splitlines() if line.startswith("# TYPE ")}
    for doc in ("grafana-rtpool.json", "operations.md"):
        named = set(re.findall(r"rtpool_[a-z_]+", (REPO / "docs" / doc).read_text()))
        only_some = {"rtpool_quota_seconds", "rtpool_ha_role", "rtpool_ha_epoch"}
        bases = {re.sub(r"_(bucket|total)$", "", n) for n in named} - only_some
        assert bases <= rendered, f"{doc} names metrics /metrics lacks: {bases - rendered}"


def test_event_stream_delivers_status_events(http_master):
    """At least two ``event: status`` frames, each a whole snapshot."""
    req = urllib.request.Request(http_master.dashboard_url + "api/events")
    events = []
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        event = None
        deadline = time.monotonic() + 15
        while len(events) < 2 and time.monotonic() < deadline:
            line = r.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: ") and event == "status":
                events.append(json.loads(line[len("data: ") :]))
    assert len(events) >= 2, events
    assert events[-1]["master"]["uptime_s"] > events[0]["master"]["uptime_s"]


def test_http_beyond_loopback_without_tls_or_token_is_refused_at_start(tmp_path):
    cmd = [sys.executable, "-m", "rtpool", "master", "--listen", "127.0.0.1:0"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--http", "0.0.0.0:0"]
    env = {k: v for k, v in os.environ.items() if k != "RTPOOL_HTTP_TOKEN"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1, done
    assert "refusing to serve HTTP on 0.0.0.0:0" in done.stderr, done.stderr
    assert "--http-token" in done.stderr and "--tls-cert" in done.stderr


def test_http_beyond_loopback_with_a_token_needs_it(tmp_path, monkeypatch):
    env_token = "tok-" + os.urandom(8).hex()
    # From the environment, as docs/operations.md advises (a token on the command line shows
    # in ps).
    monkeypatch.setenv("RTPOOL_HTTP_TOKEN", env_token)
    m = start_master(tmp_path, args=["--http", "0.0.0.0:0"])
    monkeypatch.delenv("RTPOOL_HTTP_TOKEN")
    try:
        port = urllib.parse.urlsplit(m.dashboard_url).port
        base = f"http://127.0.0.1:{port}/"
        assert get(base + "api/status")[0] == 401
        assert get(base + "metrics?token=wrong")[0] == 401
        assert get(base + f"metrics?token={env_token}")[0] == 200
        req = urllib.request.Request(
            base + "api/status", headers={"Authorization": f"Bearer {env_token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["master"]["address"] == m.address
        assert get(base + "healthz") == (200, "ok")
    finally:
        close_master(m)


def test_http_beyond_loopback_with_tls_serves_https_with_the_masters_certificate(tmp_path):
    m = start_master(tmp_path, args=["--tls-self-signed", "--http", "0.0.0.0:0"])
    try:
        url = m.dashboard_url
        assert url.startswith("https://127.0.0.1:"), url
        ctx = ssl.create_default_context(cafile=str(m.data_dir / "tls" / "cert.pem"))
        with urllib.request.urlopen(url + "api/status", timeout=10, context=ctx) as r:
            assert json.loads(r.read())["master"]["address"] == m.address
        # Plain HTTP to the HTTPS listener gets nothing readable.
        plain = "http://" + url[len("https://") :] + "healthz"
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(plain, timeout=10).read()
    finally:
        close_master(m)


def test_local_cluster_http_exposes_dashboard_url():
    with rtpool.LocalCluster(workers=1, http="127.0.0.1:0") as cluster:
        base = cluster.dashboard_url
        assert base and base.startswith("http://127.0.0.1:"), base
        client = cluster.client()
        assert client.submit(tasks.square, 7).result(60) == 49
        snap = wait_until(
            lambda: (s := status(base))["totals"]["done"] >= 1 and s, timeout=10, interval=0.1
        )
        assert snap["master"]["address"].endswith(cluster.address.rpartition(":")[2])
    with rtpool.LocalCluster(workers=0) as cluster:
        assert cluster.dashboard_url is None


def _prometheus_available() -> str | None:
    """Why the Prometheus test cannot run here, or None."""
    if shutil.which("prometheus"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "prometheus is not installed and only root with apt-get can install it"
    return None


@pytest.mark.timeout(600)  # covers installing Prometheus on a fresh machine
def test_prometheus_scrapes_the_master_and_answers_a_query(http_master, tmp_path):
    reason = _prometheus_available()
    if reason:
        pytest.skip(reason)
    target = urllib.parse.urlsplit(http_master.dashboard_url).netloc
    prom_dir = tmp_path / "prometheus"
    started = subprocess.run(
        [str(PROMETHEUS_SCRIPT), "start", str(prom_dir), target],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert started.returncode == 0, started.stderr
    prom = started.stdout.strip()
    try:
        workers = Workers(http_master, tmp_path)
        try:
            workers.start(procs=1)

            def query(expr: str) -> list:
                url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
                code, body = get(url)
                assert code == 200, body
                data = json.loads(body)
                assert data["status"] == "success", data
                return data["data"]["result"]

            def scraped_with_worker() -> list:
                # Two scrapes at least, the last one seeing the worker.
                n = query("count_over_time(rtpool_workers[1m])")
                last = query("rtpool_workers")
                return n and float(n[0]["value"][1]) >= 2 and last and last[0]["value"][1] == "1"

            wait_until(scraped_with_worker, timeout=60, interval=0.5)
        finally:
            workers.stop_all()
        up = query('up{job="rtpool"}')
        assert up and up[0]["value"][1] == "1", up
    finally:
        subprocess.run([str(PROMETHEUS_SCRIPT), "stop", str(prom_dir)], timeout=60, check=False)
