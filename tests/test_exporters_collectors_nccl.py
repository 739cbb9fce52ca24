"""NCCL collector: follows a real dump directory, counts garbage, survives truncation."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.collectors.nccl import NcclCollector
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext
from monitor.live.live_monitor import Recorder
from monitor.live.rolling_window import RollingWindow
from monitor.store import RunStore, StoreWriter

FIXTURE = Path(__file__).parent / "fixtures" / "nccl_inspector" / "gpu-node-01-pid4242.log"


def record(coll="AllReduce", comm="DP Group 0", exec_us=1000, size=1 << 20, busbw=100.0,
           pid=1, ts=None) -> str:
    ts = time.time() if ts is None else ts
    return json.dumps({
        "header": {"id": "0xabc", "comm_name": comm, "rank": pid, "n_ranks": 2, "nnodes": 1},
        "metadata": {"dump_timestamp_us": int(ts * 1e6), "hostname": "n0", "pid": pid},
        "coll_perf": {"coll": coll, "coll_sn": 1, "coll_msg_size_bytes": size,
                      "coll_exec_time_us": exec_us, "coll_algobw_gbs": busbw / 2,
                      "coll_busbw_gbs": busbw},
    }) + "\n"


def make(tmp_path, directory, store=None, window_s=10.0):
    ctx = ExporterContext(node="n0", interval=1.0, sink=Recorder(RollingWindow(), store),
                          options=ExporterOptions(nccl_dir=str(directory), nccl_window=window_s))
    collector = NcclCollector(ctx)
    reg = CollectorRegistry()
    reg.register(collector)
    return collector, reg


def test_fixture_dump_counts_and_garbage(tmp_path):
    shutil.copy(FIXTURE, tmp_path / FIXTURE.name)
    col, reg = make(tmp_path, tmp_path)
    assert col.sample_once()
    labels = {"coll": "AllReduce", "comm": "DP Group 0", "rank": "0"}
    assert reg.get_sample_value("verlmon_nccl_operations_total", labels) == 2
    assert reg.get_sample_value("verlmon_nccl_bytes_total", labels) == 17179869184 + 1048576
    assert reg.get_sample_value("verlmon_nccl_exec_seconds_total", labels) == pytest.approx(
        0.061974 + 0.0002)
    assert reg.get_sample_value("verlmon_nccl_bus_bandwidth_bytes_per_second",
                                labels) == pytest.approx(8.75e9)  # the latest, not the max
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "Send", "comm": "0x9e7a479f95a66c", "rank": "0"}) == 1
    assert col.garbage_lines == 3
    # the fixture's timestamps are from 2025: nothing in the trailing window
    assert reg.get_sample_value("verlmon_nccl_comm_share_ratio") == 0.0


def test_appended_lines_and_comm_share(tmp_path):
    dump = tmp_path / "n0-pid1.log"
    other = tmp_path / "n0-pid2.log"
    dump.write_text(record(exec_us=2_000_000, pid=1))  # 2 s of NCCL on rank 1
    other.write_text(record(exec_us=1_000_000, pid=2))  # 1 s on rank 2
    col, reg = make(tmp_path, tmp_path, window_s=10.0)
    col.sample_once()
    # (2 + 1) s over a 10 s window and 2 ranks
    assert reg.get_sample_value("verlmon_nccl_comm_share_ratio") == pytest.approx(0.15)
    with dump.open("a") as fh:
        fh.write(record(exec_us=500, pid=1))
        fh.write(record(exec_us=500, pid=1)[:40])  # half a line: waits for its end
    col.sample_once()
    labels = {"coll": "AllReduce", "comm": "DP Group 0", "rank": "1"}
    assert reg.get_sample_value("verlmon_nccl_operations_total", labels) == 2
    assert col.garbage_lines == 0
    with dump.open("a") as fh:
        fh.write(record(exec_us=500, pid=1)[40:])
    col.sample_once()
    assert reg.get_sample_value("verlmon_nccl_operations_total", labels) == 3
    assert col.garbage_lines == 0


def test_truncated_file_is_read_again_and_missing_dir_waits(tmp_path):
    directory = tmp_path / "later"
    col, reg = make(tmp_path, directory)
    assert col.sample_once()  # the directory does not exist yet: no error, no series
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "AllReduce", "comm": "DP Group 0", "rank": "7"}) is None
    directory.mkdir()
    dump = directory / "n0-pid7.log"
    dump.write_text(record(pid=7) * 3)
    col.sample_once()
    dump.write_text(record(coll="AllGather", pid=7))  # truncated and rewritten (a restart)
    col.sample_once()
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "AllGather", "comm": "DP Group 0", "rank": "7"}) == 1
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "AllReduce", "comm": "DP Group 0", "rank": "7"}) == 3


def test_rows_reach_the_store(tmp_path):
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store)
    dump = tmp_path / "dumps" / "n0-pid1.log"
    dump.parent.mkdir()
    dump.write_text(record(exec_us=4000, size=100, busbw=50.0) * 2)
    col, _ = make(tmp_path, dump.parent, store=writer)
    col.sample_once()
    assert writer.flush()
    df = store.nccl_frame()
    assert len(df) == 1
    row = df.iloc[0]
    assert (row["coll"], row["comm"], row["ops"], row["bytes"]) == ("AllReduce", "DP Group 0",
                                                                    2.0, 200.0)
    assert row["exec_s"] == pytest.approx(0.008)
    assert row["busbw_bps"] == pytest.approx(50e9)
    store.close()


def test_an_exporter_started_again_does_not_count_the_same_collectives_twice(tmp_path):
    """The dump positions are saved with the rows; a new collector (the exporter after a
    SIGKILL) resumes from them: the store holds each collective once."""
    store = RunStore(tmp_path / "run.db")
    dump = tmp_path / "dumps" / "n0-pid1.log"
    dump.parent.mkdir()
    dump.write_text(record(exec_us=4000, size=100) * 3 + '{"partial line, no end')
    writer = StoreWriter(store)
    col, _ = make(tmp_path, dump.parent, store=writer)
    col.sample_once()
    assert writer.flush()
    assert [p.offset for p in store.log_positions().values()] == [len(record(exec_us=4000,
                                                                             size=100)) * 3]
    # killed: a new process, a new writer on the same store
    writer2 = StoreWriter(store)
    col2, reg2 = make(tmp_path, dump.parent, store=writer2)
    col2.sample_once()
    assert writer2.flush()
    assert store.nccl_frame()["ops"].sum() == 3
    with dump.open("a") as fh:  # the held partial line ends, and one more record comes
        fh.write("\n" + record(exec_us=4000, size=100))
    col2.sample_once()
    assert writer2.flush()
    assert store.nccl_frame()["ops"].sum() == 4
    assert col2.garbage_lines == 1  # the partial line, read once
    # a dump replaced while down (another inode) is read from its start
    dump.unlink()
    dump.write_text(record(exec_us=4000, size=100) * 2)
    col3, _ = make(tmp_path, dump.parent, store=StoreWriter(store))
    col3.sample_once()
    assert col3.records == 2
    store.close()


def test_without_a_directory_it_exports_nothing(tmp_path):
    ctx = ExporterContext(node="n0", interval=1.0)
    col = NcclCollector(ctx)
    assert col.sample_once()
    assert list(col.collect()) == []


# --- hardening (issue 12, items 9 and 10) -----------------------------------------------------


def test_each_rank_keeps_its_execution_time(tmp_path):
    """The rank that waits (long) and the straggler (short) stay separate series."""
    (tmp_path / "n0-pid1.log").write_text(record(exec_us=90_000, pid=1) * 2)  # waits
    (tmp_path / "n0-pid2.log").write_text(record(exec_us=5_000, pid=2) * 2)  # the straggler
    col, reg = make(tmp_path, tmp_path)
    col.sample_once()
    base = {"coll": "AllReduce", "comm": "DP Group 0"}
    waits = reg.get_sample_value("verlmon_nccl_exec_seconds_total", {**base, "rank": "1"})
    fast = reg.get_sample_value("verlmon_nccl_exec_seconds_total", {**base, "rank": "2"})
    assert waits == pytest.approx(0.18) and fast == pytest.approx(0.01)
    assert reg.get_sample_value("verlmon_nccl_operations_total", {**base, "rank": "2"}) == 2


def test_a_deeply_nested_line_loses_only_itself(tmp_path):
    """Before: RecursionError escaped the parser, the sample lost every record of every file
    and the offsets had already moved past them."""
    (tmp_path / "n0-pid1.log").write_text(record(pid=1) + "[" * 20_000 + "\n" + record(pid=1))
    (tmp_path / "n0-pid2.log").write_text(record(pid=2))
    col, reg = make(tmp_path, tmp_path)
    assert col.sample_once()
    base = {"coll": "AllReduce", "comm": "DP Group 0"}
    assert reg.get_sample_value("verlmon_nccl_operations_total", {**base, "rank": "1"}) == 2
    assert reg.get_sample_value("verlmon_nccl_operations_total", {**base, "rank": "2"}) == 1
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "garbage"}) == 1
    with (tmp_path / "n0-pid1.log").open("a") as fh:
        fh.write(record(pid=1))
    col.sample_once()  # offsets consistent: the next record is counted once
    assert reg.get_sample_value("verlmon_nccl_operations_total", {**base, "rank": "1"}) == 3


def test_a_line_without_end_is_not_held(tmp_path):
    """A dump with no newline grows without bound; the collector keeps none of it."""
    dump = tmp_path / "n0-pid1.log"
    with dump.open("w") as fh:
        fh.write("x" * (3 * (8 << 20)))  # 24 MB, no newline: three reads
    col, reg = make(tmp_path, tmp_path)
    for _ in range(3):
        col.sample_once()
    assert all(len(st.partial) <= 64 * 1024 for st in col._files.values())
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "oversize"}) == 1
    with dump.open("a") as fh:
        fh.write("tail of the long line\n" + record(pid=1))
    col.sample_once()
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "AllReduce", "comm": "DP Group 0", "rank": "1"}) == 1
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "garbage"}) == 0


def test_series_are_capped_and_future_records_keep_no_buckets(tmp_path):
    """Before: 100k communicator names made 100k series, and records dated in the future
    kept one bucket each, for good."""
    far = time.time() + 10 * 86400
    lines = [record(comm=f"c{i}", pid=1, ts=far + i) for i in range(300)]
    (tmp_path / "n0-pid1.log").write_text("".join(lines))
    col, reg = make(tmp_path, tmp_path)
    col.max_series = 100
    col.sample_once()
    assert len(col.snapshot.totals) == 100
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "series_cap"}) == 200
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "future"}) == 300
    assert len(col._seconds) <= 2  # clamped to now, not one bucket per future second


def test_idle_series_are_forgotten(tmp_path):
    (tmp_path / "n0-pid1.log").write_text(record(comm="gone", pid=1))
    col, reg = make(tmp_path, tmp_path)
    col.sample_once()
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "AllReduce", "comm": "gone", "rank": "1"}) == 1
    col.series_ttl_s = -1.0  # everything is idle now
    col.sample_once()
    assert reg.get_sample_value("verlmon_nccl_operations_total",
                                {"coll": "AllReduce", "comm": "gone", "rank": "1"}) is None


def test_store_rows_follow_the_series_cap(tmp_path):
    """Before (issue 20): 20,000 communicators gave 20,000 store rows in one sample while only
    4,096 series were exported."""
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store)
    dump = tmp_path / "dumps" / "n0-pid1.log"
    dump.parent.mkdir()
    dump.write_text("".join(record(comm=f"comm-{i}") for i in range(500)))
    col, reg = make(tmp_path, dump.parent, store=writer)
    col.max_series = 50
    col.sample_once()
    assert writer.flush()
    stored = store.nccl_frame()
    assert len(stored) == 50  # the exported series' communicators, nothing past the cap
    exported = {key[1] for key in col.snapshot.totals}
    assert set(stored["comm"]) == exported
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "series_cap"}) == 450
    store.close()


def test_huge_communicator_names_become_short_distinct_labels(tmp_path):
    """Before (issue 20): 4,096 series with 31 KB communicator names made /metrics 569 MB."""
    from exporters.exposition import MAX_LABEL_CHARS, format_families

    names = [f"{i:04d}-" + "x" * 31_000 for i in range(40)]
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store)
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "n0-pid1.log").write_text("".join(record(comm=n) for n in names))
    col, reg = make(tmp_path, tmp_path / "dumps", store=writer)
    col.sample_once()
    text = format_families(col.collect()).decode()
    assert len(text) < 100_000  # 40 series x 4 families, not 40 x 4 x 31 KB
    comms = {key[1] for key in col.snapshot.totals}
    assert len(comms) == 40 and all(len(c) <= MAX_LABEL_CHARS for c in comms)
    assert all(c.startswith(n[:20]) for c, n in zip(sorted(comms), sorted(names), strict=True))
    assert reg.get_sample_value("verlmon_nccl_dropped_total", {"reason": "long_label"}) == 40
    assert writer.flush()
    assert store.nccl_frame()["comm"].str.len().max() <= MAX_LABEL_CHARS  # the store too
    store.close()
