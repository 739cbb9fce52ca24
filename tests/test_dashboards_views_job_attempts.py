"""The Job page (dashboards/views/job_attempts.py), run by Streamlit's AppTest on a run store that
holds the hand-computed job of test_analysis_attempts: three attempts, a crash, a terminate."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_analysis_attempts import _job
from test_dashboards_app import _clean  # noqa: F401 - no source from the environment, no cache

from dashboards.escape import shown_text
from monitor.store import RunStore

pytestmark = pytest.mark.slow  # Streamlit's AppTest

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")


def _page(monkeypatch, store: Path, **query) -> AppTest:
    monkeypatch.setenv("VERLMON_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["window"] = "all"
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    at.switch_page("views/job_attempts.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _store(tmp_path: Path, save_freq: int = 20) -> Path:
    steps, events, flags = _job()
    path = tmp_path / "run.db"
    with RunStore(path) as store:
        store.add_steps(steps)
        store.add_events(events)
        store.upsert_flags(flags)
        store.set_meta("job_config", {"trainer": {"save_freq": save_freq}})
    return path


def test_the_job_page_shows_each_attempt_the_ettr_the_costs_and_the_cadence(
        tmp_path, monkeypatch):
    at = _page(monkeypatch, _store(tmp_path))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["ETTR"] == "35.7%" and metrics["Attempts"] == "3"
    assert (metrics["Failures"], metrics["Steps redone"], metrics["Checkpoint saves"]) == (
        "2", "4", "3")
    table = at.dataframe[0].value
    assert list(table["ended by"]) == ["crash", "terminated", "finished"]
    assert list(table["hang"]) == [0.0, 53.0, 0.0]
    text = " ".join(shown_text(m.value) for m in at.markdown)
    assert "Failure #2 (terminated) cost 1.8 min: from its last step until step 12" in text
    assert any("Save more often: trainer.save_freq=3 instead of 20" in shown_text(i.value)
               for i in at.info)
    assert any("terminated the job's process tree (PID 7)" in shown_text(w.value)
               for w in at.warning)


def test_a_given_mtbf_replaces_the_failures_seen(tmp_path, monkeypatch):
    at = _page(monkeypatch, _store(tmp_path), mtbf="24")
    assert any("MTBF 24.00 h" in shown_text(i.value) for i in at.info)


def test_a_store_with_samples_but_no_attempt_says_so(tmp_path, monkeypatch):
    path = tmp_path / "gpus.db"
    with RunStore(path) as store:
        store.add_samples("gpu", [{"ts": 1000.0 + i, "node": "n0", "gpu": 0, "util": 50.0}
                                  for i in range(5)])
    at = _page(monkeypatch, path)
    assert any("No attempt in the store yet" in shown_text(i.value) for i in at.info)
    assert "ETTR" not in {m.label for m in at.metric}
