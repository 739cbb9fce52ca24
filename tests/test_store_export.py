"""export_dir and the train.jsonl lines it writes: raw metrics kept, phases reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.logs.keys import phases_and_total
from monitor.records import StepRecord
from monitor.store import RunStore, StoreError, export_dir
from monitor.store.export import jsonl_data


def test_raw_metrics_pass_through_unchanged() -> None:
    metrics = {"timing_s/gen": 30.0, "timing_s/update_weights": 1.0, "timing_s/step": 40.0,
               "actor/lr": 2e-06, "val-core/x/acc/mean@1": 0.5}
    phases, total = phases_and_total(metrics)
    step = StepRecord(step=3, end_time=10.0, total=total, phases=phases, metrics=metrics)
    assert jsonl_data(step) == metrics


def test_phases_from_log_lines_are_written_as_timers() -> None:
    # a breakdown line: no verl keys, phases from the line's own fields (ms)
    step = StepRecord(step=1, end_time=5.0, total=1.242,
                      phases={"gen": 0.412, "values": 0.387, "comm": 0.31, "reshard": 0.9,
                              "other": 0.133},
                      metrics={"total": 1242.0, "actor_gen": 412.0}, source="breakdown")
    data = jsonl_data(step)
    assert data["actor_gen"] == 412.0  # the raw fields stay
    phases, total = phases_and_total(data)
    assert total == pytest.approx(1.242)
    assert {k: round(v, 6) for k, v in phases.items() if k != "other"} == {
        "gen": 0.412, "values": 0.387, "comm": 0.31, "reshard": 0.9}


def test_export_dir_files(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run.db") as store:
        store.add_steps([StepRecord(step=2, end_time=20.0, total=2.0, metrics={"a": 1.0}),
                         StepRecord(step=1, end_time=10.0, total=2.0, metrics={"a": None})])
        store.add_gpu_samples([{"ts": 1.0, "node": "n0", "gpu": 0, "util": 5.0,
                                "mem_used_bytes": 1.0, "mem_total_bytes": 2.0}])
    counts = export_dir(tmp_path / "run.db", tmp_path / "out" / "deep")
    assert counts["steps"] == 2 and counts["gpu"] == 1 and counts["host"] == 0
    lines = [json.loads(x) for x in (tmp_path / "out/deep/train.jsonl").read_text().splitlines()]
    assert [(x["step"], x["ts"]) for x in lines] == [(1, 10.0), (2, 20.0)]  # time order
    header = (tmp_path / "out/deep/host.csv").read_text().splitlines()[0]
    assert header == "ts,node,cpu_max_core_pct,cpu_avg_pct,iowait_pct,disk_read_bps"
    assert json.loads((tmp_path / "out/deep/flags.json").read_text()) == []


def test_export_dir_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such file"):
        export_dir(tmp_path / "missing.db", tmp_path / "out")
    assert not (tmp_path / "missing.db").exists()
