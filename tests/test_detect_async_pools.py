"""Detectors of today's trainers on fixtures written by verl's own metric code
(tests/fixtures/verl_modes/generate.py): pool_imbalance both ways, stale_samples,
weight_sync_pause, agent_loop_overhead, and the symptoms they explain."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from detect_builders import make_gpu

from monitor.config import load_config
from monitor.detect import DETECTORS, make_context, run_all
from monitor.detect.flag_advice import REAL_KEYS, named_keys
from monitor.logs.canonical_records import parse_file
from monitor.records import Event

FIXTURES = Path(__file__).parent / "fixtures" / "verl_modes"
MINE = ("pool_imbalance", "stale_samples", "weight_sync_pause", "agent_loop_overhead")


def load(name: str, suffix: str = "jsonl"):
    parsed = parse_file(FIXTURES / f"{name}.{suffix}")
    return parsed.steps, parsed.events


def flags_of(name: str, suffix: str = "jsonl", gpu=None):
    steps, events = load(name, suffix)
    return run_all(steps, gpu, None, events)


def kinds(flags) -> list[tuple[str, str]]:
    return [(f.kind, f.severity) for f in flags]


@pytest.mark.parametrize("suffix", ["jsonl", "log"])
def test_fully_async_trainer_waiting_on_rollout_is_named_with_pool_keys(suffix: str) -> None:
    flags = flags_of("fully_async_trainer", suffix)
    pool = [f for f in flags if f.kind == "pool_imbalance"]
    assert len(pool) == 1
    f = pool[0]
    assert f.severity == "critical" and f.scope["pool"] == "rollout" and f.scope["steps"][0] == 7
    assert "waited for samples from the rollout pool" in f.evidence
    assert "fully_async/trainer/idle_ratio" in f.evidence
    text = " ".join(f.advice)
    for key in ("rollout.nnodes", "rollout.n_gpus_per_node", "async_training.staleness_threshold",
                "async_training.trigger_parameter_sync_step"):
        assert key in text
    assert "ppo_micro_batch_size_per_gpu" not in text
    assert all(k in REAL_KEYS for s in f.advice for k in named_keys(s))


@pytest.mark.parametrize("name", ["fully_async_rollouter_waits", "fully_async_rollouter"])
def test_rollouter_waiting_for_weights_points_at_the_trainer(name: str) -> None:
    pool = [f for f in flags_of(name, "log") if f.kind == "pool_imbalance"]
    assert len(pool) == 1 and pool[0].scope["pool"] == "trainer"
    assert "waiting for new weights" in pool[0].evidence
    assert "trainer.n_gpus_per_node" in " ".join(pool[0].advice)


def test_one_step_off_and_separate_async_waits_are_named() -> None:
    one = [f for f in flags_of("one_step_off") if f.kind == "pool_imbalance"]
    assert [f.scope["steps"] for f in one] == [[5, 10]]
    sep = [f for f in flags_of("separate_async") if f.kind == "pool_imbalance"]
    assert [f.scope["steps"] for f in sep] == [[6, 10]]
    assert "trainer.v1.separate_async.hybrid_rollout.enable_switch" in " ".join(sep[0].advice)


def test_stale_and_evicted_samples() -> None:
    stale = [f for f in flags_of("separate_async") if f.kind == "stale_samples"]
    assert len(stale) == 1 and stale[0].scope["steps"] == [6, 10]
    ev = stale[0].evidence
    assert "evicted as too stale" in ev and "failed rollouts" in ev
    assert "trajectory_staleness/mean" in ev
    assert "trainer.v1.sampler.max_off_policy_threshold" in " ".join(stale[0].advice)
    dropped = [f for f in flags_of("fully_async_rollouter_waits", "log") if f.kind == "stale_samples"]
    assert dropped and "dropped by the rollouter" in dropped[0].evidence


def test_agent_loop_overhead_from_tool_calls_and_no_phase_imbalance() -> None:
    flags = flags_of("agent_loop")
    over = [f for f in flags if f.kind == "agent_loop_overhead"]
    assert len(over) == 1 and over[0].scope["steps"] == [5, 10]
    assert "mostly in tool calls" in over[0].evidence
    assert "max_parallel_calls" in " ".join(over[0].advice)
    # gen grew because of the tool calls: the grown phase is explained, not flagged again
    assert "phase_imbalance" not in [f.kind for f in flags]


def test_compute_score_named_when_it_dominates() -> None:
    steps, events = load("agent_loop")
    steps = [dataclasses.replace(s, metrics={
        **s.metrics, "timing_s/agent_loop/tool_calls/mean": 0.0,
        "timing_s/agent_loop/compute_score/mean": 30.0}) for s in steps]
    over = DETECTORS["agent_loop_overhead"](make_context(steps, None, None, events, load_config()))
    assert len(over) == 1 and "mostly in compute_score" in over[0].evidence
    assert over[0].scope["steps"] == [1, 10]


def test_weight_sync_pause_from_the_sync_timer_and_the_synchronizer_line() -> None:
    steps, events = load("fully_async_trainer")
    slow = [dataclasses.replace(s, metrics={**s.metrics, "timing_s/timing_s/param_sync": 40.0})
            if s.step >= 12 else s for s in steps]
    flags = DETECTORS["weight_sync_pause"](make_context(slow, None, None, events, load_config()))
    assert [f.scope["steps"] for f in flags] == [[12, 16]]
    assert "timing_s/timing_s/param_sync" in flags[0].evidence
    assert "checkpoint_engine.backend" in " ".join(flags[0].advice)
    # the [ParameterSynchronizer] line's pause, where printed, is what paused generation
    pauses = [Event("reshard", s.end_time - 1.0, s.step, "sync", {"pause_s": 30.0})
              for s in steps if s.step >= 14 and s.total is not None]
    flags = DETECTORS["weight_sync_pause"](make_context(steps, None, None, pauses, load_config()))
    assert [f.scope["steps"] for f in flags] == [[14, 16]]
    assert "[ParameterSynchronizer] pause" in flags[0].evidence


def test_a_weight_sync_pauses_generation_where_the_printed_config_says_separate_pools() -> None:
    """verl 0.9's V1 separate-async trainer prints the sync trainer's keys: its
    ``update_weights`` (a third of the step here) pauses the rollout pool, which the keys alone
    cannot tell from a colocated sync (the engines sleep through it: no flag)."""
    steps, events = load("sync")
    v1 = [dataclasses.replace(s, metrics={**s.metrics, "timing_s/update_weights":
                                          0.35 * s.metrics["timing_s/step"]})
          for s in steps]
    assert [f for f in run_all(v1, None, None, events) if f.kind == "weight_sync_pause"] == []
    flags = [f for f in run_all(v1, None, None, events, printed_mode="separate_async")
             if f.kind == "weight_sync_pause"]
    assert len(flags) == 1 and flags[0].severity == "critical"
    assert "timing_s/update_weights" in flags[0].evidence


@pytest.mark.parametrize("name", ["sync", "agent_loop", "one_step_off", "separate_async",
                                  "fully_async_trainer"])
def test_healthy_first_steps_raise_none_of_these_flags(name: str) -> None:
    steps, events = load(name)
    head = [s for s in steps if s.step <= 4]
    assert [f for f in run_all(head, None, None, events) if f.kind in MINE] == []


def test_sync_run_is_quiet() -> None:
    assert flags_of("sync") == []


def test_waiting_trainer_node_gets_no_micro_batch_advice() -> None:
    """A trainer node whose GPUs idle while it waits for samples: the detector that would call
    the grown gen a phase imbalance (generation advice) is suppressed by pool_imbalance, and
    no flag advises micro-batches for the wait."""
    steps, events = load("fully_async_trainer")

    def idle_in_gen(df):
        df.loc[df["phase"] == "gen", ["util", "sm_active"]] = 0.5

    gpu = make_gpu([s for s in steps if s.total is not None], n_gpus=8, edit=idle_in_gen)
    ctx = make_context(steps, gpu, None, events, load_config())
    assert DETECTORS["phase_imbalance"](ctx), "the symptom is there before suppression"
    flags = run_all(steps, gpu, None, events)
    assert [f.kind for f in flags] == ["pool_imbalance"]
    assert not any("micro_batch" in a for f in flags for a in f.advice if "do not help" not in a)


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_low_utilization_is_suppressed_while_the_trainer_waits() -> None:
    steps, events = load("fully_async_trainer")

    def slow_everywhere(df):
        df.loc[:, ["util", "sm_active"]] = 20.0

    gpu = make_gpu([s for s in steps if s.total is not None], n_gpus=8, edit=slow_everywhere)
    ctx = make_context(steps, gpu, None, events, load_config())
    assert DETECTORS["low_utilization"](ctx)
    late = [f for f in run_all(steps, gpu, None, events) if f.kind == "low_utilization"]
    pool = [f for f in run_all(steps, gpu, None, events) if f.kind == "pool_imbalance"][0]
    assert all(f.end is not None and f.end < pool.start for f in late)


@pytest.mark.parametrize("kind", MINE)
def test_detectors_say_nothing_without_steps(kind: str) -> None:
    gpu = make_gpu(load("sync")[0][:2], n_gpus=1)
    ctx = make_context([], gpu, None, [], load_config())
    assert DETECTORS[kind](ctx) == []


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_pool_imbalance_opens_live_as_the_lines_arrive() -> None:
    """Fed line by line as the exporter follows the log (arrival times, a rolling window of
    steps, the flag tracker), the warning opens during the waiting versions, once."""
    from monitor.live.flag_tracker import FlagTracker
    from monitor.logs.parser import LogParser
    from monitor.records import StepRecord

    parser, tracker = LogParser("live"), FlagTracker()
    steps: list[StepRecord] = []
    opened_at: list[int] = []
    lines = (FIXTURES / "fully_async_trainer.log").read_text().splitlines()
    for i, line in enumerate(lines):
        now = 1_790_000_000.0 + 70.0 * i
        steps += [it for it in parser.feed(line, arrival_time=now) if isinstance(it, StepRecord)]
        window = [s for s in steps if s.end_time >= now - 1800.0]
        opened, _ = tracker.update(run_all(window, None, None, [], now=now), now=now)
        opened_at += [steps[-1].step for f in opened if f.kind == "pool_imbalance"]
    assert len(opened_at) == 1 and 7 <= opened_at[0] <= 9
    assert [f.kind for f in tracker.active()] == ["pool_imbalance"]
