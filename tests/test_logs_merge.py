"""Several records of one step are one step; phases outside verl's step timer are part of the
wall time; every weight sync counts once; the summary, the pools and the GPU ledger of one
report agree on the wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.logs.canonical_records import parse_file
from monitor.report import render_text
from tests.real_logs import analyze_doc

TRAINER = "(FullyAsyncTrainer pid=41) "


def kv(step: int, **fields: float) -> str:
    return f"step:{step} - " + " - ".join(f"{k.replace('__', '/')}:{v}"
                                          for k, v in fields.items())


def fully_async_step(n: int, elapsed: int) -> list[str]:
    """One sync cycle as the fully-async trainer prints it: the rollouter's reset_staleness
    line, its own metrics line, the param_sync timing on a line of its own and its print."""
    rollouter = TRAINER + f"step:{n} - fully_async/rollouter/active_time:50.0 - " \
        "fully_async/rollouter/version_time:60.0 - fully_async/rollouter/idle_ratio:0.16"
    trainer = TRAINER + f"step:{n} - training/global_step:{n} - timing_s/gen:20.0 - " \
        "timing_s/old_log_prob:5.0 - timing_s/update_actor:30.0 - timing_s/step:56.0 - " \
        "fully_async/trainer/idle_ratio:0.36 - perf/throughput:900.0"
    sync = TRAINER + f"step:{n} - timing_s/timing_s/param_sync:4.0"
    printed = (TRAINER + "[FullyAsyncTrainer] _fit_update_weights, timing_s/param_sync: "
               f"4.0000 seconds self.current_param_version: {n}")
    bar = f"Training Progress:  {n}%|#  | {n}/100 [{elapsed // 60:02d}:{elapsed % 60:02d}<1:00:00, 60.00s/it]"
    return [rollouter, trainer, printed, sync, bar]


def write_fully_async(tmp_path: Path, steps: int = 6) -> Path:
    lines = ["Training Progress:   0%|   | 0/100 [00:00<?, ?it/s]"]
    for n in range(1, steps + 1):
        lines += fully_async_step(n, 60 * n)
    log = tmp_path / "fully_async.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_the_lines_of_one_fully_async_step_are_one_step(tmp_path: Path) -> None:
    steps = parse_file(write_fully_async(tmp_path), log_end=10_000.0).steps
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    for rec in steps:
        # the sync logged alone ran outside the step timer: 56 s + 4 s, both verl's timers
        assert rec.total == pytest.approx(60.0)
        assert rec.phases["reshard"] == pytest.approx(4.0)
        assert rec.metrics["fully_async/rollouter/active_time"] == 50.0
        assert rec.time_source == "tqdm_end"
    ends = [s.end_time for s in steps]
    assert [b - a for a, b in zip(ends, ends[1:], strict=False)] == [60.0] * 5


def test_each_weight_sync_counts_once_and_the_median_step_is_the_step(tmp_path: Path) -> None:
    doc = analyze_doc(write_fully_async(tmp_path), log_end=10_000.0)
    summary = doc["summary"]
    assert summary["reshard"]["count"] == 6
    assert summary["step_time"]["p50"] == pytest.approx(60.0)
    assert summary["steps"]["count"] == 6
    trainer = next(p for p in doc["pools"]["pools"] if p["pool"] == "trainer")
    assert trainer["causes"]["parameter_sync"] == pytest.approx(6 * 4.0)
    assert not [f for f in doc["flags"] if f["kind"] in ("stalled", "step_time_spikes")]


def test_phase_shares_add_up_to_the_wall_time_and_the_pools_agree(tmp_path: Path) -> None:
    doc = analyze_doc(write_fully_async(tmp_path), log_end=10_000.0)
    wall = doc["summary"]["wall"]["span_s"]
    assert wall == pytest.approx(6 * 60.0)
    assert sum(p["share"] for p in doc["summary"]["phases"]) == pytest.approx(1.0)
    trainer = next(p for p in doc["pools"]["pools"] if p["pool"] == "trainer")
    assert trainer["seconds_per_gpu"] == pytest.approx(wall, rel=0.01)
    assert "share of wall" in render_text(doc)


def sync_06_log(tmp_path: Path) -> Path:
    """verl 0.6+: validation and checkpointing run outside timing_s/step."""
    lines = []
    for n in range(1, 11):
        extra = " - timing_s/testing:120.0 - timing_s/save_checkpoint:30.0" if n % 5 == 0 else ""
        lines.append(f"(TaskRunner pid=3) step:{n} - response/aborted_ratio:0.0 - "
                     "timing_s/gen:60.0 - timing_s/old_log_prob:10.0 - timing_s/update_actor:25.0"
                     f" - timing_s/step:100.0{extra}")
    log = tmp_path / "sync06.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_validation_outside_the_step_timer_is_wall_time(tmp_path: Path) -> None:
    doc = analyze_doc(sync_06_log(tmp_path), log_end=50_000.0)
    summary = doc["summary"]
    assert summary["wall"]["span_s"] == pytest.approx(10 * 100.0 + 2 * 150.0)
    assert sum(p["share"] for p in summary["phases"]) == pytest.approx(1.0)
    pool = doc["pools"]["pools"][0]
    assert pool["seconds_per_gpu"] == pytest.approx(summary["wall"]["span_s"], rel=0.01)


def test_the_gpu_ledger_agrees_with_the_summary(tmp_path: Path) -> None:
    log = sync_06_log(tmp_path)
    end = 50_000.0
    start = end - 1300.0
    rows = ["ts,node,gpu,util,sm_active,mem_used_bytes,mem_total_bytes"]
    t = start - 5.0
    while t <= end + 5.0:
        rows += [f"{t:.1f},n0,{g},90,70,1000000000,80000000000" for g in (0, 1)]
        t += 1.0
    gpu = tmp_path / "gpu.csv"
    gpu.write_text("\n".join(rows) + "\n")
    doc = analyze_doc(log, gpu, log_end=end)
    wall = doc["summary"]["wall"]["span_s"]
    ledger = doc["goodput"]
    assert ledger["gpu_seconds_total"] / ledger["gpus"] == pytest.approx(wall, rel=0.01)
    pool = doc["pools"]["pools"][0]
    assert pool["seconds_per_gpu"] == pytest.approx(wall, rel=0.01)


def test_two_step_timed_records_of_one_step_stay_two(tmp_path: Path) -> None:
    """A step run twice (a restart re-ran it) is two records, never one."""
    lines = ["step:3 - timing_s/gen:5.0 - timing_s/step:10.0",
             "step:3 - timing_s/gen:6.0 - timing_s/step:11.0"]
    log = tmp_path / "rerun.log"
    log.write_text("\n".join(lines) + "\n")
    assert [s.total for s in parse_file(log, log_end=100.0).steps] == [10.0, 11.0]


def fully_async_07_log(tmp_path: Path, versions: int = 6) -> Path:
    """The fully-async trainer of January 2026 (volcengine/verl b178a3c): two trainer steps a
    weight version, each followed by its 'global_steps: ... HH:MM:SS.mmm' print; then the
    version's aggregated metrics (step:N), the bar, the ParameterSynchronizer's own lines, the
    sync's timers on a line of their own (step:N), and the rollouter's line of version N from
    its own process, printed after the next version's metrics."""
    lines = ["2026-01-20 09:59:00,001\tINFO worker.py:1843 -- Started a local Ray instance.",
             "Training Progress:   0%|   | 0/100 [00:00<?, ?it/s]"]
    late: str | None = None
    for n in range(1, versions + 1):
        for local in (1, 2):
            g = 2 * (n - 1) + local
            clock = 10 * 3600 + 65 * (n - 1) + 30 * local
            hh, rest = divmod(clock, 3600)
            lines.append(TRAINER + f"[FullyAsyncTrainer] global_steps: {g} local_trigger_step: "
                         f"{local} trigger_parameter_sync_step: 2 "
                         f"{hh:02d}:{rest // 60:02d}:{rest % 60:02d}.000")
        lines.append(TRAINER + f"step:{n} - training/global_step:{2 * n} - timing_s/gen:8.0 - "
                     "timing_s/old_log_prob:10.0 - timing_s/update_actor:40.0 - "
                     "timing_s/step:60.0 - fully_async/trainer/idle_ratio:0.13")
        if late is not None:
            lines.append(late)
        elapsed = 65 * n
        lines.append(f"Training Progress:  {n}%|#  | {n}/100 [{elapsed // 60:02d}:"
                     f"{elapsed % 60:02d}<1:00:00, 65.00s/it]")
        lines += [
            "(ParameterSynchronizer pid=52) [ParameterSynchronizer] rollout paused. cost 0.50 "
            "seconds",
            "(ParameterSynchronizer pid=52) [ParameterSynchronizer] sync_weights success. cost "
            "4.80 seconds, pause:0.50s, sync:4.30s",
            TRAINER + f"step:{n} - timing_s/wait_last_valid:0.2 - timing_s/param_sync:4.8",
        ]
        late = (f"(FullyAsyncRollouter pid=60) step:{n} - fully_async/rollouter/active_time:"
                "55.0 - fully_async/rollouter/version_time:65.0 - "
                "fully_async/rollouter/idle_ratio:0.15")
    log = tmp_path / "fully_async_07.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_the_january_2026_fully_async_trainer_reads_as_one_step_a_version(
        tmp_path: Path) -> None:
    doc = analyze_doc(fully_async_07_log(tmp_path), log_end=2e9)
    steps = doc["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert all(s["phases"]["reshard"] == pytest.approx(4.8) for s in steps)
    assert all(s["total"] == pytest.approx(64.8) for s in steps)
    assert all("fully_async/rollouter/active_time" in s["metrics"] for s in steps[:-1])
    assert {s["time_source"] for s in steps} == {"tqdm"}
    summary = doc["summary"]
    assert summary["reshard"]["count"] == 6  # one sync a version, not its three lines
    assert summary["step_time"]["p50"] == pytest.approx(64.8)
    assert summary["wall"]["span_s"] == pytest.approx(6 * 65.0, abs=1.0)
    assert sum(p["share"] for p in summary["phases"]) == pytest.approx(1.0)
    trainer = next(p for p in doc["pools"]["pools"] if p["pool"] == "trainer")
    assert trainer["causes"]["parameter_sync"] == pytest.approx(6 * 4.8)
    assert trainer["seconds_per_gpu"] == pytest.approx(summary["wall"]["span_s"], rel=0.01)
    assert not [f for f in doc["flags"] if f["kind"] in ("stalled", "step_time_spikes")]


def test_a_rollouter_line_a_step_late_is_no_resume(tmp_path: Path) -> None:
    """Round 5 N19: with each rollouter line printed after the next step's trainer line
    (``T(n), R(n-1)``, the out-of-turn order the merge joins), every R(n-1) was counted as
    the step going back: 4,999 resumes for 5,000 steps that never went back."""
    lines = []
    for n in range(1, 301):
        lines.append(TRAINER + f"step:{n} - training/global_step:{n} - timing_s/gen:20.0 - "
                     "timing_s/update_actor:30.0 - timing_s/step:56.0")
        if n > 1:
            lines.append(TRAINER + kv(n - 1, fully_async__rollouter__active_time=50.0,
                                      fully_async__rollouter__version_time=60.0))
    log = tmp_path / "late.log"
    log.write_text("\n".join(lines) + "\n")
    parsed = parse_file(log, log_end=100_000.0)
    assert [s.step for s in parsed.steps] == list(range(1, 301))
    assert all(s.metrics.get("fully_async/rollouter/active_time") == 50.0
               for s in parsed.steps[:-1])
    assert [e for e in parsed.events if e.kind == "resume"] == []
    assert "0 resume(s)" in render_text(analyze_doc(log, log_end=100_000.0))


def test_a_true_resume_after_out_of_turn_lines_is_still_one(tmp_path: Path) -> None:
    """The step going back to a step already trained is a resume, out-of-turn lines or not."""
    lines = []
    for n in (1, 2, 3, 4, 2, 3):
        lines.append(TRAINER + f"step:{n} - timing_s/gen:20.0 - timing_s/step:56.0")
    log = tmp_path / "resumed.log"
    log.write_text("\n".join(lines) + "\n")
    parsed = parse_file(log, log_end=100_000.0)
    assert [e.data["from_step"] for e in parsed.events if e.kind == "resume"] == [4]
