"""monitor/sim/rollout_engines.py: what each simulated engine server reports at any instant."""

from __future__ import annotations

import pytest

from monitor.frames import ROLLOUT_COLUMNS
from monitor.sim.engine import SimRun
from monitor.sim.rollout_engines import ROLLOUT_STATE_KEYS, RolloutSim


def _at(run: SimRun, step: int, phase: str, frac: float = 0.5) -> float:
    a, b = [(x, y) for lab, x, y in run.steps[step].timeline if lab == phase][0]
    return a + frac * (b - a)


@pytest.fixture(scope="module")
def tail_run() -> SimRun:
    return SimRun("generation_tail", steps=8, seed=4, step_seconds=12)


def test_a_sync_run_has_no_engine_servers():
    sim = RolloutSim(SimRun("healthy", steps=3))
    assert sim.servers == 0 and sim.states_at(sim.run.start_time + 5) == []
    assert sim.frame(5.0).empty


def test_colocated_engines_generate_in_gen_and_sleep_while_the_trainer_trains(tail_run):
    sim = RolloutSim(tail_run)
    assert sim.servers == 4 and sim.names == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]
    gen = sim.states_at(_at(tail_run, 1, "gen", 0.2))
    assert all(set(s) == set(ROLLOUT_STATE_KEYS) for s in gen)
    assert all(s["sleeping"] == 0 and s["running"] > 20 and 0 < s["kv_cache_usage"] < 1
               for s in gen)
    train = sim.states_at(_at(tail_run, 1, "update_actor"))
    assert all(s["sleeping"] == 1 and s["running"] == 0 for s in train)
    # the same instant always reads the same
    t = _at(tail_run, 2, "gen", 0.4)
    assert sim.states_at(t) == sim.states_at(t)


def test_a_generation_tail_leaves_two_requests_on_one_server(tail_run):
    sim = RolloutSim(tail_run)
    late = sim.states_at(_at(tail_run, len(tail_run.steps) - 1, "gen", 0.8))
    assert [s["running"] for s in late] == [2, 0, 0, 0]
    healthy = sim.states_at(_at(tail_run, 0, "gen", 0.8))
    assert all(s["running"] > 2 for s in healthy)


def test_a_full_kv_cache_preempts_and_queues():
    run = SimRun("kv_cache_preemption", steps=8, seed=1, step_seconds=12)
    sim = RolloutSim(run)
    full = sim.states_at(_at(run, 7, "gen", 0.3))
    assert all(s["kv_cache_usage"] >= 0.96 and s["waiting"] > 0 for s in full)
    before = sim.states_at(_at(run, 7, "gen", 0.1))
    after = sim.states_at(_at(run, 7, "gen", 0.9))
    a, b = [(x, y) for lab, x, y in run.steps[7].timeline if lab == "gen"][0]
    rate = (after[0]["preemptions_total"] - before[0]["preemptions_total"]) / (0.8 * (b - a))
    assert rate == pytest.approx(2.0, abs=0.2)
    ok = sim.states_at(_at(run, 0, "gen", 0.3))
    assert all(s["preemptions_total"] == 0 and s["kv_cache_usage"] < 0.7 for s in ok)


def test_counters_only_grow():
    run = SimRun("agent_loop_demo", seed=0)
    frame = RolloutSim(run).frame(2.0)
    for _, part in frame.groupby("server"):
        for col in ("preemptions_total", "generation_tokens_total"):
            assert part[col].is_monotonic_increasing, col
    assert list(frame.columns) == list(ROLLOUT_COLUMNS)


def test_a_fully_async_pool_never_sleeps_and_pauses_requests_during_the_weight_sync():
    run = SimRun("weight_sync_pause", steps=8, seed=2, step_seconds=12)
    sim = RolloutSim(run)
    assert sim.servers == 4
    sync = sim.states_at(_at(run, 7, "reshard"))
    assert all(s["paused"] > 0 and s["running"] == 0 and s["sleeping"] == 0 for s in sync)
    work = sim.states_at(_at(run, 7, "update_actor"))
    assert all(s["running"] > 0 and s["paused"] == 0 and s["sleeping"] == 0 for s in work)


def test_a_slow_pool_runs_saturated_and_an_idle_rollouter_drains():
    run = SimRun("pool_imbalance", steps=8, seed=2, step_seconds=12)
    busy = RolloutSim(run).states_at(_at(run, 7, "update_actor"))
    assert all(s["waiting"] > 20 and s["kv_cache_usage"] > 0.88 for s in busy)
    run = SimRun("rollouter_idle", steps=8, seed=2, step_seconds=12)
    idle = RolloutSim(run).states_at(_at(run, 7, "update_actor", 0.95))
    assert all(s["running"] == 0 and s["waiting"] == 0 and s["sleeping"] == 0 for s in idle)


def test_sglang_servers_are_named_for_their_engine():
    sim = RolloutSim(SimRun("fully_async", steps=3), engine="sglang")
    assert sim.names[0] == "sglang-0" and sim.states_at(sim.run.start_time)[0]["engine"] == "sglang"
    with pytest.raises(ValueError, match="unknown engine"):
        RolloutSim(SimRun("fully_async", steps=3), engine="trt")
