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


def test_nodes_are_marked_only_by_open_flags_naming_them():
    per_gpu = _fleet(128, slow={"node77": 25.0})
    per_gpu.loc[(per_gpu["node"] == "node2") & (per_gpu["gpu"] == 6), "util"] = 40.0
    out = summarize_nodes(per_gpu)
    assert len(out) == 128 and not out["outlier"].any()  # no verdict of its own
    flags = [Flag("gpu_imbalance", "warning", 0.0, None, scope={"node": "node2", "gpus": [6]}),
             Flag("low_utilization", "critical", 0.0, None, scope={"node": "node77"}),
             Flag("low_utilization", "warning", 0.0, 50.0, scope={"node": "node5"}),  # closed
             Flag("stalled", "critical", 0.0, None, scope={})]  # names no node
    marked = mark_outliers(out, flags)
    assert sorted(marked.loc[marked["outlier"], "node"]) == ["node2", "node77"]
    reason = marked.set_index("node")["reason"]
    assert reason["node2"] == "gpu_imbalance warning (GPU 6)"
    assert reason["node77"] == "low_utilization critical"
    assert marked.loc[marked["node"] == "node2", "util_min_gpu"].item() == 40.0


def test_the_sources_keep_no_thresholds_of_their_own():
    import monitor.sources.base as base

    for name in ("OUTLIER_MADS", "SPREAD_POINTS"):
        assert not hasattr(base, name)
