"""Real verl logs from public repositories, judged through ``analyze``'s own path: the trainer
it names, the clock it reads, the wall time against the log's own clock, the flags it raises.

The logs and their sources are in ``tests/fixtures/real_logs/`` (``manifest.json``,
``SOURCES.md``); ``tests/real_logs.py`` finds each one (committed beside the manifest, placed
in ``../shared/real_logs/``, or in a local snapshot of its repository) and reads the reference
clocks. A log that is not here is skipped, saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.logs.canonical_records import parse_file
from monitor.report import render_text
from tests.real_logs import RealLog, analyze_doc, entries, false_flags, load, reference_wall

ENTRIES = entries()
IDS = [e.name for e in ENTRIES]

@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_logs")


def _log(entry: RealLog, cache: Path) -> Path:
    log = load(entry, cache)
    if log is None:
        pytest.skip(f"{entry.name}: not here (no committed copy and no snapshot of "
                    f"{entry.repo} at {entry.commit[:10]})")
    return log


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_each_real_log_reads_as_the_trainer_that_wrote_it(entry: RealLog, cache: Path) -> None:
    doc = analyze_doc(_log(entry, cache))
    assert doc["trainer_mode"] == entry.mode
    if entry.mode == "unknown":
        assert "trainer: unknown" in render_text(doc)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.clock == "tqdm"],
                         ids=[e.name for e in ENTRIES if e.clock == "tqdm"])
def test_wall_time_is_within_2_percent_of_the_logs_own_clock(entry: RealLog,
                                                             cache: Path) -> None:
    log = _log(entry, cache)
    doc = analyze_doc(log)
    wall = doc["summary"]["wall"]
    reference = reference_wall(entry, log, parse_file(log).steps)
    assert reference
    assert wall["clock"] in ("tqdm", "tqdm_end")  # dated by the log's lines, or not
    assert wall["span_s"] == pytest.approx(reference, rel=0.02)
    assert sum(p["share"] for p in doc["summary"]["phases"]) == pytest.approx(1.0)
    pool = doc["pools"]["pools"][0]
    assert pool["seconds_per_gpu"] == pytest.approx(wall["span_s"], rel=0.01)
    assert "no timestamps" not in render_text(doc)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.clock == "wandb_runtime"],
                         ids=[e.name for e in ENTRIES if e.clock == "wandb_runtime"])
def test_a_log_without_a_clock_says_its_times_are_estimates(entry: RealLog,
                                                            cache: Path) -> None:
    """wandb's capture of the trainer's stdout keeps no clock (the bar is redrawn in place):
    the times are rebuilt from the step timers, said to be estimates, and never longer than
    what wandb itself recorded (validation this fork does not time is missing from them)."""
    log = _log(entry, cache)
    doc = analyze_doc(log)
    steps = parse_file(log).steps
    assert {s.time_source for s in steps} == {"rebuilt"}
    assert "estimated (rebuilt from the step times" in render_text(doc)
    reference = reference_wall(entry, log, steps)
    if reference is None:
        pytest.skip(f"{entry.name}: the run's .wandb file is not here")
    assert steps[-1].end_time - steps[0].end_time <= reference * 1.001


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.healthy],
                         ids=[e.name for e in ENTRIES if e.healthy])
def test_healthy_real_runs_raise_no_false_flag(entry: RealLog, cache: Path) -> None:
    """Every warning or critical flag on a healthy run is a true observation, checked on the
    log's own numbers (``tests.real_logs.TRUE_OBSERVATIONS``); no other kind (stalled,
    reshard_spike, phase_imbalance ...) is raised."""
    log = _log(entry, cache)
    assert false_flags(analyze_doc(log), log) == []


def test_the_resumed_sync_run_raises_nothing(cache: Path) -> None:
    """The whole dstack run (PPO with a critic, 2 x 8 GPUs, resumed at step 100): no flag."""
    entry = next(e for e in ENTRIES if e.name == "dstack_ppo_qwen7b_resumed")
    doc = analyze_doc(_log(entry, cache))
    assert [f["kind"] for f in doc["flags"] if f["severity"] != "info"] == []
    assert doc["summary"]["steps"]["count"] == 335


def test_a_crash_before_the_first_step_is_unknown_and_quotes_its_error(cache: Path) -> None:
    entry = next(e for e in ENTRIES if e.name == "maze_ppo_crash_before_step1")
    doc = analyze_doc(_log(entry, cache))
    assert doc["trainer_mode"] == "unknown"
    fatal = [f for f in doc["flags"] if f["kind"] == "fatal_error"]
    assert fatal and "NotImplementedError" in fatal[0]["evidence"]


def test_a_log_placed_beside_the_repository_is_read_first(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``../shared/real_logs/<name>.log`` (the steering repo's copy) is read before the
    snapshot; a copy whose bytes are not the recorded ones is passed over."""
    import tests.real_logs as real_logs

    entry = next(e for e in ENTRIES if e.name == "opd_agent_loop_b91ltsnz")
    source = _log(entry, cache)
    monkeypatch.setattr(real_logs, "SHARED", tmp_path)
    placed = tmp_path / f"{entry.name}.log"
    placed.write_bytes(source.read_bytes())
    assert load(entry, cache / "unused") == placed
    placed.write_bytes(source.read_bytes() + b"\n")
    other = cache / "other"
    other.mkdir()
    assert load(entry, other) in (None, other / f"{entry.name}.log")  # the snapshot, if any
