"""The raw metrics dict verl logs for one step, keyed as the chosen release names them.

Key order follows the trainer's code path (data-parallel balance, critic and actor update
metrics, training counters, data metrics, timers, per-token timers, perf). Values drift the way
a real PPO run's do (entropy falls, score rises), with small noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monitor.sim.mode_keys import agent_loop_timing, fully_async_metrics, separate_async_metrics
from monitor.sim.scenarios import StepPlan
from monitor.sim.versions import VersionProfile

GIB = 1024.0**3
#: Keys verl holds as Python numbers (timers, counters); the rest are numpy scalars.
_PYTHON_PREFIXES: tuple[str, ...] = (
    "timing_s/",
    "timing_per_token_ms/",
    "training/",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
)


def is_numpy_scalar(key: str) -> bool:
    """Whether verl holds this metric as a numpy scalar (matters for 0.9's repr)."""
    return not key.startswith(_PYTHON_PREFIXES)


def timing_keys(
    profile: VersionProfile, dur: dict[str, float], total: float, with_rollout_wait: bool,
    mode: str = "sync",
) -> dict[str, float]:
    """``timing_s/*`` for one step from the timeline durations (seconds, ms-exact). The
    fully-async trainer's ``gen`` is its wait for samples and its weight sync ``param_sync``
    (logged as ``timing_s/timing_s/param_sync``: the timer's name already has the prefix)."""
    out: dict[str, float] = {}
    gen = dur["gen"]
    reshard = dur["reshard"]
    if mode in ("fully_async", "separate_async"):
        out["timing_s/gen"] = gen
    elif profile.reshard == "none":
        out["timing_s/gen"] = _ms(gen + reshard)
    elif profile.reshard == "nested":
        out["timing_s/gen"] = _ms(gen + reshard)
        out["timing_s/reshard"] = reshard
        out["timing_s/generate_sequences"] = gen
    elif profile.reshard == "derived":
        out["timing_s/gen"] = _ms(gen + reshard)
    else:
        out["timing_s/gen"] = gen
    if with_rollout_wait:
        out["timing_s/rollout_wait"] = dur.get("rollout_wait", 0.0)
    out["timing_s/reward"] = dur["reward"]
    out["timing_s/old_log_prob"] = dur["old_log_prob"]
    out["timing_s/ref"] = dur["ref"]
    out["timing_s/values"] = dur["values"]
    out["timing_s/adv"] = dur["adv"]
    out["timing_s/update_critic"] = dur["update_critic"]
    out["timing_s/update_actor"] = _ms(dur["update_actor"] + dur["comm"])
    if mode == "fully_async":
        # verl times it as "timing_s/param_sync" and compute_timing_metrics prefixes it again
        out["timing_s/timing_s/param_sync"] = reshard
    elif profile.reshard == "update_weights" or mode == "separate_async":
        out["timing_s/update_weights"] = reshard
    out["timing_s/step"] = total
    return out


def _ms(x: float) -> float:
    return round(x, 3)


def build_metrics(
    profile: VersionProfile,
    step: int,
    n_steps: int,
    dur: dict[str, float],
    total: float,
    plan: StepPlan,
    n_gpus: int,
    rng: np.random.Generator,
    with_rollout_wait: bool,
    steps_per_epoch: int = 1000,
    mode: str = "sync",
    mode_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every key the trainer logs for ``step`` (1-based), in code-path order. ``mode`` is the
    trainer mode (``monitor/sim/mode_keys.py`` adds today's agent-loop and fully-async keys);
    ``mode_state`` carries the fully-async counters from step to step."""
    progress = step / max(n_steps, 1)
    r = rng.standard_normal(32)
    prompt_mean = 118.0 + 2.0 * r[0]
    resp_mean = plan.response_mean * (1.0 + 0.08 * progress) + 6.0 * r[1]
    resp_max = plan.response_max if plan.response_max >= 4096 else plan.response_max + 60 * r[2]
    batch = 64 * n_gpus  # sequences per step (prompts x rollout.n)
    tokens = int(batch * (prompt_mean + resp_mean) * plan.tokens_factor)
    per_rank = tokens / n_gpus
    m: dict[str, Any] = {}
    m["global_seqlen/min"] = int(per_rank * (0.965 + 0.005 * r[3]))
    m["global_seqlen/max"] = int(per_rank * (1.035 + 0.005 * r[4]))
    m["global_seqlen/minmax_diff"] = m["global_seqlen/max"] - m["global_seqlen/min"]
    m["global_seqlen/balanced_min"] = int(per_rank * 0.998)
    m["global_seqlen/balanced_max"] = int(per_rank * 1.002) + 1
    m["global_seqlen/mean"] = float(per_rank)
    m["critic/vf_loss"] = float(0.08 * np.exp(-2.0 * progress) + 0.01 + 0.004 * abs(r[5]))
    m["critic/vf_clipfrac"] = float(0.002 + 0.001 * abs(r[6]))
    m["critic/vpred_mean"] = float(0.2 + 0.5 * progress + 0.02 * r[7])
    m["critic/grad_norm"] = float(3.0 + 0.6 * abs(r[8]))
    m["critic/lr"] = 1e-05
    m["actor/pg_loss"] = float(-0.01 + 0.02 * r[9])
    m["actor/pg_clipfrac"] = float(0.003 + 0.001 * abs(r[10]))
    m["actor/ppo_kl"] = float(0.0005 * r[11])
    m["actor/pg_clipfrac_lower"] = 0.0
    m[profile.entropy_key] = float(0.55 - 0.2 * progress + 0.01 * r[12])
    m["actor/kl_loss"] = float(0.001 + 0.004 * progress + 0.0003 * abs(r[13]))
    m["actor/kl_coef"] = 0.001
    m["actor/grad_norm"] = float(0.25 + 0.05 * abs(r[14]))
    m["actor/lr"] = 1e-06
    if profile.memory_prefix == "actor/perf/":
        _memory(m, "actor/perf/", plan, r)
    m["training/global_step"] = int(step)
    m["training/epoch"] = int((step - 1) // steps_per_epoch)
    score = float(min(0.95, 0.45 + 0.4 * progress + 0.02 * r[15]))
    m[profile.kl_key] = float(0.0008 * abs(r[16]))
    m[profile.kl_key + "_coeff"] = 0.001
    for name, mean, spread in (
        ("critic/score", score, 1.0),
        ("critic/rewards", score - 0.001, 1.0),
        ("critic/advantages", 0.0, 3.2),
        ("critic/returns", score - 0.02, 1.0),
        ("critic/values", m["critic/vpred_mean"], 1.1),
    ):
        m[f"{name}/mean"] = float(mean)
        m[f"{name}/max"] = float(mean + spread * (0.7 + 0.05 * abs(r[17])))
        m[f"{name}/min"] = float(mean - spread * (0.7 + 0.05 * abs(r[18])))
    m["critic/vf_explained_var"] = float(min(0.95, 0.2 + 0.6 * progress + 0.03 * r[26]))
    m["response_length/mean"] = float(resp_mean)
    m["response_length/max"] = float(round(resp_max))
    m["response_length/min"] = float(round(max(8.0, 40 + 8 * r[19])))
    m["response_length/clip_ratio"] = float(plan.clip_ratio)
    if profile.aborted_ratio:
        m["response_length_non_aborted/mean"] = float(resp_mean)
        m["response_length_non_aborted/max"] = float(round(resp_max))
        m["response_length_non_aborted/min"] = m["response_length/min"]
        m["response_length_non_aborted/clip_ratio"] = float(plan.clip_ratio)
        m["response/aborted_ratio"] = 0.0
    m["prompt_length/mean"] = float(prompt_mean)
    m["prompt_length/max"] = float(round(prompt_mean * 2.1))
    m["prompt_length/min"] = float(round(prompt_mean * 0.45))
    m["prompt_length/clip_ratio"] = 0.0
    if profile.agent_loop:
        m["num_turns/min"] = 2
        m["num_turns/max"] = 2
        m["num_turns/mean"] = 2.0
    timing: dict[str, Any] = {}
    if mode == "agent_loop":
        timing.update(agent_loop_timing(dur, plan, r, prompt_mean, resp_max))
    elif profile.agent_loop and mode == "sync":
        slowest = dur["gen"]
        timing["timing_s/agent_loop/generate_sequences/min"] = round(slowest * 0.06, 3)
        timing["timing_s/agent_loop/generate_sequences/max"] = slowest
        timing["timing_s/agent_loop/generate_sequences/mean"] = round(
            slowest * plan.slowest_ratio * (1.0 + 0.02 * r[20]), 3
        )
        timing["timing_s/agent_loop/tool_calls/min"] = 0.0
        timing["timing_s/agent_loop/tool_calls/max"] = 0.0
        timing["timing_s/agent_loop/tool_calls/mean"] = 0.0
        timing["timing_s/agent_loop/slowest/generate_sequences"] = slowest
        timing["timing_s/agent_loop/slowest/tool_calls"] = 0.0
        timing["timing_s/agent_loop/slowest/prompt_length"] = int(prompt_mean * 1.2)
        timing["timing_s/agent_loop/slowest/response_length"] = int(round(resp_max))
    timing.update(timing_keys(profile, dur, total, with_rollout_wait, mode))
    m.update(timing)
    n_resp = batch * resp_mean
    n_all = tokens
    m["timing_per_token_ms/gen"] = timing["timing_s/gen"] * 1000.0 / n_resp
    m["timing_per_token_ms/ref"] = dur["ref"] * 1000.0 / n_all
    m["timing_per_token_ms/values"] = dur["values"] * 1000.0 / n_all
    m["timing_per_token_ms/adv"] = dur["adv"] * 1000.0 / n_all
    m["timing_per_token_ms/update_critic"] = dur["update_critic"] * 1000.0 / n_all
    m["timing_per_token_ms/update_actor"] = timing["timing_s/update_actor"] * 1000.0 / n_all
    m["perf/total_num_tokens"] = tokens
    m["perf/time_per_step"] = total
    m["perf/throughput"] = tokens / (total * n_gpus)
    m[profile.mfu_key] = float(0.32 * _mfu_scale(plan) + 0.01 * r[21])
    if profile.mfu_infer:
        m["perf/mfu/actor_infer"] = float(0.21 * _mfu_scale(plan) + 0.01 * r[22])
    if profile.memory_prefix == "perf/":
        _memory(m, "perf/", plan, r)
    if mode == "fully_async":
        m.update(fully_async_metrics(step, dur, total, plan, batch, r,
                                     mode_state if mode_state is not None else {}))
    elif mode == "separate_async":
        m.update(separate_async_metrics(dur, plan, batch))
    return m


def _mfu_scale(plan: StepPlan) -> float:
    if plan.training_override is not None:
        return 0.15
    if plan.training_scale is not None:
        return plan.training_scale[1]
    return 1.0


def _memory(m: dict[str, Any], prefix: str, plan: StepPlan, r: np.ndarray) -> None:
    total_gib = 150_754_820_096 / GIB
    level = plan.mem_train if plan.mem_train is not None else 0.74
    reserved = (level - 0.015 + 0.003 * r[23]) * total_gib
    m[f"{prefix}max_memory_allocated_gb"] = float(reserved * (0.9 + 0.01 * r[24]))
    m[f"{prefix}max_memory_reserved_gb"] = float(reserved)
    m[f"{prefix}cpu_memory_used_gb"] = float(212.0 + 3.0 * r[25])
