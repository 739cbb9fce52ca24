"""Every dashboard page, run by Streamlit's AppTest on a run store built from the demo run."""

from __future__ import annotations

import html
import json
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from sample_store import build_store
from streamlit.testing.v1 import AppTest

from dashboards.escape import shown_text
from dashboards.html_blocks import stat_values
from monitor.store.runstore import RunStore

pytestmark = pytest.mark.slow  # starts processes (make test-fast skips it)

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")
END = 1_790_000_000.0


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("app") / "run.db"
    build_store(path, scenario="demo", end_time=END)
    return path


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in ("VERLMON_STORE", "VERLMON_PROMETHEUS", "VERLMON_JOB"):
        monkeypatch.delenv(name, raising=False)
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


def _app(monkeypatch, page: str | None = None, window: str = "all", **env) -> AppTest:
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = window
    at.run()
    if page:
        at.switch_page(f"views/{page}.py")
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metrics(at: AppTest) -> dict[str, str]:
    """Label -> value of every headline figure: ``st.metric`` and the HTML stat rows."""
    out = {m.label: m.value for m in at.metric}
    for block in at.html:
        out.update(stat_values(block.value))
    return out


def _table(at: AppTest, column: str):
    """The first dataframe on the page that has ``column``."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _gpu_time_bar(at: AppTest) -> str:
    """The page's GPU-time bar (HTML): the Overview's by cause, Steps & phases' by phase."""
    return next(h.value for h in at.html if "verlmon-gpu-time-bar" in h.value)


def _bar_widths(bar: str) -> list[float]:
    """The widths (% of the step) of the bar's blocks."""
    return [float(w) for w in re.findall(r'<div title="[^"]*" style="width: ([0-9.]+)%', bar)]


def _charts(at: AppTest, **params: str) -> list[dict]:
    """The Plotly specs the page draws, after setting URL parameters (a tab picked) and
    rerunning when any are given."""
    if params:
        for name, value in params.items():
            at.query_params[name] = value
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _title(chart: dict) -> str:
    return chart["layout"]["title"]["text"]


def _history(at: AppTest):
    """The Flags page's history table, its expander opened as a user opens it."""
    at.session_state["flag_history_open"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return _table(at, "evidence")


def _text(at: AppTest) -> str:
    """What the page says: Markdown with log text escaped (dashboards/escape.py) read as shown."""
    parts = [m.value for m in at.markdown] + [e.value for e in at.error]
    parts += [w.value for w in at.warning] + [i.value for i in at.info] + [s.value for s in at.success]
    parts = [shown_text(p) for p in parts]
    parts += [html.unescape(h.value) for h in at.html]
    return "\n".join(parts)


def test_overview_shows_current_step_throughput_and_phase_split(monkeypatch, store):
    at = _app(monkeypatch, VERLMON_STORE=store)
    steps = RunStore(store, create=False).steps()
    metrics = _metrics(at)
    assert metrics["Current step"] == str(steps[-1].step)
    assert metrics["Throughput (tok/s/GPU)"] == f"{steps[-1].throughput:,.0f}"
    # seconds per phase, per step: on the Steps page (one chart fewer to draw on the Overview)
    steps_page = _app(monkeypatch, "steps", VERLMON_STORE=store)
    (phase_chart,) = _charts(steps_page, steps_view="Seconds per phase")
    assert "Where the time goes" in _title(phase_chart)
    assert {"gen", "update_actor", "reshard"} <= {t["name"] for t in phase_chart["data"]}


def test_overview_leads_with_health_gpu_time_and_the_top_problem_with_advice(monkeypatch,
                                                                             store):
    at = _app(monkeypatch, VERLMON_STORE=store)
    open_flags = [f for f in RunStore(store, create=False).flags()
                  if f.end is None and f.severity in ("warning", "critical")]
    first = (at.error or at.warning or at.success or at.info)[0].value
    goodput = int(_metrics(at)["Goodput (last steps)"].rstrip("%"))
    # the banner speaks for the detectors (issue 38): "Healthy" whenever no flag is open,
    # whatever the goodput (the loss is named as information), else the flag to act on first
    assert first.startswith("Needs attention" if open_flags else "Healthy")
    assert f"Goodput {goodput}%" in first
    # the GPU-time bar: plain HTML (no chart to draw), the ledger's causes adding up to 100%,
    # goodput in its title: the banner's number
    bar = _gpu_time_bar(at)
    assert "Where the GPU time went" in bar and f"goodput {goodput}%" in bar
    assert 'title="productive: ' in bar
    assert abs(sum(_bar_widths(bar)) - 100.0) < 0.5
    # the step-time trend: inline SVG with the text, no Plotly chart to load on the Overview
    assert not at.get("plotly_chart")
    trend = next(h.value for h in at.html if "verlmon-trend" in h.value)
    assert "Step time" in trend and "data:image/svg+xml;base64," in trend
    assert "rolling median (10)" in trend
    text = _text(at)
    if open_flags:
        top = re.search(r"top problem: (\w+)", first).group(1)
        flag = next(f for f in open_flags if f.kind == top)
        assert top in _top_problem(at) and "**What to do:**" in text
        assert flag.advice[0] in text
    else:
        assert "Top open problem" not in text


def _flag_store(tmp_path, flags) -> Path:
    path = tmp_path / "flags.db"
    build_store(path, scenario="healthy", steps=12, step_seconds=10.0, end_time=END,
                detect=False, nccl=False, nodes=2, gpus_per_node=2)
    with RunStore(path) as rs:
        rs.upsert_flags(flags)
    return path


def test_flags_page_with_two_nodes_opening_the_same_kind_in_the_same_second(monkeypatch,
                                                                             tmp_path):
    from monitor.records import Flag

    t = END - 60.0
    flags = [Flag("low_utilization", "warning", t, None, scope={"node": n},
                  evidence=f"low on {n}", advice=["raise data.train_batch_size"])
             for n in ("node0", "node1")]
    at = _app(monkeypatch, "flags", VERLMON_STORE=_flag_store(tmp_path, flags))
    text = _text(at)
    assert "low on node0" in text and "low on node1" in text
    assert not any("evidence" in d.value.columns for d in at.dataframe)  # drawn when asked
    assert len(_history(at)) == 2  # the history after the cards is drawn too
    # the newest flag's evidence chart is drawn; the other's when its expander is opened,
    # both on the one page without a key clash
    assert len(_charts(at)) == 1
    at.session_state["flag_evidence_1"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [_title(c) for c in _charts(at)] == ["low_utilization: evidence"] * 2


def _strings(obj) -> list[str]:
    """Every string inside a nested structure (a chart's spec)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def test_escapes_and_bidi_overrides_in_a_flag_show_escaped_on_every_part_of_the_page(
        monkeypatch, tmp_path):
    """Issue 41 item 4: evidence, advice and scope quoting a log line or a frame (terminal
    escapes, a right-to-left override, a zero-width space) show as escapes in the card, the
    history table and the evidence chart."""
    from monitor.records import Flag

    hostile = "at evil\x1b]0;x\x07 \u202egnp.exe a\u200bb"
    flags = [Flag("hang", "critical", END - 60.0, None, scope={"node": "n\u202e0"},
                  evidence=hostile, advice=["check \u2066this\u2069"])]
    at = _app(monkeypatch, "flags", VERLMON_STORE=_flag_store(tmp_path, flags))
    text = _text(at)
    assert "\\u202egnp.exe" in text
    table = _history(at)
    cells = " ".join(str(v) for v in table.to_numpy().ravel())
    charts = " ".join(_strings(_charts(at)))
    for shown in (text, cells, charts):
        assert not [c for c in shown if c in "\x1b\x07\u202e\u200b\u2066\u2069"], shown


def test_a_flag_is_open_on_every_page_exactly_while_open_in_the_source(monkeypatch, tmp_path):
    from dataclasses import replace

    from monitor.records import Flag

    flag = Flag("gpu_imbalance", "warning", END - 120.0, None,
                scope={"node": "node1", "gpus": [1]}, evidence="GPU 1 lags its peers",
                advice=["check node1 GPU 1"])
    path = _flag_store(tmp_path, [flag])
    monkeypatch.setenv("VERLMON_STORE", str(path))
    pages = {}
    for page in (None, "gpus", "nodes"):
        pages[page] = AppTest.from_file(APP, default_timeout=60)
        pages[page].query_params["window"] = "all"
        if page == "gpus":
            pages[page].query_params["node"] = "node1"
        pages[page].run()
        if page:
            pages[page].switch_page(f"views/{page}.py")
            pages[page].run()
    assert "GPU 1 lags its peers" in _text(pages[None])
    assert "GPUs balanced" not in _text(pages["gpus"])
    assert not pages["gpus"].success or all("balanced" not in s.value
                                            for s in pages["gpus"].success)
    gpus = _table(pages["gpus"], "vs_peers").set_index(["node", "gpu"])
    assert "gpu_imbalance" in gpus.loc[("node1", 1), "status"]
    assert gpus.loc[("node1", 0), "status"] == "ok"
    nodes = _table(pages["nodes"], "reason").set_index("node")
    assert "gpu_imbalance" in nodes.loc["node1", "reason"] and nodes.loc["node0", "reason"] == ""
    # the detector closes it: the next refresh of each page says so, no cache in between
    with RunStore(path) as rs:
        rs.upsert_flags([replace(flag, end=END - 30.0)])
    for at in pages.values():
        at.run()
        assert not at.exception
    assert "GPU 1 lags its peers" not in _text(pages[None])
    assert any("GPUs balanced" in s.value for s in pages["gpus"].success)
    gpus = _table(pages["gpus"], "vs_peers").set_index(["node", "gpu"])
    assert gpus.loc[("node1", 1), "status"] == "ok"
    assert _table(pages["nodes"], "reason")["reason"].eq("").all()


def test_flags_page_lists_each_demo_flag_with_advice(monkeypatch, store):
    at = _app(monkeypatch, "flags", VERLMON_STORE=store)
    text = _text(at)
    for kind in ("io_starvation", "reshard_spike", "gpu_imbalance", "rollout_long_tail"):
        assert kind in text
    assert text.count("**Advice:**") >= 4
    assert "data.dataloader_num_workers" in text  # io_starvation's lever
    history = _history(at)
    assert len(history) == len(RunStore(store, create=False).flags())


def test_flags_page_filters_by_severity_from_the_url(monkeypatch, store):
    monkeypatch.setenv("VERLMON_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = "all"
    at.run()
    at.switch_page("views/flags.py")
    at.query_params["sev"] = "critical"
    at.run()
    history = _history(at)
    assert set(history["severity"]) == {"critical"}


def test_gpus_page_has_heat_maps_and_every_gpu(monkeypatch, store):
    at = _app(monkeypatch, "gpus", VERLMON_STORE=store)
    table = _table(at, "vs_peers")
    assert sorted(table["gpu"].astype(int)) == list(range(8))
    # one chart at a time, picked in tabs (bound to the URL): utilization by default
    views = {"Utilization": "Utilization %", "SM active": "SM active %",
             "Memory": "Memory used (GiB)"}
    for view, title in views.items():
        (chart,) = _charts(at, gpu_view=view)
        assert chart["data"][0]["type"] == "heatmap" and _title(chart).startswith(title)
    (attrib,) = _charts(at, gpu_view="Per phase")
    assert "per phase" in _title(attrib)
    assert {"gen", "update_actor"} <= {t["name"] for t in attrib["data"]}


def test_steps_page_lays_out_phases_and_reshard(monkeypatch, store):
    at = _app(monkeypatch, "steps", VERLMON_STORE=store)
    (timeline,) = _charts(at)  # the first tab
    assert "laid out in time" in _title(timeline)
    assert "GPU util mean" in {t["name"] for t in timeline["data"]}
    (reshard,) = _charts(at, steps_view="Reshard")
    assert "Reshard" in _title(reshard)
    assert any(t["name"].startswith("spike") for t in reshard["data"])  # the demo's spike
    _charts(at, steps_view="Phase statistics")
    table = _table(at, "phase")
    assert "gen" in set(table.iloc[:, 0])


def test_communication_page(monkeypatch, store):
    at = _app(monkeypatch, "communication", VERLMON_STORE=store)
    metrics = _metrics(at)
    assert metrics["Busiest collective"] == "AllReduce"
    assert metrics["NCCL busy (window mean)"].endswith("% of wall time")


def test_nodes_page(monkeypatch, store):
    at = _app(monkeypatch, "nodes", VERLMON_STORE=store)
    metrics = _metrics(at)
    assert (metrics["Nodes"], metrics["GPUs"]) == ("1", "8")
    # the first tab: the node table, no chart; the heat map over time is the second
    assert not _charts(at) and _table(at, "reason")["node"].tolist() == ["node0"]
    (heat,) = _charts(at, nodes_view="Over time")
    assert _title(heat).startswith("Mean GPU utilization by node")
    # the drill-down to one node's GPUs is the second tab
    (drill,) = _charts(at, nodes_view="One node")
    assert at.selectbox(key="drill").value == "node0"
    assert _title(drill) == "node0: utilization % per GPU"
    assert len(drill["data"][0]["y"]) == 8


@pytest.mark.parametrize("page", [None, "gpus", "steps", "communication", "flags", "nodes"])
def test_every_page_opens_with_at_most_one_chart_and_one_table(monkeypatch, store, page):
    # each Plotly chart or table costs the browser 0.2-0.3 s to draw on a 2-core machine
    # (bench/dashboard.py): the rest waits behind a tab or an expander until asked for
    at = _app(monkeypatch, page, VERLMON_STORE=store)
    charts, tables = len(at.get("plotly_chart")), len(at.dataframe)
    svg = sum("verlmon-trend" in h.value for h in at.html)  # the Overview's SVG trend
    assert charts <= 1 and tables <= 1 and charts + tables + svg >= 1
    assert at.tabs or page == "flags"


@pytest.mark.parametrize("page", [None, "gpus", "steps", "communication", "flags", "nodes"])
def test_missing_store_is_explained_on_every_page(monkeypatch, tmp_path, page):
    at = _app(monkeypatch, page, VERLMON_STORE=tmp_path / "missing.db")
    assert any("store missing" in w.value for w in at.warning)


def test_empty_store_says_no_data_yet(monkeypatch, tmp_path):
    RunStore(tmp_path / "empty.db").close()
    at = _app(monkeypatch, "gpus", VERLMON_STORE=tmp_path / "empty.db")
    assert any(i.value.startswith("No data yet") for i in at.info)


def test_unreachable_prometheus_is_explained(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    at = _app(monkeypatch, VERLMON_PROMETHEUS=f"http://127.0.0.1:{port}")
    assert any(f"Prometheus unreachable at http://127.0.0.1:{port}" in e.value for e in at.error)


def test_window_selection_comes_from_the_url(monkeypatch, store):
    at = _app(monkeypatch, window="15 min", VERLMON_STORE=store)
    assert at.selectbox(key="window").value == "15 min"
    assert "(15 min)" in at.caption[-1].value or any("15 min" in c.value for c in at.caption)


def test_gpus_page_warns_about_a_straggling_gpu(monkeypatch, tmp_path):
    path = tmp_path / "imbalance.db"
    build_store(path, scenario="gpu_imbalance", steps=30, step_seconds=12.0, end_time=END,
                detect=True, nccl=False)
    flags = [f for f in RunStore(path, create=False).flags() if f.kind == "gpu_imbalance"]
    at = _app(monkeypatch, "gpus", VERLMON_STORE=path)
    warning = " ".join(shown_text(w.value) for w in at.warning)
    table = _table(at, "vs_peers")
    open_ = [f for f in flags if f.end is None]
    if open_:
        lagging = table[table["status"].str.contains("gpu_imbalance")]
        assert len(lagging) >= 1 and "gpu_imbalance" in warning
    else:
        assert any("GPUs balanced" in s.value for s in at.success)
    # the lowest one-minute mean tells GPUs apart (a per-sample minimum read ~3 on every GPU);
    # no "-0" in the gap column
    low = table.set_index("gpu")["util_low_1m"]
    assert low.min() > 10 and low.max() - low.min() > 2
    assert not any(v == 0 and np.signbit(v) for v in table["vs_peers"])


def test_gpus_page_attribution_carries_sample_counts(monkeypatch, store):
    at = _app(monkeypatch, "gpus", VERLMON_STORE=store)
    (attrib,) = _charts(at, gpu_view="Per phase")
    assert "per phase" in _title(attrib)
    assert all("n=" in t["hovertemplate"] for t in attrib["data"])
    assert all(t["customdata"] and min(t["customdata"]) >= 3 for t in attrib["data"])
    assert any("overlaps the phase" in c.value for c in at.caption)


def test_steps_phase_table_has_units_and_step_axes_whole_numbers(monkeypatch, store):
    at = _app(monkeypatch, "steps", VERLMON_STORE=store)
    _charts(at, steps_view="Phase statistics")
    table = next(d for d in at.dataframe if "phase" in d.value.columns)
    config = json.loads(table.proto.columns)
    assert config["mean"]["label"] == "mean (s)" and config["mean"]["type_config"]["format"] == "%.2f"
    (reshard,) = _charts(at, steps_view="Reshard")
    assert reshard["layout"]["xaxis"]["tickformat"] == "d"


def test_nodes_table_first_column_is_the_named_node(monkeypatch, store):
    at = _app(monkeypatch, "nodes", VERLMON_STORE=store)
    table = next(d for d in at.dataframe if "node" in d.value.columns)
    assert table.value.columns[0] == "node"
    config = json.loads(table.proto.columns)
    assert all(c.get("label", name) for name, c in config.items())


def test_nccl_busy_share_is_per_gpu_not_summed_over_ranks(monkeypatch, tmp_path):
    path = tmp_path / "nccl.db"
    info = build_store(path, scenario="healthy", steps=12, step_seconds=10.0, end_time=END,
                       detect=False, nccl=False, nodes=2, gpus_per_node=4)
    rows = []
    for node in ("node0", "node1"):
        for t in range(int(info["start"]), int(info["end"])):
            # 4 ranks, each in AllReduce for 0.3 s of every second: the GPUs spend 30% in NCCL
            rows.append({"ts": float(t), "node": node, "coll": "AllReduce", "comm": "dp",
                         "ops": 4.0, "bytes": 4e9, "exec_s": 4 * 0.3, "busbw_bps": 100e9})
    with RunStore(path) as rs:
        rs.add_nccl_samples(rows)
    at = _app(monkeypatch, "communication", VERLMON_STORE=path)
    busy = _metrics(at)["NCCL busy (window mean)"]
    assert busy == "30.0% of wall time", busy


def test_overview_shows_goodput_and_where_each_steps_gpu_seconds_went(monkeypatch, store):
    at = _app(monkeypatch, VERLMON_STORE=store)
    value = _metrics(at)["Goodput (last steps)"]
    assert value.endswith("%") and 0 < int(value[:-1]) <= 100
    assert "Top loss:" in _text(at)
    # the top loss says what it is and what to do, in plain words (no Markdown escapes)
    from monitor.analysis.goodput import CAUSE_TEXT

    loss = re.sub(r"<[^>]+>", "", next(ln for ln in _text(at).splitlines() if "Top loss:" in ln))
    cause = re.search(r"Top loss: (\w+),", loss).group(1)
    assert CAUSE_TEXT[cause][0] in loss and "\\" not in loss, loss
    # the per-step ledger is the third trend tab, drawn when it is picked (from the URL)
    at.query_params["trend"] = "Goodput per step"
    at.run()
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 1
    bars = charts[0]
    assert bars["layout"]["title"]["text"].startswith("Goodput")
    names = [t["name"] for t in bars["data"]]
    assert names[0] == "productive"
    # every step's causes stack to 100% of its GPU-seconds
    sums: dict = {}
    for t in bars["data"]:
        for x, y in zip(t["x"], t["y"], strict=True):
            sums[x] = sums.get(x, 0.0) + y
    assert sums and all(abs(v - 100.0) < 1.0 for v in sums.values()), sums


def test_overview_gives_short_phases_a_busy_share_and_names_them_with_sample_counts(
        monkeypatch, store):
    # the demo's reward, values, adv, ... phases last under a second, shorter than the 1 s
    # samples: they used to be a blank "util n/a" block of about a third of the step (the
    # per-phase bar is on Steps & phases: the Overview's bar is the ledger's causes)
    at = _app(monkeypatch, "steps", VERLMON_STORE=store)
    bar = _gpu_time_bar(at)
    assert "util n/a" not in bar
    short = re.search(r"short phases \(\d+% of the step, ~\d+% busy\)", bar)
    assert short
    blocks = re.findall(r'<div title="([^"]*)" style="width: ([0-9.]+)%', bar)
    assert any("each shorter than the samples can resolve" in tip and float(w) > 0
               for tip, w in blocks)
    assert abs(sum(float(w) for _, w in blocks) - 100.0) < 0.5
    caption = html.unescape(bar[bar.index("Short phases"):])
    assert re.search(r"\breward \(\d+ samples?\)", caption) and "adv (" in caption
    assert "less the measured phases'" in caption


def test_flags_page_shows_who_is_stuck_when_a_hang_is_open(monkeypatch, tmp_path):
    from monitor.hang.localize import Culprit, Localization
    from monitor.records import Flag

    t = END - 60.0
    flag = Flag("hang", "critical", t, None, evidence="No progress for 95 s",
                advice=["look at the named rank first"])
    path = _flag_store(tmp_path, [flag])
    loc = Localization(culprits=[Culprit(rank=2, reason="never issued nccl:all_reduce #14",
                                         collective="nccl:all_reduce", seq=14, node="node1",
                                         gpu=0, pid=4242)], waiting={0: "nccl:all_reduce #14"})
    with RunStore(path) as rs:
        rs.add_events([loc.to_event(t + 5.0, node="node1")])
    at = _app(monkeypatch, "flags", VERLMON_STORE=path)
    who = [d.value for d in at.dataframe if "collective" in d.value.columns]
    assert len(who) == 1
    row = who[0].iloc[0]
    assert (row["node"], row["rank"], row["pid"], row["seq"]) == ("node1", "2", "4242", "14")
    assert "never issued" in row["why"]


def test_flags_page_says_how_to_get_a_name_when_no_round_named_anyone(monkeypatch, tmp_path):
    from monitor.records import Flag

    path = _flag_store(tmp_path, [Flag("hang", "critical", END - 60.0, None, evidence="x")])
    at = _app(monkeypatch, "flags", VERLMON_STORE=path)
    assert "No process named yet" in " ".join(c.value for c in at.caption)


def test_who_is_stuck_names_the_driver_a_py_spy_round_found_scoring_rewards(monkeypatch,
                                                                            tmp_path):
    from pathlib import Path

    from monitor.hang.stacks import StackRound
    from monitor.hang.where import classify, judge
    from monitor.records import Flag

    fix = Path(__file__).parent / "fixtures" / "hang_where"
    wheres = [classify((fix / f"{n}.txt").read_text(), node="node0")
              for n in ("driver_reward", "worker_idle")]
    t = END - 60.0
    path = _flag_store(tmp_path, [Flag("hang", "critical", t, None, evidence="No progress")])
    with RunStore(path) as rs:
        rs.add_events([StackRound(wheres, judge(wheres)).to_event(t + 5.0, "node0")])
    at = _app(monkeypatch, "flags", VERLMON_STORE=path)
    row = next(d.value for d in at.dataframe if "collective" in d.value.columns).iloc[0]
    assert row["node"] == "node0" and row["pid"] == str(wheres[0].pid)
    assert row["frame"].startswith("normalize_final_answer (user_reward.py:5)")
    assert "the driver" in row["why"] and "is scoring rewards" in row["why"]



def _who_is_stuck_row(at: AppTest):
    return next(d.value for d in at.dataframe if "collective" in d.value.columns).iloc[0]


@pytest.mark.parametrize("dump, said", [
    ("driver_reward", "the driver (PID 28001, node node0) is scoring rewards [phase reward], "
                      "at normalize_final_answer (user_reward.py:5)"),
    ("driver_http", "the driver (PID 28003, node node0) is scoring rewards (compute_score waits "
                    "for an HTTP answer) [phase reward], at "),
])
def test_who_is_stuck_from_prometheus_says_who_and_where_as_the_store_does(monkeypatch,
                                                                           tmp_path, dump, said):
    """The exporter's own collector publishes a py-spy round (the driver scoring rewards, or
    waiting on an HTTP answer inside compute_score) and a real Prometheus scrapes it: the Flags
    page names the same process, place, phase, frame and detail as from the run store, not a
    generic "named by the last round"."""
    import time

    from e2e.procs import start_prometheus, wait_until
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from dashboards.sources.prometheus import PrometheusSource
    from exporters.options import ExporterOptions
    from monitor import metric_names as m
    from monitor.hang.stacks import StackRound
    from monitor.hang.where import classify, judge
    from monitor.live import ViewContext
    from monitor.live.hang_dumps import FlightRecorderCollector
    from monitor.records import Flag

    fix = Path(__file__).parent / "fixtures" / "hang_where"
    wheres = [classify((fix / f"{n}.txt").read_text(), node="node0")
              for n in (dump, "worker_idle")]
    stacks = StackRound(wheres, judge(wheres))
    t = END - 60.0
    path = _flag_store(tmp_path, [Flag("hang", "critical", t, None, evidence="No progress")])
    with RunStore(path) as rs:
        rs.add_events([stacks.to_event(t + 5.0, "node0")])
    stored = _who_is_stuck_row(_app(monkeypatch, "flags", VERLMON_STORE=path))
    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.delenv("VERLMON_STORE")

    collector = FlightRecorderCollector(ViewContext(
        node="node0", interval=1.0,
        options=ExporterOptions(fr_dir=str(tmp_path), hang_pyspy=False)))
    collector._stacks = stacks  # the round the exporter took when the job went silent
    reg = CollectorRegistry()
    reg.register(collector)
    Gauge(m.BUILD_INFO, "build", ["version"], registry=reg).labels("test").set(1)
    Gauge(m.FLAG_ACTIVE, "flags", ["kind", "severity", "node", "gpu", "phase"],
          registry=reg).labels("hang", "critical", "node0", "", "").set(1)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    prom = start_prometheus(tmp_path / "prom", timeout=90, node="node0", rule_files=(),
                            scrape_targets=[f"127.0.0.1:{server.server_port}"])
    try:
        src = PrometheusSource(prom.url)
        wait_until(lambda: src.time_range() and not src.hang_culprits(0, time.time()).empty,
                   60, what="the round scraped")
        src.close()
        row = _who_is_stuck_row(_app(monkeypatch, "flags", VERLMON_PROMETHEUS=prom.url))
    finally:
        prom.stop()
        server.shutdown()
    assert stored["why"].startswith(said), stored["why"]
    for col in ("node", "rank", "pid", "frame", "why"):
        assert row[col] == stored[col], col

def _top_problem(at: AppTest) -> str:
    """The Overview's "Top open problem" card (Markdown read as shown)."""
    return shown_text(next(m.value for m in at.markdown if "**What to do:**" in m.value))


def test_top_open_problem_is_the_cause_before_the_newer_flags_it_explains(monkeypatch,
                                                                          tmp_path):
    from monitor.records import Flag

    straggler = Flag("gpu_imbalance", "warning", END - 300.0, None,
                     scope={"node": "node1", "gpus": [1]},
                     evidence="GPU 1 of node1 is the straggler in update_actor",
                     advice=["Turn on trainer.balance_batch=True"])
    waiting = [Flag(kind, "warning", END - 60.0 + i, None, scope={"node": "node0"},
                    evidence=f"{kind} on node0", advice=["raise data.train_batch_size"])
               for i, kind in enumerate(("low_utilization", "util_overstates_sm"))]
    at = _app(monkeypatch, VERLMON_STORE=_flag_store(tmp_path, [straggler, *waiting]))
    top = _top_problem(at)
    assert "gpu_imbalance" in top and "straggler" in top and "low_utilization" not in top
    # the banner names the same top problem, as analyze and wandb do
    assert "top problem: gpu_imbalance" in (at.error or at.warning)[0].value
    # severity still comes first: a critical flag outranks the straggler
    (tmp_path / "c").mkdir()
    at = _app(monkeypatch, VERLMON_STORE=_flag_store(tmp_path / "c", [
        straggler, *waiting, Flag("oom", "critical", END - 600.0, None, evidence="OOM",
                                  advice=["lower ppo_micro_batch_size_per_gpu"])]))
    assert "oom" in _top_problem(at)


def test_gpus_heat_map_calls_the_straggler_the_straggler(monkeypatch, tmp_path):
    from monitor.records import Flag

    straggler = Flag("gpu_imbalance", "warning", END - 300.0, None,
                     scope={"node": "node1", "gpus": [1]},
                     evidence="GPU 1 of node1 is the straggler in update_actor")
    below = Flag("gpu_imbalance", "warning", END - 200.0, None,
                 scope={"node": "node1", "gpus": [0]}, evidence="GPU 0 sits below its peers")
    monkeypatch.setenv("VERLMON_STORE", str(_flag_store(tmp_path, [straggler, below])))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = "all"
    at.query_params["node"] = "node1"
    at.run()
    at.switch_page("views/gpus.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (heat,) = _charts(at)
    labels = dict(zip(heat["layout"]["yaxis"]["tickvals"], heat["layout"]["yaxis"]["ticktext"],
                      strict=True))
    assert "STRAGGLER" in labels["node1/1"] and "BELOW PEERS" in labels["node1/0"]
    assert not any(a.get("text") == "LOW" for a in heat["layout"].get("annotations", []))


@pytest.fixture(scope="module")
def alerting(tmp_path_factory):
    """A real Prometheus with GPUStraggler firing and NodeImbalance pending
    (``tests/prom_alerts.py``)."""
    from prom_alerts import start_alerting_prometheus

    pair = start_alerting_prometheus(tmp_path_factory.mktemp("alerting"))
    yield pair
    pair.stop()


def test_prometheus_overview_pages_on_firing_alerts_only_with_the_cause_on_top(monkeypatch,
                                                                               alerting):
    from prom_alerts import ADVICE, JOB

    at = _app(monkeypatch, VERLMON_PROMETHEUS=alerting.url, VERLMON_JOB=JOB, window="15 min")
    # firing only: GPUStraggler, io_starvation and the newer util_overstates_sm it explains
    first = (at.error or at.warning)[0].value
    assert first.startswith("Needs attention: 3 open flags")
    top = _top_problem(at)
    assert "GPUStraggler" in top and ADVICE in top and "util_overstates_sm" not in top
    # pending apart: the pending NodeImbalance and the held-back low_utilization
    note = " ".join(shown_text(i.value) for i in at.info)
    assert "2 not paging" in note and "NodeImbalance" in note and "low_utilization" in note
    # the job on the page
    assert any(JOB in shown_text(c.value) for c in at.sidebar.caption)


def test_prometheus_overview_bar_comes_from_the_per_phase_counters(monkeypatch, alerting):
    from prom_alerts import JOB, PHASES

    at = _app(monkeypatch, "steps", VERLMON_PROMETHEUS=alerting.url, VERLMON_JOB=JOB,
              window="15 min")
    bar = html.unescape(_gpu_time_bar(at))
    # gen measured from the counters (80% busy) though Prometheus scrapes the gauges once a
    # second and a step lasts two: never "short phases 100%" on 0 samples
    assert f"gen: 99% of the step, GPUs {100 * PHASES['gen'][1]:.0f}% busy in it" in bar
    assert "short phases (100%" not in bar


def test_prometheus_flags_page_lists_what_does_not_page_apart(monkeypatch, alerting):
    from prom_alerts import JOB

    at = _app(monkeypatch, "flags", VERLMON_PROMETHEUS=alerting.url, VERLMON_JOB=JOB,
              window="15 min")
    pending = _table(at, "why")
    assert sorted(pending["kind"]) == ["NodeImbalance", "low_utilization"]
    cards = [shown_text(m.value) for m in at.markdown if "Evidence:" in m.value]
    assert any("GPUStraggler" in c for c in cards)
    assert not any("NodeImbalance" in c or "low_utilization" in c for c in cards)


def test_sidebar_warns_when_prometheus_holds_several_jobs_and_no_job_is_named(monkeypatch,
                                                                              tmp_path):
    import yaml
    from e2e.procs import start_prometheus, wait_until
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from dashboards.sources.prometheus import PrometheusSource
    from monitor import metric_names as m

    reg = CollectorRegistry()
    Gauge(m.BUILD_INFO, "build", ["version"], registry=reg).labels("test").set(1)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    target = f"127.0.0.1:{server.server_port}"
    config = yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                           for job in ("grpo-a", "grpo-b")]})
    prom = start_prometheus(tmp_path / "prom", config_text=config, timeout=90)
    try:
        src = PrometheusSource(prom.url)
        wait_until(lambda: len(src.jobs()) == 2, 60, what="both jobs scraped")
        src.close()
        at = _app(monkeypatch, VERLMON_PROMETHEUS=prom.url)
        said = " ".join(shown_text(w.value) for w in at.sidebar.warning)
        assert "holds 2 jobs (grpo-a, grpo-b)" in said and "--job NAME" in said
        assert any("every job (no --job)" in shown_text(c.value) for c in at.sidebar.caption)
        st.cache_data.clear()
        st.cache_resource.clear()
        at = _app(monkeypatch, VERLMON_PROMETHEUS=prom.url, VERLMON_JOB="grpo-a")
        assert not at.sidebar.warning
        assert any("job **grpo-a**" in shown_text(c.value) for c in at.sidebar.caption)
    finally:
        prom.stop()
        server.shutdown()


def _ledger_store(tmp_path, flags=(), finished=None) -> tuple[Path, dict]:
    """A healthy store holding the ledger as an exporter counts it (every step and GPU), with
    ``flags`` and the run's end in its meta: what the Overview reads (issue 38 item 1)."""
    from monitor.analysis.run_analysis import RunAnalysis

    path = tmp_path / "ledger.db"
    build_store(path, scenario="healthy", steps=24, gpus_per_node=2, step_seconds=12.0,
                end_time=END, detect=False, nccl=False)
    with RunStore(path) as rs:
        led = RunAnalysis(rs.steps(), rs.gpu_frame()).ledger()
        rs.add_batch(ledger=led[~led["tail"].astype(bool)].to_dict("records"))
        rs.upsert_flags(list(flags))
        if finished is not None:
            rs.set_meta("run_finished", finished)
    return path, led


def test_the_overview_reads_the_ledger_the_exporter_kept_and_names_its_top_loss(monkeypatch,
                                                                               tmp_path):
    """No open flag: "Healthy", with the goodput and the largest loss of the last 20 steps as
    information; the bar's largest lost segment is the loss the line names."""
    from monitor.analysis.headline import cause_seconds, headline, last_steps

    path, led = _ledger_store(tmp_path)
    want = headline(cause_seconds(last_steps(led, 20)), [])
    at = _app(monkeypatch, VERLMON_STORE=path)
    banner = at.success[0].value
    assert banner == want.text and "for information" in banner
    assert _metrics(at)["Goodput (last steps)"] == f"{want.goodput * 100:.0f}%"
    bar = html.unescape(_gpu_time_bar(at))
    assert f'title="{want.top_loss}: {want.top_loss_share * 100:.0f}% of the GPU time (top loss)' \
        in bar
    line = next(ln for ln in _text(at).splitlines() if "Top loss:" in ln)
    assert want.top_loss in line and "no detector flags it" in line
    assert "raise " not in line  # information, never advice with no flag behind it


def test_a_finished_run_says_finished_on_every_page(monkeypatch, tmp_path):
    path, _ = _ledger_store(tmp_path, finished={"time": END, "step": 24,
                                                "reason": "the job exited with status 0"})
    at = _app(monkeypatch, VERLMON_STORE=path)
    banner = at.info[0].value
    assert banner.startswith("Finished at 2026-09-21 ") and "after step 24" in banner
    assert "Over the run, goodput was" in banner
    assert _metrics(at)["Goodput (the run)"].endswith("%")
    for page in ("gpus", "steps", "nodes", "flags"):
        shown = " ".join(i.value for i in _app(monkeypatch, page, VERLMON_STORE=path).info)
        assert "Finished at 2026-09-21 " in shown and "after step 24" in shown, page


def test_a_hang_replaces_every_other_advice_on_the_overview(monkeypatch, tmp_path):
    from monitor.records import Flag

    hang = Flag("hang", "critical", END - 120.0, None, evidence="No step for 95 s.",
                advice=["Look at the stack py-spy took of rank 1."])
    other = Flag("low_utilization", "critical", END - 600.0, None, scope={"node": "node0"},
                 evidence="The GPUs averaged 30% SM.", advice=["raise the micro-batch"])
    path, _ = _ledger_store(tmp_path, flags=[other, hang])
    at = _app(monkeypatch, VERLMON_STORE=path)
    banner = at.error[0].value
    assert "the job is hung" in banner and "low_utilization" not in banner
    top = _top_problem(at)
    assert "hang" in top and "py-spy" in top and "micro-batch" not in top
    line = next(ln for ln in _text(at).splitlines() if "Top loss:" in ln)
    assert "flagged as" not in line and "micro-batch" not in line
