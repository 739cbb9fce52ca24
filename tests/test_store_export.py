"""export_dir and the train.jsonl lines it writes: raw metrics kept, phases reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.logs.keys import phases_and_total
from monitor.records import StepRecord
from monitor.store import RunStore, StoreError, export_dir
from monitor.store.interchange_export import jsonl_data


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
    assert header == "ts,node,cpu_max_core_pct,cpu_avg_pct,iowait_pct,disk_read_bps,train_rss_bytes"
    assert json.loads((tmp_path / "out/deep/flags.json").read_text()) == []


def test_export_dir_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such file"):
        export_dir(tmp_path / "missing.db", tmp_path / "out")
    assert not (tmp_path / "missing.db").exists()


def test_chunked_export_writes_the_same_files_as_whole_reads(tmp_path: Path) -> None:
    """The export streams (issue 20: a 333 MB store peaked at 1.75 GB): read 7 rows at a
    time, every file holds what the whole-table reads give, in the same order, ties and gaps
    included."""
    import io

    import pandas as pd

    gpu = [{"ts": float(t), "node": f"n{i % 2}", "gpu": i % 3 if i % 5 else None,
            "util": i * 1.5 if i % 4 else float("nan"), "mem_used_bytes": 2.0**40 + i,
            "mem_total_bytes": 2.0**41, "power_w": 123.456789 + i}
           for i, t in enumerate([5, 3, 3, 9, 1, 3, 7, 7, 2] * 4)]  # ties, out of order
    host = [{"ts": 100.0 - i, "node": "n0", "cpu_max_core_pct": 1.0 / (i + 1)}
            for i in range(23)]
    nccl = [{"ts": float(i // 3), "node": "n0", "coll": "AllReduce", "comm": f"c{i}",
             "ops": i, "bytes": 2.0**30, "exec_s": 0.001 * i, "busbw_bps": None}
            for i in range(17)]
    steps = [StepRecord(step=i, end_time=None if i % 6 == 0 else 1000.0 - 10 * (i % 4),
                        total=10.0 + i, phases={"gen": 4.0}, metrics={"timing_s/gen": 4.0,
                                                                      "x": i})
             for i in range(30)]
    with RunStore(tmp_path / "run.db") as store:
        store.add_batch(gpu=gpu, host=host, nccl=nccl, steps=steps)
        whole = {"gpu.csv": store.gpu_frame(), "host.csv": store.host_frame(),
                 "nccl.csv": store.nccl_frame()}
        whole_steps = store.steps()
    counts = export_dir(tmp_path / "run.db", tmp_path / "out", chunk_rows=7, step_chunk_rows=4)
    assert counts["gpu"] == 36 and counts["host"] == 23 and counts["nccl"] == 17
    assert counts["steps"] == 30
    for name, frame in whole.items():
        expected = io.StringIO()
        frame.to_csv(expected, index=False)
        assert (tmp_path / "out" / name).read_text() == expected.getvalue(), name
    back = pd.read_csv(tmp_path / "out" / "gpu.csv")
    assert back["ts"].is_monotonic_increasing and back["gpu"].isna().sum() == 8
    lines = [json.loads(x) for x in (tmp_path / "out/train.jsonl").read_text().splitlines()]
    assert [(x["step"], x["ts"]) for x in lines] == [(s.step, s.end_time) for s in whole_steps]
    assert [x["data"]["x"] for x in lines] == [s.metrics["x"] for s in whole_steps]


def test_an_empty_store_exports_headers_only(tmp_path: Path) -> None:
    RunStore(tmp_path / "run.db").close()
    counts = export_dir(tmp_path / "run.db", tmp_path / "out", chunk_rows=1, step_chunk_rows=1)
    assert set(counts.values()) == {0}
    assert (tmp_path / "out/gpu.csv").read_text().startswith("ts,node,gpu,util,")
    assert len((tmp_path / "out/gpu.csv").read_text().splitlines()) == 1
    assert (tmp_path / "out/train.jsonl").read_text() == ""


def test_rollout_engine_samples_are_exported_and_read_back(tmp_path: Path) -> None:
    from monitor.frames import read_rollout_frame

    with RunStore(tmp_path / "run.db") as store:
        store.add_steps([StepRecord(step=1, end_time=10.0, total=2.0)])
    assert "rollout" not in export_dir(tmp_path / "run.db", tmp_path / "a")
    assert not (tmp_path / "a" / "rollout.csv").exists()  # no engines: no file
    with RunStore(tmp_path / "run.db") as store:
        store.add_rollout_samples([{"ts": 5.0, "node": "n0", "server": "10.0.0.1:8000",
                                    "engine": "vllm", "model": "m", "kv_cache_usage": 0.97,
                                    "running": 40, "waiting": 12, "preemptions_total": 7}])
    assert export_dir(tmp_path / "run.db", tmp_path / "b")["rollout"] == 1
    df = read_rollout_frame(tmp_path / "b" / "rollout.csv")
    assert df.iloc[0]["server"] == "10.0.0.1:8000" and df.iloc[0]["kv_cache_usage"] == 0.97
    assert df.iloc[0]["preemptions_total"] == 7


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00" + bytes(84)],
                         ids=["zero-bytes", "header-only"])
def test_an_empty_file_is_refused_not_turned_into_a_store(tmp_path: Path, content: bytes
                                                          ) -> None:
    """Before: `export` of a 0-byte file wrote a whole schema into it and exported nothing."""
    from monitor.store import StoreError

    src = tmp_path / "empty.db"
    src.write_bytes(content)
    with pytest.raises(StoreError, match="not a verl-monitor run store"):
        export_dir(src, tmp_path / "out")
    assert src.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"] or not any(
        (tmp_path / "out").iterdir())
