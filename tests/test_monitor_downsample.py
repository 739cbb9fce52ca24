"""Downsampling keeps about max_points per series and keeps dips and spikes visible."""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.downsample import bucket_seconds, downsample


def _frame(seconds: int, gpus: int = 2) -> pd.DataFrame:
    ts = np.arange(seconds, dtype=float) + 1_700_000_000.0
    rows = []
    for g in range(gpus):
        util = np.full(seconds, 90.0)
        util[1234] = 3.0  # one idle second on every GPU
        mem = np.full(seconds, 50e9)
        mem[4321] = 140e9  # one memory spike
        rows.append(pd.DataFrame({"ts": ts, "node": "n0", "gpu": g, "util": util,
                                  "mem_used_bytes": mem}))
    return pd.concat(rows, ignore_index=True)


def test_six_hours_at_one_second_becomes_about_a_thousand_points_per_gpu():
    df = _frame(6 * 3600)
    out = downsample(df, ["node", "gpu"], ["util", "mem_used_bytes"], max_points=1000)
    per_gpu = out.groupby("gpu").size()
    assert (per_gpu <= 1001).all() and (per_gpu >= 900).all()
    # the single idle second and the single memory spike survive in the envelope
    assert out["util_min"].min() == 3.0
    assert out["mem_used_bytes_max"].max() == 140e9
    # while the mean smooths them away
    assert out["util"].min() > 80


def test_small_frame_comes_back_unchanged_with_envelope_equal_to_value():
    df = _frame(5000).query("ts < 1700000500")
    out = downsample(df, ["node", "gpu"], ["util", "mem_used_bytes"], max_points=1000)
    assert len(out) == len(df)
    assert (out["util_min"] == out["util"]).all()


def test_buckets_align_to_multiples_of_the_width():
    df = _frame(7200, gpus=1)
    out = downsample(df, ["node", "gpu"], ["util"], max_points=100)
    width = bucket_seconds(df["ts"].min(), df["ts"].max(), 100)
    assert width == 72
    assert (out["ts"] % width == 0).all()


def test_step_rule_respects_the_scrape_interval_floor():
    assert bucket_seconds(0, 3600, 1000, floor_s=15) == 15
    assert bucket_seconds(0, 6 * 3600, 1000, floor_s=1) == 22


def test_empty_frame_keeps_its_columns():
    df = _frame(5000).iloc[0:0]
    out = downsample(df, ["node", "gpu"], ["util", "mem_used_bytes"])
    assert out.empty
    assert {"ts", "util", "util_min", "mem_used_bytes_max"} <= set(out.columns)
