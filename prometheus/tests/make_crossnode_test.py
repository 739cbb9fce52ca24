"""Regenerate prometheus/tests/crossnode_alerts_test.yml: synthetic activity counters, 15 s.

Run from the repository root: ``.venv/bin/python prometheus/tests/make_crossnode_test.py``.
Each case is a small job whose counters grow at fixed rates (expanding series), so every
expected value can be checked by hand; the simulated jobs are in make_straggler_test.py.
"""

from __future__ import annotations

import yaml

S = 15
N = 40  # 10 minutes
RB = "https://github.com/example/verl-monitor/blob/main/"

def counters(job: str, node: str, gpu: int, sm: float, util: float, n: int = N,
             stale: bool = False) -> list[dict[str, str]]:
    """The three activity counters of one GPU: SM activity ``sm``, utilization ``util``."""
    lab = f'job="{job}",instance="{node}:9048",node="{node}",gpu="{gpu}"'
    tail = " stale" if stale else ""
    return [
        {"series": f"verlmon_gpu_sampled_seconds_total{{{lab}}}", "values": f"0+{S}x{n}{tail}"},
        {"series": f"verlmon_gpu_busy_seconds_total{{{lab}}}", "values": f"0+{S*util:g}x{n}{tail}"},
        {"series": f"verlmon_gpu_sm_active_seconds_total{{{lab}}}", "values": f"0+{S*sm:g}x{n}{tail}"},
    ]

def up(job: str, node: str, n: int = N, stale: bool = False) -> list[dict[str, str]]:
    """The target's ``up`` series (``stale`` once it is gone)."""
    return [{"series": f'up{{job="{job}",instance="{node}:9048",node="{node}"}}',
             "values": f"1x{n}" + (" stale" if stale else "")}]

series = []
groups = []
# slownode: 4 nodes x 2 GPUs; n2's GPUs 80% SM, the others wait at 50%; all 95% busy
for i in range(4):
    series += up("slownode", f"n{i}")
    for g in range(2):
        series += counters("slownode", f"n{i}", g, 0.8 if i == 2 else 0.5, 0.95)
# idle: a hung collective: every GPU 100% "utilized", SMs nearly idle; one GPU a bit above
for i in range(4):
    series += up("idle", f"n{i}")
    series += counters("idle", f"n{i}", 0, 0.2 if i == 1 else 0.05, 1.0)
# twonode: 2 nodes, n1 busier: no node to call slow against a single peer
for i in range(2):
    series += up("twonode", f"n{i}")
    for g in range(2):
        series += counters("twonode", f"n{i}", g, 0.8 if i == 1 else 0.5, 0.95)
groups.append(series)
series = []
# gone: the slownode picture, and the job's targets disappear after 5 minutes
for i in range(4):
    series += up("gone", f"n{i}", n=20, stale=True)
    for g in range(2):
        series += counters("gone", f"n{i}", g, 0.8 if i == 2 else 0.5, 0.95, n=20, stale=True)
groups.append(series)
series = []
# low utilization flags, on a node sampling every second whose steps spend 40% in training:
# lowutil (30 s steps: 12 samples per step in training, judged), lowutil_short (3 s steps, as
# a simulation at 10x: 1.2 samples, withheld), lowutil_straggler (a straggler explains it)
for job, steps in (("lowutil", 0.5), ("lowutil_short", 5), ("lowutil_straggler", 0.5)):
    lab = f'job="{job}",instance="n0:9048",node="n0"'
    series += [
        {"series": f'verlmon_flag_active{{{lab},kind="low_utilization",severity="warning"}}',
         "values": f"1x{N}"},
        # 30 log-seconds per step whatever the wall clock: 12 in training, 18 in generation
        {"series": f'verlmon_phase_seconds_total{{{lab},phase="update_actor"}}',
         "values": f"0+{12 * steps:g}x{N}"},
        {"series": f'verlmon_phase_seconds_total{{{lab},phase="gen"}}',
         "values": f"0+{18 * steps:g}x{N}"},
        {"series": f"verlmon_step_seconds_sum{{{lab}}}", "values": f"0+{30 * steps:g}x{N}"},
        {"series": f"verlmon_training_steps_total{{{lab}}}", "values": f"0+{steps:g}x{N}"},
        {"series": f'verlmon_gpu_samples_total{{{lab},gpu="0"}}', "values": f"0+{S}x{N}"},
    ]
for i in range(4):
    series += up("lowutil_straggler", f"n{i}")
    for g in range(4):
        series += counters("lowutil_straggler", f"n{i}", g, 0.8 if (i, g) == (3, 1) else 0.5, 0.95)

groups.append(series)
node_labels = {"job": "slownode", "node": "n2", "severity": "warning", "kind": "gpu_imbalance"}
node_ann = {
    "summary": "Node n2 is the slow node the other nodes of slownode wait for",
    "description": "Its GPUs' SMs were busy 80% of the last 2 minutes (its median GPU) while the job's median GPU was at 50% with the job busy: the other nodes spin in collectives waiting for this one.\nAdvice: Turn on trainer.balance_batch=True so each data-parallel rank gets a similar token count.\nIf it persists, compare this node's clocks, power limit, temperature and XID errors with its peers, and drain it.\nRunbook: " + RB + "docs/runbooks.md#nodeimbalance",
    "runbook_url": RB + "docs/runbooks.md#nodeimbalance",
}
lu_labels = {"job": "lowutil", "instance": "n0:9048", "node": "n0", "kind": "low_utilization", "severity": "warning"}
lu_ann = {
    "summary": "Low GPU utilization on n0 in lowutil",
    "description": "GPUs stay below the healthy range (85-95% while training; below 70% is a problem). Advice: raise actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu and actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu, enable actor_rollout_ref.model.use_remove_padding and actor_rollout_ref.actor.use_dynamic_bsz with a larger actor_rollout_ref.actor.ppo_max_token_len_per_gpu.\nRunbook: " + RB + "docs/runbooks.md#verllowutilization",
    "runbook_url": RB + "docs/runbooks.md#verllowutilization",
}
tests = []
by_group = [tests]
# the slow node: pending once the 2-minute rates exist, firing after 30 s, steady
tests.append({"eval_time": "15s", "alertname": "NodeImbalance", "exp_alerts": []})
for t in ("1m", "5m", "9m"):
    tests.append({"eval_time": t, "alertname": "NodeImbalance",
                  "exp_alerts": [{"exp_labels": {**node_labels}, "exp_annotations": node_ann}]})
    # its GPUs are one quarter of the job: none of them is a lone straggler; its peers are
    # below the median and never named
    tests.append({"eval_time": t, "alertname": "GPUStraggler", "exp_alerts": []})
tests = []
by_group.append(tests)
# gone: firing while up, resolved at the first evaluation after the targets go stale
gone = {**node_labels, "job": "gone"}
gone_ann = {**node_ann, "summary": node_ann["summary"].replace("of slownode", "of gone")}
tests.append({"eval_time": "4m45s", "alertname": "NodeImbalance",
              "exp_alerts": [{"exp_labels": gone, "exp_annotations": gone_ann}]})
tests.append({"eval_time": "5m15s", "alertname": "NodeImbalance", "exp_alerts": []})
tests = []
by_group.append(tests)
# lowutil fires; the short-phase and the straggler jobs stay quiet
tests.append({"eval_time": "30s", "alertname": "GPUStraggler", "exp_alerts": []})
tests.append({"eval_time": "5m", "alertname": "VerlLowUtilization",
              "exp_alerts": [{"exp_labels": lu_labels, "exp_annotations": lu_ann}]})
doc = {
    "rule_files": ["../rules/recording.yml", "../rules/alerts.yml"],
    "evaluation_interval": "15s",
    "tests": [{"interval": "15s", "external_labels": {"runbook_base": RB},
               "input_series": ser, "alert_rule_test": t}
              for ser, t in zip(groups, by_group, strict=True)],
}
HEAD = """\
# promtool test rules prometheus/tests/crossnode_alerts_test.yml
# Cross-node alerts on the exporters' activity counters, scraped every 15 s (made by
# prometheus/tests/make_crossnode_test.py with expanding series; the simulated jobs are in
# straggler_alerts_test.yml):
# - slownode: 4 nodes x 2 GPUs, n2's GPUs at 80% SM activity while the others wait at 50%, all
#   at 95% utilization: NodeImbalance names n2 (its GPUs are a quarter of the job, so none is a
#   lone GPUStraggler) and nobody else.
# - idle: a hung collective (100% utilization, SMs at 5%, one GPU at 20%): the busy guard
#   (median SM activity above 25%) keeps it quiet.
# - twonode: 2 nodes; with one peer there is no majority to call the other slow: quiet.
# - gone: the slownode picture whose targets disappear at 5m: resolved at the next evaluation.
# - lowutil*: a low_utilization flag pages, unless the node's training phases hold fewer than 3
#   samples per GPU per step (lowutil_short) or a straggler explains it (lowutil_straggler).
"""
open("prometheus/tests/crossnode_alerts_test.yml", "w").write(
    HEAD + yaml.safe_dump(doc, sort_keys=False, width=100000))
