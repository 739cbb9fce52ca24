"""Shared windows: the step table, GPU activity, baselines and time windows."""

import numpy as np
import pandas as pd
from detect_builders import make_gpu, make_steps

from monitor.detect import window as W
from monitor.records import Event, StepRecord


def test_step_frame_sorts_dedups_and_fills_totals():
    steps = [
        StepRecord(step=2, end_time=60.0, total=30.0, phases={"gen": 20.0}),
        StepRecord(step=1, end_time=30.0, total=None, phases={"gen": 10.0, "update_actor": 5.0}),
        StepRecord(step=3, end_time=None, total=30.0),
        StepRecord(step=2, end_time=70.0, total=35.0, phases={"gen": 21.0}),  # resumed
    ]
    sf = W.step_frame(steps)
    assert sf["step"].tolist() == [1, 2]
    assert sf["total"].tolist() == [15.0, 35.0]
    assert sf["start"].tolist() == [15.0, 35.0]
    assert np.isnan(sf.loc[0, "throughput"])
    assert W.phase(sf, "values").isna().all()
    assert len(W.step_frame([])) == 0


def test_core_total_leaves_out_testing_and_checkpoints():
    sf = W.step_frame([StepRecord(step=1, end_time=100.0, total=90.0,
                                  phases={"gen": 30.0, "testing": 40.0})])
    assert W.core_total(sf).tolist() == [50.0]


def test_activity_prefers_sm_and_falls_back_to_util_per_gpu():
    steps = make_steps(3)
    gpu = make_gpu(steps, n_gpus=2)
    gpu.loc[gpu["gpu"] == 1, "sm_active"] = np.nan
    act = W.activity(gpu)
    g0 = act[act["gpu"] == 0]
    g1 = act[act["gpu"] == 1]
    assert (g0["act"] == g0["sm_active"]).all() and set(g0["act_source"]) == {"sm"}
    assert (g1["act"] == g1["util"]).all() and set(g1["act_source"]) == {"util"}
    assert len(W.activity(pd.DataFrame())) == 0


def test_rolling_baseline_excludes_the_current_value():
    med, mad = W.rolling_baseline(pd.Series([1.0, 2.0, 3.0, 100.0, 5.0]), 3, min_periods=2)
    assert np.isnan(med[0]) and np.isnan(med[1])
    assert med[2:].tolist() == [1.5, 2.0, 3.0]
    assert mad[3] == 1.0


def test_frozen_baseline_keeps_outliers_out_of_the_history():
    values = pd.Series([1.0] * 10 + [9.0] * 20)
    med, _ = W.frozen_baseline(values, 5, 3, lambda v, m, d: v > 2 * m)
    assert med.iloc[-1] == 1.0  # a lasting jump never becomes the new normal
    plain, _ = W.rolling_baseline(values, 5, 3)
    assert plain.iloc[-1] == 9.0


def test_time_windows_and_assignment():
    win = W.time_windows(0.0, 100.0, 30.0)
    assert win["start"].tolist() == [0.0, 30.0, 60.0, 90.0]
    assert win["end"].tolist()[-1] == 100.0
    idx = W.assign_windows(pd.Series([-1.0, 0.0, 29.9, 30.0, 99.0, 150.0]), win)
    assert idx.tolist() == [-1, 0, 0, 1, 3, -1]
    assert len(W.time_windows(5.0, 5.0, 30.0)) == 0


def test_step_metrics_and_latest_time():
    steps = [StepRecord(step=1, end_time=10.0, metrics={"a": 1, "b": "x", "c": True}),
             StepRecord(step=2, end_time=20.0, metrics={"a": 2.5})]
    assert W.step_metrics(steps, "a").tolist() == [1.0, 2.5]
    assert W.step_metrics(steps, "b").empty
    gpu = pd.DataFrame({"ts": [5.0, 25.0]})
    assert W.latest_time(steps, gpu, pd.DataFrame(), [Event("oom", 30.0)]) == 30.0
    assert W.latest_time([], pd.DataFrame(), pd.DataFrame(), []) is None
