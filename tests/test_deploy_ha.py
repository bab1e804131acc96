"""The HA form of the deployment files (issue 28 item 7, docs/ha.md): the Kubernetes overlay
deploy/kubernetes-ha (two master replicas on one PostgreSQL) rendered with ``kubectl
kustomize`` and validated against the Kubernetes schemas, with what a schema cannot check;
the systemd drop-in deploy/systemd/rtpool-master-ha.conf through ``systemd-analyze verify``.
Their command lines run for real, one master from the container image, in
tests/test_container.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from test_deploy import K8S, SYSTEMD, systemd_analyze, validate, verify  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
HA = ROOT / "deploy" / "kubernetes-ha"
MASTER = {"app.kubernetes.io/name": "rtpool", "app.kubernetes.io/component": "master"}
PROBE_HANDLERS = {"exec", "httpGet", "tcpSocket", "grpc"}


def render(tmp_path: Path, edit=None) -> List[dict]:
    """The overlay rendered from a copy with made-up tokens and database URL; ``edit(dir)``
    may change the copy first."""
    shutil.copytree(K8S, tmp_path / "kubernetes", ignore=shutil.ignore_patterns("tokens"))
    shutil.copytree(HA, tmp_path / "kubernetes-ha", ignore=shutil.ignore_patterns("secrets"))
    tokens = tmp_path / "kubernetes" / "tokens"
    tokens.mkdir()
    for name, value in (("client", "rtc_" + "a" * 48), ("worker", "rtw_" + "b" * 48)):
        (tokens / f"{name}.token").write_text(value)
    (tokens / "http.token").write_text("c" * 48)
    (tmp_path / "kubernetes-ha" / "secrets").mkdir()
    (tmp_path / "kubernetes-ha" / "secrets" / "postgres.url").write_text(
        "postgres://rtpool:s3cret@db.example:5432/rtpool"
    )
    if edit is not None:
        edit(tmp_path / "kubernetes-ha")
    out = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "kubernetes-ha")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_name(docs: List[dict]) -> Dict[str, dict]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def master_container(docs: List[dict]) -> dict:
    spec = by_name(docs)["StatefulSet/rtpool-master"]["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "master"]
    return container


def check_probe(probe: dict) -> None:
    """What the schema lets through: a probe has exactly one handler."""
    handlers = PROBE_HANDLERS & set(probe)
    assert len(handlers) == 1, f"a probe needs exactly one handler, this one has {handlers}"


needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


@needs_kubectl
def test_the_ha_overlay_renders_two_masters_on_one_database(tmp_path):
    docs = render(tmp_path)
    for doc in docs:
        validate(doc)
    res = by_name(docs)
    sts = res["StatefulSet/rtpool-master"]
    assert sts["spec"]["replicas"] == 2
    # Each master advertises its own pod's name under the headless Service the StatefulSet
    # governs, which publishes not-ready pods too (a standby is named before it is ready).
    assert sts["spec"]["serviceName"] == "rtpool-master-pods"
    pods = res["Service/rtpool-master-pods"]["spec"]
    assert pods["clusterIP"] == "None" and pods["publishNotReadyAddresses"] is True
    assert pods["selector"] == MASTER
    assert res["Service/rtpool-master"]["spec"]["selector"] == MASTER
    c = master_container(docs)
    args = c["args"]
    advertise = args[args.index("--advertise") + 1]
    assert advertise == "$(POD_NAME).rtpool-master-pods.$(POD_NAMESPACE).svc:7070"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # The database URL (with its password) comes from the generated Secret, never the args.
    (secret,) = [d for d in docs if d["metadata"]["name"].startswith("rtpool-ha-")]
    assert env["RTPOOL_HA"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "url",
    }
    assert not any("postgres" in a for a in args) and "--ha" not in args
    assert "RTPOOL_HTTP_TOKEN" in env  # the base's env is kept, not replaced
    # Ready = leader or a standby that could take over (/readyz); exactly one handler.
    check_probe(c["readinessProbe"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for name in ("startupProbe", "livenessProbe"):
        check_probe(c[name])
    # Spread over nodes, and a drain keeps one master.
    term = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == MASTER
    pdb = res["PodDisruptionBudget/rtpool-master"]["spec"]
    assert pdb["minAvailable"] == 1 and pdb["selector"]["matchLabels"] == MASTER
    # The workers and their autoscaler come from the base unchanged.
    assert "Deployment/rtpool-worker" in res and "HorizontalPodAutoscaler/rtpool-worker" in res


@needs_kubectl
def test_the_probe_check_catches_a_patch_that_merges_two_handlers(tmp_path):
    def keep_tcp(d: Path) -> None:
        patch = d / "master-ha-patch.yaml"
        text = patch.read_text()
        assert "tcpSocket: null" in text
        patch.write_text(text.replace("            tcpSocket: null\n", ""))

    c = master_container(render(tmp_path, keep_tcp))
    with pytest.raises(AssertionError, match="exactly one handler"):
        check_probe(c["readinessProbe"])


def _unit_with_drop_in(tmp_path: Path, drop_in: str) -> Path:
    """rtpool-master.service with the HA drop-in beside it, ExecStart at this rtpool."""
    rtpool = str(Path(sys.executable).parent / "rtpool")
    unit = tmp_path / "rtpool-master.service"
    unit.write_text(
        (SYSTEMD / "rtpool-master.service").read_text().replace("/usr/local/bin/rtpool", rtpool)
    )
    (tmp_path / "rtpool-master.service.d").mkdir()
    (tmp_path / "rtpool-master.service.d" / "ha.conf").write_text(
        drop_in.replace("/usr/local/bin/rtpool", rtpool)
    )
    return unit


def test_the_ha_drop_in_passes_systemd_analyze_verify(systemd_analyze, tmp_path):  # noqa: F811
    text = (SYSTEMD / "rtpool-master-ha.conf").read_text()
    assert "ExecStart=\nExecStart=/usr/local/bin/rtpool master " in text  # cleared, replaced
    assert "postgres://" not in text  # the URL lives in the env file only
    (tmp_path / "good").mkdir()
    (tmp_path / "broken").mkdir()
    assert verify(systemd_analyze, _unit_with_drop_in(tmp_path / "good", text)) == ""
    # A misspelt key in the drop-in is caught: verify reads it.
    broken = text.replace("EnvironmentFile=", "EnviromentFile=")
    complaints = verify(systemd_analyze, _unit_with_drop_in(tmp_path / "broken", broken))
    assert "EnviromentFile" in complaints


def test_the_ha_env_example_names_what_the_drop_in_reads():
    env = dict(
        line.split("=", 1)
        for line in (SYSTEMD / "master-ha.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert set(env) == {"RTPOOL_HA", "RTPOOL_ADVERTISE"}
    assert env["RTPOOL_HA"].startswith("postgres://")
    assert "${RTPOOL_ADVERTISE}" in (SYSTEMD / "rtpool-master-ha.conf").read_text()
