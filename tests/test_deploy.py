"""The deployment files: Kubernetes manifests, systemd units, Dockerfile (docs/deploy.md).

No cluster, container engine or running systemd is available to the tests, so:
- every manifest is validated against the Kubernetes JSON schemas bundled by the
  ``kubernetes-validate`` package (offline), and the kustomization is rendered with
  ``kubectl kustomize`` (offline) when kubectl is installed;
- the units go through ``systemd-analyze verify``;
- the command lines of the units and of the worker Deployment run for real, against each
  other on loopback, with the token passed the way the files pass it.
Each check is also run on a broken copy, to show it can fail.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import kubernetes_validate
import pytest
import yaml

import rtpool
from conftest import _read_listening_line
from helpers import stop_process, wait_until, worker_env

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
# The oldest Kubernetes still commonly run, and the newest the package knows.
K8S_VERSIONS = ["1.28", kubernetes_validate.latest_version()]
MASTER_PORT = 7070
HTTP_PORT = 7071
PROMETHEUS = K8S / "prometheus"


# --- Kubernetes -----------------------------------------------------------------------------


def load_docs(path: Path) -> List[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def resources() -> Dict[str, dict]:
    """Every resource the kustomization lists, by ``kind/name``."""
    out = {}
    for name in kustomization()["resources"]:
        for doc in load_docs(K8S / name):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def validate(doc: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("name", sorted({*kustomization()["resources"], "hpa-queue.yaml"}), ids=str)
def test_manifest_matches_the_kubernetes_schema(name):
    docs = load_docs(K8S / name)
    assert docs
    for doc in docs:
        validate(doc)


def test_every_manifest_file_is_listed_or_deliberately_left_out():
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    # The queue autoscaler needs Prometheus and prometheus-adapter: swapped in by hand.
    assert on_disk - listed == {"hpa-queue.yaml"}
    assert listed <= on_disk


def test_the_schema_check_rejects_a_broken_manifest():
    deployment = resources()["Deployment/rtpool-worker"]
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(wrong_type)
    misspelt = copy.deepcopy(deployment)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(misspelt)


def pod_spec(kind_name: str) -> dict:
    return resources()[kind_name]["spec"]["template"]["spec"]


def test_master_and_workers_run_as_non_root_with_probes_and_requests():
    for kind_name in ("StatefulSet/rtpool-master", "Deployment/rtpool-worker"):
        spec = pod_spec(kind_name)
        assert spec["securityContext"]["runAsNonRoot"] is True, kind_name
        assert spec["securityContext"]["runAsUser"] != 0, kind_name
        assert spec["terminationGracePeriodSeconds"] >= 30, kind_name
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]
            assert c["resources"]["requests"]["cpu"], c["name"]
            assert c["resources"]["requests"]["memory"], c["name"]
        main = spec["containers"][0]
        assert "livenessProbe" in main, kind_name
        # SIGTERM is the graceful stop of both: a preStop hook would only delay it.
        assert "lifecycle" not in main, kind_name
    master = pod_spec("StatefulSet/rtpool-master")["containers"][0]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= master.keys()


def test_service_selects_the_master_pods_and_the_ports_agree():
    service = resources()["Service/rtpool-master"]
    sts = resources()["StatefulSet/rtpool-master"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    worker_labels = pod_spec_labels("Deployment/rtpool-worker")
    assert not service["spec"]["selector"].items() <= worker_labels.items()

    master = sts["spec"]["template"]["spec"]["containers"][0]
    container_ports = {p["name"]: p["containerPort"] for p in master["ports"]}
    service_ports = {p["targetPort"]: p["port"] for p in service["spec"]["ports"]}
    assert container_ports == service_ports == {"rtpool": MASTER_PORT, "http": HTTP_PORT}
    args = master["args"]
    assert args[args.index("--listen") + 1] == f"0.0.0.0:{MASTER_PORT}"
    assert args[args.index("--http") + 1] == f"0.0.0.0:{HTTP_PORT}"
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(HTTP_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert master[probe]["tcpSocket"]["port"] == "rtpool"
    mounts = {m["name"]: m["mountPath"] for m in master["volumeMounts"]}
    assert args[args.index("--data-dir") + 1] == mounts["data"]
    claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
    assert claims == ["data"]

    worker = pod_spec("Deployment/rtpool-worker")["containers"][0]["args"]
    assert worker[worker.index("--master") + 1] == f"{service['metadata']['name']}:{MASTER_PORT}"


def pod_spec_labels(kind_name: str) -> dict:
    return resources()[kind_name]["spec"]["template"]["metadata"]["labels"]


def test_tokens_come_from_the_secret_never_the_command_line():
    (generator,) = kustomization()["secretGenerator"]
    keys = {entry.split("=", 1)[0] for entry in generator["files"]}
    assert keys == {"client.token", "worker.token", "http.token"}
    worker = pod_spec("Deployment/rtpool-worker")["containers"][0]
    assert "--token" not in worker["args"]
    assert not any("rtw_" in a or "TOKEN" in a for a in worker["args"])
    (env,) = [e for e in worker["env"] if e["name"] == "RTPOOL_WORKER_TOKEN"]
    ref = env["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (generator["name"], "worker.token")

    master_spec = pod_spec("StatefulSet/rtpool-master")
    (tokens,) = [v for v in master_spec["volumes"] if v["name"] == "tokens"]
    assert tokens["secret"]["secretName"] == generator["name"]
    (init,) = master_spec["initContainers"]
    script = " ".join(init["command"])
    for key in ("client.token", "worker.token"):
        assert f"/run/rtpool-tokens/{key} /var/lib/rtpool/{key}" in script
    # The HTTP port's token: from the Secret in the master's environment, not an argument.
    master = master_spec["containers"][0]
    (env,) = [e for e in master["env"] if e["name"] == "RTPOOL_HTTP_TOKEN"]
    ref = env["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (generator["name"], "http.token")
    assert not any("token" in a.lower() or len(a) >= 40 for a in master["args"])


def test_the_hpa_scales_the_worker_deployment():
    hpa = resources()["HorizontalPodAutoscaler/rtpool-worker"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "rtpool-worker")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    (queue,) = load_docs(K8S / "hpa-queue.yaml")
    assert queue["metadata"]["name"] == hpa["metadata"]["name"]  # one replaces the other
    assert queue["spec"]["scaleTargetRef"] == target
    (metric,) = queue["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == "rtpool_tasks_queued"
    assert metric["external"]["target"]["type"] == "AverageValue"


def test_prometheus_adapter_serves_the_metric_the_queue_hpa_reads():
    (queue,) = load_docs(K8S / "hpa-queue.yaml")
    wanted = queue["spec"]["metrics"][0]["external"]["metric"]["name"]
    values = yaml.safe_load((PROMETHEUS / "adapter-values.yaml").read_text())
    (rule,) = values["rules"]["external"]
    # The master's gauge (docs/operations.md), by the name the autoscaler asks for.
    assert re.fullmatch(r"rtpool_tasks_queued\{namespace!=\"\"\}", rule["seriesQuery"])
    assert re.search(rule["name"]["matches"], "rtpool_tasks_queued")
    assert rule["name"]["as"] == wanted
    # Summed over priority and user, per namespace: the series carry `namespace`, which the
    # scrape job sets.
    assert rule["metricsQuery"].startswith("sum(<<.Series>>{<<.LabelMatchers>>})")
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"
    scrape = yaml.safe_load((PROMETHEUS / "scrape-config.yaml").read_text())
    (job,) = scrape["scrape_configs"]
    relabel = {r.get("target_label"): r for r in job["relabel_configs"]}
    assert relabel["namespace"]["source_labels"] == ["__meta_kubernetes_namespace"]
    assert job["kubernetes_sd_configs"][0]["namespaces"]["names"] == [kustomization()["namespace"]]
    # The scrape job keeps exactly what the master's pod annotations say.
    annotations = resources()["StatefulSet/rtpool-master"]["spec"]["template"]["metadata"][
        "annotations"
    ]
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep[0]["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    assert re.fullmatch(keep[0]["regex"], annotations["prometheus.io/scrape"])
    address = relabel["__address__"]
    joined = f"10.1.2.3:7070;{annotations['prometheus.io/port']}"
    assert re.sub(address["regex"], address["replacement"].replace("$", "\\"), joined) == (
        f"10.1.2.3:{HTTP_PORT}"
    )
    assert job["authorization"]["credentials_file"].endswith("http.token")


@pytest.fixture(scope="module")
def promtool() -> str:
    """Prometheus's config checker (Debian's ``prometheus`` package, installed when missing)."""
    path = shutil.which("promtool")
    if path is None:
        if os.geteuid() != 0:
            pytest.skip("promtool missing and not root: apt-get install prometheus")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, timeout=600, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
            check=True,
            timeout=600,
            env=env,
        )
        path = shutil.which("promtool")
    assert path
    return path


def test_the_scrape_job_passes_promtool(promtool, tmp_path):
    scrape = yaml.safe_load((PROMETHEUS / "scrape-config.yaml").read_text())
    (job,) = scrape["scrape_configs"]
    token = tmp_path / "http.token"
    token.write_text("e" * 48)
    job["authorization"]["credentials_file"] = str(token)
    # Debian builds Prometheus without Kubernetes discovery ("field kubernetes_sd_configs not
    # found"): check the rest of the job with a static target in its place.
    assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
    job["static_configs"] = [{"targets": ["10.1.2.3:7070"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape))
    out = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr
    config.write_text(config.read_text().replace("relabel_configs:", "relabel_config:"))
    out = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_renders_a_valid_set_with_the_generated_secret(tmp_path):
    work = tmp_path / "kubernetes"
    shutil.copytree(K8S, work, ignore=shutil.ignore_patterns("tokens"))
    (work / "tokens").mkdir()
    (work / "tokens" / "client.token").write_text("rtc_" + "a" * 48)
    (work / "tokens" / "worker.token").write_text("rtw_" + "b" * 48)
    (work / "tokens" / "http.token").write_text("c" * 48)
    out = subprocess.run(
        ["kubectl", "kustomize", str(work)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for doc in docs:
        validate(doc)
    by_kind = {d["kind"]: d for d in docs}
    secret = by_kind["Secret"]
    assert secret["metadata"]["name"].startswith("rtpool-tokens-")  # content hash suffix
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"rtpool"}
    env = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert set(secret["data"]) == {"client.token", "worker.token", "http.token"}
    # The queue autoscaler swapped in as docs/deploy.md says renders and validates too.
    text = (work / "kustomization.yaml").read_text()
    (work / "kustomization.yaml").write_text(text.replace("worker-hpa.yaml", "hpa-queue.yaml"))
    out = subprocess.run(
        ["kubectl", "kustomize", str(work)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    (hpa,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"].endswith("Autoscaler")]
    validate(hpa)
    assert hpa["metadata"]["namespace"] == "rtpool"
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "rtpool_tasks_queued"
    # Without the token files the render fails instead of deploying without a secret.
    shutil.rmtree(work / "tokens")
    out = subprocess.run(["kubectl", "kustomize", str(work)], capture_output=True, timeout=60)
    assert out.returncode != 0


def test_dockerfile_runs_rtpool_as_non_root_on_port_7070():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+ AS builder$", text, re.M)
    assert "maturin build --release --locked" in text
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert not user.startswith(("0", "root"))
    assert f"EXPOSE {MASTER_PORT}" in text
    assert 'ENTRYPOINT ["rtpool"]' in text
    uid = int(user.split(":")[0])
    for kind_name in ("StatefulSet/rtpool-master", "Deployment/rtpool-worker"):
        assert pod_spec(kind_name)["securityContext"]["runAsUser"] == uid


def test_the_prebuilt_containerfile_has_the_dockerfiles_runtime():
    """deploy/container/Containerfile.prebuilt (what tests/test_container.py builds and runs
    with podman) must not drift from the Dockerfile's runtime stage."""
    runtime = (ROOT / "Dockerfile").read_text().split("# --- runtime", 1)[1]
    prebuilt = (ROOT / "deploy" / "container" / "Containerfile.prebuilt").read_text()

    def lines(text: str) -> list:
        keep = ("USER ", "WORKDIR ", "VOLUME ", "EXPOSE ", "ENTRYPOINT ", "CMD ")
        return [line for line in text.splitlines() if line.startswith(keep)]

    assert lines(prebuilt) == lines(runtime)
    assert len(lines(runtime)) == 6
    for needle in ("RTPOOL_DATA_DIR=/var/lib/rtpool", "--uid 10001", "PYTHONUNBUFFERED=1"):
        assert needle in runtime and needle in prebuilt, needle


# --- systemd --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        if os.geteuid() != 0:
            pytest.skip("systemd-analyze missing and not root: apt-get install systemd")
        subprocess.run(["apt-get", "update", "-q"], check=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", "systemd"], check=True, timeout=600)
        path = shutil.which("systemd-analyze")
    assert path
    return path


def rtpool_script() -> str:
    # The console script of the Python running the tests (ExecStart needs an absolute path).
    script = Path(sys.executable).parent / "rtpool"
    assert script.exists(), script
    return str(script)


def unit_copy(tmp_path: Path, name: str) -> Path:
    """A copy of the unit with ExecStart's /usr/local/bin/rtpool pointing at this rtpool."""
    text = (SYSTEMD / name).read_text()
    assert "ExecStart=/usr/local/bin/rtpool " in text
    path = tmp_path / name
    path.write_text(text.replace("/usr/local/bin/rtpool", rtpool_script()))
    return path


def verify(systemd_analyze: str, unit: Path, instance: str | None = None) -> str:
    """``systemd-analyze verify``; return its complaints ("" for a clean unit)."""
    target = unit
    if instance is not None:
        target = unit.with_name(unit.name.replace("@", f"@{instance}"))
        shutil.copy(unit, target)
    out = subprocess.run(
        [systemd_analyze, "verify", str(target)], capture_output=True, text=True, timeout=60
    )
    complaints = (out.stdout + out.stderr).strip()
    if out.returncode != 0:
        complaints += f"\n(exit status {out.returncode})"
    return complaints


@pytest.mark.parametrize("name", ["rtpool-master.service", "rtpool-worker@.service"])
def test_unit_passes_systemd_analyze_verify(systemd_analyze, tmp_path, name):
    instance = "main" if "@" in name else None
    assert verify(systemd_analyze, unit_copy(tmp_path, name), instance) == ""


def test_systemd_analyze_verify_catches_broken_units(systemd_analyze, tmp_path):
    unit = unit_copy(tmp_path, "rtpool-master.service")
    good = unit.read_text()
    unit.write_text(good.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    assert "Unknown key" in verify(systemd_analyze, unit)
    unit.write_text(good.replace(rtpool_script(), str(tmp_path / "no-such-rtpool")))
    assert "exit status" in verify(systemd_analyze, unit)


def test_sysusers_file_creates_the_masters_user(systemd_analyze, tmp_path):
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group"):
        (tmp_path / "etc" / name).touch()
    sysusers = Path(systemd_analyze).with_name("systemd-sysusers")
    out = subprocess.run(
        [str(sysusers), f"--root={tmp_path}", str(SYSTEMD / "rtpool.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    (entry,) = (tmp_path / "etc" / "passwd").read_text().splitlines()
    name, _, uid, _, _, home, _ = entry.split(":")
    assert (name, home) == ("rtpool", "/var/lib/rtpool")
    assert 0 < int(uid) < 1000  # a system user
    opts = unit_options("rtpool-master.service")
    assert opts["User"] == [name] and opts["StateDirectory"] == ["rtpool"]


def unit_options(name: str) -> Dict[str, List[str]]:
    options: Dict[str, List[str]] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            options.setdefault(key, []).append(value)
    return options


@pytest.mark.parametrize("name", ["rtpool-master.service", "rtpool-worker@.service"])
def test_units_are_hardened_and_keep_the_token_off_the_command_line(name):
    opts = unit_options(name)
    assert opts["ProtectSystem"] == ["strict"]
    for key in ("ProtectHome", "NoNewPrivileges", "PrivateTmp"):
        assert opts[key] == ["yes"], key
    assert opts["LimitNOFILE"] == ["65536"]
    assert opts["Restart"] == ["on-failure"]
    assert opts["KillSignal"] == ["SIGTERM"]
    assert int(opts["TimeoutStopSec"][0]) >= 30
    assert "DynamicUser" in opts or "StateDirectory" in opts
    (exec_start,) = opts["ExecStart"]
    assert "--token" not in exec_start and "rtw_" not in exec_start
    if "@" in name:
        assert opts["EnvironmentFile"] == ["/etc/rtpool/%i.env"]
        # SIGTERM to the supervisor only: a second one would make the workers exit at once.
        assert opts["KillMode"] == ["mixed"]


# --- the command lines, run for real ----------------------------------------------------------


def exec_start_argv(name: str, env: Dict[str, str]) -> List[str]:
    """ExecStart of a unit as argv, with ${VAR}, %i and %H expanded the way systemd does."""
    (line,) = unit_options(name)["ExecStart"]
    line = line.replace("%i", "main").replace("%H", socket.gethostname())
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in shlex.split(line)]
    assert argv[0] == "/usr/local/bin/rtpool"
    return [sys.executable, "-m", "rtpool", *argv[1:]]


def env_file(text: str) -> Dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line and line[0] != "#"]
    return dict(pairs)


def start_worker(argv: List[str], token: str, log: Path) -> subprocess.Popen:
    env = worker_env(token)
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def test_unit_and_deployment_command_lines_serve_tasks(tmp_path):
    # The master as rtpool-master.service starts it, on loopback and a free port.
    argv = exec_start_argv("rtpool-master.service", {})
    argv[argv.index("--listen") + 1] = "127.0.0.1:0"
    argv[argv.index("--data-dir") + 1] = str(tmp_path / "data")
    unit_env = dict(e.split("=", 1) for e in unit_options("rtpool-master.service")["Environment"])
    log = tmp_path / "master.log"
    with open(log, "ab") as err:
        master = subprocess.Popen(
            argv,
            env={**os.environ, **unit_env},
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    workers = []
    try:
        address = _read_listening_line(master, log, timeout=30.0)
        worker_token = (tmp_path / "data" / "worker.token").read_text().strip()
        client_token = (tmp_path / "data" / "client.token").read_text().strip()

        # The worker unit, with an env file shaped like worker.env.example.
        example = env_file((SYSTEMD / "worker.env.example").read_text())
        assert set(example) == {"RTPOOL_MASTER", "RTPOOL_PROCS", "RTPOOL_WORKER_TOKEN"}
        env = {**example, "RTPOOL_MASTER": address, "RTPOOL_WORKER_TOKEN": worker_token}
        unit_argv = exec_start_argv("rtpool-worker@.service", env)
        workers.append(start_worker(unit_argv, env["RTPOOL_WORKER_TOKEN"], tmp_path / "w1.log"))

        # The worker Deployment's container args, the Service name swapped for the address.
        args = pod_spec("Deployment/rtpool-worker")["containers"][0]["args"]
        args = [address if a == f"rtpool-master:{MASTER_PORT}" else a for a in args]
        pod_argv = [sys.executable, "-m", "rtpool", *args]
        workers.append(start_worker(pod_argv, worker_token, tmp_path / "w2.log"))

        procs = int(example["RTPOOL_PROCS"]) + int(args[args.index("--procs") + 1])
        with rtpool.Client(address, token=client_token) as client:
            # Every process of both workers connected with its token.
            wait_until(lambda: len(workers_seen(log)) == procs, timeout=30)
            results = list(client.map(pow, [2] * 20, range(20)))
        assert results == [2**n for n in range(20)]
        for w in workers:
            cmdline = Path(f"/proc/{w.pid}/cmdline").read_bytes()
            assert worker_token.encode() not in cmdline
        # SIGTERM is the graceful stop both files rely on: exit 0 within the grace period.
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(timeout=30) == 0
        master.send_signal(signal.SIGTERM)
        assert master.wait(timeout=30) == 0
    finally:
        for w in workers:
            stop_process(w)
        stop_process(master)
        if master.stdout is not None:
            master.stdout.close()


def test_statefulset_master_takes_the_tokens_its_init_container_copies(tmp_path):
    # The Secret, as step 2 of docs/deploy.md writes it: no trailing newline.
    secret = tmp_path / "secret"
    secret.mkdir()
    tokens = {"client.token": "rtc_" + "c" * 48, "worker.token": "rtw_" + "d" * 48}
    for key, value in tokens.items():
        (secret / key).write_text(value)
    (secret / "http.token").write_text("e" * 48)
    data = tmp_path / "data"
    data.mkdir()
    spec = pod_spec("StatefulSet/rtpool-master")
    (init,) = spec["initContainers"]
    script = init["command"][-1].replace("/run/rtpool-tokens", str(secret))
    subprocess.run(["sh", "-c", script.replace("/var/lib/rtpool", str(data))], check=True)
    for key, value in tokens.items():
        assert (data / key).read_text() == value
        assert (data / key).stat().st_mode & 0o777 == 0o600
    args = list(spec["containers"][0]["args"])
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    args[args.index("--data-dir") + 1] = str(data)
    args[args.index("--http") + 1] = "127.0.0.1:0"
    # What secretKeyRef puts in RTPOOL_HTTP_TOKEN: the file's bytes.
    master_env = {**os.environ, "RTPOOL_HTTP_TOKEN": (secret / "http.token").read_text()}
    log = tmp_path / "master.log"
    with open(log, "ab") as err:
        master = subprocess.Popen(
            [sys.executable, "-m", "rtpool", *args],
            env=master_env,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    worker = None
    try:
        address = _read_listening_line(master, log, timeout=30.0)
        worker_args = pod_spec("Deployment/rtpool-worker")["containers"][0]["args"]
        worker_args = [address if a.startswith("rtpool-master:") else a for a in worker_args]
        argv = [sys.executable, "-m", "rtpool", *worker_args]
        # What secretKeyRef puts in RTPOOL_WORKER_TOKEN: the file's bytes.
        worker = start_worker(argv, (secret / "worker.token").read_text(), tmp_path / "w.log")
        with rtpool.Client(address, token=tokens["client.token"]) as client:
            assert client.submit(pow, 3, 4).result(timeout=30) == 81
        procs = int(worker_args[worker_args.index("--procs") + 1])
        wait_until(lambda: len(workers_seen(log)) == procs, timeout=30)
        # The master kept the Secret's tokens: it generated none of its own.
        assert all((data / key).read_text() == value for key, value in tokens.items())
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(master)
        if master.stdout is not None:
            master.stdout.close()


def workers_seen(log: Path) -> set:
    """Names of the worker processes the master's log says connected."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return set(re.findall(r" connected .*name=(\S+) .*role=Worker", text))
