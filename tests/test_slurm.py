"""SlurmCluster and `rtpool slurm up|down` against a real one-node Slurm cluster.

The session fixture starts slurmctld, slurmd and munged with scripts/slurm-test-server (which
installs Debian's packages when they are missing, as root). Not being root, or having neither
Slurm nor apt-get, skips these tests; a cluster that fails to start is an error.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Set

import pytest

import rtpool
import rtpool.slurm
from conftest import close_master, start_master
from helpers import TESTS_DIR, as_from_a_shell, signal_state, wait_until
from rtpool._slurm_adapt import (
    Demand,
    TaskTimer,
    adapt_loop,
    demand_from_status,
    want_jobs,
    want_slots,
)
from rtpool.worker import EXIT_CONFIG
from tasks.slurm import marked_square, square, worker_name

# The first test's timeout covers the session fixture, which on a fresh machine installs Slurm
# with apt-get; every wait below has its own deadline.
pytestmark = pytest.mark.timeout(600)

_SCRIPT = Path(TESTS_DIR).parent / "scripts" / "slurm-test-server"
_JOB_START_S = 30.0  # a job's worker connects within ~2 s here; slack for a loaded machine


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """``SLURM_CONF`` of a one-node test cluster, also set in ``os.environ``."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests run slurmd, which needs root; run them as root")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    slurm_dir = tempfile.mkdtemp(prefix="rtpool-slurm-")
    started = subprocess.run(
        [str(_SCRIPT), "start", slurm_dir], capture_output=True, text=True, timeout=600
    )
    saved = os.environ.get("SLURM_CONF")
    try:
        assert started.returncode == 0, f"slurm-test-server start failed: {started.stderr[-3000:]}"
        conf = started.stdout.strip().partition("SLURM_CONF=")[2]
        os.environ["SLURM_CONF"] = conf
        yield conf
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        subprocess.run([str(_SCRIPT), "stop", slurm_dir], capture_output=True, timeout=120)
        shutil.rmtree(slurm_dir, ignore_errors=True)


def squeue_ids() -> Set[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--format=%i"], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_package_runs_on_slurm_workers_named_by_job_id(slurm, tmp_path):
    options = {"http": "127.0.0.1:0"}
    with rtpool.SlurmCluster(workers=2, job_dir=tmp_path, master_options=options) as cluster:
        ids = cluster.job_ids
        assert len(ids) == 2 and set(ids) <= squeue_ids()
        cluster.wait_for_workers(2, timeout=_JOB_START_S)
        client = cluster.client()
        assert client.submit_many(square, range(200)).results(timeout=60) == [
            x * x for x in range(200)
        ]
        names = set(client.submit_many(lambda _: worker_name(), range(20)).results(timeout=30))
        assert names and names <= {f"slurm-{j}" for j in ids}
        # Accounting: the job ids label the per-worker metrics (the snapshot behind /metrics
        # is rebuilt about once a second: wait for the series rather than read once).
        url = cluster._master.dashboard_url + "metrics"

        def job_series():
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            return set(re.findall(r'rtpool_worker_exec_seconds_total\{worker="slurm-(\d+)', text))

        assert wait_until(lambda: job_series() >= {j for j in ids}, timeout=10), job_series()
        # The token is in a 0600 file only: not in the script, the job record or `ps`.
        token = cluster._master.worker_token
        assert token not in Path(tmp_path, "worker.sh").read_text()
        assert os.stat(tmp_path / "worker.token").st_mode & 0o777 == 0o600
        job = subprocess.run(
            ["scontrol", "-dd", "show", "job", ids[0]], capture_output=True, text=True
        )
        assert ids[0] in job.stdout and token not in job.stdout
        ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
        assert f"slurm-{ids[0]}" in ps and token not in ps
    wait_until(lambda: not set(ids) & squeue_ids(), timeout=30, interval=0.1)
    assert not (tmp_path / "worker.token").exists()


def test_scale_up_and_down(slurm, tmp_path):
    with rtpool.SlurmCluster(job_dir=tmp_path) as cluster:
        cluster.scale(1)
        first = cluster.job_ids
        cluster.wait_for_workers(1, timeout=_JOB_START_S)
        cluster.scale(3)
        ids = cluster.job_ids
        assert len(ids) == 3 and ids[0] == first[0] and set(ids) <= squeue_ids()
        cluster.wait_for_workers(3, timeout=_JOB_START_S)
        assert cluster.stats()["workers"] == 3
        cluster.scale(1)  # the two newest drain and leave
        wait_until(lambda: set(ids) & squeue_ids() == set(first), timeout=30, interval=0.1)
        wait_until(lambda: cluster.stats()["workers"] == 1, timeout=10, interval=0.05)
        assert list(cluster.jobs()) == first and cluster.job_ids == first
        assert cluster.client().submit(square, 7).result(timeout=30) == 49


def _executions(marker_dir: Path, n: int) -> list:
    return [(marker_dir / str(i)).read_text().split("\n")[:-1] for i in range(n)]


def test_kill_one_worker_job_mid_package_loses_and_duplicates_nothing(slurm, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    # The victim's tasks wait on a hold file until its job is gone from the queue, so the kill
    # lands mid-task however long scancel takes (through slurmctld and slurmd): 3 s tasks alone
    # once let a task end before a slow scancel reached it.
    n = 10
    with rtpool.SlurmCluster(workers=2, job_dir=tmp_path / "jobs") as cluster:
        cluster.wait_for_workers(2, timeout=_JOB_START_S)
        victim = cluster.job_ids[0]
        hold = markers / f"hold-slurm-{victim}"
        hold.touch()
        client = cluster.client()
        pkg = client.submit_many(
            marked_square, [(str(markers), i, 3.0) for i in range(n)], star=True
        )

        def victim_mid_task() -> bool:
            for path in markers.iterdir():
                lines = path.read_text().split("\n")[:-1]
                if lines and lines[-1] == f"start slurm-{victim}":
                    return True
            return False

        wait_until(victim_mid_task, timeout=30, interval=0.01)
        subprocess.run(["scancel", "--signal=KILL", "--full", victim], check=True)
        wait_until(lambda: victim not in squeue_ids(), timeout=30, interval=0.05)
        hold.unlink()
        assert pkg.results(timeout=60) == [i * i for i in range(n)]  # lost: 0
        runs = _executions(markers, n)
    ends = [sum(line.startswith("end ") for line in r) for r in runs]
    assert ends == [1] * n, runs  # duplicated: 0 (every task completed exactly once)
    # Only the killed job's task(s) started twice: their first run never ended.
    restarted = [r for r in runs if len(r) > 2]
    assert restarted, f"the kill landed between tasks: {runs}"
    assert all(r[0] == f"start slurm-{victim}" and r[1].startswith("start ") for r in restarted), (
        runs
    )


def test_adapt_scales_up_with_the_queue_and_down_when_idle(slurm, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    with rtpool.SlurmCluster(job_dir=tmp_path / "jobs") as cluster:
        cluster.adapt(minimum=0, maximum=2, interval_s=0.2, cooldown_s=2.0)
        client = cluster.client()
        items = [(str(markers), i, 0.2) for i in range(30)]
        pkg = client.submit_many(marked_square, items, star=True)
        ids = wait_until(lambda: len(cluster.job_ids) == 2 and cluster.job_ids, timeout=10)
        assert pkg.results(timeout=60) == [i * i for i in range(30)]
        wait_until(lambda: not set(ids) & squeue_ids(), timeout=30, interval=0.1)
        wait_until(lambda: cluster.stats()["workers"] == 0, timeout=10, interval=0.05)
        assert cluster.jobs() == {} and cluster.job_ids == []


def test_adapt_scales_up_ahead_of_the_queue_for_a_deadline_at_risk(slurm, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    task_s, n = 0.5, 24  # 12 s of work
    with rtpool.SlurmCluster(job_dir=tmp_path / "jobs") as cluster:
        client = cluster.client()
        # Until a task time is known adapt wants one slot per task: learn it on one job first.
        cluster.scale(1)
        cluster.wait_for_workers(1, timeout=_JOB_START_S)
        warm = client.submit_many(
            marked_square, [(str(tmp_path), i, task_s) for i in range(4)], star=True
        )
        assert warm.results(timeout=30) == [i * i for i in range(4)]
        # By queue, 12 s of work wants ceil(12 / 60) = 1 job.
        cluster.adapt(minimum=1, maximum=3, interval_s=0.2, cooldown_s=60, target_s=60, startup_s=1)
        # The same package without a deadline: the task time gets known, the pool stays at 1.
        items = [(str(markers), i, task_s) for i in range(n)]
        pkg = client.submit_many(marked_square, items, star=True)
        most = 0
        while not pkg.done():
            most = max(most, len(cluster.job_ids))
            time.sleep(0.05)
        assert pkg.results(timeout=0) == [i * i for i in range(n)]
        assert most == 1, "the queue alone wanted more than 1 job"
        # With a deadline 6 s away the work needs 12 s / (6 - 1) s -> 3 slots: 3 jobs at once.
        for path in markers.iterdir():
            path.unlink()
        pkg = client.options(deadline=6.0).submit_many(marked_square, items, star=True)
        t0 = time.monotonic()
        wait_until(lambda: len(cluster.job_ids) == 3, timeout=5, interval=0.05)
        up_s = time.monotonic() - t0
        assert pkg.results(timeout=60) == [i * i for i in range(n)]
        ran_on = {name for p in markers.iterdir() for name in p.read_text().split()[1::2]}
        print(f"adapt up for the deadline in {up_s:.2f} s; ran on {sorted(ran_on)}")


def test_tls_master_and_slurm_workers(slurm, tmp_path):
    job_dir = tmp_path / "jobs"
    with rtpool.SlurmCluster(workers=2, job_dir=job_dir, tls=True) as cluster:
        cluster.wait_for_workers(2, timeout=_JOB_START_S)
        ids = cluster.job_ids
        client = cluster.client()
        assert client.submit_many(square, range(50)).results(timeout=60) == [
            x * x for x in range(50)
        ]
        names = set(client.submit_many(lambda _: worker_name(), range(20)).results(timeout=30))
        assert names and names <= {f"slurm-{j}" for j in ids}
        # The workers trust the master's certificate, copied next to the token; the key
        # stays on this machine, outside the job directory; no secret in the script or ps.
        ca = job_dir / "ca.pem"
        script = (job_dir / "worker.sh").read_text()
        assert f"--ca-file {ca}" in script
        assert "BEGIN CERTIFICATE" in ca.read_text() and ca.stat().st_mode & 0o777 == 0o600
        assert job_dir.stat().st_mode & 0o777 == 0o700
        for path in job_dir.iterdir():
            assert "PRIVATE KEY" not in path.read_text(errors="replace"), path
        key = Path(cluster._master._master.tls_cert).with_name("key.pem")
        assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
        token = cluster._master.worker_token
        assert token not in script
        ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
        assert f"--ca-file {ca}" in ps and token not in ps
        # A plain-TCP worker is refused: the jobs' workers really speak TLS.
        plain = subprocess.run(
            [sys.executable, "-m", "rtpool", "worker", "--master", cluster.worker_address]
            + ["--token-file", str(job_dir / "worker.token"), "--reconnect-timeout", "0"],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert plain.returncode != 0
    assert not key.parent.exists()


def _allocation(ntasks: int) -> str:
    """A job that only holds resources (``salloc --no-shell``); returns its id."""
    out = subprocess.run(
        ["salloc", "--no-shell", "--ntasks", str(ntasks), "--time", "10", "--job-name", "alloc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Granted job allocation (\d+)", out.stderr)
    assert found, out.stderr
    return found.group(1)


def test_srun_mode_runs_workers_as_steps_of_one_allocation(slurm, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    alloc = _allocation(2)
    try:
        with rtpool.SlurmCluster(mode="srun", allocation=alloc, job_dir=tmp_path / "jobs") as c:
            c.scale(2)
            c.wait_for_workers(2, timeout=_JOB_START_S)
            steps = wait_until(lambda: c.jobs() and all("." in j for j in c.job_ids) and c.job_ids)
            assert sorted(steps) == [f"{alloc}.0", f"{alloc}.1"]
            assert set(c.jobs().values()) == {"RUNNING"}
            client = c.client()
            names = set(client.submit_many(lambda _: worker_name(), range(20)).results(timeout=30))
            assert names and names <= {f"slurm-{s}" for s in steps}
            # Scale down while the newest step runs a task: SIGINT drains it, so its task
            # ends there, once, and no task is lost.
            items = [(str(markers), i, 2.0) for i in range(6)]
            pkg = client.submit_many(marked_square, items, star=True)
            newest = f"slurm-{steps[-1]}"

            def newest_mid_task():
                return any(
                    p.read_text().split("\n")[:-1][-1:] == [f"start {newest}"]
                    for p in markers.iterdir()
                )

            wait_until(newest_mid_task, timeout=30, interval=0.01)
            c.scale(1)
            assert pkg.results(timeout=60) == [i * i for i in range(6)]
            runs = _executions(markers, 6)
            wait_until(lambda: list(c.jobs()) == [steps[0]], timeout=30, interval=0.1)
            assert c.job_ids == [steps[0]]
            wait_until(lambda: c.stats()["workers"] == 1, timeout=10, interval=0.05)
        assert all(len(r) == 2 for r in runs), runs  # each task started and ended once
        assert [f"start {newest}", f"end {newest}"] in runs, runs
        # close() ended the steps, not the allocation (it is not ours).
        assert alloc in squeue_ids()
        steps_left = subprocess.run(
            ["squeue", "--steps", f"--jobs={alloc}", "--noheader"], capture_output=True, text=True
        )
        assert steps_left.stdout.strip() == ""
    finally:
        subprocess.run(["scancel", alloc], timeout=60)


def test_srun_mode_needs_an_allocation(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ValueError, match="allocation"):
        rtpool.SlurmCluster(mode="srun")


_SIGINT_SCRIPT = """
import faulthandler, signal, sys, time, rtpool
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump on a hang
cluster = rtpool.SlurmCluster(workers=1, job_dir=sys.argv[1])
print(cluster.job_ids[0], flush=True)
cluster.wait_for_workers(1, timeout=60)
print("ready", flush=True)
time.sleep(120)
"""


def test_ctrl_c_cancels_the_jobs(slurm, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", _SIGINT_SCRIPT, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_shell,
    ) as proc:
        try:
            job = proc.stdout.readline().strip()
            assert job.isdigit(), proc.stderr.read()
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            assert job in squeue_ids()
            proc.send_signal(signal.SIGINT)
            # communicate() drains stderr while waiting: a full pipe would block the script's
            # exit (its cluster logs there), and a bare wait() would then time out.
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                # Seen once in .ci/run next to a CPU hog (not reproduced in 12 + 3 x 17 runs
                # under load since): say where each of its threads stands.
                proc.send_signal(signal.SIGUSR1)
                try:
                    _, err = proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    err = "(no stack dump within 10 s)"
                pytest.fail(
                    f"no exit within 30 s of Ctrl-C; the test process: {signal_state()}; "
                    f"its threads:\n{err}"
                )
            assert "KeyboardInterrupt" in err
            wait_until(lambda: job not in squeue_ids(), timeout=30, interval=0.1)
        finally:
            proc.kill()


def _connected_workers(log: Path) -> Set[str]:
    """Names of the worker processes the master's log says connected."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return set(re.findall(r" connected .*name=(\S+) .*role=Worker", text))


def test_cli_up_and_down_for_a_running_master(slurm, tmp_path):
    # `rtpool master` as on a login node; its log is what it reports about each worker.
    m = start_master(tmp_path, listen="0.0.0.0:0")
    try:
        port = m.address.rpartition(":")[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        cmd = [sys.executable, "-m", "rtpool", "slurm"]
        job_dir = ["--job-dir", str(tmp_path / "jobs")]
        up = subprocess.run(
            cmd
            + ["up", "--workers", "2", "--procs", "2", "--partition", "debug", "--time", "10"]
            + ["--master", f"127.0.0.1:{port}", "--token-file", str(m.data_dir / "worker.token")]
            + job_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert up.returncode == 0, up.stderr
        ids = up.stdout.split()
        assert len(ids) == 2 and all(re.fullmatch(r"\d+", j) for j in ids)
        assert set(ids) <= squeue_ids()
        # The master names each worker process slurm-<jobid>-<slot> (--procs 2): the name its
        # log, its status snapshot and its per-worker metrics carry.
        expected = {f"slurm-{j}-{slot}" for j in ids for slot in (0, 1)}
        wait_until(lambda: _connected_workers(m.log) == expected, timeout=_JOB_START_S)
        with rtpool.Client(f"127.0.0.1:{port}", m.client_token) as client:
            names = set(client.submit_many(lambda _: worker_name(), range(40)).results(timeout=30))
        assert names and names <= expected
        down = subprocess.run(
            cmd + ["down"] + job_dir, env=env, capture_output=True, text=True, timeout=60
        )
        assert down.returncode == 0, down.stderr
        wait_until(lambda: not set(ids) & squeue_ids(), timeout=30, interval=0.1)
    finally:
        close_master(m)


def test_cli_srun_mode_with_a_tls_master(slurm, tmp_path):
    m = start_master(tmp_path, listen="0.0.0.0:0", args=["--tls-self-signed"])
    try:
        port = m.address.rpartition(":")[2]
        cert = m.data_dir / "tls" / "cert.pem"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        up = [sys.executable, "-m", "rtpool", "slurm", "up", "--master", f"127.0.0.1:{port}"]
        up += ["--token-file", str(m.data_dir / "worker.token"), "--job-dir", str(tmp_path / "j")]
        # The key given as the CA file is refused before anything is submitted.
        wrong = subprocess.run(
            up + ["--ca-file", str(cert.with_name("key.pem"))],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert wrong.returncode == 1 and "holds a private key" in wrong.stderr
        assert not (tmp_path / "j" / "ca.pem").exists()
        out = subprocess.run(
            up + ["--mode", "srun", "--workers", "2", "--time", "10", "--ca-file", str(cert)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        (job,) = out.stdout.split()
        assert job in squeue_ids()
        expected = {f"slurm-{job}.0.0", f"slurm-{job}.0.1"}
        wait_until(lambda: _connected_workers(m.log) == expected, timeout=_JOB_START_S)
        address = f"127.0.0.1:{port}"
        with rtpool.Client(address, m.client_token, ca_file=str(cert)) as client:
            names = set(client.submit_many(lambda _: worker_name(), range(40)).results(timeout=30))
        assert names and names <= expected
        down = subprocess.run(
            [sys.executable, "-m", "rtpool", "slurm", "down", "--job-dir", str(tmp_path / "j")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert down.returncode == 0, down.stderr
        wait_until(lambda: job not in squeue_ids(), timeout=30, interval=0.1)
    finally:
        close_master(m)


# Without Slurm: the worker options the jobs rely on.


def test_worker_reads_its_token_from_a_file_and_tells_tasks_its_name(tmp_path):
    token_file = tmp_path / "worker.token"
    with rtpool.LocalCluster(workers=0) as master:
        token_file.write_text(master.worker_token + "\n")
        env = {k: v for k, v in os.environ.items() if k != "RTPOOL_WORKER_TOKEN"}
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        cmd = [sys.executable, "-m", "rtpool", "worker", "--master", master.address]
        cmd += ["--token-file", str(token_file), "--name", "slurm-42"]
        with subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL) as proc:
            try:
                master.wait_for_workers(1, timeout=30)
                assert master.client().submit(worker_name).result(timeout=30) == "slurm-42"
            finally:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0


def test_worker_with_an_unreadable_token_file_says_so(tmp_path):
    missing = tmp_path / "nope"
    out = subprocess.run(
        [sys.executable, "-m", "rtpool", "worker", "--master", "127.0.0.1:1"]
        + ["--token-file", str(missing)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == EXIT_CONFIG
    assert f"cannot read the worker token from --token-file {missing}" in out.stderr


# The adapt rule, on the status snapshot's shape (docs/operations.md).


def test_adapt_rule_by_queue_and_by_deadlines():
    # Unknown task time: one slot per task, whatever the deadlines.
    assert want_slots(Demand(12, None), target_s=10, startup_s=5) == (12, 0)
    assert want_slots(Demand(12, None, ((30.0, 4),)), target_s=10, startup_s=5) == (12, 4)
    # Known: 100 tasks of 0.5 s is 50 s of work -> 5 slots for 10 s; never more than tasks.
    assert want_slots(Demand(100, 0.5), target_s=10, startup_s=5) == (5, 0)
    assert want_slots(Demand(3, 60.0), target_s=10, startup_s=5) == (3, 0)
    # Deadlines, earliest first: 20 tasks due in 15 s need 20 * 0.5 / (15 - 5) = 1 slot;
    # with 100 more due in 25 s, 120 * 0.5 / 20 = 3 slots.
    demand = Demand(120, 0.5, ((25.0, 100), (15.0, 20)))
    assert want_slots(demand, target_s=60, startup_s=5) == (1, 3)
    # A deadline closer than a new job's start: as urgent as 1 s, at most one slot per task.
    assert want_slots(Demand(8, 2.0, ((3.0, 8),)), target_s=60, startup_s=5) == (1, 8)
    assert want_slots(Demand(8, 2.0, ((-4.0, 8),)), target_s=60, startup_s=5) == (1, 8)
    # Jobs of 4 processes, within the bounds.
    assert want_jobs(demand, 4, 0, 8, target_s=60, startup_s=5) == 1
    assert want_jobs(Demand(0, None), 4, 2, 8, target_s=60, startup_s=5) == 2
    assert want_jobs(Demand(400, None), 4, 0, 8, target_s=60, startup_s=5) == 8


def test_demand_from_the_status_snapshot():
    snapshot = {
        "totals": {"queued": 30, "running": 4, "done": 100},
        "workers": [
            {"name": "slurm-7", "exec_s": 30.0, "done": 60},
            {"name": "slurm-8", "exec_s": 20.0, "done": 40},
        ],
        "packages": [
            {"id": 1, "queued": 10, "running": 2, "deadline_in_s": 12.5},
            {"id": 2, "queued": 20, "running": 2, "deadline_in_s": None},
            {"id": 3, "queued": 0, "running": 0, "deadline_in_s": 3.0},  # done: no risk
        ],
    }
    assert demand_from_status(snapshot) == Demand(34, 0.5, ((12.5, 12),))
    assert demand_from_status({"totals": {}, "workers": [], "packages": []}) == Demand(0, None)


def test_task_time_by_littles_law_from_stats_polls():
    timer = TaskTimer(window_s=30)
    assert timer.update(0.0, running=4, delivered=0) is None
    # 4 tasks running throughout, 8 completed in 2 s: each took 4 * 2 / 8 = 1 s.
    assert timer.update(1.0, running=4, delivered=4) == pytest.approx(1.0)
    assert timer.update(2.0, running=4, delivered=8) == pytest.approx(1.0)
    # Old polls leave the window.
    for t in range(3, 40):
        estimate = timer.update(float(t), running=2, delivered=8 + 4 * (t - 2))
    assert estimate == pytest.approx(0.5)


class _FakePool:
    """The part of SlurmCluster's job pool adapt_loop drives, recording what it is told."""

    def __init__(self) -> None:
        self.spec = type("Spec", (), {"procs": 1})()
        self.lock = threading.Lock()
        self.n = 0
        self.calls: list = []  # (time, n)

    def live(self) -> list:
        return [str(i) for i in range(self.n)]

    def scale(self, n: int) -> None:
        self.n = n
        self.calls.append((time.monotonic(), n))


_RULE = dict(target_s=10, startup_s=5)


def test_adapt_loop_scales_up_at_once_and_down_after_the_cooldown():
    pool = _FakePool()
    stop = threading.Event()
    polls = []  # (time, tasks)

    def poll() -> Demand:
        if pool.calls and pool.calls[-1][1] == 0:
            stop.set()
        # 8 tasks (unknown time: 8 slots, max 4), then 2 tasks, then none.
        tasks = 8 if len(polls) < 5 else 2 if len(polls) < 45 else 0
        polls.append((time.monotonic(), tasks))
        return Demand(tasks, None)

    thread = threading.Thread(
        target=adapt_loop,
        args=(pool, poll, stop),
        kwargs=dict(minimum=0, maximum=4, interval_s=0.01, cooldown_s=0.2, rule=_RULE),
    )
    thread.start()
    thread.join(20)
    stop.set()
    assert [n for _, n in pool.calls] == [4, 2, 0], pool.calls
    (up, _), (down2, _), (down0, _) = pool.calls
    assert polls[0][0] < up < polls[1][0]  # at the first poll
    # Down only once the last higher want is cooldown_s (0.2 s) old, each time.
    last = {tasks: t for t, tasks in polls}
    assert down2 - last[8] >= 0.2 and down0 - last[2] >= 0.2, (pool.calls, last)
