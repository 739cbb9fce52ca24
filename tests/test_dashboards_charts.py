"""Chart builders: what each figure shows a person (spikes marked, phases ordered, scope
highlighted, empty data explained)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboards import charts
from dashboards.sources.base import steps_to_frame
from monitor.records import Flag, StepRecord


def _steps(n: int = 30, spike_at: int | None = None, reshard_spike_at: int | None = None):
    out = []
    for i in range(1, n + 1):
        reshard = 9.0 if i == reshard_spike_at else 0.5
        total = 24.0 if i == spike_at else 12.0
        out.append(StepRecord(step=i, end_time=1000.0 + 12 * i, total=total, throughput=3000.0,
                              phases={"gen": 6.0, "update_actor": 3.0, "reshard": reshard,
                                      "old_log_prob": 1.0}))
    return out


def _names(fig) -> list[str]:
    return [t.name for t in fig.data]


def _annotation(fig) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def test_step_time_spike_is_marked_where_the_flag_says():
    from monitor.records import Flag

    frame = steps_to_frame(_steps(spike_at=17))
    flag = Flag("step_time_spikes", "warning", 0.0, None, scope={"steps": [17, 17]})
    fig = charts.step_time_trend(frame, flagged=charts.flagged_steps([flag], "step_time_spikes",
                                                                     frame))
    spike = next(t for t in fig.data if t.name.startswith("spike"))
    assert list(spike.x) == [17]


def test_no_flag_no_spike_marker():
    # the chart draws no verdict of its own: a spike the detector did not flag is not marked
    fig = charts.step_time_trend(steps_to_frame(_steps(spike_at=17)))
    assert not any(n.startswith("spike") for n in _names(fig))


def test_reshard_spike_marked_from_the_flag_time_when_it_has_no_step_range():
    from monitor.records import Flag

    frame = steps_to_frame(_steps(reshard_spike_at=20))
    end = float(frame.loc[frame["step"] == 20, "end_time"].iloc[0])
    flag = Flag("reshard_spike", "warning", end - 0.5, end + 0.5, scope={"node": "n0"})
    fig = charts.reshard_vs_median(frame, flagged=charts.flagged_steps([flag], "reshard_spike",
                                                                       frame))
    spike = next(t for t in fig.data if t.name.startswith("spike"))
    assert list(spike.x) == [20] and list(spike.y) == [9.0]


def test_comm_threshold_line_comes_from_the_config():
    steps = steps_to_frame([StepRecord(step=1, end_time=1.0, total=10.0,
                                       phases={"gen": 7.0, "comm": 3.0})])
    fig = charts.comm_share(steps, pd.DataFrame())
    assert any(s.y0 == 25.0 for s in fig.layout.shapes)
    assert "comm_heavy" in _annotation(fig)


def test_step_axes_are_whole_numbers():
    fig = charts.step_time_trend(steps_to_frame(_steps(n=5)))
    assert fig.layout.xaxis.tickformat == "d" and fig.layout.xaxis.dtick == 1


def test_reshard_chart_explains_missing_timing():
    steps = [StepRecord(step=1, end_time=1.0, total=10.0, phases={"gen": 9.0})]
    fig = charts.reshard_vs_median(steps_to_frame(steps))
    assert "no reshard timing" in _annotation(fig)


def test_phase_bars_follow_verls_order_and_keep_the_last_steps():
    fig = charts.phase_stacked_bars(steps_to_frame(_steps(n=100)), last=40)
    assert _names(fig) == ["gen", "old_log_prob", "update_actor", "reshard"]
    assert list(fig.data[0].x) == list(range(61, 101))
    assert fig.layout.barmode == "stack"


def test_gpu_heatmap_rows_in_natural_order_with_one_column_per_bucket():
    rows = [{"ts": float(t), "node": "n0", "gpu": g, "util": 50.0 + g}
            for t in range(5) for g in (10, 2, 0)]
    fig = charts.gpu_heatmap(pd.DataFrame(rows), "util", "util")
    heat = fig.data[0]
    assert list(heat.y) == ["n0/0", "n0/2", "n0/10"]
    assert np.asarray(heat.z).shape == (3, 5)
    assert np.asarray(heat.z)[2, 0] == 60.0


def test_node_heatmap_scales_to_128_nodes():
    frame = pd.DataFrame([{"ts": float(t), "node": f"node{i}", "util": 80.0}
                          for t in range(0, 3600, 15) for i in range(128)])
    fig = charts.node_heatmap(frame)
    assert len(fig.data[0].y) == 128 and list(fig.data[0].y[:3]) == ["node0", "node1", "node2"]
    assert np.asarray(fig.data[0].z).shape == (128, 240)


def test_empty_frames_say_why():
    empty = pd.DataFrame(columns=["ts", "node", "gpu", "util"])
    assert "no data in this window" in _annotation(charts.gpu_heatmap(empty, "util", "u"))
    assert "no steps yet" in _annotation(charts.step_time_trend(steps_to_frame([])))
    assert "NCCL Inspector" in _annotation(charts.nccl_by_op(pd.DataFrame(), "exec_share", "t"))


def test_step_timeline_draws_phase_bands_with_their_durations_and_the_gpu_overlay():
    from monitor.analysis.attribution import phase_timeline

    steps = _steps(n=2)
    fleet = pd.DataFrame({"ts": [1000.0, 1010.0], "util_mean": [90.0, 40.0],
                          "util_min": [80.0, 5.0]})
    fig = charts.step_timeline(phase_timeline(steps), fleet)
    gen = next(t for t in fig.data if t.name == "gen")
    assert list(gen.x) == [6000.0, 6000.0]  # milliseconds on a date axis
    assert {"GPU util mean", "GPU util lowest"} <= set(_names(fig))


def test_imbalance_evidence_highlights_the_lagging_gpu_and_shades_the_window():
    gpu = pd.DataFrame([{"ts": float(t), "node": "n0", "gpu": g, "util": 30.0 if g == 3 else 90.0,
                         "sm_active": 50.0} for t in range(100, 200, 5) for g in range(4)])
    flag = Flag("gpu_imbalance", "warning", 120.0, 180.0, scope={"node": "n0", "gpus": [3]})
    fig = charts.flag_evidence(flag, gpu, pd.DataFrame(), pd.DataFrame())
    lagging = next(t for t in fig.data if t.name == "n0/3 *")
    assert lagging.line.width == 3
    assert [s.type for s in fig.layout.shapes] == ["rect"]


def test_memory_creep_evidence_carries_the_growth_on_to_the_capacity():
    gib = 2**30
    gpu = pd.DataFrame([{"ts": float(t), "node": "n0", "gpu": g,
                         "mem_used_bytes": (10 + (t / 60.0) * (2 if g == 1 else 0)) * gib,
                         "mem_total_bytes": 80 * gib} for t in range(0, 1200, 10) for g in range(2)])
    flag = Flag("memory_creep", "warning", 600.0, None, scope={"node": "n0", "gpus": [1]},
                evidence="GPU 1 on node n0: memory grows steadily (12 min: 20.0 -> 48.0 GiB of "
                         "80 GiB): at +2.0 GiB per minute, out of memory in about 16 minutes.")
    fig = charts.flag_evidence(flag, gpu, pd.DataFrame(), pd.DataFrame(), window=(0.0, 1190.0))
    line = next(t for t in fig.data if t.name.startswith("at +2.0 GiB per minute"))
    assert abs(line.y[-1] - 80.0) < 1e-6
    # it reaches the capacity about (80 - 49.7) / 2 = 15 minutes after the last sample
    end = pd.Timestamp(line.x[-1]).timestamp()
    assert 1190 + 13 * 60 < end < 1190 + 17 * 60


def test_io_starvation_evidence_shows_iowait_and_gpu_activity():
    host = pd.DataFrame({"ts": [100.0, 110.0], "node": "n0", "iowait_pct": [2.0, 35.0],
                         "cpu_max_core_pct": [50.0, 100.0]})
    fleet = pd.DataFrame({"ts": [100.0, 110.0], "util_mean": [90.0, 30.0],
                          "util_min": [80.0, 0.0], "sm_active_mean": [60.0, 10.0]})
    flag = Flag("io_starvation", "warning", 105.0, None, scope={"node": "n0"})
    fig = charts.flag_evidence(flag, pd.DataFrame(), host, pd.DataFrame(), fleet)
    assert {"iowait %", "busiest core %", "GPU util mean %"} == set(_names(fig))


def test_gpu_heatmap_writes_each_marked_rows_word_in_its_own_label():
    rows = [{"ts": float(t), "node": "n0", "gpu": g, "util": 99.0 if g == 1 else 60.0}
            for t in range(5) for g in range(3)]
    fig = charts.gpu_heatmap(pd.DataFrame(rows), "util", "util",
                             highlight={"n0/1": "STRAGGLER"})
    # the mark is part of the row's tick label (it cannot overlap the name), nothing says LOW
    assert list(fig.layout.yaxis.tickvals) == ["n0/0", "n0/1", "n0/2"]
    texts = list(fig.layout.yaxis.ticktext)
    assert texts[0] == "n0/0" and texts[2] == "n0/2"
    assert texts[1].startswith("n0/1 ") and "STRAGGLER" in texts[1]
    assert not fig.layout.annotations and "LOW" not in " ".join(texts)


def test_a_marked_row_keeps_its_label_among_many_rows():
    rows = [{"ts": 0.0, "node": f"n{n}", "gpu": g, "util": 50.0} for n in range(8)
            for g in range(8)]
    fig = charts.gpu_heatmap(pd.DataFrame(rows), "util", "util",
                             highlight={"n5/3": "STRAGGLER"})
    labelled = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext, strict=True))
    assert len(labelled) < 64 and "STRAGGLER" in labelled["n5/3"]


def test_step_based_evidence_shades_the_flags_steps():
    steps = steps_to_frame(_steps(reshard_spike_at=21))
    flag = Flag("reshard_spike", "critical", 0.0, 1.0, scope={"phase": "reshard",
                                                              "steps": [20, 24]})
    fig = charts.flag_evidence(flag, pd.DataFrame(), pd.DataFrame(), steps)
    (rect,) = fig.layout.shapes
    assert (rect.x0, rect.x1) == (19.5, 24.5)
    assert fig.layout.title.text == "reshard_spike: evidence"


def test_a_heat_map_of_many_nodes_labels_every_kth_row() -> None:
    ts = np.repeat([1_790_000_000.0, 1_790_000_015.0], 128)
    nodes = [f"node{i}" for i in range(128)] * 2
    frame = pd.DataFrame({"ts": ts, "node": nodes, "util": 50.0})
    fig = charts.node_heatmap(frame)
    labels = list(fig.layout.yaxis.tickvals)
    assert 16 <= len(labels) <= charts.ROW_LABELS_MAX
    assert labels[:2] == ["node0", "node4"]  # natural order, every 4th of 128
    assert len(fig.data[0].y) == 128  # every row is drawn (hover names it)
    few = charts.node_heatmap(frame[frame["node"].isin(["node0", "node1"])])
    assert few.layout.yaxis.tickvals is None  # a few rows: each labelled


def _rollout_view() -> pd.DataFrame:
    rows = []
    for k, ts in enumerate(np.arange(0.0, 50.0, 5.0)):
        for i in range(3):
            running = 40.0 - 10 * k if k < 4 else (2.0 if i == 0 else 0.0)
            rows.append({"ts": ts, "node": "n0", "server": f"vllm-{i}", "engine": "vllm",
                         "model": "m", "kv_cache_usage": 0.9, "running": running,
                         "waiting": 3.0, "paused": 0.0, "preemptions_per_s": 0.5,
                         "tokens_per_s": 100.0, "queue_time_mean_s": 0.1,
                         "e2e_latency_mean_s": 2.0, "sleeping": 0.0})
    return pd.DataFrame(rows)


def test_rollout_charts_draw_one_line_per_server_and_the_tail():
    view = _rollout_view()
    fig = charts.rollout_by_server(view, "kv_cache_usage", "KV", scale=100.0, unit="%")
    assert [t.name for t in fig.data] == ["vllm-0", "vllm-1", "vllm-2"]
    assert max(fig.data[0].y) == 90.0
    tail = charts.rollout_tail(view)
    busy = list(tail.data[1].y)
    assert busy[:4] == [3.0, 3.0, 3.0, 3.0] and busy[-1] == 1.0  # one server left running
    assert list(tail.data[0].y)[-1] == 2.0
    req = charts.rollout_requests(view)
    assert [t.name for t in req.data] == ["running", "waiting", "paused"]
    two = pd.concat([view, view.assign(node="n1")])
    labels = [t.name for t in charts.rollout_by_server(two, "running", "R").data]
    assert labels[0] == "n0/vllm-0" and len(labels) == 6


def test_rollout_charts_without_engines_say_how_to_get_them():
    for fig in (charts.rollout_by_server(pd.DataFrame(), "running", "R"),
                charts.rollout_tail(pd.DataFrame()), charts.rollout_requests(None)):
        assert "--rollout-server" in fig.layout.annotations[0].text
