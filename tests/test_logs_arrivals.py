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


# --- issue 41 item 2: the sidecar read like the log; item 6: one that ends early ------------

import os  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import pytest  # noqa: E402

from monitor.logs.canonical_records import parse_file  # noqa: E402
from monitor.report import render_text  # noqa: E402
from tests.real_logs import analyze_doc  # noqa: E402
from tests.threads import in_thread  # noqa: E402


def step_text(n: int, step_s: float = 1.0) -> str:
    return (f"(TaskRunner pid=7) step:{n} - timing_s/gen:{step_s / 2} - "
            f"timing_s/step:{step_s}\n")


def write_log(folder: Path, steps: int, name: str = "job.log") -> tuple[Path, list[int]]:
    """A log of ``steps`` one-second steps, dated by nothing; the byte offset of each line."""
    log = folder / name
    lines = [step_text(n) for n in range(1, steps + 1)]
    log.write_text("".join(lines))
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line.encode())
    return log, offsets


def sources(doc: dict) -> list[str]:
    return [s["time_source"] for s in doc["steps"]]


def said(doc: dict) -> str:
    return " ".join(doc["parse"].get("side_files") or [])


def test_a_fifo_at_the_sidecars_name_is_said_and_not_waited_on(tmp_path: Path) -> None:
    log, _ = write_log(tmp_path, 3)
    os.mkfifo(sidecar_path(log))
    doc = in_thread(lambda: analyze_doc(log))
    assert sources(doc) == ["rebuilt"] * 3
    assert "a FIFO, not a regular file" in said(doc)
    assert "a FIFO, not a regular file" in render_text(doc)


def test_a_sidecar_linked_to_a_device_or_out_of_its_folder_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    log, offsets = write_log(tmp_path / "logs", 3)
    os.symlink("/dev/zero", sidecar_path(log))
    doc = in_thread(lambda: analyze_doc(log))
    assert sources(doc) == ["rebuilt"] * 3 and "not read" in said(doc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    now = time.time()
    records = "".join(f"{o} {now - 100 + k:.6f}\n" for k, o in enumerate(offsets))
    (elsewhere / "x.arrivals").write_text(records)
    sidecar_path(log).unlink()
    os.symlink(elsewhere / "x.arrivals", sidecar_path(log))
    doc = analyze_doc(log)
    assert sources(doc) == ["rebuilt"] * 3 and "a symbolic link out of" in said(doc)
    (tmp_path / "logs" / "kept.arrivals").write_text(records)  # inside the log's folder: fine
    sidecar_path(log).unlink()
    os.symlink("kept.arrivals", sidecar_path(log))
    assert sources(analyze_doc(log)) == ["sidecar"] * 3


@pytest.mark.parametrize("bad", ["1e300", "-1e15", "inf", "nan", "-inf", "12.5"])
def test_capture_times_out_of_range_are_not_used(tmp_path: Path, bad: str) -> None:
    """A time that no capture of this log can have (not finite, before the epoch's sane range,
    after the log's last write) times nothing: its line is timed as if it had no record."""
    log, offsets = write_log(tmp_path, 3)
    now = time.time()
    sidecar_path(log).write_text(f"{offsets[0]} {now - 50:.6f}\n{offsets[1]} {bad}\n"
                                 f"{offsets[2]} {now - 48:.6f}\n")
    doc = analyze_doc(log)
    assert sources(doc) == ["sidecar", "rebuilt", "sidecar"]
    assert "not used" in said(doc)
    text = render_text(doc)  # no OverflowError in the report's times
    assert "not used" in text
    assert not doc["flags"]


def test_offsets_that_go_back_are_not_used(tmp_path: Path) -> None:
    """Round 5 D6: decreasing offsets made a 1 h 28 min span and a false critical stalled."""
    log, offsets = write_log(tmp_path, 4)
    now = time.time()
    records = "".join(f"{o} {now - 30 + k:.6f}\n" for k, o in enumerate(offsets))
    sidecar_path(log).write_text(records + f"0 {now - 5300:.6f}\n")
    doc = analyze_doc(log)
    assert "out of order" in said(doc)
    assert sources(doc) == ["sidecar"] * 4
    assert [s["end_time"] for s in doc["steps"]] == pytest.approx([now - 30 + k
                                                                  for k in range(4)])
    assert not [f for f in doc["flags"] if f["kind"] == "stalled"]


def test_a_sidecar_that_ends_early_times_only_the_lines_it_covers(tmp_path: Path) -> None:
    """Round 5 N16: ``run`` killed at 8 s of 25 one-second steps; the job went on writing.
    The lines past the sidecar's last chunk are not given its time (a 4.98 s run with step
    timers at 501.9%): they are rebuilt from their step times."""
    log, offsets = write_log(tmp_path, 25)
    end = time.time()
    os.utime(log, (end, end))
    sidecar_path(log).write_text("".join(f"{o} {end - 25 + k:.6f} {offsets[k + 1]}\n"
                                         for k, o in enumerate(offsets[:4])))
    doc = analyze_doc(log)
    assert sources(doc)[:4] == ["sidecar"] * 4
    assert set(sources(doc)[4:]) == {"rebuilt"}
    ends = [s["end_time"] for s in doc["steps"]]
    # each later step one second (its timer) after the one before: 24 s from the first
    # step's end to the last's, not the 4.98 s run every later line at one time gave
    assert [b - a for a, b in zip(ends, ends[1:], strict=False)] == pytest.approx([1.0] * 24,
                                                                                abs=1e-3)
    assert "capture times end" in said(doc)


def test_an_older_sidecars_last_record_times_only_what_the_step_timers_allow(tmp_path: Path
                                                                             ) -> None:
    """The same with a sidecar of an older ``run`` (no chunk ends): its last record's chunk
    has no known end, so the step lines after its first are given its time only while their
    timers allow it (lines captured together were printed within a second of each other)."""
    log = tmp_path / "job.log"
    lines = [step_text(n, 2.0) for n in range(1, 11)]
    log.write_text("".join(lines))
    offsets = [sum(len(x.encode()) for x in lines[:k]) for k in range(10)]
    end = time.time()
    sidecar_path(log).write_text("".join(f"{o} {end - 100 + 2 * k:.6f}\n"
                                         for k, o in enumerate(offsets[:4])))
    doc = analyze_doc(log)
    assert sources(doc) == ["sidecar"] * 4 + ["rebuilt"] * 6
    ends = [s["end_time"] for s in doc["steps"]]
    assert [b - a for a, b in zip(ends, ends[1:], strict=False)] == pytest.approx([2.0] * 9,
                                                                                abs=1e-3)
    assert "older verl-monitor run" in said(doc)
    # a finished run's last chunk (its last step, the final validation, the bar) keeps it
    sidecar_path(log).write_text("".join(f"{o} {end - 100 + 2 * k:.6f}\n"
                                         for k, o in enumerate(offsets)))
    doc = analyze_doc(log)
    assert sources(doc) == ["sidecar"] * 10 and not said(doc)


def test_the_writer_records_where_each_chunk_ends(tmp_path: Path) -> None:
    """A record says where its chunk of lines ends, so a reader knows how far it goes."""
    log, offsets = write_log(tmp_path, 4)
    now = time.time()
    w = ArrivalWriter(log)
    w.record(offsets[0], now - 10, end=offsets[2])  # lines 1 and 2 captured together
    w.record(offsets[2], now - 9, end=offsets[3])
    w.close()
    assert sidecar_path(log).read_text().split("\n")[0].split()[2] == str(offsets[2])
    doc = analyze_doc(log)
    assert sources(doc) == ["sidecar", "sidecar", "sidecar", "rebuilt"]


def test_the_log_is_not_held_in_memory_to_time_its_lines(tmp_path: Path) -> None:
    """Round 5 N21: with a sidecar, the whole log was read into memory (1.21 GB for 1 GB)."""
    log = tmp_path / "big.log"
    noise = "x" * 65_535 + "\n"
    with open(log, "w") as fh:
        fh.write(step_text(1))
        for _ in range(120):  # 7.5 MiB of lines that are neither steps nor events
            fh.write(noise)
        fh.write(step_text(2))
    now = time.time()
    sidecar_path(log).write_text(f"0 {now - 20:.6f}\n{os.path.getsize(log) - 80} {now - 1:.6f}\n")
    tracemalloc.start()
    try:
        parsed = parse_file(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.step for s in parsed.steps] == [1, 2]
    assert peak < 6 * 2**20, f"peak {peak / 2**20:.1f} MiB for a 7.5 MiB log"
