"""The table of telemetry kinds drives every part that carries sample rows: a kind is one entry
(monitor/telemetry_kinds.py), and its rows go from the sink to the window, the store (and its
retention) and the frame readers with no method of its own anywhere."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from monitor.frames import FrameError, empty_frame, read_frame, rows_frame, write_frame
from monitor.live.live_monitor import Recorder
from monitor.live.rolling_window import RollingWindow
from monitor.live.sink import NullSink
from monitor.store.runstore import RunStore
from monitor.store.writer import StoreWriter
from monitor.telemetry_kinds import KIND, KINDS, TelemetryKind

NOW = 1000.0

#: A kind none of the parts has heard of: power-supply readings, two supplies per node.
PSU = TelemetryKind("psu", "PSU rows", ("ts", "node", "psu", "watts", "temp_c"),
                    ("ts", "node", "watts"), "psu_samples", series=("node", "psu"),
                    text=("node", "psu"), aggregates={"watts": "max"}, create_on_use=True)


def _parts(tmp_path: Path, **store_args) -> tuple[Recorder, RollingWindow, RunStore, StoreWriter]:
    window = RollingWindow(clock=lambda: NOW)
    store = RunStore(tmp_path / "run.db", **store_args)
    writer = StoreWriter(store, compact_interval_s=None)
    return Recorder(window, writer), window, store, writer


def _row(kind: TelemetryKind, i: int) -> dict:
    """A row of ``kind`` with every column set: text as words, ``gpu`` an index, numbers."""
    row: dict = {}
    for col in kind.columns:
        if col == "ts":
            row[col] = NOW - 100.0 + i
        elif col in kind.text:
            row[col] = f"{col}-{i % 2}"
        elif col == "gpu":
            row[col] = i % 4
        else:
            row[col] = 10.0 * i + len(col)
    return row


def test_a_kind_added_to_the_table_goes_from_sink_to_window_store_and_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(KIND, "psu", PSU)
    recorder, window, store, writer = _parts(tmp_path)
    rows = [{"ts": NOW - 60 + i, "node": "n0", "psu": "ab"[i % 2], "watts": 400.0 + i}
            for i in range(6)]
    recorder.add_rows("psu", rows)
    NullSink().add_rows("psu", rows)  # the bare exporter's sink takes it too, and drops it

    live = window.frame("psu")
    assert list(live.columns) == list(PSU.columns)
    assert live["watts"].tolist() == [400.0 + i for i in range(6)]
    assert live["temp_c"].isna().all()  # not given: NaN
    assert window.sizes()["psu"] == 6

    assert writer.flush(), writer.last_error
    stored = store.samples_frame("psu")
    pd.testing.assert_frame_equal(stored, live)
    assert store.samples_frame("psu", node="n1").empty
    folded = store.samples_frame("psu", resample_s=60.0)  # one bucket per supply
    assert sorted(zip(folded["psu"], folded["watts"], strict=True)) == [("a", 404.0), ("b", 405.0)]

    path = tmp_path / "psu.csv"
    write_frame(stored, path)
    pd.testing.assert_frame_equal(read_frame("psu", path), stored)
    pd.DataFrame({"ts": [1.0], "node": ["n0"]}).to_csv(path, index=False)
    with pytest.raises(FrameError, match="missing column.*watts"):
        read_frame("psu", path)
    assert list(empty_frame("psu").columns) == list(PSU.columns)


def test_retention_folds_a_kind_added_to_the_table_as_its_entry_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(KIND, "psu", PSU)
    store = RunStore(tmp_path / "run.db", retention_s=10.0, downsample_s=10.0)
    store.add_samples("psu", [{"ts": float(t), "node": "n0", "psu": "a", "watts": 300.0 + t}
                              for t in range(40)])
    counts = store.compact(now=40.0)
    assert counts["downsampled"] == 30 and counts["buckets"] == 3
    df = store.samples_frame("psu")
    assert df["watts"].tolist()[:3] == [309.0, 319.0, 329.0]  # "max", as the entry says
    assert len(df) == 3 + 10


def test_a_store_that_never_saw_a_create_on_use_kind_reads_as_holding_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(KIND, "psu", PSU)
    store = RunStore(tmp_path / "run.db")
    pd.testing.assert_frame_equal(store.samples_frame("psu"), empty_frame("psu"))
    assert store.compact(now=0.0)["downsampled"] == 0  # retention skips the missing table


def test_rows_of_a_kind_missing_from_the_table_are_refused_not_dropped(tmp_path: Path):
    store = RunStore(tmp_path / "run.db")
    with pytest.raises(ValueError, match="no telemetry kind 'psu'"):
        store.add_samples("psu", [{"ts": 1.0, "node": "n0", "watts": 5.0}])
    with pytest.raises(KeyError):
        RollingWindow().add_rows("psu", [{"ts": 1.0, "node": "n0", "watts": 5.0}])


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_kind_round_trips_through_the_sink_the_store_and_the_frame_readers(
        kind: TelemetryKind, tmp_path: Path):
    recorder, window, store, writer = _parts(tmp_path)
    rows = [_row(kind, i) for i in range(5)]
    getattr(recorder, f"add_{kind.name}")(rows[:2])  # the per-kind spelling
    recorder.add_rows(kind.name, rows[2:])
    assert writer.flush(), writer.last_error

    stored = store.samples_frame(kind.name)
    assert list(stored.columns) == list(kind.columns)
    assert stored["ts"].tolist() == [r["ts"] for r in rows]
    for col in kind.text:
        assert stored[col].tolist() == [r[col] for r in rows]
    pd.testing.assert_frame_equal(window.frame(kind.name)[list(kind.columns)], stored,
                                  check_dtype=False)
    pd.testing.assert_frame_equal(getattr(store, f"{kind.name}_frame")(), stored)
    pd.testing.assert_frame_equal(rows_frame(kind.name, rows)[list(kind.columns)], stored,
                                  check_dtype=False)

    path = tmp_path / f"{kind.name}.csv"
    write_frame(stored, path)
    pd.testing.assert_frame_equal(read_frame(kind.name, path), stored)
    assert store.samples_frame(kind.name, start=rows[3]["ts"])["ts"].tolist() == \
        [rows[3]["ts"], rows[4]["ts"]]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_kind_has_one_empty_frame_in_the_store_and_the_files(kind: TelemetryKind,
                                                                   tmp_path: Path):
    store = RunStore(tmp_path / "run.db")
    empty = empty_frame(kind.name)
    assert list(empty.columns) == list(kind.columns) and empty.empty
    pd.testing.assert_frame_equal(store.samples_frame(kind.name), empty)
    path = tmp_path / "empty.csv"
    write_frame(empty, path)
    pd.testing.assert_frame_equal(read_frame(kind.name, path), empty)
