"""Regenerate prometheus/tests/straggler_alerts_test.yml from the simulator, scraped at 15 s.

Run from the repository root: ``.venv/bin/python prometheus/tests/make_straggler_test.py``.
Each of the 4 nodes is its own ``SimRun`` with seed 0, as the exporters run it. Each node's
exporter samples its GPUs every second and integrates them into the activity counters
(``verlmon_gpu_{sampled,busy,sm_active}_seconds_total``); Prometheus scrapes those every 15 s
(the shipped cadence), each node at its own offset within the 15 s, as Prometheus spreads its
targets. The alerts' annotations are filled in from what promtool computes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import yaml

from monitor.sim.engine import SimRun

OUT = Path("prometheus/tests/straggler_alerts_test.yml")
SCRAPE_S = 15
SAMPLES = 60  # 15 minutes of scrapes
ONSET_STEPS = 5
STRAGGLER_NODE = "n2"
#: seconds into each 15 s scrape period at which each node is scraped
OFFSETS = {"n0": 0, "n1": 4, "n2": 9, "n3": 13}
#: the straggler job's targets disappear after this many scrapes (the job ended)
GONE_AFTER = 50
RUNBOOK_BASE = "https://github.com/example/verl-monitor/blob/main/"
HEAD = """\
# promtool test rules prometheus/tests/straggler_alerts_test.yml
# Cross-node alerts on a simulated 4-node job (4 GPUs each, 30-second steps), from the
# exporters' activity counters scraped every 15 s as shipped (each node at its own offset), made
# by prometheus/tests/make_straggler_test.py: each node its own SimRun with seed 0 as the
# exporters run it. healthy: every node `healthy`; no cross-node alert in 15 minutes.
# straggler: n2 runs `gpu_imbalance` (one GPU busy, its peers waiting), the others
# `straggler_elsewhere` (every GPU waiting in the collectives). Only the straggler GPU is named,
# within 3 steps of the onset (the slowed steps take ~38 s), and stays firing; NodeImbalance
# stays quiet. When the job's targets disappear (stale), it resolves at the next evaluation.
"""


def _counters(run: SimRun) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per GPU: cumulative sampled, busy and SM-active seconds after each 1 s sample."""
    df = run.gpu_frame(1.0)
    out = {}
    for g, grp in df.groupby("gpu"):
        grp = grp.sort_values("ts")
        sm = np.nan_to_num(grp.sm_active.to_numpy(float) / 100)
        util = np.nan_to_num(grp.util.to_numpy(float) / 100)
        out[int(g)] = (np.arange(1, len(sm) + 1, dtype=float), np.cumsum(util), np.cumsum(sm))
    return out


def _values(cum: np.ndarray, offset: int, gone: int | None) -> str:
    """The counter as scraped every 15 s at ``offset``; ``stale`` once the target is gone."""
    idx = [min(offset + SCRAPE_S * k, len(cum) - 1) for k in range(SAMPLES)]
    vals = [f"{cum[i]:.2f}" for i in idx]
    if gone is not None:
        vals = vals[:gone] + ["stale"]
    return " ".join(vals)


def _input(job: str, nodes: dict[str, SimRun], gone: int | None = None) -> list[dict[str, str]]:
    rows = []
    names = ("verlmon_gpu_sampled_seconds_total", "verlmon_gpu_busy_seconds_total",
             "verlmon_gpu_sm_active_seconds_total")
    for node, run in nodes.items():
        inst = f'job="{job}",instance="{node}:9048",node="{node}"'
        up = " ".join(["1"] * (gone or SAMPLES)) + (" stale" if gone else "")
        rows.append({"series": f"up{{{inst}}}", "values": up})
        for g, series in _counters(run).items():
            for name, cum in zip(names, series, strict=True):
                rows.append({"series": f'{name}{{{inst},gpu="{g}"}}',
                             "values": _values(cum, OFFSETS[node], gone)})
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
            got[_seconds(m.group(1))] = {"description": g.group(1).replace("\\n", "\n"),
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
    three_steps = int(sum(s.total for s in slow.steps[ONSET_STEPS:ONSET_STEPS + 3]))
    onset_eval = (onset // SCRAPE_S) * SCRAPE_S  # the last evaluation before the onset
    gpu = slow.truth[0]["scope"]["gpus"][0]
    gone_s = GONE_AFTER * SCRAPE_S
    quiet = [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": []}
             for m in range(1, 15) for a in ("GPUStraggler", "NodeImbalance")]
    labels = {"job": "straggler", "instance": f"{STRAGGLER_NODE}:9048", "node": STRAGGLER_NODE,
              "gpu": str(gpu), "severity": "warning", "kind": "gpu_imbalance",
              "alertstate": "firing"}
    labels.pop("alertstate")
    fires = [{"eval_time": f"{onset_eval}s", "alertname": "GPUStraggler", "exp_alerts": []}]
    # within 3 steps of the onset, then at every evaluation until the targets go
    first = (onset + three_steps) // SCRAPE_S * SCRAPE_S
    fire_at = list(range(first, gone_s, SCRAPE_S))
    fires += [{"eval_time": f"{t}s", "alertname": "GPUStraggler",
               "exp_alerts": [{"exp_labels": dict(labels)}]} for t in fire_at]
    fires += [{"eval_time": f"{t}s", "alertname": "NodeImbalance", "exp_alerts": []}
              for t in range(onset_eval, gone_s, 60)]
    # the targets are gone: resolved at the next evaluation
    fires += [{"eval_time": f"{gone_s + SCRAPE_S}s", "alertname": a, "exp_alerts": []}
              for a in ("GPUStraggler", "NodeImbalance")]
    doc = {"rule_files": ["../rules/recording.yml", "../rules/alerts.yml"],
           "evaluation_interval": f"{SCRAPE_S}s",
           "tests": [{"interval": f"{SCRAPE_S}s", "external_labels": {"runbook_base": RUNBOOK_BASE},
                      "input_series": _input("healthy", healthy),
                      "alert_rule_test": quiet},
                     {"interval": f"{SCRAPE_S}s", "external_labels": {"runbook_base": RUNBOOK_BASE},
                      "input_series": _input("straggler", straggler, gone=GONE_AFTER),
                      "alert_rule_test": fires}]}

    def write() -> None:
        OUT.write_text(HEAD + yaml.safe_dump(doc, sort_keys=False, width=100000))

    write()
    got = _promtool_annotations()
    for check in fires:
        if check["exp_alerts"] and check["alertname"] == "GPUStraggler":
            check["exp_alerts"][0]["exp_annotations"] = got[_seconds(check["eval_time"])]
    write()
    print(f"onset {onset} s, 3 steps {three_steps} s: expected firing from {first} s")


if __name__ == "__main__":
    main()
