"""Console text: step lines per release, tqdm, breakdown, validation block, OOM, JSON values."""

from __future__ import annotations

import re

from monitor.sim.engine import SimRun
from monitor.sim.logtext import (
    breakdown_line,
    iso_timestamp,
    jsonable,
    oom_traceback,
    tqdm_line,
)


def _step_line(version: str) -> str:
    run = SimRun(steps=2, gpus_per_node=2, verl_version=version)
    return run.log_lines(1)[0]


def test_step_lines_are_long_like_real_verl():
    for version in ("0.6", "0.7.1", "0.8", "0.9"):
        assert len(_step_line(version)) > 3000, version
    for version in ("0.3", "0.4.1", "0.5"):  # fewer keys, shorter numbers
        assert len(_step_line(version)) > 1900, version


def test_041_prints_every_value_with_three_decimals():
    line = _step_line("0.4.1")
    assert line.startswith("(TaskRunner pid=")
    body = line.split(") ", 1)[1]
    assert body.startswith("step:2 - ")
    values = [kv.rsplit(":", 1)[1] for kv in body.split(" - ")[1:]]
    assert all(re.fullmatch(r"-?\d+\.\d{3}", v) for v in values)
    assert "training/global_step:2.000" in body and "actor/lr:0.000" in body
    assert "timing_s/reshard:" in body and "timing_s/update_weights" not in body


def test_05_to_08_print_python_repr():
    line = _step_line("0.5")
    assert "training/global_step:2 " in line and "actor/lr:1e-06" in line
    assert "np.float64" not in line and "timing_s/reshard:" in line
    line = _step_line("0.8")
    assert "actor/perf/max_memory_reserved_gb:" in line and "perf/max_memory" not in line.replace(
        "actor/perf/max_memory", "")


def test_09_wraps_numpy_scalars_and_colours_the_prefix():
    line = _step_line("0.9")
    assert line.startswith("\x1b[36m(TaskRunnerV1 pid=") and ", ip=10.0.0.11)\x1b[0m step:2" in line
    assert "actor/entropy:np.float64(" in line
    assert "training/global_step:2 " in line  # a Python int stays bare
    assert "timing_s/update_weights:" in line


def test_preamble_has_validation_block_step0_and_tqdm():
    run = SimRun(steps=2, verl_version="0.9")
    pre = run.preamble()
    assert "Initial validation metrics:" in pre[0]
    assert any("step:0 - val-aux/openai/gsm8k/reward/mean@1:np.float64(" in ln for ln in pre)
    assert pre[-1].endswith("Training Progress:   0%|          | 0/2 [00:00<?, ?it/s]")


def test_tqdm_line_shows_progress_and_rate():
    assert tqdm_line(19, 624, 19 * 196.4) == (
        "Training Progress:   3%|▎         | 19/624 [1:02:11<33:00:22, 196.40s/it]"
    )


def test_breakdown_line_in_milliseconds():
    line = breakdown_line(1234, 1.242, {"actor_gen": 0.412, "comm": 0.31})
    assert line == "Step 1234: total=1242ms | actor_gen=412ms | comm=310ms"


def test_oom_traceback_ends_with_cuda_out_of_memory():
    lines = oom_traceback(3, "10.0.0.11", 4242, 0.5)
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert "GPU 3" in lines[-1]


def test_json_values_turn_nan_and_inf_into_null():
    assert jsonable({"a": float("nan"), "b": float("inf"), "c": 1.5, "d": 3}) == {
        "a": None, "b": None, "c": 1.5, "d": 3}


def test_iso_timestamp_is_utc_with_milliseconds():
    assert iso_timestamp(1_767_225_600.25) == "2026-01-01T00:00:00.250+00:00"
