"""The Rollout page (dashboards/views/rollout.py), run by Streamlit's AppTest on run stores
built from the simulator's agent-loop and fully-async scripts (engine samples included)."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest
from sample_store import build_store
from streamlit.testing.v1 import AppTest
from test_dashboards_app import _clean  # noqa: F401 - no source from the environment, no cache

pytestmark = pytest.mark.slow  # starts Streamlit's script runner on a real store

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")
END = 1_790_000_000.0


@pytest.fixture(scope="module")
def agent_loop_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rollout") / "agent_loop.db"
    build_store(path, scenario="agent_loop_demo", end_time=END, detect=False, nccl=False)
    return path


def _page(monkeypatch, store: Path, **params: str) -> AppTest:
    monkeypatch.setenv("VERLMON_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = "all"
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    at.switch_page("views/rollout.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _ys(trace: dict) -> list[float]:
    """A trace's y values without gaps (Plotly sends numbers as a typed base64 array)."""
    y = trace["y"]
    if isinstance(y, dict):
        y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return [float(v) for v in y if v is not None and not math.isnan(float(v))]


def test_rollout_page_shows_each_server_kv_cache_and_the_full_cache(monkeypatch,
                                                                   agent_loop_store):
    at = _page(monkeypatch, agent_loop_store)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Engine servers"] == "4"  # 8 GPUs, tensor parallel 2
    # the script's kv_cache_preemption segment fills the cache
    mean, peak = (int(v.rstrip("%")) for v in metrics["KV cache (awake, mean / max)"].split(" / "))
    assert peak >= 97 and mean < peak
    assert float(metrics["Preemptions (pool)"].removesuffix("/s")) > 0
    (kv,) = _charts(at)  # one chart at a time: the first view
    assert kv["layout"]["title"]["text"] == "KV cache use per server (%)"
    assert [t["name"] for t in kv["data"]] == ["vllm-0", "vllm-1", "vllm-2", "vllm-3"]
    assert max(max(_ys(t)) for t in kv["data"]) >= 97


def test_rollout_views_follow_the_url(monkeypatch, agent_loop_store):
    at = _page(monkeypatch, agent_loop_store, rollout_view="Preemptions")
    (pre,) = _charts(at)
    assert pre["layout"]["title"]["text"] == "Preemptions per second per server"
    assert max(max(_ys(t)) for t in pre["data"]) > 1.0  # ~2/s while the cache is full
    at = _page(monkeypatch, agent_loop_store, rollout_view="Tail")
    (tail,) = _charts(at)
    names = [t["name"] for t in tail["data"]]
    assert names == ["requests running (pool)", "servers with a request running"]
    busy = _ys(tail["data"][1])
    assert max(busy) == 4 and 1 in busy  # the generation tail: one server left running
    at = _page(monkeypatch, agent_loop_store, rollout_view="Requests")
    (req,) = _charts(at)
    assert {t["name"] for t in req["data"]} >= {"running", "waiting"}


def test_a_run_without_engine_servers_says_how_to_get_them(monkeypatch, tmp_path):
    path = tmp_path / "sync.db"
    build_store(path, scenario="healthy", steps=6, end_time=END, detect=False, nccl=False)
    at = _page(monkeypatch, path)
    assert not _charts(at)
    assert any("--rollout-server" in i.value for i in at.info)


def test_a_missing_store_is_explained(monkeypatch, tmp_path):
    at = _page(monkeypatch, tmp_path / "missing.db")
    assert any("store missing" in w.value for w in at.warning)
