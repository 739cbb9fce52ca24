"""StoreWriter: a full disk or a locked file never raises, loses nothing within the bound,
and the next flush after the problem clears writes everything kept."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from monitor.logs.follow import LogPosition
from monitor.records import Event, Flag, StepRecord
from monitor.store import RunStore, StoreWriter


def rows(t0: int, n: int) -> list[dict]:
    return [
        {"ts": float(t0 + i), "node": "n0", "gpu": 0, "util": 90.0, "mem_used_bytes": 1.0,
         "mem_total_bytes": 2.0, "power_w": 123.456789}
        for i in range(n)
    ]


def full_disk_writer(tmp_path: Path, written: int) -> tuple[RunStore, StoreWriter]:
    """A writer that stored ``written`` GPU rows, on a store that cannot grow any more (a real
    SQLITE_FULL), with 5000 more GPU rows and one step put."""
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store)
    w.put_gpu(rows(0, written))
    assert w.flush()
    pages = store._conn().execute("PRAGMA page_count").fetchone()[0]
    store.set_page_limit(pages)
    w.put_gpu(rows(written, 5000))
    w.put_steps([StepRecord(step=7, end_time=7.0, total=1.0)])
    return store, w


def test_flush_writes_everything_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store)
    w.put_gpu(rows(0, 10))
    w.put_host([{"ts": 1.0, "node": "n0", "cpu_max_core_pct": 5.0, "cpu_avg_pct": 1.0}])
    w.put_steps([StepRecord(step=1, end_time=3.0, total=3.0)])
    w.put_events([Event(kind="resume", time=2.0, step=1)])
    flag = Flag(kind="stalled", severity="warning", start=4.0, end=None, scope={"node": "n0"})
    w.put_flags([flag])
    w.put_flags([Flag(**{**flag.to_dict(), "end": 9.0})])  # newer version of the same flag
    w.set_meta("backend", "sim")
    assert w.buffered == 15
    assert w.flush() is True and w.up and w.buffered == 0
    assert w.flush() is True  # nothing left: nothing written twice
    assert len(store.gpu_frame()) == 10 and len(store.host_frame()) == 1
    assert store.flags()[0].end == 9.0 and store.meta() == {"backend": "sim"}
    assert len(store.steps()) == 1 and len(store.events()) == 1
    store.close()


def test_full_disk_keeps_rows_until_space_returns(tmp_path: Path) -> None:
    store, w = full_disk_writer(tmp_path, written=100)
    assert w.flush() is False  # no exception reaches the caller
    assert w.up is False and w.write_errors == 1
    assert "disk" in w.last_error and "full" in w.last_error
    assert w.buffered == 5001
    assert len(store.gpu_frame()) == 100  # the failed batch left nothing half-written
    assert w.flush() is False and w.write_errors == 2
    store.set_page_limit(None)  # space freed
    assert w.flush() is True and w.up is True and w.last_error is None
    df = store.gpu_frame()
    assert len(df) == 5100 and df["ts"].is_unique
    assert [s.step for s in store.steps()] == [7]
    store.close()


def test_locked_file_then_released(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", busy_timeout_s=0.05)
    w = StoreWriter(store)
    other = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        w.put_gpu(rows(0, 3))
        assert w.flush() is False
        assert w.up is False and "locked" in w.last_error and w.write_errors == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert w.flush() is True and w.up is True
    assert len(store.gpu_frame()) == 3
    store.close()


def test_bound_drops_oldest_samples_and_counts_them(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", busy_timeout_s=0.05)
    w = StoreWriter(store, max_samples=1000)
    store.set_page_limit(1)  # the file cannot grow: nothing new fits
    w.put_gpu(rows(0, 800))
    w.put_host([{"ts": 2000.0 + i, "node": "n0", "cpu_max_core_pct": 1.0, "cpu_avg_pct": 1.0}
                for i in range(500)])
    assert w.flush() is False
    assert w.dropped_rows == 300
    store.set_page_limit(None)
    assert w.flush() is True
    gpu = store.gpu_frame()
    assert gpu["ts"].min() == 300.0 and len(gpu) == 500  # the 300 oldest went
    assert len(store.host_frame()) == 500
    store.close()


def test_sample_without_timestamp_is_dropped_not_blocking(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store)
    w.put_gpu([{"node": "n0", "gpu": 0, "util": 1.0}] + rows(0, 2))
    assert w.dropped_rows == 1 and "without a timestamp" in w.last_error
    assert w.flush() is True and len(store.gpu_frame()) == 2
    store.close()


def test_flush_runs_retention_now_and_then(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", retention_s=60, downsample_s=15)
    w = StoreWriter(store, compact_interval_s=0.0)
    w.put_gpu(rows(0, 600))
    assert w.flush()
    df = store.gpu_frame()
    assert len(df) < 600 and df["ts"].max() == 599.0
    store.close()


def test_puts_during_flushes_are_written_exactly_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store)
    done = threading.Event()

    def produce() -> None:
        for i in range(200):
            w.put_gpu(rows(i * 10, 10))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    while not done.is_set():
        assert w.flush()
    producer.join(timeout=30)
    assert w.flush()
    df = store.gpu_frame()
    assert len(df) == 2000 and df["ts"].is_unique and w.buffered == 0
    store.close()


def test_rows_left_when_the_final_flush_fails_are_counted_as_lost(tmp_path: Path) -> None:
    """At stop a failed flush cannot be retried: the rows left are counted, not kept quietly."""
    store = RunStore(tmp_path / "clean.db")
    clean = StoreWriter(store)
    clean.put_gpu(rows(0, 5))
    assert clean.flush()
    assert clean.drop_unwritten() is None  # nothing left: nothing to say
    store.close()
    store, w = full_disk_writer(tmp_path, written=5)
    assert w.flush() is False
    line = w.drop_unwritten()
    assert line is not None and "\n" not in line
    assert "is full" in line and "5001 buffered rows" in line and "5000 gpu, 1 steps" in line
    assert w.buffered == 0 and w.dropped["unwritten_at_stop"] == 5001
    store.close()


def test_a_position_is_written_with_the_steps_put_before_it_never_ahead(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db", busy_timeout_s=0.05)  # the lock is met at once
    writer = StoreWriter(store, compact_interval_s=None)
    locker = sqlite3.connect(tmp_path / "run.db", timeout=0)
    pos = LogPosition(str(tmp_path / "train.log"), 1, 2, 300, 300, "cd" * 20)
    locker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    writer.put_steps([StepRecord(step=1, end_time=1.0), StepRecord(step=2, end_time=2.0)])
    writer.put_position(pos)
    assert not writer.flush() and writer.buffered == 3
    assert store.log_positions() == {}  # neither the steps nor the position
    locker.execute("ROLLBACK")
    assert writer.flush()
    assert store.log_positions()[pos.path] == pos
    assert [s.step for s in store.steps()] == [1, 2]
    locker.close()
    store.close()


def test_rollout_rows_are_buffered_and_written_with_the_rest(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "w.db")
    writer = StoreWriter(store)
    writer.put_rollout([{"ts": 5.0, "node": "n0", "server": "h:1", "engine": "sglang",
                         "model": "m", "kv_cache_usage": 0.99, "preemptions_total": 7.0}])
    writer.put_rollout([{"node": "n0", "server": "h:1"}])  # no timestamp: dropped, counted
    assert writer.dropped["invalid"] == 1
    assert writer.flush()
    df = store.rollout_frame()
    assert df[["server", "engine", "preemptions_total"]].values.tolist() == [["h:1", "sglang",
                                                                              7.0]]
    store.close()
