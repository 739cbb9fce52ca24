"""monitor/live/attempt_counter.py: the attempt marks reach the run store once, and the job's
ledger reaches /metrics from the whole store, across exporter restarts."""

from __future__ import annotations

import json

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from test_analysis_attempts import _job

from exporters.options import ExporterOptions
from monitor.live import ViewContext
from monitor.live.attempt_counter import AttemptsView
from monitor.live.flag_tracker import FlagTracker
from monitor.live.rolling_window import RollingWindow
from monitor.logs.attempt_marks import marks_path
from monitor.store import RunStore


class StoreSink:
    """Events straight into the run store (the live monitor's writer does it in batches)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def add_events(self, events) -> None:
        self.store.add_events(list(events))


def _stored_job(tmp_path):
    """The hand-computed job of test_analysis_attempts: its steps, resume lines and crash in
    the store (as the exporter stored them), its starts and exits in ``train.log.attempts``
    (as verl-monitor run wrote them), its hang flag in the store."""
    steps, events, flags = _job()
    store = RunStore(tmp_path / "run.db")
    store.add_steps(steps)
    store.add_events([e for e in events if not e.kind.startswith("attempt_")])
    store.upsert_flags(flags)
    log = tmp_path / "train.log"
    log.write_text("")
    lines = []
    for e in events:
        if e.kind == "attempt_start":
            lines.append({"event": "start", "time": e.time, "pid": 10, "offset": 0})
        elif e.kind == "attempt_end":
            lines.append({"event": "end", "time": e.time, "status": e.data["status"]})
    marks_path(log).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return store, log


def _view(store, log) -> AttemptsView:
    ctx = ViewContext(node="n0", interval=1.0, window=RollingWindow(), tracker=FlagTracker(),
                      sink=StoreSink(store),
                      options=ExporterOptions(store=str(store.path), log=(str(log),)))
    return AttemptsView(ctx)


def _scrape(view) -> str:
    reg = CollectorRegistry()
    reg.register(view)
    return generate_latest(reg).decode()


def _value(text: str, series: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(series + " "))
    return float(line.rsplit(" ", 1)[1])


def test_the_jobs_ledger_reaches_metrics_from_the_store(tmp_path):
    store, log = _stored_job(tmp_path)
    view = _view(store, log)
    doc = view.poll(2000.0)
    assert len(store.events(kind="attempt_start")) == 3  # kept in the store
    text = _scrape(view)
    assert _value(text, "verlmon_job_attempts_total") == 3
    assert _value(text, 'verlmon_job_seconds_total{bucket="productive"}') == 141.0
    assert _value(text, 'verlmon_job_seconds_total{bucket="hang"}') == 53.0
    assert _value(text, 'verlmon_job_seconds_total{bucket="between_attempts"}') == 19.0
    assert _value(text, 'verlmon_job_failures_total{ended_by="terminated"}') == 1
    assert _value(text, 'verlmon_job_failures_total{ended_by="crash"}') == 1
    assert _value(text, "verlmon_job_steps_redone_total") == 4
    assert _value(text, "verlmon_job_checkpoint_saves_total") == 3
    assert _value(text, "verlmon_job_ettr_ratio") == pytest.approx(141 / 395, abs=1e-4)
    assert doc["ettr"] == pytest.approx(141 / 395, abs=1e-4)


def test_a_restarted_exporter_stores_each_mark_once_and_exports_the_same(tmp_path):
    store, log = _stored_job(tmp_path)
    first = _view(store, log)
    first.poll(2000.0)
    again = _view(store, log)  # a new exporter on the same store and log
    again.poll(2001.0)
    assert len(store.events(kind="attempt_start")) == 3
    assert len(store.events(kind="attempt_end")) == 3
    assert _scrape(first) == _scrape(again)


def test_nothing_is_exported_before_the_first_booking_and_without_steps_no_ettr(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    store = RunStore(tmp_path / "run.db")
    view = _view(store, log)
    assert _scrape(view) == ""
    view.poll(10.0)
    text = _scrape(view)
    assert _value(text, "verlmon_job_attempts_total") == 0
    assert "verlmon_job_ettr_ratio" not in text
