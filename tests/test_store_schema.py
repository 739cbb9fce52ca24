"""The store's schema: WAL, versioned, space given back; foreign or newer files left alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from monitor.store import SCHEMA_VERSION, RunStore, StoreError


def pragma(path: Path, name: str):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


def test_new_file_is_wal_versioned_and_incremental_vacuum(tmp_path: Path) -> None:
    RunStore(tmp_path / "run.db").close()
    assert pragma(tmp_path / "run.db", "journal_mode") == "wal"
    assert pragma(tmp_path / "run.db", "user_version") == SCHEMA_VERSION
    assert pragma(tmp_path / "run.db", "auto_vacuum") == 2  # incremental


def test_reopening_keeps_the_data(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run.db") as store:
        store.set_meta("run_name", "a")
    with RunStore(tmp_path / "run.db", create=False) as store:
        assert store.meta() == {"run_name": "a"}


def test_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this verl-monitor"):
        RunStore(path)
    assert pragma(path, "journal_mode") == "delete"


def test_other_programs_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE accounts (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a verl-monitor run store"):
        RunStore(path)
    assert pragma(path, "journal_mode") == "delete"
    conn = sqlite3.connect(path)
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    conn.close()
    assert names == ["accounts"]


def test_garbage_file_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="junk.db: not a verl-monitor run store"):
        RunStore(junk)
    assert junk.read_bytes() == b"this is not sqlite" * 100


def test_a_store_written_before_the_link_rates_gains_them_and_exports_them(tmp_path: Path) -> None:
    """Issue 23: PCIe/NVLink columns join gpu_samples; an older store gets them on open (its
    old rows read NaN there), new rows keep them, and ``export`` writes them to gpu.csv."""
    from monitor.frames import read_gpu_frame
    from monitor.store import export_dir

    path = tmp_path / "run.db"
    with RunStore(path) as store:
        store.add_gpu_samples([{"ts": 1.0, "node": "n0", "gpu": 0, "util": 50.0,
                                "mem_used_bytes": 1.0, "mem_total_bytes": 2.0}])
    conn = sqlite3.connect(path)  # make it look like a store from before the columns
    for col in ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps"):
        conn.execute(f"ALTER TABLE gpu_samples DROP COLUMN {col}")
    conn.commit()
    conn.close()
    with RunStore(path, create=False) as store:
        store.add_gpu_samples([{"ts": 2.0, "node": "n0", "gpu": 0, "util": 60.0,
                                "mem_used_bytes": 1.0, "mem_total_bytes": 2.0,
                                "pcie_tx_bps": 1e9, "pcie_rx_bps": 8e9,
                                "nvlink_tx_bps": 5e10, "nvlink_rx_bps": 6e10}])
        df = store.gpu_frame()
    assert df["pcie_rx_bps"].isna().tolist() == [True, False]
    assert df["pcie_rx_bps"].iloc[1] == 8e9 and df["nvlink_rx_bps"].iloc[1] == 6e10
    export_dir(path, tmp_path / "out")
    csv = read_gpu_frame(tmp_path / "out" / "gpu.csv")
    assert csv["pcie_tx_bps"].iloc[1] == 1e9 and csv["nvlink_tx_bps"].iloc[1] == 5e10


def test_a_store_written_before_the_workers_rss_gains_it_and_exports_it(tmp_path: Path) -> None:
    """Issue 23 (memory_creep on the host): the training process tree's RSS joins host_samples
    the same way: an older store gets the column on open and ``export`` writes it to host.csv."""
    from monitor.frames import read_host_frame
    from monitor.store import export_dir

    path = tmp_path / "run.db"
    row = {"ts": 1.0, "node": "n0", "cpu_max_core_pct": 50.0, "cpu_avg_pct": 10.0}
    with RunStore(path) as store:
        store.add_host_samples([row])
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE host_samples DROP COLUMN train_rss_bytes")
    conn.commit()
    conn.close()
    with RunStore(path, create=False) as store:
        store.add_host_samples([{**row, "ts": 2.0, "train_rss_bytes": 3e10}])
        df = store.host_frame()
    assert df["train_rss_bytes"].isna().tolist() == [True, False]
    export_dir(path, tmp_path / "out")
    csv = read_host_frame(tmp_path / "out" / "host.csv")
    assert csv["train_rss_bytes"].iloc[1] == 3e10
