"""A simulated 5-node job scraped by a real Prometheus with the repository's rules: only the
driver (node0) follows the verl log. Healthy nodes without the log raise no flag and no alert;
a slow node (node3) and a slow GPU on another node (node4), neither of them the driver, are
named by NodeImbalance and GPULagging and stay firing.

Every node runs its own simulator (phases not in step across nodes, which is harder than a real
job); the others get the scenario's log written but not followed (``--no-collector.verl_log``),
which is what a node without the log sees. 20x simulated speed: a 30 s step takes 1.5 s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from procs import RULES_DIR, free_port, start_prometheus

pytestmark = pytest.mark.e2e

CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
#: node -> (scenario script, follows the log)
NODES = {
    "node0": ("healthy", True),
    "node1": ("healthy", False),
    "node2": ("healthy", False),
    "node3": ("healthy:10,low_utilization:400", False),  # the whole node slow in training
    "node4": ("healthy:10,gpu_imbalance:400", False),  # one GPU at ~40% of its peers
}


def _start_exporter(tmp_path: Path, node: str, scenario: str, follows: bool, port: int,
                    seed: int) -> subprocess.Popen:
    d = tmp_path / node
    d.mkdir()
    argv = [CLI, "exporter", "--listen-address", f"127.0.0.1:{port}", "--node", node,
            "--gpu-backend", "sim", "--scenario", scenario, "--sim-gpus", "4",
            "--seed", str(seed), "--sim-log", str(d / "train.log"), "--sim-speed", "20",
            "--interval", "0.5", "--detect-interval", "5", "--no-collector.nccl"]
    if not follows:
        argv.append("--no-collector.verl_log")
    return subprocess.Popen(argv, stdout=(d / "out.txt").open("w"),
                            stderr=subprocess.STDOUT, cwd=d,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_healthy_nodes_without_the_log_stay_quiet_and_slow_ones_are_named(tmp_path):
    ports = {node: free_port() for node in NODES}
    procs = [_start_exporter(tmp_path, node, sc, follows, ports[node], seed)
             for seed, (node, (sc, follows)) in enumerate(NODES.items())]
    cfg = yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES_DIR / "recording.yml"), str(RULES_DIR / "alerts.yml")],
        "scrape_configs": [{"job_name": "grpo", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"node": n}} for n in NODES]}],
    })
    seen: dict[tuple[str, str, str], set[str]] = {}  # (alert, node, gpu) -> states
    try:
        with start_prometheus(tmp_path / "prom", config_text=cfg) as prom:
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:
                for a in prom.alerts():
                    lab = a["labels"]
                    if lab["alertname"] in ("NodeImbalance", "GPULagging"):
                        key = (lab["alertname"], lab.get("node", ""), lab.get("gpu", ""))
                        seen.setdefault(key, set()).add(a["state"])
                firing = {k for k, states in seen.items() if "firing" in states}
                if (any(k[:2] == ("NodeImbalance", "node3") for k in firing)
                        and any(k[:2] == ("GPULagging", "node4") for k in firing)):
                    break
                for p in procs:
                    assert p.poll() is None, "an exporter died"
                time.sleep(1)
            up = prom.query('up{job="grpo"} == 1')
            assert sorted(r["metric"]["node"] for r in up) == sorted(NODES)
            # the slow node and the slow GPU are named, by node and GPU
            firing = {k for k, states in seen.items() if "firing" in states}
            assert ("NodeImbalance", "node3", "") in firing, seen
            lagging = [k for k in firing if k[:2] == ("GPULagging", "node4")]
            assert len(lagging) == 1 and lagging[0][2].isdigit(), seen
            # nobody else, not even pending
            others = {k for k in seen if k[:2] not in {("NodeImbalance", "node3"),
                                                       ("GPULagging", "node4")}}
            assert others == set(), seen
            # still firing a while later: no flapping
            time.sleep(10)
            now = {(a["labels"]["alertname"], a["labels"].get("node")) for a in prom.alerts()
                   if a["state"] == "firing"}
            assert {("NodeImbalance", "node3"), ("GPULagging", "node4")} <= now
            # nodes without the log raised no low_utilization flag at any time
            flags = prom.query('max_over_time(verlmon_flag_active{kind="low_utilization"}[10m])'
                               ' == 1')
            assert [r["metric"]["node"] for r in flags] == [], flags
            # ... nor any warning or critical flag on the healthy nodes
            bad = prom.query('max_over_time(verlmon_flag_active{node=~"node[012]",'
                             'severity=~"warning|critical"}[10m]) == 1')
            assert bad == [], [r["metric"] for r in bad]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    for node in NODES:
        out = (tmp_path / node / "out.txt").read_text()
        assert re.search(r"serving http://127\.0\.0\.1:\d+/metrics", out), out[-2000:]
