"""The goodput ledger per pool (trainer, rollout, or one colocated pool) on fixtures written by
verl's own metric code, and the engines' preemptions where a rollout frame has them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from monitor.analysis.pools import document, preempted_requests, rollout_pool, trainer_pool
from monitor.logs.canonical_records import parse_file

FIXTURES = Path(__file__).parent / "fixtures" / "verl_modes"


def steps_of(name: str, suffix: str = "log"):
    return parse_file(FIXTURES / f"{name}.{suffix}").steps


@pytest.mark.parametrize("suffix", ["log", "jsonl"])
def test_fully_async_trainer_pool_adds_up_to_its_steps_with_the_wait_as_a_loss(suffix):
    steps = steps_of("fully_async_trainer", suffix)
    causes = trainer_pool(steps, "fully_async_trainer")
    timed = [s for s in steps if s.total is not None]
    assert sum(causes.values()) == pytest.approx(sum(s.total for s in timed), rel=1e-9)
    assert causes["waiting_for_samples"] == pytest.approx(sum(s.phases["gen"] for s in timed))
    assert causes["generation"] == pytest.approx(
        sum(s.metrics.get("timing_s/wait_for_enough_samples", 0.0) for s in timed))
    assert causes["parameter_sync"] > 0 and causes["weight_sync"] == 0.0


def test_fully_async_rollout_pool_from_the_rollouters_figures():
    steps = steps_of("fully_async_rollouter_waits")
    ro = rollout_pool(steps, "fully_async_trainer")
    active = sum(s.metrics["fully_async/rollouter/active_time"] for s in steps
                 if "fully_async/rollouter/active_time" in s.metrics)
    whole = sum(s.metrics["fully_async/rollouter/version_time"] for s in steps
                if "fully_async/rollouter/version_time" in s.metrics)
    assert ro["generation"] == pytest.approx(active)
    assert ro["waiting_for_weights"] == pytest.approx(whole - active)
    assert ro["waiting_for_weights"] / whole == pytest.approx(0.55, abs=0.01)
    # the rollouter's own stream, unprefixed, says the same
    alone = rollout_pool(steps_of("fully_async_rollouter"), "fully_async_rollouter")
    assert alone == pytest.approx(ro)


def test_pools_add_up_overall_when_gpu_counts_are_known():
    doc = document(steps_of("fully_async_trainer"), trainer_gpus=8, rollout_gpus=24)
    assert doc["mode"] == "fully_async_trainer"
    trainer, rollout = doc["pools"]
    assert (trainer["pool"], rollout["pool"]) == ("trainer", "rollout")
    assert trainer["shares"]["waiting_for_samples"] > 0.35
    assert rollout["busy_share"] > 0.99
    overall = doc["overall"]
    assert overall["gpus"] == 32
    assert overall["gpu_seconds"] == pytest.approx(
        trainer["seconds_per_gpu"] * 8 + rollout["seconds_per_gpu"] * 24, rel=1e-6)
    assert sum(overall["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert document(steps_of("fully_async_trainer"))["overall"] is None


def test_one_colocated_pool_for_the_sync_and_agent_loop_trainers():
    for name in ("sync", "agent_loop"):
        doc = document(steps_of(name), trainer_gpus=8)
        assert [p["pool"] for p in doc["pools"]] == ["colocated"]
        pool = doc["pools"][0]
        assert "waiting_for_samples" not in pool["causes"] and pool["causes"]["generation"] > 0
        assert doc["overall"]["gpus"] == 8


def test_one_step_off_rollout_idles_while_training_outlasts_generation():
    doc = document(steps_of("one_step_off"))
    trainer, rollout = doc["pools"]
    assert trainer["causes"]["waiting_for_samples"] > 0
    assert rollout["causes"]["waiting_for_weights"] > 0 and rollout["source"] == "log"


def test_separate_async_lends_trainer_gpus_and_says_the_rollout_pool_is_unknown():
    trainer, rollout = document(steps_of("separate_async"))["pools"]
    assert trainer["causes"]["generation"] > 0  # switch_wait: the hybrid GPUs roll out
    assert trainer["causes"]["unattributed"] < 0.02 * trainer["seconds_per_gpu"]
    assert "no rollout-pool timers" in rollout["note"]


def test_the_gpu_ledger_stands_for_the_trainer_pool_when_given():
    gp = {"gpu_seconds_total": 800.0, "gpus": 8, "productive": 400.0, "goodput_share": 0.5,
          "lost": {"waiting_for_samples": 300.0, "parameter_sync": 100.0}, "unattributed": 0.0}
    doc = document(steps_of("fully_async_trainer"), gpu_ledger=gp, rollout_gpus=8)
    trainer = doc["pools"][0]
    assert trainer["source"] == "gpu" and trainer["gpus"] == 8
    assert trainer["causes"] == {"productive": 50.0, "waiting_for_samples": 37.5,
                                 "parameter_sync": 12.5}
    assert doc["overall"]["gpus"] == 16


def test_preempted_requests_from_the_engine_counters_else_the_agent_loop():
    rollout = pd.DataFrame({
        "ts": [1.0, 2.0, 3.0, 1.0, 2.0],
        "server": ["a", "a", "a", "b", "b"],
        "preemptions_total": [5.0, 9.0, 2.0, 0.0, 3.0],  # a restarted (counter reset) at 3.0
    })
    assert preempted_requests([], rollout) == 7.0
    from_loop = preempted_requests(steps_of("agent_loop"), None)
    assert from_loop is not None and from_loop > 0
    assert preempted_requests(steps_of("sync"), None) is None
    doc = document(steps_of("agent_loop"), rollout=rollout)
    assert doc["pools"][0]["preempted_requests"] == 7.0
