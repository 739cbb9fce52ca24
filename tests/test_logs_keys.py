"""Key renames, canonical phases per verl version, and version guesses."""

from __future__ import annotations

import math

import pytest

from monitor.logs.keys import canonical_phases, guess_version, normalise_key
from monitor.records import ALL_PHASES


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("timing/gen", "timing_s/gen"),
        ("timing/update_actor", "timing_s/update_actor"),
        ("mfu/actor", "perf/mfu/actor"),
        ("critic/kl", "actor/reward_kl_penalty"),
        ("actor/entropy_loss", "actor/entropy"),
        ("actor/perf/max_memory_allocated_gb", "perf/max_memory_allocated_gb"),
        ("actor/perf/max_memory_reserved_gb", "perf/max_memory_reserved_gb"),
        ("actor/perf/cpu_memory_used_gb", "perf/cpu_memory_used_gb"),
        ("actor/pg_loss", "actor/pg_loss"),
        ("timing_s/gen", "timing_s/gen"),
        ("val-core/openai/gsm8k/acc/mean@1", "val-core/openai/gsm8k/acc/mean@1"),
    ],
)
def test_normalise_key_accepts_old_names(old: str, new: str) -> None:
    assert normalise_key(old) == new


def test_phases_map_by_name_and_other_is_the_rest() -> None:
    metrics = {
        "timing_s/gen": 60.0,
        "timing_s/reward": 2.0,
        "timing_s/old_log_prob": 8.0,
        "timing_s/ref": 5.0,
        "timing_s/values": 4.0,
        "timing_s/adv": 1.0,
        "timing_s/update_critic": 6.0,
        "timing_s/update_actor": 20.0,
        "timing_s/update_weights": 1.5,
        "timing_s/step": 110.0,
        "timing_s/testing": 30.0,
        "timing_s/save_checkpoint": 9.0,
    }
    phases = canonical_phases(metrics)
    assert set(phases) <= set(ALL_PHASES)
    assert phases["gen"] == 60.0
    assert phases["reshard"] == 1.5
    assert phases["testing"] == 30.0 and phases["save_checkpoint"] == 9.0
    # 0.6+ leaves testing and checkpointing out of timing_s/step: they are not subtracted.
    assert phases["other"] == pytest.approx(110.0 - 107.5)


def test_old_timing_prefix_is_read_and_other_includes_testing_before_06() -> None:
    metrics = {
        "timing/gen": 50.0,
        "timing/update_actor": 20.0,
        "timing/testing": 10.0,
        "timing/step": 85.0,
        "mfu/actor": 0.3,
    }
    phases = canonical_phases(metrics)
    assert phases == {"gen": 50.0, "update_actor": 20.0, "testing": 10.0, "other": 5.0}


def test_nested_reshard_of_041_is_taken_out_of_gen() -> None:
    metrics = {
        "timing_s/gen": 70.0,
        "timing_s/reshard": 3.0,
        "timing_s/generate_sequences": 67.0,
        "timing_s/step": 71.0,
    }
    phases = canonical_phases(metrics)
    assert phases["gen"] == 67.0
    assert phases["reshard"] == 3.0
    assert phases["other"] == 1.0


def test_06_reshard_is_derived_from_generate_sequences() -> None:
    metrics = {
        "timing_s/gen": 80.25,
        "timing_s/agent_loop/slowest/generate_sequences": 78.0,
        "timing_s/step": 81.0,
        "response/aborted_ratio": 0.0,
    }
    phases = canonical_phases(metrics)
    assert phases["gen"] == 78.0
    assert phases["reshard"] == pytest.approx(2.25)
    assert phases["other"] == pytest.approx(0.75)
    # timing_s/generate_sequences wins over the agent-loop key when both are there
    metrics["timing_s/generate_sequences"] = 79.0
    assert canonical_phases(metrics)["reshard"] == pytest.approx(1.25)


def test_no_reshard_when_generation_is_not_shorter_than_gen() -> None:
    metrics = {"timing_s/gen": 40.0, "timing_s/generate_sequences": 40.0}
    assert "reshard" not in canonical_phases(metrics)


def test_pre_041_logs_get_no_reshard_even_with_generate_sequences() -> None:
    metrics = {
        "timing_s/gen": 40.0,
        "timing_s/generate_sequences": 35.0,
        "actor/entropy_loss": 0.5,
    }
    assert canonical_phases(metrics) == {"gen": 40.0}
    plain = {"timing_s/gen": 40.0, "timing_s/generate_sequences": 35.0}
    assert canonical_phases(plain, version_hint="<=0.4.1") == {"gen": 40.0}
    assert canonical_phases(plain)["reshard"] == 5.0


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"timing_s/sync_rollout_weights": 2.5}, 2.5),
        ({"timing_s/param_sync": 4.0, "timing_s/wait_last_valid": 1.0}, 4.0),
        ({"timing_s/switch_to_rollout": 1.5, "timing_s/switch_to_trainer": 0.5}, 2.0),
        ({"timing_s/switch_to_rollout": 1.5}, 1.5),
    ],
)
def test_async_trainers_reshard_keys(metrics: dict[str, float], expected: float) -> None:
    metrics = {"timing_s/gen": 10.0, **metrics}
    phases = canonical_phases(metrics)
    assert phases["reshard"] == expected
    assert phases["gen"] == 10.0  # own timers are not nested in gen


def test_other_needs_the_step_time_and_never_goes_negative() -> None:
    assert "other" not in canonical_phases({"timing_s/gen": 10.0})
    phases = canonical_phases({"timing_s/gen": 10.0, "timing_s/step": 8.0})
    assert phases["other"] == 0.0


def test_non_finite_and_non_numeric_timers_are_ignored() -> None:
    metrics = {
        "timing_s/gen": math.nan,
        "timing_s/ref": math.inf,
        "timing_s/adv": True,
        "timing_s/update_actor": 3.0,
    }
    assert canonical_phases(metrics) == {"update_actor": 3.0}


def test_breakdown_style_derived_phases_are_kept() -> None:
    phases = canonical_phases(
        {"timing_s/rollout_wait": 0.5, "timing_s/comm": 2.0, "timing_s/step": 3.0}
    )
    assert phases == {"rollout_wait": 0.5, "comm": 2.0, "other": 0.5}


@pytest.mark.parametrize(
    ("keys", "prefixes", "number_format", "expected"),
    [
        (["mfu/actor", "timing_s/gen"], ["main_task"], "3dec", "<=0.2"),
        (["timing/gen"], [], None, "<=0.2"),
        (["critic/kl", "actor/entropy_loss"], ["TaskRunner"], "3dec", "0.3"),
        (["actor/entropy_loss"], ["TaskRunner"], "3dec", "0.3-0.4.0"),
        # the keys decide each bound they give (a JSONL of the run has them too); the prefix
        # and the number format speak only for a bound the keys leave open
        (["timing_s/reshard", "timing_s/step"], ["TaskRunner"], "3dec", "0.4.1-0.5.x"),
        (["timing_s/reshard", "timing_s/step"], [], None, "0.4.1-0.5.x"),
        (["timing_s/reshard", "timing_s/step"], ["TaskRunner"], "repr", "0.4.1-0.5.x"),
        (["timing_s/step"], ["TaskRunner"], "3dec", "0.3-0.4.1"),
        (["timing_s/step"], ["TaskRunner"], "repr", "0.5+"),
        (["training/off_policy/trajectory_staleness/mean", "timing_s/step"], [], None, "0.9+"),
        (["response/aborted_ratio", "timing_s/step", "timing_s/gen"], [], "repr", "0.5.x-0.7.0"),
        (["perf/mfu/actor_infer", "response/aborted_ratio", "timing_s/step"], [], None, "0.7.0"),
        (["timing_s/update_weights", "timing_s/step"], ["TaskRunner"], "repr", "0.7.1+"),
        (["actor/perf/max_memory_allocated_gb", "timing_s/step"], [], "repr", "0.8+"),
        (["timing_s/step"], ["TaskRunnerV1"], None, "0.9+"),
        # numpy 2's repr of verl 0.5+'s pformat: says what full-precision values say, no more
        (["timing_s/step"], [], "numpy", "0.5+"),
        (["response/aborted_ratio", "timing_s/step", "timing_s/param_sync"], [], None, "0.5.x+"),
        # 2025-08-13 .. 09-03: aborted_ratio added while the sharding managers still timed
        (["response/aborted_ratio", "timing_s/reshard", "timing_s/step"], [], "numpy", "0.5.x"),
        ([], [], None, "unknown"),
        (["foo/bar"], ["WorkerDict"], None, "unknown"),
    ],
)
def test_guess_version(
    keys: list[str], prefixes: list[str], number_format: str | None, expected: str
) -> None:
    assert guess_version(keys, prefixes, number_format=number_format) == expected


def test_guess_version_trusts_newer_evidence_when_hints_contradict() -> None:
    # 3-decimal numbers but a 0.8 key: the key cannot lie about being new.
    assert guess_version(["actor/perf/max_memory_allocated_gb"], [], number_format="3dec") == "0.8+"


def test_old_prefix_is_found_even_without_step_or_gen_timers() -> None:
    assert canonical_phases({"timing/update_actor": 3.0, "actor/pg_loss": 0.1}) == {
        "update_actor": 3.0
    }


def test_negative_timers_are_not_phases() -> None:
    phases = canonical_phases({"timing_s/gen": -5.0, "timing_s/ref": 2.0, "timing_s/step": -1.0})
    assert phases == {"ref": 2.0}


# --- today's trainers: every key family has a meaning (fixtures from verl's own code) ----------

_MODE_FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "verl_modes"
#: Key prefixes of today's trainers (issue 21); each key under them must have a meaning.
_TODAY = ("timing_s/agent_loop/", "separate_async/", "training/off_policy/",
          "training/rollout_failure/", "fully_async/", "rollouter/", "count/", "static/",
          "monitor/", "dynamic_resource/", "timing_s/switch_", "timing_s/update_weights",
          "timing_s/param_sync", "timing_s/timing_s/param_sync", "timing_s/wait_for_enough_samples",
          "timing_s/generate_async", "timing_s/sync_rollout_weights")


def _fixture_keys() -> set[str]:
    from monitor.logs.canonical_records import parse_file

    keys: set[str] = set()
    for path in sorted(_MODE_FIXTURES.glob("*.jsonl")) + sorted(_MODE_FIXTURES.glob("*.log")):
        for rec in parse_file(path).steps:
            keys.update(rec.metrics)
    return keys


def test_every_key_of_todays_trainers_has_a_meaning() -> None:
    from monitor.logs.keys import key_meaning

    today = sorted(k for k in _fixture_keys() if k.startswith(_TODAY))
    assert len(today) > 60
    missing = [k for k in today if key_meaning(k) is None]
    assert missing == []


@pytest.mark.parametrize(
    ("key", "family"),
    [
        ("timing_s/agent_loop/num_preempted/max", "agent_loop"),
        ("timing_s/agent_loop/tool_calls/mean", "agent_loop"),
        ("timing_s/agent_loop/compute_score/mean", "agent_loop"),
        ("timing_s/agent_loop/slowest/response_length", "agent_loop"),
        ("timing_s/switch_wait", "separate_async"),
        ("timing_s/switch_to_rollout", "separate_async"),
        ("timing_s/switch_to_trainer", "separate_async"),
        ("timing_s/update_weights", "weight_sync"),
        ("separate_async/decision/remaining", "separate_async"),
        ("training/off_policy/trajectory_staleness_worst/max", "staleness"),
        ("training/off_policy/evicted_samples", "staleness"),
        ("training/rollout_failure/evicted_samples", "staleness"),
        ("fully_async/trainer/idle_ratio", "fully_async"),
        ("trainer/idle_ratio", "fully_async"),  # the README's spelling
        ("fully_async/rollouter/idle_ratio", "fully_async"),
        ("rollouter/active_time", "fully_async"),  # the rollouter's own spelling
        ("fully_async/count/dropped_stale_samples", "staleness"),
        ("count/dropped_stale_samples", "staleness"),
        ("fully_async/total_wait_time", "fully_async"),
        ("timing_s/timing_s/param_sync", "weight_sync"),
        ("timing_s/wait_for_enough_samples", "fully_async"),
        ("dynamic_resource/train_resource_utilization", "fully_async"),
        ("timing_s/generate_async", "one_step_off"),
        ("timing_s/sync_rollout_weights", "weight_sync"),
        ("timing_s/gen", "phase"),
    ],
)
def test_key_families(key: str, family: str) -> None:
    from monitor.logs.keys import key_meaning

    meaning = key_meaning(key)
    assert meaning is not None and meaning[0] == family and meaning[1]


def test_fixtures_cover_every_key_family_the_issue_names() -> None:
    keys = _fixture_keys()
    for needle in ("agent_loop/slowest/", "agent_loop/num_preempted/", "agent_loop/tool_calls/",
                   "agent_loop/compute_score/", "timing_s/switch_wait", "timing_s/switch_to_rollout",
                   "timing_s/switch_to_trainer", "timing_s/update_weights", "separate_async/",
                   "training/off_policy/", "training/rollout_failure/", "fully_async/trainer/idle_ratio",
                   "param_sync", "wait_for_enough_samples", "fully_async/total_wait_time",
                   "fully_async/rollouter/idle_ratio", "fully_async/rollouter/active_time",
                   "dynamic_resource/", "timing_s/generate_async", "timing_s/sync_rollout_weights"):
        assert any(needle in k for k in keys), needle
    # both spellings of the fully-async keys
    assert "rollouter/idle_ratio" in keys and "count/dropped_stale_samples" in keys
    assert "fully_async/count/dropped_stale_samples" in keys


def test_the_fully_async_weight_sync_is_read_under_its_doubled_name() -> None:
    """verl's compute_timing_metrics prefixes the timer named "timing_s/param_sync" once more."""
    phases = canonical_phases({"timing_s/gen": 30.0, "timing_s/timing_s/param_sync": 4.5,
                               "timing_s/update_actor": 20.0, "timing_s/step": 60.0})
    assert phases["reshard"] == 4.5 and phases["gen"] == 30.0
    assert phases["other"] == pytest.approx(5.5)


def test_async_value_reads_both_spellings() -> None:
    from monitor.logs.keys import async_value

    assert async_value({"rollouter/idle_ratio": 0.4}, "fully_async/rollouter/idle_ratio") == 0.4
    assert async_value({"fully_async/rollouter/idle_ratio": 0.2, "rollouter/idle_ratio": 0.4},
                       "fully_async/rollouter/idle_ratio") == 0.2
    assert async_value({"rollouter/idle_ratio": float("nan")},
                       "fully_async/rollouter/idle_ratio") is None


# --- one run, two logs: the console and the JSONL say the same version ----------------------


def _verl_050dev_steps(n: int = 4) -> list[dict]:
    """The metrics of a GRPO step with the HF rollout and a reference model as verl 0.5.0.dev
    (commit 4c3310db, the one on our H200) returns them: the keys of ``compute_data_metrics``,
    ``compute_timing_metrics`` (timing_raw with the worker's ``generate_sequences`` and
    ``generation_timing/*``), ``compute_throughout_metrics``, the actor's update metrics and
    ``training/*``; values as numpy scalars, as the trainer gets them."""
    import numpy as np

    steps = []
    for i in range(1, n + 1):
        timing = {"gen": 3.1 + 0.01 * i, "generate_sequences": 3.0, "generation_timing/max": 3.0,
                  "generation_timing/min": 3.0, "generation_timing/topk_ratio": 1.0,
                  "reward": 0.2, "old_log_prob": 0.3, "ref": 0.25, "adv": 0.05,
                  "update_actor": 0.6, "step": 4.6, "start_profile": 0.0, "stop_profile": 0.0}
        data = {"training/global_step": i, "training/epoch": 0,
                "actor/entropy": np.float64(9.1), "actor/kl_loss": np.float64(0.001),
                "actor/kl_coef": 0.001, "actor/pg_loss": np.float64(-0.002),
                "actor/pg_clipfrac": np.float64(0.0), "actor/ppo_kl": np.float64(0.0),
                "actor/pg_clipfrac_lower": np.float64(0.0), "actor/grad_norm": np.float64(0.8),
                "perf/mfu/actor": np.float64(0.01), "perf/max_memory_allocated_gb": 7.5,
                "perf/max_memory_reserved_gb": 9.25, "perf/cpu_memory_used_gb": 60.5,
                "actor/lr": 1e-06}
        for name in ("score", "rewards", "advantages", "returns"):
            data.update({f"critic/{name}/{s}": np.float64(0.1) for s in ("mean", "max", "min")})
        for group in ("response_length", "response_length_non_aborted", "prompt_length"):
            data.update({f"{group}/{s}": np.float64(120.0) for s in ("mean", "max", "min")})
            data[f"{group}/clip_ratio"] = np.float64(0.0)
        data["response/aborted_ratio"] = np.float64(0.0)
        data.update({f"timing_s/{k}": np.float64(v) for k, v in timing.items()})
        data.update({f"timing_per_token_ms/{k}": np.float64(0.2)
                     for k in ("gen", "ref", "adv", "update_actor")})
        data.update({"perf/total_num_tokens": 30000, "perf/time_per_step": np.float64(4.6),
                     "perf/throughput": np.float64(6500.0)})
        steps.append(data)
    return steps


def test_the_console_log_and_the_jsonl_of_one_run_give_the_same_version(tmp_path) -> None:
    """issue 28: real verl 0.5.0.dev on the H200 read as 0.9+ from its console log (numpy 2's
    ``np.float64(...)``) and as 0.6-0.7 from the JSONL of the same run; both are 0.5.x-0.7.0."""
    import json
    import pprint

    from monitor.logs.canonical_records import parse_file

    steps = _verl_050dev_steps()
    lines = ["\x1b[36m(TaskRunner pid=2741)\x1b[0m TaskRunner hostname: gpu-0, PID: 2741"]
    with open(tmp_path / "train.jsonl", "w") as fh:
        for i, data in enumerate(steps, 1):
            # verl 0.5's concat_dict_to_str (verl/utils/logger/aggregate_logger.py)
            body = " - ".join([f"step:{i}"] + [f"{k}:{pprint.pformat(v)}" for k, v in data.items()])
            lines.append(f"\x1b[36m(TaskRunner pid=2741)\x1b[0m {body}")
            fh.write(json.dumps({"step": i, "data": {k: float(v) for k, v in data.items()}}) + "\n")
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    assert "np.float64(" in lines[1]
    console = parse_file(tmp_path / "train.log", log_end=10_000.0)
    jsonl = parse_file(tmp_path / "train.jsonl", log_end=10_000.0)
    assert console.format == "console" and len(console.steps) == len(jsonl.steps) == 4
    assert console.version_guess == jsonl.version_guess == "0.5.x-0.7.0"


def test_every_recorded_run_gives_its_console_log_and_jsonl_the_same_version() -> None:
    """The trainer-mode fixtures (verl's own metric code) and the real-GPU recordings hold one
    run twice: where the keys say anything, both files give the same range (the real-GPU
    console lines carry TaskRunnerV1 and numpy reprs: they used to read 0.9+ against 0.7.1+)."""
    from pathlib import Path

    from monitor.logs.canonical_records import parse_file

    fixtures = Path(__file__).parent / "fixtures"
    pairs = [(p, p.with_suffix(".jsonl")) for p in sorted((fixtures / "verl_modes").glob("*.log"))]
    pairs += [(d / "train.log", d / "train.jsonl") for d in sorted((fixtures / "real_gpu").iterdir())]
    compared = 0
    for log, jsonl in pairs:
        if not (log.exists() and jsonl.exists()):
            continue
        from_jsonl = parse_file(jsonl, log_end=1e10).version_guess
        if from_jsonl == "unknown":
            continue  # no key bounds it: only the console's prefix or number format can
        assert parse_file(log, log_end=1e10).version_guess == from_jsonl, log
        compared += 1
    assert compared >= 20


def test_agent_loop_sync_leaves_out_the_slowest_samples_tools_and_score() -> None:
    """verl's slowest sample is the one with the most generation + tool time; its tool calls
    and (later releases) its compute_score are part of it, not of the weight sync. A real
    0.5.0.dev agent-loop step: gen 107.4 s, slowest sample 73.7 s generating + 30.6 s in tools."""
    from monitor.logs.keys import reshard_is_derived

    metrics = {
        "timing_s/gen": 107.45,
        "timing_s/agent_loop/slowest/generate_sequences": 73.68,
        "timing_s/agent_loop/slowest/tool_calls": 30.63,
        "timing_s/step": 253.63,
        "response/aborted_ratio": 0.0,
    }
    phases = canonical_phases(metrics)
    assert phases["reshard"] == pytest.approx(3.14)
    assert phases["gen"] == pytest.approx(104.31)
    metrics["timing_s/agent_loop/slowest/compute_score"] = 1.0
    assert canonical_phases(metrics)["reshard"] == pytest.approx(2.14)
    assert reshard_is_derived(metrics)
    assert not reshard_is_derived({**metrics, "timing_s/update_weights": 2.0})
