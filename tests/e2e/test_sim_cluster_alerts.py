"""A simulated 5-node job scraped by a real Prometheus with the repository's rules: only the
driver (node0) follows the verl log. A slow node (node3, not the driver: its GPUs keep doing
the full work while every other node's GPUs wait for it in the collectives, the signature
measured on H200s) is named by NodeImbalance and stays firing; the waiting nodes are never
named and raise no flag; every node's GPUs get per-phase counters from the driver's timeline.
(A slow GPU is covered by the promtool tests, and in real time by the second test here; the
shipped 15 s cadence by test_pages_shipped_cadence.py.)

Every node runs its own simulator, all with the same seed and started together, so their steps
run the same phases at about the same time as a real job's nodes do (with different seeds each
node would validate and checkpoint at its own moments, which no real job does). The others get
the scenario's log written but not followed (``--no-collector.verl_log``), which is what a node
without the log sees. 10x simulated speed: a 30 s step takes 3 s.
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
from procs import RULES_DIR, free_port, start_prometheus, stop_all

pytestmark = pytest.mark.e2e

CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
#: node -> (scenario script, follows the log)
NODES = {
    # scripts, so the run outlasts the test; the others wait for node3 from step 3 on
    "node0": ("healthy:2,straggler_elsewhere:400", True),
    "node1": ("healthy:2,straggler_elsewhere:400", False),
    "node2": ("healthy:2,straggler_elsewhere:400", False),
    # the whole node slow: its SMs stay busy (~63%) while the others wait at ~0.58x
    "node3": ("healthy:400", False),
    "node4": ("healthy:2,straggler_elsewhere:400", False),
}


def _start_exporter(tmp_path: Path, node: str, scenario: str, follows: bool, port: int,
                    seed: int, driver: str, speed: float = 10) -> subprocess.Popen:
    d = tmp_path / node
    d.mkdir(parents=True)
    argv = [CLI, "exporter", "--listen-address", f"127.0.0.1:{port}", "--node", node,
            "--gpu-backend", "sim", "--scenario", scenario, "--sim-gpus", "4",
            "--seed", str(seed), "--sim-log", str(d / "train.log"), "--sim-speed", f"{speed:g}",
            "--interval", "1", "--detect-interval", "5", "--no-collector.nccl"]
    if not follows:  # no log here: the driver's phase timeline comes from its /metrics
        argv += ["--no-collector.verl_log", "--phase-source", driver]
    return subprocess.Popen(argv, stdout=(d / "out.txt").open("w"),
                            stderr=subprocess.STDOUT, cwd=d,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_slow_node_is_named_and_the_nodes_waiting_for_it_are_not(tmp_path):
    ports = {node: free_port() for node in NODES}
    driver = f"http://127.0.0.1:{ports['node0']}/metrics"
    procs = [_start_exporter(tmp_path, node, sc, follows, ports[node], 0, driver)
             for node, (sc, follows) in NODES.items()]
    cfg = yaml.safe_dump({
        "global": {"scrape_interval": "2s", "evaluation_interval": "1s", "scrape_timeout": "2s"},
        "rule_files": [str(RULES_DIR / "recording.yml"), str(RULES_DIR / "alerts.yml")],
        "scrape_configs": [{"job_name": "grpo", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"node": n}} for n in NODES]}],
    })
    seen: dict[tuple[str, str, str], set[str]] = {}  # (alert, node, gpu) -> states
    late: set[tuple[str, str, str]] = set()  # seen after the first minute's few samples
    t0 = time.monotonic()
    try:
        with start_prometheus(tmp_path / "prom", config_text=cfg) as prom:
            # the 2-minute rates must fill with the slowed steps (~75 s here), on a busy
            # machine later
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                for a in prom.alerts():
                    lab = a["labels"]
                    if lab["alertname"] in ("NodeImbalance", "GPULagging", "GPUStraggler"):
                        key = (lab["alertname"], lab.get("node", ""), lab.get("gpu", ""))
                        seen.setdefault(key, set()).add(a["state"])
                        if time.monotonic() - t0 > 60:
                            late.add(key)
                firing = {k for k, states in seen.items() if "firing" in states}
                if any(k[:2] == ("NodeImbalance", "node3") for k in firing):
                    break
                for p in procs:
                    assert p.poll() is None, "an exporter died"
                time.sleep(1)
            up = prom.query('up{job="grpo"} == 1')
            assert sorted(r["metric"]["node"] for r in up) == sorted(NODES)
            # the slow node is named
            firing = {k for k, states in seen.items() if "firing" in states}
            assert ("NodeImbalance", "node3", "") in firing, seen
            # nobody else fires; nobody else is even pending once the 2-minute averages hold
            # more than a few steps
            others = {k for k in seen if k[:2] != ("NodeImbalance", "node3")}
            assert not any("firing" in seen[k] for k in others), seen
            assert others & late == set(), seen
            # still firing a while later: no flapping
            time.sleep(10)
            now = {(a["labels"]["alertname"], a["labels"].get("node")) for a in prom.alerts()
                   if a["state"] == "firing"}
            assert ("NodeImbalance", "node3") in now
            # nodes without the log raised no low_utilization flag at any time (the driver's
            # own flags are not judged here: at 10x the log's phase seconds are simulated
            # seconds while its samples are wall-clock)
            flags = prom.query('max_over_time(verlmon_flag_active{kind="low_utilization",'
                               'node!="node0"}[10m]) == 1')
            assert [r["metric"]["node"] for r in flags] == [], flags
            # ... nor any warning or critical flag on the waiting ones
            bad = prom.query('max_over_time(verlmon_flag_active{node=~"node[124]",'
                             'severity=~"warning|critical"}[10m]) == 1')
            assert bad == [], [r["metric"] for r in bad]
            # every node's GPUs are attributed to the driver's phases
            attributed = prom.query('count by (node) (verlmon_phase_gpu_sm_active_seconds_total'
                                    '{phase="update_actor"} > 0)')
            assert sorted(r["metric"]["node"] for r in attributed) == sorted(NODES)
            assert all(float(r["value"][1]) == 4 for r in attributed)  # one series per GPU
    finally:
        stop_all(procs)
    for node in NODES:
        out = (tmp_path / node / "out.txt").read_text()
        assert re.search(r"serving http://127\.0\.0\.1:\d+/metrics", out), out[-2000:]


#: Slow GPU: the straggler's node runs `gpu_imbalance` (one GPU busy, its node peers waiting in
#: collectives), every other node `straggler_elsewhere` (all its GPUs waiting), as a data-
#: parallel job does: every rank waits for the slowest. Real time (1x: 30 s steps, ~38 s once
#: slowed), since the rule's windows are wall-clock minutes. The onset is step 4.
GPU_ONSET_STEP = 4
GPU_NODES = {
    "node0": (f"healthy:{GPU_ONSET_STEP - 1},straggler_elsewhere:400", True),
    "node1": (f"healthy:{GPU_ONSET_STEP - 1},straggler_elsewhere:400", False),
    "node2": (f"healthy:{GPU_ONSET_STEP - 1},straggler_elsewhere:400", False),
    "node3": (f"healthy:{GPU_ONSET_STEP - 1},gpu_imbalance:400", False),
}
#: Steps after the onset the alert may take, and steps it must then keep firing through.
WITHIN_STEPS = 3
HOLD_STEPS = 2


def _alerts_by_key(prom) -> dict[tuple[str, str, str], str]:
    """(alertname, node, gpu) -> state of the cross-node alerts now."""
    return {(a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("gpu", "")):
            a["state"] for a in prom.alerts()
            if a["labels"]["alertname"] in ("GPUStraggler", "NodeImbalance", "GPULagging")}


def test_slow_gpu_on_a_node_without_the_log_is_named_within_three_steps_and_stays(tmp_path):
    from monitor.sim.engine import SimRun

    scenario, _ = GPU_NODES["node3"]
    truth = SimRun(scenario, nodes=1, gpus_per_node=4, seed=0).truth[0]["scope"]
    slow = ("GPUStraggler", "node3", str(truth["gpus"][0]))
    ports = {node: free_port() for node in GPU_NODES}
    driver = f"http://127.0.0.1:{ports['node0']}/metrics"
    cfg = yaml.safe_dump({
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s", "scrape_timeout": "2s"},
        "rule_files": [str(RULES_DIR / "recording.yml"), str(RULES_DIR / "alerts.yml")],
        "scrape_configs": [{"job_name": "grpo", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"node": n}} for n in GPU_NODES]}],
    })
    procs = []
    states: list[tuple[int, dict]] = []  # (driver's last step, alerts) every poll
    try:
        with start_prometheus(tmp_path / "prom", config_text=cfg) as prom:
            procs = [_start_exporter(tmp_path, node, sc, follows, ports[node], 0, driver,
                                     speed=1)
                     for node, (sc, follows) in GPU_NODES.items()]
            last_step = GPU_ONSET_STEP - 1 + WITHIN_STEPS + HOLD_STEPS
            deadline = time.monotonic() + 60 + 40 * last_step
            step = 0
            while time.monotonic() < deadline and step < last_step:
                got = prom.query('verlmon_training_step{node="node0"}')
                step = int(float(got[0]["value"][1])) if got else 0
                states.append((step, _alerts_by_key(prom)))
                for p in procs:
                    assert p.poll() is None, "an exporter died"
                time.sleep(2)
            assert step >= last_step, f"the driver reached step {step} only"
            firing_at = [s for s, a in states if a.get(slow) == "firing"]
            assert firing_at, f"{slow} never fired: {states[-1]}"
            print(f"{slow} firing from the driver's step {firing_at[0]} (onset: step "
                  f"{GPU_ONSET_STEP}) through step {states[-1][0]}")
            # named by node and GPU within 3 steps of the onset (step N's line ends step N)
            assert firing_at[0] <= GPU_ONSET_STEP - 1 + WITHIN_STEPS, states
            # and it stays: firing at every look from then on (no resolve and re-fire)
            first = next(i for i, (_, a) in enumerate(states) if a.get(slow) == "firing")
            assert all(a.get(slow) == "firing" for _, a in states[first:]), states[first:]
            # nobody else is named
            others = {k for _, a in states for k, v in a.items() if k != slow and v == "firing"}
            assert others == set(), others
            # the straggler's node has the per-phase GPU counters of the driver's timeline
            attributed = prom.query('count(verlmon_phase_gpu_sm_active_seconds_total'
                                    '{node="node3",phase="update_actor"} > 0)')
            assert attributed and float(attributed[0]["value"][1]) == 4
            # the pages read the same verdict: the firing alert as an open flag naming node3's
            # GPU, with the alert's own advice (verl keys) and runbook link
            from dashboards.sources.base import mark_outliers
            from dashboards.sources.prometheus import PrometheusSource

            src = PrometheusSource(prom.url)
            try:
                named = [f for f in src.flags(active_only=True) if f.kind == "GPUStraggler"]
                marked = mark_outliers(src.node_summary(time.time() - 300, time.time()), named)
            finally:
                src.close()
            assert [(f.kind, f.scope) for f in named] == [
                ("GPUStraggler", {"node": "node3", "gpus": [int(slow[2])]})], named
            assert any("trainer.balance_batch" in a for a in named[0].advice), named
            assert any("docs/runbooks.md#gpustraggler" in a for a in named[0].advice), named
            assert list(marked[marked["outlier"]]["node"]) == ["node3"], marked
    finally:
        stop_all(procs)
