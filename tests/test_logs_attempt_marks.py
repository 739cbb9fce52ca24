"""``<log>.attempts``: what verl-monitor run writes at each start and exit, read back."""

from __future__ import annotations

from monitor.logs.arrivals import ArrivalWriter
from monitor.logs.attempt_marks import (
    END,
    START,
    file_marks,
    first_line_time,
    marks_path,
    read_marks,
    record_end,
    record_start,
)
from monitor.records import Event, StepRecord


def test_starts_and_exits_are_read_back_in_order_and_a_torn_line_is_skipped(tmp_path):
    log = tmp_path / "train.log"
    record_start(log, 4403, 0, when=100.0)
    record_end(log, 1, when=150.0)
    record_start(log, 4500, 2048, when=160.0)
    with open(marks_path(log), "a") as fh:
        fh.write('{"event": "end", "time": 2')  # a kill mid-write
    marks = read_marks(log)
    assert [(e.kind, e.time) for e in marks] == [(START, 100.0), (END, 150.0), (START, 160.0)]
    assert marks[0].data["pid"] == 4403 and marks[2].data["offset"] == 2048
    assert marks[1].data["status"] == 1 and marks[1].data["source"] == "run"


def test_no_file_is_no_marks(tmp_path):
    assert read_marks(tmp_path / "nothing.log") == []


def test_a_log_without_marks_is_one_attempt_from_its_first_line_to_its_last(tmp_path):
    steps = [StepRecord(1, 140.0, 10.0), StepRecord(2, 152.0, 10.0)]
    events = [Event("oom", 155.0, 2, "CUDA out of memory")]
    got = file_marks(tmp_path / "a.log", steps, events, first_line=100.0)
    assert [(e.kind, e.time) for e in got] == [(START, 100.0), (END, 155.0)]
    assert got[1].data["status"] is None
    bare = file_marks(tmp_path / "a.log", steps, events)
    assert bare[0].time == 130.0  # no first-line time: the first step's start
    assert file_marks(tmp_path / "a.log", [], []) == []


def test_the_first_line_time_is_its_capture_time_else_its_first_timestamp(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("no stamp here\n[2026-12-03 10:00:05] step:1 - timing_s/step:1\n")
    assert first_line_time(log) == 1796292005.0
    writer = ArrivalWriter(log)
    writer.record(0, 1796291999.5)
    writer.close()
    assert first_line_time(log) == 1796291999.5
    assert first_line_time(tmp_path / "missing.log") is None


def test_an_attempts_file_that_is_a_fifo_or_a_device_is_not_waited_on(tmp_path):
    """Issue 41 item 2: ``<log>.attempts`` is read like the log: a FIFO there would block the
    reader for good, a link to /dev/zero would be read without end."""
    import os

    from tests.threads import in_thread

    log = tmp_path / "train.log"
    for make in (lambda p: os.mkfifo(p), lambda p: os.symlink("/dev/zero", p)):
        make(marks_path(log))
        assert in_thread(lambda: read_marks(log)) == []
        os.unlink(marks_path(log))
