"""Shared source helpers: steps as a frame, scope labels, peer-compared node outliers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboards.sources.base import mark_outliers, parse_scope, steps_to_frame, summarize_nodes
from monitor.records import Flag, StepRecord


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
    import dashboards.sources.base as base

    for name in ("OUTLIER_MADS", "SPREAD_POINTS"):
        assert not hasattr(base, name)


def test_rollout_view_buckets_gauges_and_turns_counters_into_rates():
    from dashboards.sources.base import ROLLOUT_VIEW_COLUMNS, rollout_view

    rows = []
    for i, ts in enumerate([0.0, 5.0, 10.0, 15.0]):
        for server, pre in (("a:1", 4.0 * i), ("b:2", [0.0, 10.0, 2.0, 6.0][i])):
            rows.append({"ts": ts, "node": "n0", "server": server, "engine": "vllm",
                         "model": "m", "kv_cache_usage": 0.5 + 0.1 * i, "running": 10 * i,
                         "waiting": 1, "paused": 0, "preemptions_total": pre,
                         "generation_tokens_total": 100.0 * i, "queue_time_mean_s": 0.1,
                         "e2e_latency_mean_s": 2.0, "sleeping": 0})
    view = rollout_view(pd.DataFrame(rows), width=10.0)
    assert list(view.columns) == list(ROLLOUT_VIEW_COLUMNS)
    a = view[view["server"] == "a:1"].reset_index(drop=True)
    assert a["ts"].tolist() == [0.0, 10.0]
    assert a["running"].tolist() == [5.0, 25.0] and a["engine"].tolist() == ["vllm", "vllm"]
    assert np.isnan(a.loc[0, "preemptions_per_s"])  # no previous bucket
    assert a.loc[1, "preemptions_per_s"] == (12.0 - 4.0) / 10.0
    assert a.loc[1, "tokens_per_s"] == (300.0 - 100.0) / 10.0
    # a counter that falls (an engine restarted) counts from zero
    b = view[view["server"] == "b:2"].reset_index(drop=True)
    assert b.loc[1, "preemptions_per_s"] == 6.0 / 10.0
    assert rollout_view(pd.DataFrame(), 5.0).empty
