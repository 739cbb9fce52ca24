"""monitor/sim/mode_keys.py through SimRun: today's trainers write the keys verl's newest main writes
(agent_loop.py's ``_performance_metrics``; the fully-async trainer's and rollouter's keys)."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.logs.canonical_records import parse_file
from monitor.sim.engine import SimRun
from monitor.sim.scenarios import UnknownScenario

AGENT_LOOP_KEYS = {
    f"timing_s/agent_loop/{name}/{stat}"
    for name in ("generate_sequences", "tool_calls", "compute_score", "num_preempted")
    for stat in ("min", "max", "mean")
} | {f"timing_s/agent_loop/slowest/{name}" for name in (
    "generate_sequences", "tool_calls", "compute_score", "num_preempted", "prompt_length",
    "response_length")}
FULLY_ASYNC_KEYS = {
    "timing_s/gen", "timing_s/step", "timing_s/timing_s/param_sync",
    "fully_async/trainer/idle_ratio",
    "fully_async/rollouter/idle_ratio", "fully_async/rollouter/active_time",
    "fully_async/rollouter/version_time", "fully_async/rollouter/step_generated_samples",
    "fully_async/count/total_generated_samples", "fully_async/count/staleness_samples",
    "fully_async/count/dropped_stale_samples", "fully_async/count/stale_trajectory_processed",
    "fully_async/count/current_param_version", "fully_async/partial/total_partial_num",
    "fully_async/partial/partial_ratio", "fully_async/partial/max_partial_span",
    "fully_async/processing_time/avg", "fully_async/processing_time/tp99",
    "fully_async/total_wait_time", "fully_async/monitor/queue/mq_queue_size",
    "fully_async/static/staleness_threshold", "dynamic_resource/rollout_resource_utilization",
    "dynamic_resource/train_resource_utilization",
}


def _segment(run: SimRun, scenario: str) -> list:
    return [st for st in run.steps if st.scenario == scenario]


def test_the_mode_comes_from_the_scenarios_and_a_script_cannot_mix_them():
    assert SimRun("healthy", steps=4).mode == "sync"
    assert SimRun("kv_cache_preemption", steps=6).mode == "agent_loop"
    run = SimRun("pool_imbalance", steps=6)
    assert run.mode == "fully_async"
    assert [s for s, _ in run.script] == ["healthy", "pool_imbalance"]  # healthy, fully async
    assert SimRun("io_starvation", steps=6, mode="agent_loop").mode == "agent_loop"
    with pytest.raises(UnknownScenario, match="cannot mix trainer modes"):
        SimRun("pool_imbalance:3,generation_tail:3")
    with pytest.raises(ValueError, match="verl 0.6 or later"):
        SimRun("fully_async", steps=4, verl_version="0.5")


def test_sync_runs_keep_the_classic_keys():
    m = SimRun("healthy", steps=3).steps[-1].metrics
    assert "timing_s/update_weights" in m and "timing_s/agent_loop/compute_score/mean" not in m
    assert not any(k.startswith("fully_async/") for k in m)


def test_agent_loop_writes_every_agent_loop_timer():
    run = SimRun("agent_loop_demo", seed=2)
    for st in run.steps:
        assert AGENT_LOOP_KEYS <= set(st.metrics)
        # the batch waits for its slowest sample: generation + tools + scoring = gen
        m = st.metrics
        slowest = sum(m[f"timing_s/agent_loop/slowest/{k}"]
                      for k in ("generate_sequences", "tool_calls", "compute_score"))
        assert slowest == pytest.approx(m["timing_s/gen"], abs=0.01)
    pre = [st.metrics["timing_s/agent_loop/num_preempted/mean"]
           for st in _segment(run, "kv_cache_preemption")]
    assert min(pre) > 1.0
    assert all(st.metrics["timing_s/agent_loop/num_preempted/mean"] == 0
               for st in _segment(run, "agent_loop"))
    over = _segment(run, "agent_loop_overhead")[-1].metrics
    tools = over["timing_s/agent_loop/tool_calls/mean"]
    score = over["timing_s/agent_loop/compute_score/mean"]
    assert tools + score > over["timing_s/agent_loop/generate_sequences/mean"]


def test_fully_async_gen_is_the_wait_for_samples_and_idle_ratio_is_gen_over_step():
    run = SimRun("fully_async_demo", seed=1)
    for st in run.steps:
        m = st.metrics
        assert FULLY_ASYNC_KEYS <= set(m), FULLY_ASYNC_KEYS - set(m)
        assert "timing_s/update_weights" not in m
        assert m["fully_async/trainer/idle_ratio"] == pytest.approx(
            m["timing_s/gen"] / m["timing_s/step"], rel=1e-6)
    healthy = np.median([st.metrics["fully_async/trainer/idle_ratio"]
                         for st in _segment(run, "fully_async")])
    waiting = np.median([st.metrics["fully_async/trainer/idle_ratio"]
                         for st in _segment(run, "pool_imbalance")])
    assert healthy < 0.12 and 0.5 < waiting < 0.6
    idle = _segment(run, "rollouter_idle")
    assert all(st.metrics["fully_async/rollouter/idle_ratio"] == pytest.approx(0.45)
               and st.metrics["fully_async/trainer/idle_ratio"] < 0.02 for st in idle)
    sync = [st.metrics["timing_s/timing_s/param_sync"]
            for st in _segment(run, "weight_sync_pause")]
    base = [st.metrics["timing_s/timing_s/param_sync"] for st in _segment(run, "fully_async")]
    assert np.median(sync) > 6 * np.median(base)


def test_fully_async_counters_climb_and_staleness_grows_in_its_segment():
    run = SimRun("fully_async_demo", seed=1)
    total = [st.metrics["fully_async/count/total_generated_samples"] for st in run.steps]
    traj = [st.metrics["fully_async/count/stale_trajectory_processed"] for st in run.steps]
    assert total == sorted(total) and traj == sorted(traj)
    stale = _segment(run, "stale_samples")
    dropped = [st.metrics["fully_async/count/dropped_stale_samples"] for st in stale]
    assert dropped[-1] - dropped[0] == 12 * (len(stale) - 1)
    ratio = [st.metrics["fully_async/partial/partial_ratio"] for st in stale]
    assert ratio == sorted(ratio) and ratio[-1] > 0.9
    assert all(st.metrics["fully_async/partial/max_partial_span"] == 3 for st in stale)


def test_the_fully_async_trainer_idles_on_its_gpus_while_it_waits():
    run = SimRun("pool_imbalance", steps=8, seed=3, step_seconds=12)
    st = run.steps[-1]
    a, b = st.phases["gen"]
    util = [g["util"] for g in run.gpu_sample_at((a + b) / 2)]
    assert max(util) < 15
    a, b = st.phases["update_actor"]
    assert min(g["util"] for g in run.gpu_sample_at((a + b) / 2)) > 80


def test_the_parser_reads_the_fully_async_log_with_gen_as_the_wait(tmp_path):
    run = SimRun("pool_imbalance", steps=8, seed=3)
    run.write(tmp_path)
    parsed = parse_file(tmp_path / "train.log", log_end=run.log_end_time)
    assert [s.step for s in parsed.steps] == [st.step for st in run.steps]
    last = parsed.steps[-1]
    assert last.phases["gen"] == pytest.approx(run.steps[-1].metrics["timing_s/gen"], abs=1e-3)
    assert last.metrics["fully_async/trainer/idle_ratio"] > 0.5


def test_v1_separate_async_writes_its_switch_decision_and_off_policy_keys():
    run = SimRun("separate_async_demo", seed=1)
    assert run.mode == "separate_async"
    for st in run.steps:
        m = st.metrics
        assert {"timing_s/gen", "timing_s/update_weights", "separate_async/switch/idle",
                "separate_async/decision/should_switch_to_rollout",
                "training/off_policy/trajectory_staleness_worst/max",
                "training/off_policy/evicted_samples"} <= set(m)
        assert "timing_s/timing_s/param_sync" not in m
        assert not any(k.startswith("fully_async/") for k in m)
    wait = _segment(run, "separate_async_wait")
    ok = _segment(run, "separate_async")
    share = [st.metrics["timing_s/gen"] / st.metrics["timing_s/step"] for st in wait]
    assert min(share) > 0.5 and max(st.metrics["timing_s/gen"] / st.metrics["timing_s/step"]
                                    for st in ok) < 0.12
    # the switch lends the hybrid replicas only while the trainer waits
    assert all(st.metrics["separate_async/switch/idle"] == 1.0
               and st.metrics["timing_s/switch_wait"] < st.metrics["timing_s/gen"] for st in wait)
    assert all("timing_s/switch_wait" not in st.metrics for st in ok)
    evicted = _segment(run, "separate_async_evictions")
    assert all(st.metrics["training/off_policy/evicted_samples"] == 16 for st in evicted)
    worst = [st.metrics["training/off_policy/trajectory_staleness_worst/max"] for st in evicted]
    assert worst == sorted(worst) and worst[-1] >= 5
