"""Run-store hardening (issue 12): no value stops the writer, drops are counted, a store with
garbage inside is reported, and one store has one writer."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.records import Event, Flag, StepRecord
from monitor.store import RunStore, StoreWriter
from monitor.store.lock import StoreLock, StoreLocked


def gpu_rows(t0: int, n: int) -> list[dict]:
    return [{"ts": float(t0 + i), "node": "n0", "gpu": 0, "util": 50.0} for i in range(n)]


def test_a_step_number_past_64_bits_is_dropped_and_the_rest_is_stored(tmp_path: Path) -> None:
    """Before: OverflowError escaped flush() (killing the flusher) and every later flush failed
    on the same buffered step, while ``up`` stayed True."""
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store)
    w.put_steps([StepRecord(step=1, end_time=1.0, total=10.0),
                 StepRecord(step=2**63, end_time=2.0, total=10.0),
                 StepRecord(step=10**30, end_time=3.0, total=10.0)])
    w.put_events([Event(kind="resume", time=5.0, step=2**64)])
    w.put_gpu(gpu_rows(0, 3))
    assert w.flush() is True and w.up
    assert [s.step for s in store.steps()] == [1]
    assert len(store.events()) == 1 and len(store.gpu_frame()) == 3
    assert w.dropped["invalid"] == 2 and w.buffered == 0
    store.close()


def test_a_row_the_store_rejects_is_found_dropped_and_counted(tmp_path: Path) -> None:
    """Any content error (here a flag whose severity SQLite cannot bind) drops that row alone."""
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store)
    good = Flag(kind="stalled", severity="warning", start=4.0, end=None, scope={"node": "n0"})
    bad = Flag(kind="oom", severity={"not": "text"}, start=5.0, end=None, scope={})
    w.put_flags([good, bad])
    w.put_gpu(gpu_rows(0, 50))
    w.put_gpu([{"ts": 60.0, "node": "n0", "gpu": float("inf"), "util": float("inf")}])
    assert w.flush() is True
    assert [f.kind for f in store.flags()] == ["stalled"]
    assert len(store.gpu_frame()) == 51  # the infinite GPU index is stored as missing
    assert w.dropped == {"buffer_full": 0, "invalid": 1} and w.buffered == 0
    assert w.flush() is True  # nothing stuck in the buffer
    store.close()


def test_garbage_inside_the_file_turns_the_store_down(tmp_path: Path) -> None:
    """Before: a store with garbage mid-file opened with store_up 1."""
    path = tmp_path / "r.db"
    store = RunStore(path)
    w = StoreWriter(store)
    w.put_gpu(gpu_rows(0, 20_000))
    assert w.flush()
    store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    size = path.stat().st_size
    with path.open("r+b") as fh:  # scribble over pages in the middle of the table
        fh.seek(size // 2 - (size // 2) % 4096)
        fh.write(os.urandom(3 * 4096))
    store = RunStore(path)
    w = StoreWriter(store)
    assert w.up
    assert w.check_integrity() is False
    assert w.up is False and "integrity check" in w.integrity_error
    store.close()
    clean = RunStore(tmp_path / "clean.db")
    assert StoreWriter(clean).check_integrity() is True
    clean.close()


def test_a_burst_is_written_not_dropped_while_writes_work(tmp_path: Path) -> None:
    """Before: 980k of a 1M-step burst were dropped (the buffer keeps 20k) with no counter."""
    store = RunStore(tmp_path / "r.db")
    w = StoreWriter(store, max_samples=100, max_records=10)
    w.put_gpu(gpu_rows(0, 150))
    w.put_steps([StepRecord(step=i, end_time=float(i), total=1.0) for i in range(25)])
    assert w.dropped_rows == 0 and w.flush()
    assert len(store.gpu_frame()) == 150 and len(store.steps()) == 25
    store.close()


def test_the_buffer_bound_is_counted_while_writes_fail(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "r.db", busy_timeout_s=0.05)
    w = StoreWriter(store, max_samples=100, max_records=10)
    other = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        w.put_gpu(gpu_rows(0, 150))
        w.put_steps([StepRecord(step=i, end_time=float(i), total=1.0) for i in range(25)])
        assert w.dropped["buffer_full"] == 50 + 15 and w.dropped_rows == 65
        assert w.up is False and w.write_errors >= 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert w.flush() and len(store.gpu_frame()) == 100  # the newest 100 kept
    store.close()


@pytest.mark.slow
def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    """Before: two exporters on one store doubled every row without a word."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from monitor.store.lock import StoreLock; "
         f"StoreLock({str(tmp_path / 'r.db')!r}).acquire(); print('held', flush=True); "
         "time.sleep(30)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLocked, match=rf"another exporter \(pid {holder.pid}\)"):
            StoreLock(tmp_path / "r.db").acquire()
    finally:
        holder.kill()
        holder.wait(timeout=10)
    lock = StoreLock(tmp_path / "r.db")  # the holder died: its lock went with it
    lock.acquire()
    lock.release()


def _scribbled_store(path: Path) -> int:
    """A store of 20,000 GPU rows with random bytes over many of its pages; its size."""
    store = RunStore(path)
    w = StoreWriter(store)
    w.put_gpu(gpu_rows(0, 20_000))
    assert w.flush()
    store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    size = path.stat().st_size
    with path.open("r+b") as fh:
        for off in range(3 * 4096, size - 4096, 7 * 4096):
            fh.seek(off + 8)
            fh.write(bytes((i * 97 + off) % 256 for i in range(3000)))
    return size


def test_a_store_that_failed_its_check_is_not_written_and_says_so_briefly(tmp_path: Path
                                                                         ) -> None:
    """Before: the exporter went on writing into the damaged file, and the error was a
    6-10 KB line of every problem SQLite found, with the raw bytes it read."""
    path = tmp_path / "r.db"
    _scribbled_store(path)
    store = RunStore(path)
    w = StoreWriter(store)
    assert w.check_integrity() is False
    err = w.integrity_error
    assert len(err) < 400 and err.isprintable() and "integrity check" in err, err
    before = path.read_bytes()
    w.put_gpu(gpu_rows(100_000, 10))
    assert w.flush() is False and not w.up
    assert w.buffered == 10  # kept in memory, not written into the damaged file
    assert "integrity check" in w.last_error and w.last_error.isprintable()
    store.close()
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
