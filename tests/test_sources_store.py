"""StoreSource over a real run store built from the simulator's demo run."""

from __future__ import annotations

import sqlite3

import pytest
from sample_store import build_store

from dashboards.sources import SourceError
from dashboards.sources.base import NCCL_COLUMNS, NODE_SUMMARY_COLUMNS
from dashboards.sources.store import StoreSource
from monitor.store.runstore import RunStore

END = 1_790_000_000.0


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "run.db"
    info = build_store(path, scenario="demo", end_time=END)
    src = StoreSource(path)
    yield src, info
    src.close()


def test_status_and_time_range(demo):
    src, info = demo
    status = src.status()
    assert status.ok and "min of data" in status.message
    lo, hi = src.time_range()
    assert lo <= info["start"] and hi >= info["end"] - 1
    assert src.nodes() == ["node0"]


def test_missing_store_says_so(tmp_path):
    status = StoreSource(tmp_path / "nope.db").status()
    assert not status.ok and status.message.startswith("store missing")
    with pytest.raises(SourceError, match="store missing"):
        StoreSource(tmp_path / "nope.db").gpu_frame(0, 1)


def test_file_that_is_not_a_store_is_unreadable(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    status = StoreSource(bad).status()
    assert not status.ok and "store unreadable" in status.message


def test_empty_store_has_no_data_yet(tmp_path):
    RunStore(tmp_path / "empty.db").close()
    status = StoreSource(tmp_path / "empty.db").status()
    assert (status.ok, status.message) == (False, "no data yet")


def test_gpu_frame_is_downsampled_per_gpu_and_keeps_dips(demo):
    src, info = demo
    full = src.gpu_frame(info["start"], info["end"], max_points=100_000)
    small = src.gpu_frame(info["start"], info["end"], max_points=60)
    assert full.groupby("gpu").size().min() > 500
    per_gpu = small.groupby("gpu").size()
    assert len(per_gpu) == 8 and per_gpu.max() <= 61
    # the lowest raw utilization survives downsampling in util_min
    assert small["util_min"].min() == pytest.approx(full["util"].min())


def test_steps_and_flags_of_the_demo(demo):
    src, info = demo
    steps = src.steps()
    assert len(steps) == info["steps"] and [s.step for s in steps] == sorted(s.step for s in steps)
    kinds = {f.kind for f in src.flags()}
    assert {"io_starvation", "reshard_spike", "gpu_imbalance"} <= kinds
    flags = src.flags()
    assert [f.start for f in flags] == sorted((f.start for f in flags), reverse=True)
    assert all(f.advice for f in flags)
    # a window before the run overlaps no flag
    assert src.flags(start=info["start"] - 7200, end=info["start"] - 3600) == []


def test_nccl_frame_buckets_per_collective(demo):
    src, info = demo
    nccl = src.nccl_frame(info["start"], info["end"], max_points=50)
    assert list(nccl.columns) == list(NCCL_COLUMNS)
    assert set(nccl["coll"]) == {"AllReduce", "AllGather"}
    assert nccl.groupby("coll").size().max() <= 51
    assert (nccl["exec_share"] > 0).all() and (nccl["exec_share"] < 1).all()


def test_node_summary_and_node_frame(demo):
    src, info = demo
    summary = src.node_summary(info["start"], info["end"])
    assert list(summary.columns) == list(NODE_SUMMARY_COLUMNS)
    row = summary.iloc[0]
    assert row["node"] == "node0" and row["gpus"] == 8
    assert 0 < row["util_mean"] <= 100 and 0 < row["mem_used_max_ratio"] <= 1
    frame = src.node_frame(info["start"], info["end"], max_points=100)
    assert set(frame["node"]) == {"node0"} and len(frame) <= 101


def test_store_written_while_reading_is_seen(tmp_path):
    path = tmp_path / "live.db"
    writer = RunStore(path)
    src = StoreSource(path)
    assert src.status().message == "no data yet"
    writer.add_gpu_samples([{"ts": 100.0, "node": "n0", "gpu": 0, "util": 50.0,
                             "mem_used_bytes": 1.0, "mem_total_bytes": 2.0}])
    assert src.status().ok and src.time_range() == (100.0, 100.0)
    writer.close()
    src.close()


def test_locked_or_broken_table_becomes_a_source_error(tmp_path):
    path = tmp_path / "broken.db"
    RunStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE gpu_samples")
    with pytest.raises(SourceError, match="broken.db"):
        StoreSource(path).gpu_frame(0, 10)


def test_long_window_sees_samples_appended_after_the_first_query(tmp_path):
    """Sealed chunks are cached; the chunk still being written is always read afresh."""
    path = tmp_path / "growing.db"
    writer = RunStore(path)
    t0 = 1_700_000_000.0
    writer.add_gpu_samples([{"ts": t0 + i, "node": "n0", "gpu": 0, "util": 80.0,
                             "mem_used_bytes": 1.0, "mem_total_bytes": 2.0}
                            for i in range(3 * 3600)])
    src = StoreSource(path)
    end = t0 + 3 * 3600 + 600
    first = src.gpu_frame(t0, end, max_points=1000)
    assert first["util"].max() == 80.0
    writer.add_gpu_samples([{"ts": t0 + 3 * 3600 + i, "node": "n0", "gpu": 0, "util": 5.0,
                             "mem_used_bytes": 1.0, "mem_total_bytes": 2.0} for i in range(300)])
    second = src.gpu_frame(t0, end, max_points=1000)
    assert second["ts"].max() > first["ts"].max()
    assert second["util_min"].min() == 5.0
    # the old part is unchanged and equals what a fresh reader computes
    fresh = StoreSource(path).gpu_frame(t0, end, max_points=1000)
    assert second.equals(fresh)
    writer.close()


def test_rollout_frame_of_an_agent_loop_run(tmp_path):
    from dashboards.sources.base import ROLLOUT_VIEW_COLUMNS

    path = tmp_path / "agent.db"
    info = build_store(path, scenario="kv_cache_preemption", steps=10, end_time=1_790_000_000.0,
                       detect=False, nccl=False, step_seconds=12)
    src = StoreSource(path)
    try:
        view = src.rollout_frame(info["start"], info["end"], max_points=100)
        assert list(view.columns) == list(ROLLOUT_VIEW_COLUMNS)
        assert sorted(view["server"].unique()) == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]
        assert view.groupby("server")["ts"].nunique().max() <= 101
        assert view["kv_cache_usage"].max() > 0.95 and view["preemptions_per_s"].max() > 1.0
        assert src.rollout_frame(info["start"] - 7200, info["start"] - 3600).empty
    finally:
        src.close()
    sync = tmp_path / "sync.db"
    info = build_store(sync, scenario="healthy", steps=4, detect=False, nccl=False)
    src = StoreSource(sync)
    try:
        assert src.rollout_frame(info["start"], info["end"]).empty
    finally:
        src.close()
