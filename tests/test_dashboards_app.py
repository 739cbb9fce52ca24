"""Every dashboard page, run by Streamlit's AppTest on a run store built from the demo run."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from dashboards.sample_store import build_store
from monitor.store.runstore import RunStore

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
    return {m.label: m.value for m in at.metric}


def _table(at: AppTest, column: str):
    """The first dataframe on the page that has ``column``."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [e.value for e in at.error]
    parts += [w.value for w in at.warning] + [i.value for i in at.info] + [s.value for s in at.success]
    return "\n".join(parts)


def test_overview_shows_current_step_throughput_and_phase_split(monkeypatch, store):
    at = _app(monkeypatch, VERLMON_STORE=store)
    steps = RunStore(store, create=False).steps()
    metrics = _metrics(at)
    assert metrics["Current step"] == str(steps[-1].step)
    assert metrics["Throughput (tok/s/GPU)"] == f"{steps[-1].throughput:,.0f}"
    assert metrics["GPU util (last 5 min)"].endswith("%")
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    phase_chart = next(c for c in charts if "Where the time goes" in c["layout"]["title"]["text"])
    assert {"gen", "update_actor", "reshard"} <= {t["name"] for t in phase_chart["data"]}


def test_flags_page_lists_each_demo_flag_with_advice(monkeypatch, store):
    at = _app(monkeypatch, "flags", VERLMON_STORE=store)
    text = _text(at)
    for kind in ("io_starvation", "reshard_spike", "gpu_imbalance", "rollout_long_tail"):
        assert kind in text
    assert text.count("**Advice:**") >= 4
    assert "data.dataloader_num_workers" in text  # io_starvation's lever
    history = _table(at, "evidence")
    assert len(history) == len(RunStore(store, create=False).flags())


def test_flags_page_filters_by_severity_from_the_url(monkeypatch, store):
    monkeypatch.setenv("VERLMON_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = "all"
    at.run()
    at.switch_page("views/flags.py")
    at.query_params["sev"] = "critical"
    at.run()
    history = _table(at, "evidence")
    assert set(history["severity"]) == {"critical"}


def test_gpus_page_has_heat_maps_and_every_gpu(monkeypatch, store):
    at = _app(monkeypatch, "gpus", VERLMON_STORE=store)
    table = _table(at, "vs_peers")
    assert sorted(table["gpu"].astype(int)) == list(range(8))
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    heat = [c for c in charts if c["data"] and c["data"][0]["type"] == "heatmap"]
    assert len(heat) == 3
    attrib = next(c for c in charts if "per phase" in c["layout"]["title"]["text"])
    assert {"gen", "update_actor"} <= {t["name"] for t in attrib["data"]}


def test_steps_page_lays_out_phases_and_reshard(monkeypatch, store):
    at = _app(monkeypatch, "steps", VERLMON_STORE=store)
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    timeline = next(c for c in charts if "laid out in time" in c["layout"]["title"]["text"])
    assert "GPU util mean" in {t["name"] for t in timeline["data"]}
    reshard = next(c for c in charts if "Reshard" in c["layout"]["title"]["text"])
    assert any(t["name"].startswith("spike") for t in reshard["data"])  # the demo's spike
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
    assert at.selectbox(key="drill").value == "node0"


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
                detect=False, nccl=False)
    at = _app(monkeypatch, "gpus", VERLMON_STORE=path)
    warning = " ".join(w.value for w in at.warning)
    table = _table(at, "vs_peers")
    lagging = table[table["status"] == "below peers"]
    assert len(lagging) >= 1
    for row in lagging.itertuples():
        assert f"{row.node}/GPU {row.gpu}" in warning
