"""deploy/ray/verl_monitor_ray.py on a real local Ray cluster: a head and a worker node (two
raylets on this machine), an exporter actor pinned to each, targets from
``ray.nodes()`` scraped by a real Prometheus, the driver's node following the log, all gone
after ``stop``.

``ray`` is not a dependency of verl-monitor (it is verl's, and ~250 MB): when it is missing
the fixture pip-installs it into this test's Python (CI has PyPI), and skips with the reason
when that fails. ``VERLMON_NO_INSTALL=1`` turns the install off (then the test skips).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dashboard_check import chromium_missing, nodes_shown_by_dashboard
from procs import RULES_DIR, start_prometheus, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "ray" / "verl_monitor_ray.py"
VERL_LINE = ("(TaskRunner pid=1) step:{step} - timing_s/gen:0.3 - timing_s/update_actor:0.1 - "
             "timing_s/step:0.5 - perf/throughput:1000.0 - training/global_step:{step}\n")


@pytest.fixture(scope="module")
def ray_cluster():
    """Head + one worker node on this machine, shut down afterwards."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("VERLMON_NO_INSTALL"):
            pytest.skip("ray is not installed (pip install ray to run this test)")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "ray"],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"ray is not installed and pip install ray failed: "
                        f"{done.stderr.strip()[-300:]}")
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="ray did not import")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # the nodes bind this machine's own address (Ray picks it; nothing leaves the machine)
    args = {"num_cpus": 1, "include_dashboard": False}
    cluster = cluster_utils.Cluster(initialize_head=True, connect=False, head_node_args=args)
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _script(action: str, cluster, *more: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, str(SCRIPT), action, "--address", cluster.address,
                           *more],
                          capture_output=True, text=True, timeout=180, env=env)


def _open(target: str) -> bool:
    host, port = target.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def test_an_exporter_on_every_ray_node_scraped_and_stopped(ray_cluster, tmp_path):
    if chromium_missing():
        pytest.skip(chromium_missing())
    targets = tmp_path / "targets" / "grpo.json"
    log = tmp_path / "driver" / "train.log"
    log.parent.mkdir()
    prom_cfg = yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES_DIR / "recording.yml")],
        "scrape_configs": [{"job_name": "ray", "file_sd_configs": [
            {"files": [str(targets.parent / "*.json")], "refresh_interval": "1s"}]}],
    })
    started = _script("start", ray_cluster, "--port", "0", "--driver-log", str(log),
                      "--targets-file", str(targets), "--job", "grpo-ray",
                      "--out-dir", str(tmp_path / "out"), "--",
                      "--gpu-backend", "sim", "--scenario", "healthy", "--sim-gpus", "2",
                      "--interval", "0.5")
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        groups = json.loads(targets.read_text())
        ray_nodes = {g["labels"]["ray_node_id"] for g in groups}
        assert len(groups) == 2 and len(ray_nodes) == 2, groups  # one per Ray node
        names = sorted(g["labels"]["node"] for g in groups)
        assert len(set(names)) == 2, "two Ray nodes on one host need distinct node labels"
        with log.open("w") as fh:  # the driver's log, as `verl-monitor run` writes it
            for step in (1, 2, 3):
                fh.write(VERL_LINE.format(step=step))
        with start_prometheus(tmp_path / "prom", config_text=prom_cfg) as prom:
            up = wait_until(lambda: (r := prom.query('up{job="grpo-ray"} == 1')) and
                            len(r) == 2 and r, 60, what="both Ray nodes' exporters scraped")
            assert sorted(r["metric"]["node"] for r in up) == names
            sm = wait_until(lambda: (r := prom.query(
                'node:verlmon_gpu_sm_active_ratio:avg{job="grpo-ray"}')) and len(r) == 2 and r,
                30, what="GPU activity of both nodes")
            assert sorted(r["metric"]["node"] for r in sm) == names
            # only the driver's node follows the log
            steps = wait_until(lambda: prom.query(
                'verlmon_training_step{job="grpo-ray"} == 3'), 30, what="the driver's steps")
            assert len(steps) == 1 and steps[0]["metric"]["node"] in names
            # the dashboard on this Prometheus lists both Ray nodes
            assert nodes_shown_by_dashboard(prom.url, tmp_path / "dash", names) == names
            # `start` again (nodes joining) finds the running actors instead of doubling them
            again = _script("start", ray_cluster, "--port", "0", "--targets-file",
                            str(targets), "--job", "grpo-ray", "--out-dir",
                            str(tmp_path / "out"))
            assert again.returncode == 0, again.stderr[-2000:]
            assert json.loads(targets.read_text()) == groups
    finally:
        stopped = _script("stop", ray_cluster, "--targets-file", str(targets))
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    assert "stopped 2 exporter(s)" in stopped.stdout
    assert not targets.exists()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_open(g["targets"][0]) for g in groups):
        time.sleep(0.2)
    assert not any(_open(g["targets"][0]) for g in groups), "an exporter outlived stop"
