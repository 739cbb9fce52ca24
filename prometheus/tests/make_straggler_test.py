"""Regenerate prometheus/tests/straggler_alerts_test.yml from the simulator, sampled every 10 s.

Run from the repository root: ``.venv/bin/python prometheus/tests/make_straggler_test.py``.
Each of the 4 nodes is its own ``SimRun`` with seed 0, as the exporters run it. The alerts'
annotations are filled in from what promtool computes (their numbers follow the window).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import yaml

from monitor.sim.engine import SimRun

OUT = Path("prometheus/tests/straggler_alerts_test.yml")
SAMPLE_S = 10.0
SAMPLES = 90  # 15 minutes
ONSET_STEPS = 5
STRAGGLER_NODE = "n2"
HEAD = """\
# promtool test rules prometheus/tests/straggler_alerts_test.yml
# GPUStraggler on a simulated 4-node job (4 GPUs each, sampled every 10 s, 30-second steps),
# made by prometheus/tests/make_straggler_test.py: each node its own SimRun with seed 0 as the
# exporters run it. healthy: every node `healthy`. straggler: n2 runs `gpu_imbalance` (one GPU
# busy, its peers waiting), the others `straggler_elsewhere` (every GPU waiting in the
# collectives). Healthy stays quiet 15 minutes (no cross-node alert); the straggler is named by
# node and GPU within 3 steps of the onset (the slowed steps take ~38 s) and stays firing;
# NodeImbalance and GPULagging stay quiet on it.
"""


def _series(run: SimRun) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    df = run.gpu_frame(SAMPLE_S)
    out = {}
    for g, grp in df.groupby("gpu"):
        grp = grp.sort_values("ts").head(SAMPLES)
        out[int(g)] = (np.round(grp.sm_active.to_numpy() / 100, 3),
                       np.round(grp.util.to_numpy() / 100, 3))
    return out


def _input(job: str, nodes: dict[str, SimRun]) -> list[dict[str, str]]:
    rows = []
    for node, run in nodes.items():
        for g, (sm, util) in _series(run).items():
            lab = f'job="{job}",instance="{node}:9048",node="{node}",gpu="{g}"'
            rows.append({"series": f"verlmon_gpu_sm_active_ratio{{{lab}}}",
                         "values": " ".join(map(str, sm))})
            rows.append({"series": f"verlmon_gpu_utilization_ratio{{{lab}}}",
                         "values": " ".join(map(str, util))})
    return rows


def _seconds(text: str) -> int:
    return sum(int(v) * {"h": 3600, "m": 60, "s": 1}[u]
               for v, u in re.findall(r"(\d+)([hms])", text))


def _promtool_annotations() -> dict[int, dict[str, str]]:
    """GPUStraggler annotations promtool got, by evaluation second (from its failure report)."""
    res = subprocess.run(["promtool", "test", "rules", str(OUT)], capture_output=True, text=True)
    got = {}
    for chunk in (res.stdout + res.stderr).split("alertname: ")[1:]:
        m = re.match(r"GPUStraggler, time: (\S+),", chunk)
        g = re.search(r'got:\[.*?description="(.*?)", runbook_url="(.*?)", summary="(.*?)"\}',
                      chunk, re.S)
        if m and g:
            got[_seconds(m.group(1))] = {"description": g.group(1),
                                         "runbook_url": g.group(2), "summary": g.group(3)}
    return got


def main() -> None:
    """Write the test file, run promtool once, write it again with the annotations."""
    healthy = {f"n{i}": SimRun("healthy:60", nodes=1, gpus_per_node=4, seed=0)
               for i in range(4)}
    straggler = {
        f"n{i}": SimRun(f"healthy:{ONSET_STEPS},"
                        f"{'gpu_imbalance' if f'n{i}' == STRAGGLER_NODE else 'straggler_elsewhere'}"
                        ":60", nodes=1, gpus_per_node=4, seed=0)
        for i in range(4)
    }
    slow = straggler[STRAGGLER_NODE]
    onset = int(slow.steps[ONSET_STEPS].start - slow.start_time)
    gpu = slow.truth[0]["scope"]["gpus"][0]
    quiet = [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": []}
             for m in range(1, 15, 2) for a in ("GPUStraggler", "NodeImbalance", "GPULagging")]
    labels = {"job": "straggler", "instance": f"{STRAGGLER_NODE}:9048", "node": STRAGGLER_NODE,
              "gpu": str(gpu), "severity": "warning", "kind": "gpu_imbalance"}
    fires = [{"eval_time": f"{onset - 10}s", "alertname": "GPUStraggler", "exp_alerts": []}]
    fire_at = [onset + d for d in (110, 200, 300, 400, 600)]
    fires += [{"eval_time": f"{t}s", "alertname": "GPUStraggler",
               "exp_alerts": [{"exp_labels": dict(labels)}]} for t in fire_at]
    fires += [{"eval_time": f"{t}s", "alertname": a, "exp_alerts": []}
              for t in (onset + 110, onset + 400) for a in ("NodeImbalance", "GPULagging")]
    doc = {"rule_files": ["../rules/recording.yml", "../rules/alerts.yml"],
           "evaluation_interval": "10s",
           "tests": [{"interval": "10s", "input_series": _input("healthy", healthy),
                      "alert_rule_test": quiet},
                     {"interval": "10s", "input_series": _input("straggler", straggler),
                      "alert_rule_test": fires}]}

    def write() -> None:
        OUT.write_text(HEAD + yaml.safe_dump(doc, sort_keys=False, width=100000))

    write()
    got = _promtool_annotations()
    for check in fires:
        if check["exp_alerts"]:
            check["exp_alerts"][0]["exp_annotations"] = got[_seconds(check["eval_time"])]
    write()


if __name__ == "__main__":
    main()
