"""Retention: old samples become 15 s means (memory keeps its peak), the size cap drops the
oldest downsampled samples first, and steps/events/flags always survive."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.records import Event, Flag, StepRecord
from monitor.store import RunStore


def fill(store: RunStore, seconds: int, gpus: int = 2, t0: float = 0.0) -> None:
    rows = [
        {"ts": t0 + i, "node": "n0", "gpu": g, "util": float(i % 15), "sm_active": None,
         "mem_used_bytes": float(1000 + (i % 15)), "mem_total_bytes": 8000.0}
        for i in range(seconds)
        for g in range(gpus)
    ]
    store.add_gpu_samples(rows)
    store.add_host_samples(
        [{"ts": t0 + i, "node": "n0", "cpu_max_core_pct": 100.0 if i % 2 else 0.0,
          "cpu_avg_pct": 10.0} for i in range(seconds)]
    )
    store.add_nccl_samples(
        [{"ts": t0 + i, "node": "n0", "coll": "AllReduce", "comm": "c0", "ops": 2,
          "bytes": 100.0, "exec_s": 0.5, "busbw_bps": 10.0} for i in range(seconds)]
    )


def test_old_samples_become_bucket_means_with_memory_peaks(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", retention_s=600, downsample_s=15)
    fill(store, 3600)
    store.add_steps([StepRecord(step=1, end_time=5.0, total=5.0)])
    store.add_events([Event(kind="oom", time=6.0)])
    store.upsert_flags([Flag(kind="oom", severity="critical", start=6.0, end=None)])
    result = store.compact()
    # cut = floor((3599 - 600) / 15) * 15 = 2985: 199 buckets of 15 s per series
    assert result["downsampled"] == 2985 * 2 + 2985 + 2985
    old = store.gpu_frame(end=2984.0)
    assert len(old) == 199 * 2
    bucket = old[(old["ts"] == 0.0) & (old["gpu"] == 0)].iloc[0]
    assert bucket["util"] == pytest.approx(7.0)  # mean of 0..14
    assert bucket["mem_used_bytes"] == 1014.0  # the peak, not the mean
    assert store.gpu_frame(start=2985.0)["ts"].nunique() == 3600 - 2985  # recent raw kept
    host = store.host_frame(end=2984.0)
    assert len(host) == 199 and host.iloc[0]["cpu_max_core_pct"] == pytest.approx(7 * 100 / 15)
    nccl = store.nccl_frame(end=2984.0)
    assert nccl.iloc[0]["ops"] == 30 and nccl.iloc[0]["exec_s"] == pytest.approx(7.5)
    assert len(store.steps()) == 1 and len(store.events()) == 1 and len(store.flags()) == 1
    # compacting again changes nothing
    again = store.compact()
    assert again["downsampled"] == 0 and again["dropped"] == 0
    assert len(store.gpu_frame()) == 199 * 2 + (3600 - 2985) * 2
    store.close()


@pytest.mark.slow
def test_size_cap_drops_oldest_downsampled_first(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", retention_s=3600, downsample_s=15)
    fill(store, 3 * 3600, gpus=4)
    store.add_steps([StepRecord(step=i, end_time=float(i * 60), total=60.0) for i in range(300)])
    store.compact()  # downsample the first 2 hours
    full = store.file_bytes()
    newest = store.gpu_frame(start=3 * 3600 - 10.0)
    counts = store.counts()
    total_rows = counts["gpu_samples"] + counts["host_samples"] + counts["nccl_samples"]
    bucket_rows = 2 * 240 * (4 + 1 + 1)  # 2 h of 15 s buckets: 4 GPUs, host, NCCL
    # a cap that takes about a third of the downsampled rows' share of the file
    store.max_bytes = int(store.data_bytes() * (1 - bucket_rows / total_rows / 3))
    result = store.compact()
    assert result["dropped"] > 0
    assert store.data_bytes() <= store.max_bytes
    assert store.file_bytes() < full  # space was handed back to the file system
    df = store.gpu_frame()
    # raw samples (the last hour) are untouched; the earliest buckets are gone
    assert df["ts"].min() > 0.0
    assert len(store.gpu_frame(start=3 * 3600 - 10.0)) == len(newest)
    assert len(store.gpu_frame(start=2 * 3600.0)) == 3600 * 4
    assert len(store.steps()) == 300
    store.close()


@pytest.mark.slow
def test_size_cap_reaches_raw_samples_when_nothing_else_is_left(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", retention_s=10 * 3600)
    fill(store, 3600, gpus=8)
    store.max_bytes = int(store.data_bytes() * 0.5)
    store.compact()
    assert store.data_bytes() <= store.max_bytes
    df = store.gpu_frame()
    assert df["ts"].max() == 3599.0 and df["ts"].min() > 0.0
    store.close()


def test_old_rollout_samples_become_buckets_with_the_fullest_cache(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", retention_s=600, downsample_s=15)
    fill(store, 3600, gpus=1)
    store.add_rollout_samples(
        [{"ts": float(i), "node": "n0", "server": "h:1", "engine": "vllm", "model": "m",
          "kv_cache_usage": 0.99 if i % 15 == 5 else 0.5, "running": 10.0,
          "preemptions_total": float(i)} for i in range(0, 3600, 5)])
    store.compact()
    old = store.rollout_frame(end=2984.0)
    assert len(old) == 199  # one row per 15 s bucket, as the GPU samples
    assert (old["kv_cache_usage"] == 0.99).all()  # the bucket's fullest, not its mean
    assert old["preemptions_total"].iloc[0] == 10.0  # the counter's last value in the bucket
    assert len(store.rollout_frame(start=2985.0)) == len(range(2985, 3600, 5))  # raw, recent
    store.close()
