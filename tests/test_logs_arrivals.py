"""The capture-time sidecar: written, read back, torn last line tolerated."""

from __future__ import annotations

from pathlib import Path

from monitor.logs.arrivals import ArrivalWriter, read_arrivals, sidecar_path


def test_sidecar_sits_beside_the_log(tmp_path: Path) -> None:
    assert sidecar_path(tmp_path / "job.log") == tmp_path / "job.log.arrivals"


def test_records_read_back_in_order(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    assert read_arrivals(log) is None
    w = ArrivalWriter(log)
    w.record(0, 1700000000.25)
    w.record(42, 1700000001.5)
    w.record(42, 1700000002.0)  # same chunk again: skipped
    w.close()
    w.record(99, 1.0)  # after close: nothing
    assert read_arrivals(log) == [(0, 1700000000.25), (42, 1700000001.5)]
    assert sidecar_path(log).read_text().splitlines() == [
        "0 1700000000.250000",
        "42 1700000001.500000",
    ]


def test_torn_last_line_and_junk_are_skipped(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    sidecar_path(log).write_text("0 10.0\nhello\n7 x\n15 11.5\n30 17")
    assert read_arrivals(log) == [(0, 10.0), (15, 11.5)]


def test_a_sidecar_of_other_bytes_is_started_again(tmp_path: Path) -> None:
    """The log was truncated since the sidecar was written: its records are not kept."""
    log = tmp_path / "job.log"
    log.write_bytes(b"a\n" * 100)
    w = ArrivalWriter(log)
    w.record(150, 1.0)
    w.close()
    log.write_bytes(b"b\n")  # truncated and written again
    w = ArrivalWriter(log)
    w.record(0, 2.0)
    w.close()
    assert read_arrivals(log) == [(0, 2.0)]
    log.write_bytes(b"b\nc\n")  # grown: the records still hold
    w = ArrivalWriter(log)
    w.record(2, 3.0)
    w.close()
    assert read_arrivals(log) == [(0, 2.0), (2, 3.0)]


def test_the_tail_reads_what_was_appended_and_times_each_line(tmp_path: Path) -> None:
    """A live exporter gives each line the time it was captured, reading only the new records."""
    from monitor.logs.arrivals import ArrivalTail

    log = tmp_path / "job.log"
    tail = ArrivalTail(log)
    assert tail.times([0]) is None  # no sidecar yet
    w = ArrivalWriter(log)
    w.record(0, 10.0)
    w.record(20, 12.5)
    assert tail.times([0, 5, 20, None]) == [10.0, 10.0, 12.5, None]
    w.record(40, 15.0)
    sidecar_path(log).open("a").write("60 1")  # torn mid-write: not read yet
    assert tail.times([40, 60]) == [15.0, 15.0]
    sidecar_path(log).open("a").write("6.0\n")
    assert tail.times([60]) == [16.0]
    w.close()
    sidecar_path(log).write_text("0 99.0\n")  # a new job's sidecar: read from its start
    assert tail.times([0]) == [99.0]
