"""Progress of a user's own work against a real LocalCluster: ``Package.progress``,
``rtpool.progress`` (the rich bar: drawn on a terminal, silent in a pipe) and
``rtpool.as_completed``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

import rtpool
import tasks
from helpers import TESTS_DIR, wait_until


def test_package_progress_counts_results_failures_and_cancellations(cluster, cluster_client):
    # 6 quick tasks, 2 failing ones, then 2 that run until cancelled (the time limit lets
    # the worker kill them when the package is cancelled).
    args = [(tasks.square, i) for i in range(6)] + [(tasks.fail, "boom")] * 2
    args += [(tasks.sleep_return, i, 60.0) for i in range(2)]
    package = cluster_client.options(timeout=120).submit_many(tasks.apply, args, star=True)

    first = package.progress
    assert first.total == 10
    assert first.done <= 8

    wait_until(lambda: package.progress.done == 8, timeout=30)
    counts = package.progress
    assert (counts.done, counts.total, counts.failed, counts.cancelled) == (8, 10, 2, 0)
    assert counts.pending == 2
    assert str(counts) == "8/10 done, 2 failed"
    assert "<progress value='8' max='10'" in package._repr_html_()

    assert package.cancel() == 2
    counts = package.progress
    assert (counts.done, counts.failed, counts.cancelled, counts.pending) == (10, 2, 2, 0)
    assert counts.fraction == 1.0


def test_progress_draws_a_bar_on_a_terminal(cluster_client):
    package = cluster_client.submit_many(
        tasks.apply, [(tasks.square, i) for i in range(40)] + [(tasks.fail, "x")], star=True
    )
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    counts = rtpool.progress(package, console=console, description="squares")
    assert (counts.done, counts.total, counts.failed) == (41, 41, 1)
    text = out.getvalue()
    # The last frame of the bar: label, done/total, the failure, a rate.
    assert "squares" in text
    assert "41/41" in text
    assert "1 failed" in text
    assert "tasks/s" in text


def test_progress_of_futures_and_packages_together(cluster_client):
    futures = [cluster_client.submit(tasks.square, i) for i in range(5)]
    package = cluster_client.submit_many(tasks.square, range(7))
    counts = rtpool.progress([futures, package], show=False)
    assert (counts.done, counts.total, counts.failed, counts.cancelled) == (12, 12, 0, 0)
    values = sorted(f.result() for f in rtpool.as_completed([package, futures[0]], timeout=30))
    assert values == sorted([i * i for i in range(7)] + [0])


def test_progress_times_out_with_the_counts(cluster_client):
    package = cluster_client.options(timeout=60).submit_many(
        tasks.sleep_return, [(i, 30.0) for i in range(2)], star=True
    )
    try:
        with pytest.raises(TimeoutError, match=r"0/2 done .*2 tasks still pending"):
            rtpool.progress(package, timeout=0.3, show=False)
    finally:
        package.cancel()


def test_as_completed_yields_results_before_the_package_is_done(cluster_client):
    # Three quick tasks, then one that runs until cancelled: the quick ones come out of
    # as_completed while the slow one still runs.
    args = [(tasks.square, i) for i in range(3)] + [(tasks.sleep_return, "slow", 60.0)]
    package = cluster_client.options(timeout=120).submit_many(tasks.apply, args, star=True)
    try:
        stream = rtpool.as_completed(package, timeout=30)
        first = sorted(next(stream).result() for _ in range(3))
        assert first == [0, 1, 4]
        assert not package[3].done()
    finally:
        package.cancel()


def test_progress_is_silent_when_stdout_is_not_a_terminal(cluster):
    # A child process whose stdout is a pipe: rtpool.progress() waits and prints nothing.
    script = textwrap.dedent(
        f"""
        import rtpool, tasks
        client = rtpool.Client({cluster.address!r}, {cluster.client_token!r})
        package = client.submit_many(tasks.square, range(20))
        counts = rtpool.progress(package)
        import sys
        sys.stderr.write(f"counts={{tuple(counts)}}\\n")
        client.close()
        """
    )
    path = os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    assert "counts=(20, 20, 0, 0)" in run.stderr
