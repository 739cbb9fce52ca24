"""The metrics dict per release: reshard keys, agent-loop keys, memory keys, throughput."""

from __future__ import annotations

import pytest

from monitor.sim.engine import SimRun
from monitor.sim.metrics import is_numpy_scalar


def _metrics(version: str) -> tuple[dict, dict]:
    run = SimRun(steps=3, gpus_per_node=2, verl_version=version, seed=4)
    st = run.steps[1]
    return st.metrics, {lab: b - a for lab, a, b in st.timeline if lab != "gap"}


def test_reshard_hidden_in_gen_before_041():
    m, d = _metrics("0.4.0")
    assert not any(k in m for k in ("timing_s/reshard", "timing_s/update_weights"))
    assert m["timing_s/gen"] == pytest.approx(d["gen"] + d["reshard"], abs=1e-6)


def test_reshard_nested_in_gen_041_to_05():
    for v in ("0.4.1", "0.5"):
        m, d = _metrics(v)
        assert m["timing_s/reshard"] == pytest.approx(d["reshard"], abs=1e-6)
        assert m["timing_s/generate_sequences"] == pytest.approx(d["gen"], abs=1e-6)
        assert m["timing_s/gen"] == pytest.approx(d["gen"] + d["reshard"], abs=1e-6)


def test_reshard_derived_from_agent_loop_in_06_070():
    for v in ("0.6", "0.7.0"):
        m, d = _metrics(v)
        assert "timing_s/update_weights" not in m and "timing_s/reshard" not in m
        derived = m["timing_s/gen"] - m["timing_s/agent_loop/slowest/generate_sequences"]
        assert derived == pytest.approx(d["reshard"], abs=1e-6)


def test_update_weights_from_071_and_memory_keys_move_in_08():
    m, d = _metrics("0.7.1")
    assert m["timing_s/update_weights"] == pytest.approx(d["reshard"], abs=1e-6)
    assert "perf/max_memory_allocated_gb" in m and "perf/mfu/actor_infer" in m
    m8, _ = _metrics("0.8")
    assert "actor/perf/max_memory_allocated_gb" in m8 and "perf/max_memory_allocated_gb" not in m8


def test_old_key_names_before_041():
    m, _ = _metrics("0.2")
    assert "mfu/actor" in m and "critic/kl" in m and "actor/entropy_loss" in m
    m, _ = _metrics("0.5")
    assert "perf/mfu/actor" in m and "actor/reward_kl_penalty" in m and "actor/entropy" in m


def test_throughput_is_tokens_per_second_per_gpu():
    m, _ = _metrics("0.7.1")
    assert m["perf/throughput"] == pytest.approx(
        m["perf/total_num_tokens"] / (m["timing_s/step"] * 2))
    assert m["global_seqlen/minmax_diff"] == m["global_seqlen/max"] - m["global_seqlen/min"]


def test_timers_are_python_numbers_other_metrics_numpy():
    assert not is_numpy_scalar("timing_s/gen")
    assert not is_numpy_scalar("training/global_step")
    assert is_numpy_scalar("actor/entropy")
