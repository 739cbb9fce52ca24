"""The keys today's trainers log besides the classic ones: the agent loop and the fully-async
policy, named as verl's newest main writes them.

- Agent loop (``verl/experimental/agent_loop/agent_loop.py``, ``_performance_metrics``):
  ``timing_s/agent_loop/{generate_sequences,tool_calls,compute_score,num_preempted}/
  {min,max,mean}`` and ``timing_s/agent_loop/slowest/*``; the batch waits for its slowest sample.
- Fully-async trainer (``verl/experimental/fully_async_policy/``): ``timing_s/gen`` is the wait
  for samples from the message queue and ``fully_async/trainer/idle_ratio`` = gen / step
  (``detach_utils.MetricsAggregator``); ``timing_s/timing_s/param_sync`` the weight sync (the
  trainer names its timer ``timing_s/param_sync`` and ``compute_timing_metrics`` prefixes it
  again); the batch's
  ``fully_async/{processing_time,partial,count,monitor,static}/*`` (``assemble_batch_from_
  rollout_samples``, the rollouter's ``get_statistics``); the rollouter's ``reset_staleness``
  keys ``fully_async/rollouter/{active_time,version_time,idle_ratio,step_generated_samples}``
  (logged by verl as a second record of the same step; the simulator writes them on the step's
  line, as the JSONL reader merges them); ``dynamic_resource/*`` utilizations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monitor.sim.scenarios import StepPlan

#: Samples (prompts) per trainer step; each brings ``ROLLOUT_N`` trajectories.
ROLLOUT_N = 8


def agent_loop_timing(dur: dict[str, float], plan: StepPlan, r: np.ndarray, prompt_mean: float,
                      resp_max: float) -> dict[str, Any]:
    """``timing_s/agent_loop/*`` of one step of server-mode rollout (sync trainer).

    A sample's time is generation + tool calls + scoring; the slowest sample bounds gen.
    """
    eng = plan.engine
    slowest = dur["gen"]
    gen_part = 1.0 - eng.tool_share - eng.score_share
    out: dict[str, Any] = {}
    for name, share, lo in (("generate_sequences", gen_part, 0.06),
                            ("tool_calls", eng.tool_share, 0.3),
                            ("compute_score", eng.score_share, 0.5)):
        top = slowest * share
        out[f"timing_s/agent_loop/{name}/min"] = round(top * lo, 3)
        out[f"timing_s/agent_loop/{name}/max"] = round(top, 3)
        ratio = plan.slowest_ratio if name == "generate_sequences" else 0.8
        out[f"timing_s/agent_loop/{name}/mean"] = round(top * ratio * (1.0 + 0.02 * r[20]), 3)
    pre = eng.preempted_mean
    out["timing_s/agent_loop/num_preempted/min"] = 0
    out["timing_s/agent_loop/num_preempted/max"] = int(round(pre * 3))
    out["timing_s/agent_loop/num_preempted/mean"] = float(pre)
    out["timing_s/agent_loop/slowest/generate_sequences"] = round(slowest * gen_part, 3)
    out["timing_s/agent_loop/slowest/tool_calls"] = round(slowest * eng.tool_share, 3)
    out["timing_s/agent_loop/slowest/compute_score"] = round(slowest * eng.score_share, 3)
    out["timing_s/agent_loop/slowest/num_preempted"] = int(round(pre * 2))
    out["timing_s/agent_loop/slowest/prompt_length"] = int(prompt_mean * 1.2)
    out["timing_s/agent_loop/slowest/response_length"] = int(round(resp_max))
    return out


def fully_async_metrics(step: int, dur: dict[str, float], total: float, plan: StepPlan,
                        n_seqs: int, r: np.ndarray, state: dict[str, Any]) -> dict[str, Any]:
    """The fully-async trainer's own keys for one step (``trigger_parameter_sync_step`` 1, so
    every step is one sync cycle); ``state`` carries the run's counters between steps."""
    eng = plan.engine
    samples = max(1, n_seqs // ROLLOUT_N)
    wait = dur["gen"]
    gen_time = max(total - dur.get("reshard", 0.0), 1e-3)
    produced = samples + eng.dropped_per_step
    state["generated"] = state.get("generated", 0) + produced
    stale_traj = int(round(n_seqs * eng.stale_share))
    state["stale_traj"] = state.get("stale_traj", 0) + stale_traj
    state["dropped"] = state.get("dropped", 0) + eng.dropped_per_step
    partial = int(round(samples * min(1.0, eng.stale_share * 1.5)))
    busy = gen_time * (1.0 - eng.idle_share)
    m: dict[str, Any] = {}
    sample_s = gen_time * 0.45
    for key, q in (("avg", 0.55), ("max", 1.0), ("min", 0.08), ("tp50", 0.5), ("tp99", 0.97),
                   ("tp95", 0.9)):
        m[f"fully_async/processing_time/{key}"] = float(sample_s * q * (1.0 + 0.01 * r[27]))
    m["fully_async/monitor/active_tasks_size"] = int(0 if eng.idle_share else samples * 2)
    m["fully_async/monitor/queue/pending_queue_size"] = int(samples * 3)
    m["fully_async/monitor/queue/mq_queue_size"] = int(0 if wait > 0.2 * total else samples // 4)
    m["fully_async/count/total_generated_samples"] = int(state["generated"])
    m["fully_async/count/staleness_samples"] = int(samples * eng.stale_share)
    m["fully_async/count/dropped_stale_samples"] = int(state["dropped"])
    m["fully_async/static/max_required_samples"] = int(samples * 2)
    m["fully_async/static/required_samples"] = int(samples)
    m["fully_async/static/staleness_threshold"] = 1.0
    m["fully_async/static/max_queue_size"] = int(samples * 2)
    m["fully_async/static/max_concurrent_samples"] = int(samples * 2)
    m["fully_async/partial/total_partial_num"] = partial
    m["fully_async/partial/partial_ratio"] = float(partial / samples)
    m["fully_async/partial/max_partial_span"] = int(eng.partial_span if partial else 0)
    if eng.tool_share:
        for key, q in (("max", 1.0), ("min", 0.3), ("mean", 0.8)):
            m[f"timing_s/agent_loop/tool_calls/{key}"] = float(sample_s * eng.tool_share * q)
    m["fully_async/total_wait_time"] = float(wait)
    m["fully_async/count/stale_trajectory_processed"] = int(state["stale_traj"])
    m["fully_async/count/current_param_version"] = int(step)
    m["dynamic_resource/train_compute_time_s"] = float(sum(
        dur.get(p, 0.0) for p in ("reward", "old_log_prob", "ref", "values", "adv",
                                  "update_critic", "update_actor", "comm")))
    m["dynamic_resource/train_allocated_time_s"] = float(total)
    m["dynamic_resource/mq_size"] = m["fully_async/monitor/queue/mq_queue_size"]
    m["fully_async/rollouter/active_time"] = float(busy)
    m["fully_async/rollouter/version_time"] = float(gen_time)
    m["fully_async/rollouter/idle_ratio"] = float(eng.idle_share)
    m["fully_async/rollouter/step_generated_samples"] = int(produced)
    m["dynamic_resource/rollout_resource_utilization"] = float(
        (1.0 - eng.idle_share) * (0.97 if eng.saturated else 0.85))
    m["fully_async/trainer/idle_ratio"] = float(wait / total) if total > 0 else 0.0
    m["dynamic_resource/train_resource_utilization"] = float(
        m["dynamic_resource/train_compute_time_s"] / total) if total > 0 else 0.0
    return m


def separate_async_metrics(dur: dict[str, float], plan: StepPlan, n_seqs: int) -> dict[str, Any]:
    """The V1 separate-async trainer's own keys for one step (``trainer_separate_async.py``
    with ``hybrid_rollout.enable_switch``, ``trainer_base.py``, ``v1/utils.py``): the switch
    decision, the switch timers when the hybrid replicas were lent (parts of the wait, which
    ``timing_s/gen`` already counts), and the off-policy staleness of the batch."""
    eng = plan.engine
    wait = dur["gen"]
    groups = max(1, n_seqs // ROLLOUT_N)
    m: dict[str, Any] = {}
    if eng.switching:
        m["timing_s/switch_to_trainer"] = round(min(0.4, 0.1 * wait), 3)
        m["timing_s/switch_wait"] = round(0.4 * wait, 3)
        m["timing_s/switch_to_rollout"] = round(min(0.6, 0.1 * wait), 3)
    m["separate_async/switch/threshold_ratio"] = 0.45 if eng.switching else 0.4
    m["separate_async/switch/wait_samples"] = float(groups // 2 if eng.switching else 0)
    m["separate_async/switch/idle"] = float(eng.switching)
    m["separate_async/decision/sampleable_count"] = float(groups // 4 if eng.switching else groups)
    m["separate_async/decision/remaining"] = float(groups - groups // 4 if eng.switching else 0)
    m["separate_async/decision/should_switch_to_rollout"] = float(eng.switching)
    stale = eng.stale_share
    spans = max(1, eng.partial_span)
    worst = 1 + int(round(8 * max(0.0, stale - 0.3)))
    for name, mean, top in (("trajectory_spans", 1.0 + (spans - 1) * stale, spans),
                            ("trajectory_staleness", stale, max(1, worst - 1)),
                            ("trajectory_staleness_worst", stale * 1.5, worst)):
        m[f"training/off_policy/{name}/mean"] = float(mean)
        m[f"training/off_policy/{name}/max"] = int(top)
        m[f"training/off_policy/{name}/min"] = int(1 if name == "trajectory_spans" else 0)
    m["training/off_policy/evicted_samples"] = int(eng.dropped_per_step)
    return m
