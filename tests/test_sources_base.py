"""Shared source helpers: steps as a frame, scope labels, peer-compared node outliers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.records import Flag, StepRecord
from monitor.sources.base import mark_outliers, parse_scope, steps_to_frame, summarize_nodes


def test_steps_frame_has_one_column_per_phase_in_canonical_order():
    steps = [
        StepRecord(step=2, end_time=20.0, total=10.0, phases={"update_actor": 3.0, "gen": 5.0}),
        StepRecord(step=1, end_time=10.0, total=9.0, phases={"gen": 4.0, "reshard": 1.0},
                   throughput=1000.0),
    ]
    df = steps_to_frame(steps)
    assert list(df["step"]) == [1, 2]
    assert [c for c in df.columns if c in ("gen", "update_actor", "reshard")] == [
        "gen", "update_actor", "reshard"]
    assert np.isnan(df.loc[0, "update_actor"]) and df.loc[1, "gen"] == 5.0


def test_scope_label_round_trips():
    flag = Flag("gpu_imbalance", "warning", 0.0, None,
                scope={"node": "n3", "gpus": [3, 5], "phase": "gen"})
    assert parse_scope(flag.scope_label) == {"node": "n3", "gpus": [3, 5], "phase": "gen"}
    assert parse_scope("") == {}


def _fleet(n_nodes: int, slow: dict[str, float] | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n_nodes):
        node = f"node{i}"
        for g in range(8):
            util = 88 + rng.normal(0, 1.5) - (slow or {}).get(node, 0.0)
            rows.append({"node": node, "gpu": g, "util": util, "sm_active": util - 10,
                         "mem_ratio": 0.6})
    return pd.DataFrame(rows)


def test_slow_node_among_128_is_marked_and_no_other():
    out = summarize_nodes(_fleet(128, slow={"node77": 25.0}))
    assert len(out) == 128
    assert list(out.loc[out["outlier"], "node"]) == ["node77"]
    assert "fleet median" in out.loc[out["node"] == "node77", "reason"].item()


def test_uniform_fleet_has_no_outliers():
    assert not summarize_nodes(_fleet(16))["outlier"].any()


def test_one_lagging_gpu_marks_its_node_as_imbalanced():
    per_gpu = _fleet(4)
    per_gpu.loc[(per_gpu["node"] == "node2") & (per_gpu["gpu"] == 6), "util"] = 40.0
    out = summarize_nodes(per_gpu)
    row = out[out["node"] == "node2"].iloc[0]
    assert row["outlier"] and "GPU spread" in row["reason"]
    assert row["util_min_gpu"] == 40.0


def test_mark_outliers_needs_three_nodes_for_peer_comparison():
    df = pd.DataFrame({"node": ["a", "b"], "util_mean": [90.0, 20.0], "util_spread": [1.0, 1.0],
                       "util_min_gpu": [89.0, 19.0], "util_max_gpu": [90.0, 20.0]})
    assert not mark_outliers(df)["outlier"].any()
