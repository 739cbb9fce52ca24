"""The per-phase GPU-time bar ("Where the GPU time goes", on Steps & phases since the Overview
leads with the ledger's causes) agrees with ``analyze`` on the same store (issue 31): each
phase's share and busy figure, and the same samples behind each phase.

Before, the store mode measured the bar on the mean across GPUs, bucketed, and on steps
stripped of their metrics: "update_actor (0 samples)" while ``analyze`` of the same store
measured it from 57.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import streamlit as st
from sample_store import build_store
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow  # Streamlit's AppTest and the CLI

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")
END = 1_790_000_000.0


@pytest.fixture
def store(tmp_path, monkeypatch):
    for name in ("VERLMON_STORE", "VERLMON_PROMETHEUS", "VERLMON_JOB", "VERLMON_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    st.cache_data.clear()
    st.cache_resource.clear()
    path = tmp_path / "run.db"
    # fewer steps than the Overview's last 20: the bar and analyze read the same steps
    build_store(path, scenario="healthy", steps=16, gpus_per_node=4, step_seconds=12.0,
                end_time=END, nccl=False)
    _sample_as_an_exporter_does(path)
    yield path
    st.cache_data.clear()
    st.cache_resource.clear()


def _sample_as_an_exporter_does(path: Path) -> None:
    """Move the samples off the whole second and each GPU a little later than the one before,
    as a live exporter reads its GPUs one after another (its store holds them so)."""
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("UPDATE gpu_samples SET ts = ts + 0.37 + 0.013 * gpu")


def _analyze(store: Path, tmp: Path, capsys) -> dict:
    from cli.main import main

    out = tmp / "export"
    assert main(["export", str(store), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out / "train.jsonl"), "--gpu", str(out / "gpu.csv"),
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_bar_and_analyze_agree_on_each_phase(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERLMON_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = "all"
    at.run()
    at.switch_page("views/steps.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    bar = html.unescape(next(h.value for h in at.html if "verlmon-gpu-time-bar" in h.value))
    shown = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(
        r'title="(\w+): (\d+)% of the step, GPUs (\d+)% busy in it"', bar)}
    held = {m[0]: int(m[1]) for m in re.findall(r"\b(\w+) \((\d+) samples?\)", bar)}

    doc = _analyze(store, tmp_path, capsys)
    attrib = pd.DataFrame(doc["attribution"])
    per = attrib.groupby("phase").agg(util=("util_mean", "mean"), full=("full_samples", "min"))
    share = {p["phase"]: 100.0 * p["share"] for p in doc["summary"]["phases"]}
    measured = set(per.index[per["util"].notna()])
    assert shown and set(shown) == measured, (shown, per)
    for phase, (pct, busy) in shown.items():
        assert abs(pct - share[phase]) <= 3.0, (phase, pct, share[phase])
        assert abs(busy - per.loc[phase, "util"]) <= 2.0, (phase, busy, per.loc[phase])
    # the phases withheld on the bar are analyze's, with the same samples wholly inside
    withheld = {p: int(n) for p, n in per.loc[per["util"].isna(), "full"].items()}
    assert held == withheld, (held, withheld)
