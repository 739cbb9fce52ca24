"""Micro-batches of one, with the GPUs idle and no CPU core pegged: the advice names the knobs
and their values first (monitor/detect/micro_batch_advice.py, through ``tell_job_config``)."""

from __future__ import annotations

from monitor.detect.flag_advice import advice_for, tell_job_config
from monitor.detect.micro_batch_advice import micro_batch_first, tiny_micro_batches
from monitor.records import Flag

IDLE = advice_for("low_utilization", "update_actor", "idle")


def _config(micro: int, log_prob: int, dynamic: bool = False) -> dict:
    """verl's printed config (nested), as the H200 tiny_micro run printed it."""
    return {"actor_rollout_ref": {
        "actor": {"ppo_micro_batch_size_per_gpu": micro, "ppo_mini_batch_size": 32,
                  "use_dynamic_bsz": dynamic},
        "rollout": {"n": 4, "log_prob_micro_batch_size_per_gpu": log_prob,
                    "log_prob_use_dynamic_bsz": dynamic},
        "ref": {"log_prob_micro_batch_size_per_gpu": log_prob,
                "log_prob_use_dynamic_bsz": dynamic}},
        "data": {"train_batch_size": 32}, "trainer": {"nnodes": 1, "n_gpus_per_node": 1}}


def _told(config: dict, kind: str = "low_utilization", advice: list[str] = IDLE) -> list[str]:
    flag = Flag(kind, "critical", 0.0, 10.0, {}, "", list(advice))
    tell_job_config([flag], config)
    return flag.advice


def test_micro_batches_of_one_come_first_with_their_values():
    advice = _told(_config(1, 1))
    assert advice[0].startswith("ppo_micro_batch_size_per_gpu is 1 in this job "
                                "(actor_rollout_ref.actor) and log_prob_micro_batch_size_per_gpu"
                                " is 1 (actor_rollout_ref.rollout, actor_rollout_ref.ref): raise "
                                "them"), advice[0]
    assert "use_dynamic_bsz=True" in advice[0]
    assert advice[1].startswith("The GPUs sat idle through the actor update")


def test_a_micro_batch_small_against_its_batch_is_tiny_too():
    # 4 of the 128 samples a mini-batch gives one GPU: 1/32 of it
    assert tiny_micro_batches({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
                               "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
                               "actor_rollout_ref.rollout.n": 4}) == [
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 4)]


def test_sizes_that_fill_the_gpu_or_token_packing_leave_the_advice_alone():
    assert _told(_config(32, 32))[0].startswith("The GPUs sat idle through")
    assert _told(_config(1, 1, dynamic=True))[0].startswith("The GPUs sat idle through")


def test_only_an_idle_low_utilization_flag_is_told():
    cpu = advice_for("low_utilization", "update_actor", "cpu_bound")
    assert micro_batch_first("low_utilization", cpu, {
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1}) == cpu
    assert _told(_config(1, 1), kind="stalled")[0].startswith("The GPUs sat idle through")
