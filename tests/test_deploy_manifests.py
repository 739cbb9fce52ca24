"""deploy/ recipes that need no cluster to check: the Kubernetes manifests (schema-validated by
kubernetes-validate, selectors and ports consistent, the exporter options real), the Prometheus
pod-discovery job (promtool), the systemd unit (systemd-analyze verify, and its options start
a real exporter), the Dockerfile's entry point."""

from __future__ import annotations

import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.commands.exporter import parse_options

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
CORE_MANIFESTS = ("namespace.yaml", "daemonset.yaml", "service.yaml")
CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"


def load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


@pytest.mark.parametrize("name", CORE_MANIFESTS)
def test_manifest_validates_against_the_kubernetes_schema(name):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    for version in ("1.27.0", "1.33.0"):
        kv.validate(load(name), version, strict=True)  # raises on any unknown or bad field


def test_schema_validation_catches_a_broken_manifest():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    broken = load("daemonset.yaml")
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9048"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.33.0", strict=True)


def test_daemonset_service_and_servicemonitor_select_the_same_pods_and_port():
    ds, svc, sm = load("daemonset.yaml"), load("service.yaml"), load("servicemonitor.yaml")
    pod = ds["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    container = pod["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    # the exporter listens where the probes and the scrape annotations look
    opts = parse_options(container["args"][1:])
    assert opts.listen_address.endswith(f":{port}")
    # the node label comes from the downward API, and no GPU is taken from verl's pods
    assert opts.node == "$(NODE_NAME)"
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} \
        in container["env"]
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert Path(opts.log[0]).parent.as_posix() in mounts
    assert Path(opts.store).parent.as_posix() in mounts


@pytest.mark.slow
def test_pod_discovery_scrape_job_passes_promtool(tmp_path):
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    cfg = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    cfg["rule_files"] = [str(REPO / "prometheus" / p) for p in cfg["rule_files"]]
    jobs = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())["scrape_configs"]
    assert jobs[0]["kubernetes_sd_configs"][0]["role"] == "pod"
    # Debian's Prometheus is built without Kubernetes discovery: check the job with a static
    # target in its place (the relabelling, the part we wrote, is still checked)
    jobs[0].pop("kubernetes_sd_configs")
    jobs[0]["static_configs"] = [{"targets": ["10.0.0.1:9048"]}]
    cfg["scrape_configs"] = jobs
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _unit() -> str:
    return (REPO / "deploy" / "systemd" / "verl-monitor-exporter.service").read_text()


@pytest.mark.slow
def test_systemd_unit_verifies(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "verl-monitor-exporter.service"
    unit.write_text(_unit().replace("/usr/local/bin/verl-monitor", CLI))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60)
    complaints = [ln for ln in (done.stdout + done.stderr).splitlines() if unit.name in ln]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


@pytest.mark.slow
def test_systemd_unit_options_start_a_real_exporter_that_stops_on_sigterm(tmp_path):
    env_line = next(ln for ln in _unit().splitlines()
                    if ln.startswith("Environment=") and "VERLMON_EXPORTER_ARGS=" in ln)
    args = shlex.split(env_line.split("=", 1)[1].strip('"').split("=", 1)[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [a.replace("/var/lib/verl-monitor", str(tmp_path / "state"))
             .replace("/var/log/verl", str(tmp_path / "log"))
             .replace("0.0.0.0:9048", f"127.0.0.1:{port}") for a in args]
    (tmp_path / "state").mkdir()
    proc = subprocess.Popen([CLI, "exporter", *args, "--no-collector.gpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"serving http://127.0.0.1:{port}/metrics" in line, proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # systemd's stop: a clean exit, not a failure


def test_dockerfile_runs_the_exporter_on_the_port_the_daemonset_scrapes():
    text = (REPO / "deploy" / "container" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["verl-monitor"]' in text
    assert "EXPOSE 9048" in text
    ds = load("daemonset.yaml")["spec"]["template"]["spec"]["containers"][0]
    assert ds["image"].split(":")[0] == "verl-monitor" and ds["args"][0] == "exporter"
    for copied in ("monitor", "exporters", "dashboards", "pyproject.toml"):
        assert (REPO / copied).exists() and copied in text


def _unit_settings() -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in _unit().splitlines()
                if "=" in ln and not ln.startswith("#"))


def test_systemd_unit_restarts_on_any_end_and_allows_enough_open_files():
    """Before (issue 20): Restart=on-failure with SIGHUP exiting 0 left the node unmonitored,
    and the default 1,024 open files ran out under idle connections."""
    from cli.commands.exporter import HANGUP_EXIT
    from exporters.metrics_server import DEFAULT_MAX_CONNECTIONS

    unit = _unit_settings()
    assert unit["Restart"] == "always"
    assert unit["RestartPreventExitStatus"] == "2"  # bad options: no restart loop
    assert HANGUP_EXIT not in {int(x) for x in unit["RestartPreventExitStatus"].split()}
    assert int(unit["LimitNOFILE"]) >= 4 * DEFAULT_MAX_CONNECTIONS


@pytest.mark.slow
@pytest.mark.parametrize("first_exit, runs", [(129, 2), (1, 2), (2, 1), (0, 1)])
def test_the_slurm_step_restarts_an_exporter_that_ends_unasked(tmp_path, first_exit, runs):
    """Before (issue 20): the step exec'd the exporter once; a crash or SIGHUP left the node
    unmonitored for the rest of the job. Now: started again unless it stopped cleanly (0) or
    its options were wrong (2). Runs the step's own script with a stand-in exporter."""
    sbatch = (REPO / "deploy" / "slurm" / "verl-monitor.sbatch").read_text()
    step = sbatch.split("--job-name=verl-monitor bash -c '", 1)[1].split("' &\n", 1)[0]
    fake = tmp_path / "fake-verl-monitor"
    count = tmp_path / "runs"
    fake.write_text(f"#!/bin/bash\necho run >> {count}\n"
                    f"[ $(wc -l < {count}) -eq 1 ] && exit {first_exit}\nexit 0\n")
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "VERLMON": str(fake), "VERLMON_DIR": str(tmp_path / "d"),
           "VERLMON_PORT": "9048", "VERLMON_DRIVER_METRICS": "http://n0:9048/metrics",
           "VERLMON_EXPORTER_ARGS": "", "VERLMON_RESTART_S": "0"}
    done = subprocess.run(["bash", "-c", step], env=env, capture_output=True, text=True,
                          timeout=60)
    assert count.read_text().count("run") == runs
    assert done.returncode == (first_exit if first_exit in (0, 2) else 0)
    assert ("restarting" in done.stderr) is (runs == 2)


def test_the_daemonset_restarts_its_pods():
    ds = load("daemonset.yaml")["spec"]["template"]["spec"]
    assert ds.get("restartPolicy", "Always") == "Always"


@pytest.mark.slow
def test_the_ray_actor_restarts_an_exporter_that_ends_unasked(tmp_path, monkeypatch):
    """Before (issue 20): the actor's exporter child was started once; after a crash or
    SIGHUP the node had none until someone ran ``start`` again. The actor body runs here
    without Ray (it is a plain class Ray wraps), with a real exporter child."""
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location(
        "verl_monitor_ray", REPO / "deploy" / "ray" / "verl_monitor_ray.py")
    ray_recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ray_recipe)
    monkeypatch.setattr(ray_recipe, "RESTART_S", 0.1)
    monkeypatch.chdir(REPO)  # `python -m monitor` from the checkout under test
    actor = ray_recipe.NodeExporter(["--listen-address", "127.0.0.1:0", "--no-collector.gpu"],
                                    str(tmp_path / "exporter.log"))
    try:
        first = actor.proc
        assert actor.port_of() is not None
        first.send_signal(signal.SIGHUP)
        assert first.wait(timeout=30) == 129
        for _ in range(600):  # 60 s at most for the new child's startup line
            if actor.restarts == 1 and actor.proc is not first and actor.port_of():
                break
            time.sleep(0.1)
        assert actor.restarts == 1 and actor.port_of() is not None
    finally:
        assert actor.stop() == 0
    time.sleep(0.5)
    assert actor.restarts == 1 and actor.proc.poll() == 0  # a requested stop stays stopped
