"""Advice chosen by phase and signature: likely cause first, contradicted advice withheld."""

from __future__ import annotations

import pytest

from monitor.analysis.signature import SIGNATURES
from monitor.detect.cause_advice import CAUSE_ADVICE, cause_advice, contradicted, reward_era
from monitor.detect.flag_advice import (
    ADVICE,
    GEN_VS_CRITIC,
    INVENTED_KEYS,
    REAL_KEYS,
    advice_for,
    named_keys,
)
from monitor.records import PHASES

VERSIONS = (None, "unknown", "0.4.1-0.5.x", "0.6.0-0.7.0", "0.7.1+", "0.9+", "<=0.2")


def _all_texts():
    phases = sorted({p for p, _ in CAUSE_ADVICE} - {"*"} | set(PHASES))
    for phase in phases:
        for sig in SIGNATURES:
            for version in VERSIONS:
                yield phase, sig, version, cause_advice(phase, sig, version)


def test_every_sentence_chosen_by_phase_and_signature_names_only_real_keys():
    for phase, sig, version, sentences in _all_texts():
        for s in sentences:
            assert "{phase}" not in s, (phase, sig)
            for key in named_keys(s):
                assert key in REAL_KEYS, f"{phase}/{sig}/{version}: {key} is not a real key"
            for key in INVENTED_KEYS:
                assert key not in s


def test_the_issues_cases_get_their_cause_first():
    reward = advice_for("phase_imbalance", "reward", "cpu_bound", "0.9+")
    assert reward[0].startswith("The reward is computed on the CPU")
    assert "reward.num_workers" in reward[0] and "compute_score" in reward[0]
    offload = advice_for("phase_imbalance", "old_log_prob", "pcie_bound", measured=("pcie",))
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=False" in offload[0]
    ref = advice_for("phase_imbalance", "ref", "pcie_bound")
    assert "actor_rollout_ref.ref.fsdp_config.param_offload" in ref[0]
    assert "rollout" in advice_for("phase_imbalance", "gen", "memory_bound")[0]
    assert "trainer.test_freq" in advice_for("phase_imbalance", "testing", "busy")[0]
    assert "trainer.save_freq" in advice_for("phase_imbalance", "save_checkpoint", "idle")[0]
    update = advice_for("phase_imbalance", "update_actor", "busy")[0]
    assert "ppo_micro_batch_size_per_gpu" in update and "use_dynamic_bsz" in update
    thin_gen = advice_for("phase_imbalance", "gen", "thin")
    assert "thinned" in thin_gen[0] and "data.max_response_length" in thin_gen[0]


@pytest.mark.parametrize("sig", ["cpu_bound", "pcie_bound", "idle"])
def test_no_micro_batch_advice_while_the_gpus_wait(sig):
    for kind in ("phase_imbalance", "low_utilization", "util_overstates_sm"):
        for phase in ("update_actor", "old_log_prob", "ref", None):
            for s in advice_for(kind, phase, sig):
                assert "micro_batch_size" not in s or "offload" in s, (kind, phase, sig, s)
                assert "use_dynamic_bsz" not in s or "offload" in s, (kind, phase, sig, s)


def test_turning_offload_off_is_withheld_when_pcie_was_read_quiet_or_the_host_is_busy():
    quiet = advice_for("low_utilization", "update_actor", "thin", measured=("pcie",))
    assert not any("Turn off offloading" in s for s in quiet)
    unread = advice_for("low_utilization", "update_actor", "thin")
    assert any("Turn off offloading" in s for s in unread)  # not read: not contradicted
    assert not any("Turn off offloading" in s
                   for s in advice_for("low_utilization", "adv", "cpu_bound"))


def test_generation_against_the_critic_only_for_gen_and_values():
    assert GEN_VS_CRITIC in advice_for("phase_imbalance", "values", "busy")
    assert GEN_VS_CRITIC in advice_for("phase_imbalance", "gen", "memory_bound")
    for phase in ("reward", "old_log_prob", "ref", "update_actor", "testing"):
        assert GEN_VS_CRITIC not in advice_for("phase_imbalance", phase, "busy")
    assert contradicted(GEN_VS_CRITIC, "reward", None)
    assert not contradicted(GEN_VS_CRITIC, None, None)


def test_without_phase_or_signature_the_kinds_advice_is_unchanged():
    for kind, sentences in ADVICE.items():
        assert advice_for(kind) == sentences


def test_reward_keys_by_version():
    assert reward_era("0.7.1+") == "new" and reward_era("0.9+") == "new"
    assert reward_era("0.6.0-0.7.0") == "old" and reward_era("0.4.1-0.5.x") == "old"
    assert reward_era("<=0.2") == "old"
    assert reward_era("unknown") is None and reward_era("0.5+") is None
    # the ranges guess_version gives the real 0.5.0.dev run (both files) and a 0.5 log whose
    # keys leave the top open: the range's keys, or both spellings where it straddles 0.7.1
    assert reward_era("0.5.x-0.7.0") == "old" and reward_era("0.5.x+") is None
    old = cause_advice("reward", "cpu_bound", "0.6.0-0.7.0")[0]
    assert "reward_model.launch_reward_fn_async=True" in old and "reward.num_workers" not in old
    new = cause_advice("reward", "cpu_bound", "0.8+")[0]
    assert "reward.num_workers" in new and "reward_model." not in new
    both = cause_advice("reward", "cpu_bound", None)[0]
    assert "reward.num_workers" in both and "reward_model.launch_reward_fn_async" in both


def test_a_cpu_bound_phase_other_than_reward_points_to_the_host_work():
    adv = advice_for("phase_imbalance", "adv", "cpu_bound")
    assert "CPU core" in adv[0] and "the advantage computation" in adv[0]
    assert not any("The reward is computed" in s for s in adv)
    assert not any("GPUs idle while one CPU core" in s
                   for s in advice_for("phase_imbalance", "reward", "cpu_bound"))
