"""The trainer mode is recognised from the keys verl's own metric code prints
(tests/fixtures/verl_modes/, written by its generate.py from the mirrored verl source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.logs.canonical_records import LogParser, parse_file
from monitor.logs.modes import (
    TRAINER_MODES,
    WAITING_GEN_MODES,
    judge_mode,
    printed_mode,
    run_mode,
    step_modes,
    trainer_mode,
    waits_in_gen,
)
from monitor.logs.vocabulary import Vocabulary
from monitor.records import StepRecord

FIXTURES = Path(__file__).parent / "fixtures" / "verl_modes"

EXPECTED = {
    "sync": "sync",
    "agent_loop": "agent_loop",
    "one_step_off": "one_step_off",
    "separate_async": "separate_async",
    "fully_async_trainer": "fully_async_trainer",
    "fully_async_rollouter_waits": "fully_async_trainer",
    "fully_async_rollouter": "fully_async_rollouter",
}


@pytest.mark.parametrize("suffix", ["log", "jsonl"])
@pytest.mark.parametrize(("name", "mode"), sorted(EXPECTED.items()))
def test_each_fixture_reads_as_its_trainer(name: str, mode: str, suffix: str) -> None:
    parsed = parse_file(FIXTURES / f"{name}.{suffix}")
    assert parsed.steps, name
    assert run_mode(parsed.steps) == mode


def test_every_mode_has_a_fixture() -> None:
    assert set(EXPECTED.values()) == set(TRAINER_MODES) - {"unknown"}


def test_fully_async_console_lines_of_the_rollouter_alone_read_as_rollouter() -> None:
    """The trainer prints the rollouter's reset_staleness figures on a line of their own: that
    line alone is the rollouter's; the two lines of one step are one step record, the
    trainer's, and so is the run."""
    parser = LogParser()
    raw = [item for line in (FIXTURES / "fully_async_trainer.log").read_text().splitlines()
           for item in parser.feed(line) if isinstance(item, StepRecord)]
    modes = step_modes(raw)
    assert modes[0] == "fully_async_rollouter" and modes[1] == "fully_async_trainer"
    steps = parse_file(FIXTURES / "fully_async_trainer.log").steps
    assert len(steps) == len(raw) // 2
    assert set(step_modes(steps)) == {"fully_async_trainer"}
    assert run_mode(steps) == "fully_async_trainer"


@pytest.mark.parametrize("text", [
    "",
    "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n",
    "step:1 - actor/entropy:0.5 - critic/score/mean:0.1\nstep:2 - actor/entropy:0.4\n",
])
def test_text_with_no_verl_timer_is_unknown_not_sync(tmp_path, text: str) -> None:
    """A pasted traceback, or step lines with no timer, name no trainer and no GPU layout."""
    log = tmp_path / "paste.log"
    log.write_text(text)
    assert run_mode(parse_file(log).steps) == "unknown"


@pytest.mark.parametrize(
    ("keys", "mode"),
    [
        ({"timing_s/gen", "timing_s/step"}, "sync"),
        ({"timing/gen", "timing/step"}, "sync"),
        ({"timing_s/gen", "timing_s/step", "timing_s/agent_loop/slowest/tool_calls"}, "agent_loop"),
        ({"timing_s/gen", "timing_s/step", "timing_s/generate_async"}, "one_step_off"),
        ({"timing_s/step", "timing_s/sync_rollout_weights"}, "one_step_off"),
        ({"timing_s/step", "timing_s/switch_to_trainer"}, "separate_async"),
        ({"timing_s/step", "separate_async/switch/idle"}, "separate_async"),
        ({"timing_s/step", "timing_s/timing_s/param_sync"}, "fully_async_trainer"),
        ({"timing_s/step", "fully_async/trainer/idle_ratio"}, "fully_async_trainer"),
        ({"timing_s/step", "trainer/idle_ratio"}, "fully_async_trainer"),  # unprefixed
        ({"count/staleness_samples", "rollouter/idle_ratio"}, "fully_async_rollouter"),
        ({"fully_async/rollouter/idle_ratio", "fully_async/rollouter/active_time"},
         "fully_async_rollouter"),
        (set(), "unknown"),
        ({"actor/entropy", "critic/score/mean"}, "unknown"),
    ],
)
def test_mode_from_keys(keys: set[str], mode: str) -> None:
    assert trainer_mode(keys) == mode


def test_gen_is_a_wait_only_where_the_rollout_has_its_own_pool() -> None:
    assert {m for m in TRAINER_MODES if waits_in_gen(m)} == set(WAITING_GEN_MODES)
    assert not waits_in_gen("agent_loop") and not waits_in_gen("sync")
    assert waits_in_gen("fully_async_trainer")


def test_vocabulary_tells_the_mode_from_every_key_seen() -> None:
    vocab = Vocabulary()
    vocab.keys.update({"timing_s/gen", "timing_s/step"})
    assert vocab.trainer_mode() == "sync"
    vocab.keys.add("fully_async/total_wait_time")
    assert vocab.trainer_mode() == "fully_async_trainer"


def _v1(mode: str, use_v1: bool = True) -> dict:
    """A printed config of verl 0.9's V1 trainer (only the keys that name the trainer)."""
    return {"trainer": {"use_v1": use_v1, "v1": {"trainer_mode": mode, "sync": {}}}}


def test_the_printed_config_names_the_v1_trainer_it_runs() -> None:
    assert printed_mode(_v1("separate_async")) == "separate_async"
    # verl runs its legacy trainer without use_v1, whatever v1 says
    assert printed_mode(_v1("separate_async", use_v1=False)) is None
    # sync is what the keys say already; colocate_async is no mode here
    assert printed_mode(_v1("sync")) is None and printed_mode(_v1("colocate_async")) is None
    assert printed_mode({"trainer": {"nnodes": 1}}) is None and printed_mode(None) is None


def test_the_printed_mode_decides_only_where_the_keys_cannot_tell() -> None:
    """verl 0.9's V1 trainer prints the common timers in every mode: they read sync, and the
    printed config says separate-async. Keys that name a trainer keep deciding, and a run with
    no step line stays unknown."""
    sync = parse_file(FIXTURES / "sync.jsonl").steps
    assert judge_mode(sync) == ("sync", "keys")
    assert judge_mode(sync, "separate_async") == ("separate_async", "config")
    assert run_mode(sync, "separate_async") == "separate_async"
    agent = parse_file(FIXTURES / "agent_loop.jsonl").steps
    assert judge_mode(agent, "separate_async") == ("separate_async", "config")
    fully = parse_file(FIXTURES / "fully_async_trainer.jsonl").steps
    assert judge_mode(fully, "separate_async") == ("fully_async_trainer", "keys")
    assert judge_mode([], "separate_async") == ("unknown", "keys")
