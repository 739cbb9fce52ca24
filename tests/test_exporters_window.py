"""The rolling window: bounded by age and count, frames in the interchange format."""

from __future__ import annotations

import math
import threading

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS
from monitor.live.rolling_window import RollingWindow
from monitor.records import Event, StepRecord


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_frames_have_canonical_columns_and_extras():
    w = RollingWindow(clock=Clock(1000.0))
    w.add_gpu([{"ts": 999.0, "node": "n0", "gpu": 1, "util": 90.0, "mem_used_bytes": 1.0,
                "mem_total_bytes": 2.0, "up": True, "xid_total": 0}])
    w.add_host([{"ts": 999.0, "node": "n0", "cpu_max_core_pct": 50.0, "cpu_avg_pct": 10.0}])
    steps, gpu, host, events = w.frames()
    assert list(gpu.columns[: len(GPU_COLUMNS)]) == list(GPU_COLUMNS)
    assert {"up", "xid_total"} <= set(gpu.columns)
    assert gpu.loc[0, "gpu"] == 1 and gpu.loc[0, "util"] == 90.0
    assert math.isnan(gpu.loc[0, "sm_active"])  # optional column missing -> NaN
    assert list(host.columns) == list(HOST_COLUMNS)
    assert steps == [] and events == []


def test_empty_window_gives_empty_frames():
    steps, gpu, host, events = RollingWindow().frames()
    assert gpu.empty and list(gpu.columns) == list(GPU_COLUMNS)
    assert host.empty and list(host.columns) == list(HOST_COLUMNS)


def test_old_samples_age_out_and_counts_are_bounded():
    clock = Clock(10_000.0)
    w = RollingWindow(max_age_s=60, max_steps=3, max_events=2, clock=clock)
    w.add_gpu([{"ts": 9_000.0, "node": "n0", "gpu": 0, "util": 1.0},
               {"ts": 9_990.0, "node": "n0", "gpu": 0, "util": 2.0}])
    w.add_steps([StepRecord(step=i, end_time=1.0) for i in range(5)])  # old end times: kept
    w.add_events([Event(kind="progress", time=None) for _ in range(4)])
    steps, gpu, _, events = w.frames()
    assert list(gpu["util"]) == [2.0]
    assert [s.step for s in steps] == [2, 3, 4]
    assert len(events) == 2 and w.dropped["events"] == 2
    clock.t += 120  # two minutes later everything has aged out
    steps, gpu, _, events = w.frames()
    assert gpu.empty and steps == [] and events == []


def test_concurrent_writers_lose_nothing():
    w = RollingWindow(clock=Clock(100.0))

    def writer(gpu: int) -> None:
        for i in range(500):
            w.add_gpu([{"ts": 50.0 + i * 0.01, "node": "n0", "gpu": gpu, "util": 1.0}])

    threads = [threading.Thread(target=writer, args=(g,)) for g in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, gpu, _, _ = w.frames()
    assert len(gpu) == 2000
    assert gpu["ts"].is_monotonic_increasing
    assert w.sizes()["gpu"] == 2000


def test_the_runs_first_steps_are_kept_after_they_age_out():
    clock = Clock(10_000.0)
    w = RollingWindow(max_age_s=60, max_steps=5, first_steps=3, clock=clock)
    w.add_steps([StepRecord(step=i, end_time=float(i)) for i in range(1, 8)])
    assert [s.step for s in w.frames()[0]] == [3, 4, 5, 6, 7]
    clock.t += 120
    assert w.frames()[0] == []
    # the baseline for throughput_regression: the first three steps, not the latest
    assert [s.step for s in w.first_steps()] == [1, 2, 3]


def test_nccl_rows_reach_the_detectors_as_a_frame_and_age_out():
    clock = [1000.0]
    w = RollingWindow(max_age_s=60.0, clock=lambda: clock[0])
    assert w.nccl().empty and "exec_s" in w.nccl().columns
    w.add_nccl([{"ts": 990.0, "node": "n0", "coll": "AllReduce", "comm": "0x1", "ops": 8,
                 "bytes": 1e9, "exec_s": 2.5, "busbw_bps": 3e11}])
    df = w.nccl()
    assert df[["coll", "comm"]].values.tolist() == [["AllReduce", "0x1"]]
    assert df["exec_s"].tolist() == [2.5] and w.sizes()["nccl"] == 1
    clock[0] = 1100.0
    assert w.nccl().empty


def test_an_oom_before_a_flood_of_events_stays_until_a_detector_pass_saw_it():
    """An OOM followed by 1,500 other events before the next detector pass: the pass still
    sees it (and later ones too, until no other event is left to evict); evictions count."""
    w = RollingWindow(max_events=1000)
    w.add_events([Event(kind="oom", time=1.0, message="CUDA out of memory")])
    w.add_events([Event(kind="progress", time=2.0 + i) for i in range(1500)])
    _, _, _, events = w.frames()
    assert [e.kind for e in events].count("oom") == 1
    assert len(events) == 1000 and w.dropped["events"] == 501
    w.add_events([Event(kind="progress", time=9e3 + i) for i in range(1500)])
    _, _, _, events = w.frames()
    assert [e.kind for e in events].count("oom") == 1  # others go first, even after it was seen
    assert w.dropped["events"] == 2001


def test_unseen_critical_events_pass_the_cap_and_seen_ones_go_when_nothing_else_is_left():
    w = RollingWindow(max_events=2)
    w.add_events([Event(kind="nccl_timeout", time=float(i), data={"fatal": True})
                  for i in range(3)])
    assert w.sizes()["events"] == 3 and w.dropped["events"] == 0  # none seen yet: all kept
    _, _, _, events = w.frames()
    assert len(events) == 3
    w.add_events([Event(kind="traceback", time=9.0, data={"fatal": True})])
    assert w.sizes()["events"] == 2 and w.dropped["events"] == 2
    _, _, _, events = w.frames()
    assert [e.time for e in events] == [2.0, 9.0]


def test_rollout_rows_age_out_and_come_back_as_the_rollout_frame():
    from monitor.frames import ROLLOUT_COLUMNS

    clock = Clock(1000.0)
    w = RollingWindow(max_age_s=60.0, clock=clock)
    assert list(w.rollout().columns) == list(ROLLOUT_COLUMNS) and len(w.rollout()) == 0
    w.add_rollout([{"ts": 930.0, "node": "n0", "server": "h:1", "engine": "vllm", "model": "m",
                    "kv_cache_usage": 0.5, "preemptions_total": 1.0},
                   {"ts": 990.0, "node": "n0", "server": "h:1", "engine": "vllm", "model": "m",
                    "kv_cache_usage": 0.97, "preemptions_total": 3.0}])
    df = w.rollout()
    assert df["ts"].tolist() == [990.0] and df["kv_cache_usage"].tolist() == [0.97]
    assert math.isnan(df["waiting"].iloc[0]) and w.sizes()["rollout"] == 1
