"""HA under real faults across hosts (issue 28 item 5): PostgreSQL on host ``db``, masters on
``m1`` and ``m2`` (``--advertise`` their own address), workers on ``w1`` and ``w2``, recording
clients on ``c`` given both masters' addresses (no front): each a network namespace
(``rtpool_bench/ha_netns.py``). One run per fault, each judged by the history checker (0 lost,
0 duplicated, 0 wrong, 0 phantom, every client finished), plus the fencing facts:

* the leader SIGKILLed: the standby leads; the killed one comes back as a standby;
* the leader's cable pulled while it runs: it fences itself by its own clock (its log), and
  plugged back it stands by naming the new leader; the database holds no journal row of its
  epoch above the new epoch's first (so it acknowledged nothing after the takeover: a package
  is acknowledged only once its record commits);
* the leader SIGSTOPped past its lease, then resumed: the same facts;
* PostgreSQL stopped under load and started again on the same data: the leader fences itself
  while it is down, a master leads again with a new epoch, everything completes (``slow``,
  opt-in: one unexplained failure in 21 runs);
* the standby SIGKILLed: the leader keeps its epoch, the clients finish, it stands by again.

The peers' ``--lease-ms`` is 1000 here (the default 3000 makes a partition's run ~10 s
longer: clients behind a cut cable notice the silence after 3 of these). Failover times are
printed, not asserted: ``rtpool bench ha netns`` measures them. Needs root (CI) and PostgreSQL.
"""

from __future__ import annotations

import argparse
import glob
import shutil

import pytest

from rtpool_bench.netns import skip_reason


def _why_skip() -> str | None:
    why = skip_reason()
    if why is None and shutil.which("initdb") is None:
        if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
            why = "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    return why


_SKIP = _why_skip()
pytestmark = [
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
    pytest.mark.timeout(240),
]

RESULTS_BETWEEN = 100


@pytest.fixture(scope="module")
def cluster():
    from rtpool_bench.ha_netns import NetCluster

    c = NetCluster()
    try:
        yield c
    finally:
        c.close()


def _run(cluster, tmp_path, fault: str) -> dict:
    from rtpool_bench.ha_netns_faults import run_fault

    opts = argparse.Namespace(
        fault=fault,
        clients=2,
        tasks=10,
        inflight=4,
        results_between=RESULTS_BETWEEN,
        seconds=120.0,
        lease_ms=1000,
        peer_lease_ms=1000,
    )
    out = run_fault(cluster, tmp_path / fault, opts)
    print(
        f"\n{fault}: failover {out['failover_ms']} ms, takeover {out['takeover_ms']} ms, "
        f"old-epoch writes refused {out['refused_writes']}, journal {out['journal_epochs']}"
    )
    v = out["verdict"]
    assert v["clients"] == 2 and v["unfinished_clients"] == [], v
    assert v["ok"] >= 2 * RESULTS_BETWEEN, v  # not vacuous: results before and after
    assert (v["lost"], v["duplicated"], v["wrong"], v["phantom"]) == (0, 0, 0, 0), (
        v["examples"],
        v["lost_errors"],
    )
    assert v["valid"]
    # No write of the old epoch accepted once a newer epoch wrote (a standby fault has none).
    assert out["old_epoch_writes_accepted"] == 0, out
    return out


def _took_over(out: dict) -> None:
    """The old leader stands by, naming the other master, in a newer epoch."""
    old = out["old"]
    assert old["role"] == "standby" and old["epoch"] > out["old_epoch"], out
    assert old["leader"] == out["other_address"], out
    assert max(out["journal_epochs"]) > out["old_epoch"], out  # the new leader wrote


def test_leader_killed_across_hosts(cluster, tmp_path):
    _took_over(_run(cluster, tmp_path, "kill"))


def test_leader_partitioned_fences_itself_and_stands_by_after_restore(cluster, tmp_path):
    out = _run(cluster, tmp_path, "partition")
    _took_over(out)
    # Cut off from the database and from its peers, only its own clock could fence it.
    assert out["fenced"] == f"the lease of epoch {out['old_epoch']} was not renewed in time"


def test_leader_frozen_past_its_lease_fences_itself_on_resume(cluster, tmp_path):
    out = _run(cluster, tmp_path, "stop")
    _took_over(out)
    assert out["fenced"] == f"the lease of epoch {out['old_epoch']} was not renewed in time"


# Opt-in (slow): 1 of 21 runs here failed with a ~30 s wait after the run, cause not found
# in time (its histories were valid); `rtpool bench ha netns --fault pgrestart` runs it.
@pytest.mark.slow
def test_postgres_restarted_under_load_everything_completes(cluster, tmp_path):
    out = _run(cluster, tmp_path, "pgrestart")
    assert out["fenced"] == f"the lease of epoch {out['old_epoch']} was not renewed in time"
    # A master (either) leads again in a new epoch; the other stands by naming it.
    assert out["old"]["role"] == "standby" and out["old"]["epoch"] > out["old_epoch"], out


def test_standby_killed_nothing_happens_to_clients(cluster, tmp_path):
    out = _run(cluster, tmp_path, "standby")
    assert out["leader_kept_epoch"], out
    assert out["takeover_ms"] is None
    assert out["old"]["role"] == "standby" and out["old"]["epoch"] == out["old_epoch"], out
    assert out["refused_writes"] == 0, out
