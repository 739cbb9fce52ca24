"""The GPUs page shows the straggler the flag names (issue 31 item 5): beside the window's
means, each GPU's utilization and SM activity in the phase the flag looked at, since it opened
(Streamlit's AppTest on a real store written by the simulator and the detectors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit as st
from sample_store import build_store
from streamlit.testing.v1 import AppTest

from monitor.store.runstore import RunStore

pytestmark = pytest.mark.slow  # starts Streamlit's AppTest

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")
END = 1_790_000_000.0


def test_the_table_shows_the_stragglers_sm_in_the_flags_phase(monkeypatch, tmp_path):
    path = tmp_path / "imbalance.db"
    build_store(path, scenario="gpu_imbalance", steps=30, step_seconds=12.0, end_time=END,
                detect=True, nccl=False)
    (flag,) = [f for f in RunStore(path, create=False).flags()
               if f.kind == "gpu_imbalance" and f.end is None]
    (culprit,) = flag.scope["gpus"]
    assert flag.scope["phase"] == "update_actor"
    monkeypatch.setenv("VERLMON_STORE", str(path))
    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["window"] = "all"
    at.run()
    at.switch_page("views/gpus.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "phase_sm" in d.value.columns)
    cols = list(table.columns)  # next to the window's means, not off the table's right edge
    assert cols[cols.index("sm_active") + 1:cols.index("sm_active") + 3] == ["phase_util",
                                                                             "phase_sm"]
    by_gpu = table.set_index("gpu")
    others = by_gpu.drop(index=culprit)
    # in the flag's phase the straggler's SMs stand far above the waiters', whose utilization
    # is as high as its own (they spin in collectives): what the flag's evidence says
    assert by_gpu.loc[culprit, "phase_sm"] > others["phase_sm"].max() + 15
    assert others["phase_util"].min() > 90
    # the window's SM mean (every phase mixed in) shows a smaller gap than the phase does
    window_gap = by_gpu.loc[culprit, "sm_active"] - others["sm_active"].median()
    phase_gap = by_gpu.loc[culprit, "phase_sm"] - others["phase_sm"].median()
    assert phase_gap > window_gap
    st.cache_data.clear()
