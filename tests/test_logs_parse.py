"""verl log parsing: one fixture per era, events, JSONL, whole files, and robustness."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.logs.canonical_records import LogParser, LogReadError, parse_file
from monitor.records import ALL_PHASES, Event, StepRecord

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
GIB = 2**30


def events_of(parsed, kind: str) -> list[Event]:
    return [e for e in parsed.events if e.kind == kind]


def feed_all(parser: LogParser, lines: list[str], arrival: float | None = None) -> list:
    out = []
    for line in lines:
        out += parser.feed(line, arrival)
    return out + parser.flush(arrival)


# --- one fixture per era --------------------------------------------------------------------


def test_v02_main_task_three_decimals() -> None:
    parsed = parse_file(FIXTURES / "verl_0.2_main_task.log", log_end=10_000.0)
    assert parsed.format == "console"
    assert parsed.version_guess == "<=0.2"
    assert [s.step for s in parsed.steps] == [1, 2, 3]
    second = parsed.steps[1]
    assert second.phases["gen"] == 52.0
    assert second.phases["update_critic"] == 10.0
    assert second.phases["testing"] == 4.0
    # before 0.6 timing_s/step includes testing, so "other" stays the same 2.5 s
    assert [s.phases["other"] for s in parsed.steps] == [2.5, 2.5, 2.5]
    assert "reshard" not in second.phases
    assert second.total == 100.5
    assert second.metrics["actor/lr"] == 0.0  # 1e-6 printed as 0.000
    assert second.metrics["mfu/actor"] == 0.384
    assert math.isnan(parsed.steps[0].metrics["val-core/openai/gsm8k/acc/mean@1"])
    assert second.mem_allocated_peak_bytes == pytest.approx(43.5 * GIB)
    assert second.throughput == pytest.approx(1522.5)
    (validation,) = events_of(parsed, "validation")
    assert validation.step == 0
    assert validation.data["metrics"] == {"val-core/openai/gsm8k/acc/mean@1": 0.312}


def test_v041_fixed3_nested_reshard() -> None:
    parsed = parse_file(FIXTURES / "verl_0.4.1_fixed3.log", log_end=10_000.0)
    # timing_s/reshard bounds it by its keys (as the run's JSONL would); 3 decimals do not narrow
    assert parsed.version_guess == "0.4.1-0.5.x"
    for record in parsed.steps:
        assert record.phases["gen"] == 67.0
        assert record.phases["reshard"] == 3.0
        assert record.phases["other"] == 1.5
    assert [e.data["current"] for e in events_of(parsed, "progress")] == [1, 2]


def test_v05_repr_with_initial_validation_block() -> None:
    parsed = parse_file(FIXTURES / "verl_0.5_repr.log", log_end=10_000.0)
    assert parsed.version_guess == "0.4.1-0.5.x"  # the keys decide (see guess_version)
    assert [s.step for s in parsed.steps] == [1, 2, 3]
    assert parsed.steps[2].phases["update_actor"] == 23.0
    assert parsed.steps[2].metrics["actor/lr"] == 1e-06  # full repr since 0.5
    (validation,) = events_of(parsed, "validation")
    assert validation.data["origin"] == "initial_block"
    assert validation.data["metrics"] == {
        "val-core/openai/gsm8k/acc/mean@1": 0.3125,
        "val-aux/openai/gsm8k/reward/mean@1": 0.3125,
    }
    (progress,) = events_of(parsed, "progress")
    assert progress.data == {
        "current": 3,
        "total": 300,
        "percent": 1,
        "elapsed_s": 210.0,
        "eta_s": 5 * 3600 + 46 * 60 + 30.0,
        "s_per_it": 70.0,
        "time_rebuilt": True,
    }
    assert progress.time == parsed.steps[2].end_time
    assert parsed.stats.parse_errors == 0


def test_v06_derived_reshard_resume_and_iso_timestamps() -> None:
    parsed = parse_file(FIXTURES / "verl_0.6_derived_reshard.log")
    # response/aborted_ratio is printed since 2025-08-13 (after v0.5.0), no sync timer: <= 0.7.0
    assert parsed.version_guess == "0.5.x-0.7.0"
    assert [s.step for s in parsed.steps] == [11, 12, 13]
    for record in parsed.steps:
        assert record.phases["gen"] == 78.0
        assert record.phases["reshard"] == pytest.approx(2.25)
        assert record.phases["other"] == pytest.approx(1.25)
        assert record.time_source == "line"
    # 2026-02-01T12:00:00.500+02:00 is 10:00:00.5 UTC
    assert parsed.steps[0].end_time == pytest.approx(1769940000.5)
    assert parsed.steps[1].end_time - parsed.steps[0].end_time == pytest.approx(60.0)
    assert parsed.steps[1].phases["testing"] == 30.0
    (load,) = events_of(parsed, "checkpoint_load")
    assert load.data["path"] == "/ckpt/global_step_10"
    (resume,) = events_of(parsed, "resume")
    assert resume.step == 11 and resume.time == pytest.approx(1769940001.0)


def test_v071_update_weights_and_oom_traceback() -> None:
    parsed = parse_file(FIXTURES / "verl_0.7.1_update_weights_oom.log")
    assert parsed.version_guess == "0.7.1+"
    assert [s.phases["reshard"] for s in parsed.steps] == [1.75, 1.75]
    assert [s.phases["gen"] for s in parsed.steps] == [61.5, 61.5]  # own timer: gen untouched
    assert parsed.steps[0].end_time == pytest.approx(1772352000.0)  # [2026-03-01 08:00:00] UTC
    (oom,) = events_of(parsed, "oom")
    assert oom.data["tried_gib"] == pytest.approx(3.5)
    assert oom.step == 2
    (traceback,) = events_of(parsed, "traceback")
    assert traceback.data["type"] == "torch.OutOfMemoryError"
    assert traceback.message.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert parsed.stats.parse_errors == 0


def test_v08_actor_perf_memory_and_logging_timestamps() -> None:
    parsed = parse_file(FIXTURES / "verl_0.8_actor_perf.log")
    assert parsed.version_guess == "0.8+"
    first = parsed.steps[0]
    assert first.step == 5
    assert first.mem_allocated_peak_bytes == pytest.approx(46.5 * GIB)
    assert first.mem_reserved_peak_bytes == pytest.approx(57.25 * GIB)
    assert first.end_time == pytest.approx(1775034000.25)  # 2026-04-01 09:00:00,250 UTC
    memory = events_of(parsed, "memory")
    assert len(memory) == 2
    assert memory[0].data["role"] == "actor"
    assert memory[0].data["fn"] == "update_policy"
    assert memory[0].data["allocated_gb"] == 30.5
    assert memory[0].data["device_total_gb"] == 79.11
    assert memory[1].data["allocated_gb"] == 30.51


def test_v09_numpy_ansi_task_runner_v1() -> None:
    parsed = parse_file(FIXTURES / "verl_0.9_numpy_ansi.log", log_end=5000.0)
    # its keys say 0.8+ (actor/perf/max_memory_*), as its JSONL would: TaskRunnerV1 and numpy
    # reprs do not move a bound the keys give
    assert parsed.version_guess == "0.8+"
    assert [s.step for s in parsed.steps] == [1, 2, 3]
    record = parsed.steps[0]
    assert record.metrics["training/global_step"] == 1
    assert record.metrics["training/rollout_probs_diff_valid"] == 1
    assert record.phases == {
        "gen": 31.0,
        "reward": 1.0,
        "old_log_prob": 5.0,
        "ref": 2.0,
        "adv": 0.5,
        "update_actor": 12.0,
        "reshard": 1.25,
        "other": 0.75,
    }
    assert set(record.phases) <= set(ALL_PHASES)
    # no timestamps, but tqdm's elapsed time after steps 1 and 2 (3:10, 6:10, 180 s apart);
    # step 3 (no bar after it) is rebuilt back from log_end with its timers
    assert [s.time_source for s in parsed.steps] == ["tqdm_end", "tqdm_end", "rebuilt"]
    assert [s.end_time for s in parsed.steps] == [4766.5, 4946.5, 5000.0]
    validations = events_of(parsed, "validation")
    assert [v.data["origin"] for v in validations] == ["step", "final_block"]
    assert validations[1].data["metrics"] == {
        "val-core/openai/gsm8k/acc/mean@1": 0.53125,
        "val-aux/openai/gsm8k/reward/mean@1": 0.53125,
    }
    assert [p.data["current"] for p in events_of(parsed, "progress")] == [0, 1, 2]
    assert parsed.stats.records == 3 and parsed.stats.parse_errors == 0


def test_fully_async_parameter_synchronizer_fills_reshard() -> None:
    parsed = parse_file(FIXTURES / "verl_0.9_fully_async.log", log_end=100.0)
    syncs = events_of(parsed, "reshard")
    assert [e.data["seconds"] for e in syncs] == [2.5, 3.5]
    assert syncs[0].data["pause_s"] == 0.5 and syncs[0].data["sync_s"] == 1.5
    assert [s.phases["reshard"] for s in parsed.steps] == [2.5, 3.5]
    # other = 40 - (20 + 4 + 9 + reshard)
    assert [s.phases["other"] for s in parsed.steps] == [4.5, 3.5]


def test_breakdown_lines_and_hybrid_engine_switch() -> None:
    parsed = parse_file(FIXTURES / "breakdown_hybrid_engine.log")
    first, second = parsed.steps
    assert first.source == "breakdown"
    assert first.total == pytest.approx(1.242)
    assert first.phases["gen"] == pytest.approx(0.412)
    assert first.phases["values"] == pytest.approx(0.387)
    assert first.phases["update_actor"] == pytest.approx(0.021)
    assert first.phases["rollout_wait"] == pytest.approx(0.012)
    assert first.phases["comm"] == pytest.approx(0.310)
    assert first.phases["other"] == pytest.approx(1.242 - 1.142)
    (switch,) = events_of(parsed, "reshard")
    assert switch.data["seconds"] == pytest.approx(0.9)  # 00:00:00,100 -> 00:00:01,000
    assert second.phases["reshard"] == pytest.approx(0.9)
    assert second.phases["other"] == pytest.approx(max(0.0, 1.5 - 0.95 - 0.9))
    assert "reshard" not in first.phases


def test_jsonl_merge_nan_validation_and_resume() -> None:
    parsed = parse_file(FIXTURES / "file_logger_resume.jsonl")
    assert parsed.format == "jsonl"
    assert [s.step for s in parsed.steps] == [1, 2, 3, 2, 3]  # both runs kept
    first, merged = parsed.steps[0], parsed.steps[1]
    assert math.isnan(first.metrics["actor/pg_loss"])
    assert first.source == "jsonl"
    assert first.end_time == 1767225649.0 and first.time_source == "line"
    # two logger calls of step 2 become one record with both halves
    assert merged.metrics["actor/pg_loss"] == -0.01
    assert merged.phases["gen"] == 32.0 and merged.throughput == 1010.0
    assert merged.end_time == 1767225700.0  # the later object's ts
    assert parsed.steps[3].end_time == pytest.approx(1767229200.0)  # ISO "timestamp"
    (resume,) = events_of(parsed, "resume")
    assert resume.step == 2 and resume.data["from_step"] == 3
    (validation,) = events_of(parsed, "validation")
    assert validation.step == 0
    assert parsed.version_guess == "0.7.1+"


# --- single lines through LogParser ---------------------------------------------------------


def test_step_zero_validation_line_is_an_event_not_a_record() -> None:
    parser = LogParser()
    out = parser.feed("(TaskRunner pid=1) step:0 - val-core/a/acc/mean@1:0.5 - val-aux/b:0.25\n")
    assert len(out) == 1 and isinstance(out[0], Event) and out[0].kind == "validation"
    assert parser.stats.records == 0 and parser.stats.events == 1


def test_validation_line_before_the_training_line_of_its_step_is_one_step() -> None:
    """v0.1-0.2 print ``step:0 - test_score/...`` then the training line of step 0: one step
    record carrying both (it used to be an extra, empty step record)."""
    path = FIXTURES / "failures" / "healthy_v0.1_ppo.log"
    parsed = parse_file(path, log_end=1_750_000_000.0)
    assert [s.step for s in parsed.steps] == list(range(30))
    first = parsed.steps[0]
    assert first.metrics["test_score/openai/gsm8k"] == 0.521
    assert first.phases["gen"] > 0 and first.total is not None
    assert "test_score/openai/gsm8k" not in parsed.steps[1].metrics
    (val,) = events_of(parsed, "validation")
    assert val.step == 0 and val.data["metrics"] == {"test_score/openai/gsm8k": 0.521}
    assert parsed.version_guess == "<=0.2"


def test_jsonl_validation_object_merges_into_the_training_object_of_its_step() -> None:
    parser = LogParser()
    out = feed_all(parser, [
        '{"step": 3, "data": {"val-core/gsm8k/acc/mean@1": 0.61}}',
        '{"step": 3, "data": {"timing_s/gen": 10.0, "timing_s/step": 20.0}}',
        '{"step": 4, "data": {"timing_s/gen": 11.0, "timing_s/step": 21.0}}',
    ])
    records = [r for r in out if isinstance(r, StepRecord)]
    assert [r.step for r in records] == [3, 4]
    assert records[0].metrics["val-core/gsm8k/acc/mean@1"] == 0.61
    assert "val-core/gsm8k/acc/mean@1" not in records[1].metrics


def test_validation_of_another_step_is_not_merged() -> None:
    parser = LogParser()
    out = feed_all(parser, ["step:5 - val-core/a:0.5", "step:6 - timing_s/gen:1.0"])
    (record,) = [r for r in out if isinstance(r, StepRecord)]
    assert record.step == 6 and "val-core/a" not in record.metrics


def test_0_2_era_full_precision_values_with_mfu_actor_and_main_task() -> None:
    """The 0.2 era printed some logs at full precision: still "<=0.2", not "0.5+"."""
    parser = LogParser()
    for i in range(6):
        parser.feed(f"(main_task pid=77) step:{i} - mfu/actor:0.4123456 - actor/lr:1e-06 - "
                    "timing/gen:18.859123 - timing/values:5.66401 - timing/step:40.25 - "
                    "critic/score/mean:0.12345")
    assert parser.version_guess == "<=0.2"
    plain = LogParser()
    for i in range(6):
        plain.feed(f"step:{i} - timing/gen:18.859123 - timing/step:40.25 - actor/lr:1e-06 - "
                   "a:0.12345 - b:0.5")
    assert plain.version_guess == "<=0.2"


@pytest.mark.parametrize(
    "line",
    [
        "step:1000000000000000000000000000000 - timing_s/gen:1.0 - timing_s/step:2.0",
        "step:9223372036854775808 - timing_s/gen:1.0",
        "step:-1 - timing_s/gen:1.0",
        "step:1e30 - timing_s/gen:1.0",
        '{"step": 9223372036854775808, "data": {"timing_s/gen": 1.0}}',
        '{"step": -5, "data": {"timing_s/gen": 1.0}}',
        '{"step": 1e300, "data": {"timing_s/gen": 1.0}}',
    ],
)
def test_step_numbers_outside_int64_are_bad_lines_not_records(line: str) -> None:
    parser = LogParser()
    out = feed_all(parser, [line])
    assert not [r for r in out if isinstance(r, StepRecord)]
    assert parser.stats.parse_errors == 1
    assert "outside 0..2**63-1" in parser.stats.error_samples[0]


def test_largest_int64_step_is_still_a_record() -> None:
    parser = LogParser()
    out = feed_all(parser, ["step:9223372036854775807 - timing_s/gen:1.0"])
    assert [r.step for r in out if isinstance(r, StepRecord)] == [2**63 - 1]


def test_values_keep_bools_nan_and_infinities() -> None:
    parser = LogParser()
    (record,) = parser.feed(
        "step:4 - a:True - b:False - c:nan - d:inf - e:-inf - f:np.True_ - g:np.int64(-1) "
        "- h:np.float32(0.25) - i:-3"
    )
    m = record.metrics
    assert m["a"] is True and m["b"] is False and m["f"] is True
    assert math.isnan(m["c"]) and m["d"] == math.inf and m["e"] == -math.inf
    assert m["g"] == -1 and m["h"] == 0.25 and m["i"] == -3.0


def test_arrival_time_is_the_end_time_without_a_timestamp() -> None:
    parser = LogParser()
    (record,) = parser.feed("step:1 - timing_s/step:3.0", arrival_time=1234.5)
    assert record.end_time == 1234.5 and record.time_source == "arrival"
    (stamped,) = parser.feed("2026-01-02T03:04:05Z step:2 - timing_s/step:3.0", 1234.5)
    assert stamped.time_source == "line" and stamped.end_time == 1767323045.0


def test_tqdm_rate_in_iterations_per_second() -> None:
    parser = LogParser()
    (event,) = parser.feed("Training Progress:  50%|█████     | 50/100 [00:20<00:20,  2.50it/s]")
    assert event.data["s_per_it"] == pytest.approx(0.4)
    assert event.data["eta_s"] == 20.0
    (start,) = parser.feed("Training Progress:   0%|          | 0/100 [00:00<?, ?it/s]")
    assert start.data["eta_s"] is None and start.data["s_per_it"] is None


def test_tqdm_carriage_return_redraws_keep_the_last() -> None:
    parser = LogParser()
    line = (
        "Training Progress:   1%|  | 1/100 [00:10<16:30, 10.0s/it]\r"
        "Training Progress:   2%|  | 2/100 [00:20<16:20, 10.0s/it]"
    )
    (event,) = parser.feed(line)
    assert event.data["current"] == 2


def test_pprint_dict_block_is_swallowed_into_one_validation_event() -> None:
    parser = LogParser()
    out = feed_all(
        parser,
        [
            "Initial validation metrics:",
            "{'val-core/openai/gsm8k/acc/mean@1': 0.25,",
            " 'val-aux/openai/gsm8k/reward/mean@1': 0.5,",
            " 'val-aux/openai/gsm8k/reward/std@1': 0.0}",
            "step:1 - timing_s/step:2.0 - timing_s/gen:1.5",
        ],
    )
    kinds = [type(o).__name__ + ":" + getattr(o, "kind", "") for o in out]
    assert kinds == ["Event:validation", "StepRecord:"]
    assert len(out[0].data["metrics"]) == 3
    assert parser.stats.parse_errors == 0


def test_single_line_quoted_pprint_validation() -> None:
    parser = LogParser()
    # pprint of a short f-string: its repr on one line
    (event,) = parser.feed("\"Final validation metrics: {'val-core/x/acc': np.float64(0.75)}\"")
    assert event.kind == "validation" and event.data["metrics"] == {"val-core/x/acc": 0.75}
    assert parser.flush() == []


def test_unterminated_validation_block_ends_at_flush() -> None:
    parser = LogParser()
    assert parser.feed("('Final validation metrics: '") == []
    assert parser.feed(" \"{'val-core/x/acc': 0.5, \"") == []
    (event,) = parser.flush()
    assert event.kind == "validation" and event.data["metrics"] == {"val-core/x/acc": 0.5}


def test_chained_traceback_is_one_event_with_the_final_exception() -> None:
    parser = LogParser()
    out = feed_all(
        parser,
        [
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in f',
            "KeyError: 'x'",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "a.py", line 3, in g',
            "RuntimeError: worker died",
            "step:9 - timing_s/step:1.0",
        ],
    )
    tracebacks = [o for o in out if isinstance(o, Event) and o.kind == "traceback"]
    assert len(tracebacks) == 1
    assert tracebacks[0].message == "RuntimeError: worker died"
    assert tracebacks[0].data["chained"] == 1
    assert any(isinstance(o, StepRecord) and o.step == 9 for o in out)


def test_traceback_at_the_end_of_a_file_is_emitted_by_flush() -> None:
    parser = LogParser()
    assert parser.feed("Traceback (most recent call last):") == []
    assert parser.feed('  File "x", line 1') == []
    assert parser.feed("ValueError: boom") == []
    (event,) = parser.flush()
    assert event.kind == "traceback" and event.data["type"] == "ValueError"


def test_oom_sizes_in_mib_and_repeated_lines_counted_once() -> None:
    parser = LogParser()
    line = (
        "(WorkerDict pid=3) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "512.00 MiB [repeated 4x across cluster]"
    )
    (event,) = parser.feed(line)
    assert event.kind == "oom" and event.data["tried_gib"] == pytest.approx(0.5)
    assert parser.feed(line) == []  # the same message again before any step: not a new OOM


def test_hybrid_engine_switch_timed_by_arrival() -> None:
    parser = LogParser()
    assert parser.feed("[HybridEngine] Resharding actor from TP=2 to FSDP...", 100.0) == []
    assert parser.feed("[HybridEngine] Old tensor_parallel group destroyed.", 104.0) == []
    assert parser.feed("[HybridEngine] New FSDP process group initialized.", 109.0) == []
    out = parser.feed("Step 7: total=12000ms | actor_gen=2000ms | loss_comp=1000ms", 110.0)
    switch, record = out
    assert switch.kind == "reshard" and switch.data["seconds"] == 9.0
    assert record.phases["reshard"] == 9.0 and record.phases["other"] == 0.0


def test_setting_global_step_suppresses_a_second_resume_for_the_same_restart() -> None:
    parser = LogParser()
    feed_all(parser, [f"step:{n} - timing_s/step:1.0" for n in (1, 2, 3)])
    out = feed_all(parser, ["Setting global step to 2", "step:2 - timing_s/step:1.0"])
    assert [o.kind for o in out if isinstance(o, Event)] == ["resume"]


def test_console_step_going_back_is_a_resume() -> None:
    parser = LogParser()
    out = feed_all(parser, [f"step:{n} - timing_s/step:1.0" for n in (5, 6, 2)])
    resumes = [o for o in out if isinstance(o, Event)]
    assert len(resumes) == 1 and resumes[0].data["from_step"] == 6
    assert [o.step for o in out if isinstance(o, StepRecord)] == [5, 6, 2]


def test_live_jsonl_record_waits_for_the_next_step_or_flush() -> None:
    parser = LogParser()
    assert parser.feed(json.dumps({"step": 1, "data": {"timing_s/step": 5.0}}), 10.0) == []
    assert parser.feed(json.dumps({"step": 1, "data": {"perf/throughput": 9.0}}), 11.0) == []
    (record,) = parser.feed(json.dumps({"step": 2, "data": {"timing_s/step": 6.0}}), 20.0)
    assert record.step == 1 and record.total == 5.0 and record.throughput == 9.0
    assert record.end_time == 11.0
    (last,) = parser.flush()
    assert last.step == 2
    # a late object of the flushed step re-emits it, merged
    assert parser.feed(json.dumps({"step": 2, "data": {"perf/throughput": 7.0}})) == []
    (again,) = parser.flush()
    assert again.step == 2 and again.total == 6.0 and again.throughput == 7.0


def test_unparseable_step_lines_are_counted_and_sampled_noise_is_not() -> None:
    parser = LogParser(source="job.log")
    out = feed_all(
        parser,
        [
            "step:abc - timing_s/gen:1.0",
            "step:3 - timing_s/gen:12x - timing_s/step:20.0",
            '{"step": 4, "data": {"timing_s/gen": 1.0',
            "INFO 2026 vllm engine started",
            "some random output",
            "",
        ],
    )
    assert parser.stats.parse_errors == 3
    assert parser.stats.noise_lines == 2
    samples = parser.stats.error_samples
    assert samples[0].startswith("bad step number: step:abc")
    assert samples[1].startswith("bad value for 'timing_s/gen': step:3")
    assert samples[2].startswith("bad JSON")
    # the readable part of the damaged step line is kept
    (record,) = [o for o in out if isinstance(o, StepRecord)]
    assert record.step == 3 and record.total == 20.0 and "timing_s/gen" not in record.metrics


def test_error_samples_keep_the_last_twenty_cut_to_200_chars() -> None:
    parser = LogParser()
    for i in range(30):
        parser.feed(f"step:x{i} - " + "k:v - " * 100)
    assert parser.stats.parse_errors == 30
    assert len(parser.stats.error_samples) == 20
    assert "step:x29" in parser.stats.error_samples[-1]
    assert "step:x10" in parser.stats.error_samples[0]
    assert all(len(s) <= len("bad step number: ") + 200 for s in parser.stats.error_samples)


def test_step_inside_a_logging_prefix_is_found_but_global_step_is_not_a_step() -> None:
    parser = LogParser()
    (record,) = parser.feed("INFO:trainer: step:12 - timing_s/step:3.5 - timing_s/gen:1.0")
    assert record.step == 12
    assert parser.feed("training/global_step:5 - x:1") == []
    assert parser.stats.parse_errors == 0


# --- whole files ---------------------------------------------------------------------------


def test_missing_file_is_one_line_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    with pytest.raises(LogReadError) as info:
        parse_file(missing)
    message = str(info.value)
    assert str(missing) in message and "\n" not in message and "no such file" in message
    with pytest.raises(LogReadError, match="is a directory"):
        parse_file(tmp_path)


@pytest.mark.slow
def test_unreadable_file_is_a_log_read_error(tmp_path: Path) -> None:
    """A file the user may not read is one clear line. Root reads anything, so as root (CI)
    the check runs in a child process without the DAC-override capabilities (setpriv)."""
    path = tmp_path / "secret.log"
    path.write_text("step:1 - a:1\n")
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(LogReadError, match="permission denied"):
            parse_file(path)
        return
    code = ("import sys\nfrom monitor.logs.canonical_records import LogReadError, parse_file\n"
            "try:\n    parse_file(sys.argv[1])\nexcept LogReadError as exc:\n"
            "    print(exc)\n")
    repo = str(Path(__file__).resolve().parent.parent)
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to test permissions as root"
    done = subprocess.run([setpriv, "--bounding-set", "-dac_override,-dac_read_search",
                           sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60, cwd=repo, env={**os.environ, "PYTHONPATH": repo})
    assert "permission denied" in done.stdout, done.stdout + done.stderr
    assert str(path) in done.stdout and done.stdout.count("\n") == 1


def test_format_is_detected_from_content_not_extension(tmp_path: Path) -> None:
    jsonl_named_log = tmp_path / "metrics.log"
    jsonl_named_log.write_text('\n{"step": 1, "data": {"timing_s/step": 2.0}}\n')
    assert parse_file(jsonl_named_log).format == "jsonl"
    console_named_jsonl = tmp_path / "run.jsonl"
    console_named_jsonl.write_text("step:1 - timing_s/step:2.0\n")
    assert parse_file(console_named_jsonl).format == "console"
    empty = tmp_path / "empty.log"
    empty.write_text("")
    parsed = parse_file(empty)
    assert parsed.format == "empty" and parsed.steps == [] and parsed.version_guess == "unknown"


def test_end_times_without_a_clock_are_relative_never_the_file_mtime(tmp_path: Path) -> None:
    """A log with no clock in its text gets times relative to its first step's start; the
    file's modification time (a copy's, a week later) says nothing of when it ran (issue 37)."""
    path = tmp_path / "run.log"
    path.write_text(
        "step:1 - timing_s/step:10.0\nstep:2 - timing_s/step:20.0\nstep:3 - a:1.0\n"
        "step:4 - timing_s/step:30.0\n"
    )
    os.utime(path, (2_000_000.0, 2_000_000.0))
    parsed = parse_file(path)
    # step 3 lost its timers (a step of its own all the same): the median (20 s) stands in
    assert [s.end_time for s in parsed.steps] == [10.0, 30.0, 50.0, 80.0]
    assert {s.time_source for s in parsed.steps} == {"rebuilt"}
    assert parsed.clock == "relative"
    # where the user says when the log ended, the times end there
    told = parse_file(path, log_end=2_000_000.0)
    assert [s.end_time for s in told.steps][-1] == 2_000_000.0 and told.clock == "absolute"


def test_invalid_utf8_in_a_file_is_replaced_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "bad.log"
    path.write_bytes(b"step:1 - timing_s/step:2.0\n\xff\xfe garbage \xc3\nstep:2 - a:\xff1\n")
    parsed = parse_file(path)
    assert parsed.stats.bad_utf8_lines == 2
    assert [s.step for s in parsed.steps] == [1]
    assert parsed.stats.parse_errors == 1


def test_last_line_without_newline_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "crlf.log"
    path.write_bytes(b"step:1 - timing_s/step:2.0\r\nstep:2 - timing_s/step:3.0")
    parsed = parse_file(path)
    assert [(s.step, s.total) for s in parsed.steps] == [(1, 2.0), (2, 3.0)]


# --- property tests ------------------------------------------------------------------------

VALID_LINE = (FIXTURES / "verl_0.9_numpy_ansi.log").read_text().splitlines()[2]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=20))
def test_arbitrary_text_never_raises(lines: list[str]) -> None:
    parser = LogParser()
    for line in lines:
        assert isinstance(parser.feed(line), list)
    parser.flush()
    assert parser.stats.lines == len(lines)
    assert not any("internal error" in s for s in parser.stats.error_samples)
    assert isinstance(parser.version_guess, str)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    parser = LogParser()
    for raw in data.split(b"\n"):
        parser.feed(raw.decode("utf-8", errors="replace"))
    parser.flush()
    assert not any("internal error" in s for s in parser.stats.error_samples)


PIECES = st.sampled_from(
    [
        " - ",
        ":",
        "step:",
        "np.float64(",
        ")",
        "nan",
        "-",
        "{",
        "}",
        "'",
        '"',
        "\x1b[0m",
        "(",
        "Traceback (most recent call last):",
        "Initial validation metrics: ",
        "[HybridEngine] ",
        "CUDA out of memory",
        "Training Progress: 3%|",
        "Step 1: total=",
        "=12ms",
        "|",
        "\r",
        "e+999",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(VALID_LINE)),
            st.integers(0, 50),
            st.one_of(PIECES, st.text(max_size=5)),
        ),
        max_size=6,
    )
)
def test_mutated_step_lines_never_raise(edits: list[tuple[int, int, str]]) -> None:
    line = VALID_LINE
    for at, cut, insert in edits:
        line = line[:at] + insert + line[at + cut :]
    parser = LogParser()
    out = parser.feed(line) + parser.feed(line[: len(line) // 2]) + parser.flush()
    assert not any("internal error" in s for s in parser.stats.error_samples)
    for item in out:
        assert isinstance(item, (StepRecord, Event))
        if isinstance(item, StepRecord):
            assert set(item.phases) <= set(ALL_PHASES)
            assert all(v >= 0 for v in item.phases.values())


def test_repeated_across_cluster_is_kept_on_the_event() -> None:
    parser = LogParser()
    (event,) = parser.feed(
        "(WorkerDict pid=9, ip=10.0.0.3) actor After offload, memory allocated (GB): 1.50, "
        "memory reserved (GB): 2.00 [repeated 15x across cluster]"
    )
    assert event.kind == "memory" and event.data["repeated"] == 15
    assert event.data["reserved_gb"] == 2.0 and event.data["device_used_gb"] is None


def test_replacement_characters_from_the_reader_are_counted_by_the_parser() -> None:
    parser = LogParser()
    parser.feed("step:1 - timing_s/step:2.0")
    parser.feed("garbage \ufffd\ufffd from a bad byte")
    assert parser.stats.bad_utf8_lines == 1


def test_oversize_line_in_a_file_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "huge.log"
    with open(path, "wb") as fh:
        fh.write(b"step:1 - timing_s/step:2.0\n")
        fh.write(b"step:2 - " + b"k:1.0 - " * (17 * 2**20 // 8) + b"z:1\n")
        fh.write(b"step:3 - timing_s/step:4.0\n")
    parsed = parse_file(path)
    assert [s.step for s in parsed.steps] == [1, 3]
    assert parsed.stats.oversize_lines == 1


@pytest.mark.slow
def test_ten_megabyte_step_line_parses(tmp_path: Path) -> None:
    path = tmp_path / "wide.log"
    fields = " - ".join(f"k{i}:{i}.5" for i in range(600_000))
    path.write_text(f"step:1 - timing_s/step:2.0 - {fields}\n")
    assert path.stat().st_size > 10 * 2**20
    (record,) = parse_file(path).steps
    assert len(record.metrics) == 600_001 and record.metrics["k599999"] == 599999.5


def test_ray_prefix_without_actor_name_and_with_ansi_only_on_text() -> None:
    parser = LogParser()
    (record,) = parser.feed("(pid=77) \x1b[32mstep:3 - timing_s/step:2.0\x1b[0m")
    assert record.step == 3 and record.total == 2.0
    assert parser.version_guess == "unknown"
