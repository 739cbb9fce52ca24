"""Following real log files: partial writes, rotation, truncation, re-creation, huge lines."""

from __future__ import annotations

import os
from pathlib import Path

from monitor.logs.canonical_records import ParseStats
from monitor.logs.follow import LogFollower, LogPosition, iter_lines


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_reads_complete_lines_and_holds_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"first\nsec")
    follower = LogFollower(path)
    assert follower.poll() == ["first"]
    assert follower.poll() == []
    append(path, b"ond\r\nthird\n")
    assert follower.poll() == ["second", "third"]
    assert follower.lines == 3
    assert follower.bytes_read == path.stat().st_size


def test_waits_for_a_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "later.log"
    follower = LogFollower(path, start_at_end=True)
    assert follower.poll() == []
    path.write_bytes(b"hello\n")
    # the file appeared after we started: read it from its beginning
    assert follower.poll() == ["hello"]


def test_start_at_end_skips_old_content_and_the_line_in_progress(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"old 1\nold 2\nhalf of a li")
    follower = LogFollower(path, start_at_end=True)
    assert follower.poll() == []
    append(path, b"ne\nnew\n")
    assert follower.poll() == ["new"]
    assert follower.oversize_lines == 0


def test_rename_rotation_finishes_the_old_file_first(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"a\n")
    follower = LogFollower(path)
    assert follower.poll() == ["a"]
    append(path, b"b\nc-partial")  # written before the rotation, not yet read
    os.rename(path, tmp_path / "run.log.1")
    path.write_bytes(b"d\n")
    assert follower.poll() == ["b", "c-partial", "d"]
    assert follower.rotations == 1
    assert follower.truncations == 0
    assert follower.drain_events() == []
    append(path, b"e\n")
    assert follower.poll() == ["e"]


def test_copy_truncate_starts_over_with_an_event(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"line one\nline two\n")
    follower = LogFollower(path)
    assert len(follower.poll()) == 2
    with open(path, "r+b") as fh:  # logrotate copytruncate / verl's logger on resume
        fh.truncate(0)
    append(path, b"fresh\n")
    assert follower.poll() == ["fresh"]
    assert follower.truncations == 1
    (event,) = follower.drain_events()
    assert event.kind == "truncated" and event.data["reason"] == "shrunk"
    assert follower.drain_events() == []


def test_deletion_and_recreation(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"one\n")
    follower = LogFollower(path)
    assert follower.poll() == ["one"]
    path.unlink()
    assert follower.poll() == []  # gone: wait quietly
    assert follower.poll() == []
    path.write_bytes(b"two\n")
    assert follower.poll() == ["two"]
    (event,) = follower.drain_events()
    assert event.kind == "truncated" and event.data["reason"] == "replaced"
    assert follower.truncations == 1


def test_ten_megabyte_line_arrives_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    big = b"step:1 - " + b"k:1.0 - " * (10 * 2**20 // 8) + b"end:2"
    follower = LogFollower(path)
    path.write_bytes(big[: 3 * 2**20])  # the writer is halfway through
    assert follower.poll() == []
    append(path, big[3 * 2**20 :] + b"\nsmall\n")
    lines = follower.poll()
    assert len(lines) == 2
    assert len(lines[0]) == len(big) and lines[0].endswith("end:2")
    assert lines[1] == "small"


def test_line_above_the_limit_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "huge.log"
    follower = LogFollower(path, max_line_bytes=1000, chunk_bytes=256)
    path.write_bytes(b"ok\n" + b"x" * 1500)
    assert follower.poll() == ["ok"]
    assert follower.oversize_lines == 1
    assert len(follower._splitter.buf) == 0  # nothing of it held in memory
    append(path, b"y" * 3000 + b"\nafter\n" + b"z" * 2000 + b"\n")
    assert follower.poll() == ["after"]
    assert follower.oversize_lines == 2


def test_invalid_utf8_is_replaced_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "bin.log"
    path.write_bytes(b"good \xc3\xa9\nbad \xff\xfe\ncut \xe2\x82\n")
    follower = LogFollower(path)
    lines = follower.poll()
    assert lines == ["good \u00e9", "bad \ufffd\ufffd", "cut \ufffd"]
    assert follower.bad_utf8_lines == 2


def test_poll_budget_spreads_a_backlog_over_polls(tmp_path: Path) -> None:
    path = tmp_path / "backlog.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    follower = LogFollower(path, chunk_bytes=512, max_poll_bytes=2048)
    got: list[str] = []
    for _ in range(100):
        got += follower.poll()
    assert got == [f"line {i}" for i in range(1000)]


def test_iter_lines_streams_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"a\n\xffb\n" + b"c" * 5000 + b"\nlast")
    stats = ParseStats()
    lines = list(iter_lines(path, stats=stats, max_line_bytes=4096, chunk_bytes=1000))
    assert lines == ["a", "\ufffdb", "last"]
    assert stats.bad_utf8_lines == 1


def test_truncated_and_regrown_between_polls_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = b"".join(b'{"step": %d, "data": {"timing_s/step": 1.0}}\n' % i for i in range(1, 4))
    path.write_bytes(first)
    follower = LogFollower(path)
    assert len(follower.poll()) == 3
    # verl's file logger reopened the file with "w" on resume and wrote more than before
    second = b"".join(b'{"step": %d, "data": {"timing_s/step": 2.0}}\n' % i for i in range(2, 7))
    path.write_bytes(second)
    lines = follower.poll()
    assert [line[:11] for line in lines] == [f'{{"step": {i},' for i in range(2, 7)]
    (event,) = follower.drain_events()
    assert event.data["reason"] == "rewritten"
    append(path, b"tail\n")
    assert follower.poll() == ["tail"]
    assert follower.drain_events() == []


# --- positions and restarts -------------------------------------------------------------------


def lines_of(n: int, start: int = 0) -> bytes:
    return b"".join(b"step:%d - timing_s/step:%d.5\n" % (i, i) for i in range(start, start + n))


def saved_after(path: Path, polls: int = 1) -> tuple[list[str], LogPosition]:
    follower = LogFollower(path)
    got: list[str] = []
    for _ in range(polls):
        got += follower.poll()
    pos = follower.saved_position()
    follower.close()
    assert pos is not None
    return got, pos


def test_position_at_gives_the_offset_past_each_line(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"a\n" + b"x" * 100 + b"\nccc\npartial")
    follower = LogFollower(path, max_line_bytes=50)  # the 100-byte line is dropped
    assert follower.poll() == ["a", "ccc"]
    assert [follower.position_at(i).offset for i in range(2)] == [2, 107]
    assert follower.saved_position().offset == 107  # the partial line is not passed
    pos = follower.position_at(1)
    assert pos.path == str(path.resolve()) and pos.head_len == 107
    assert (pos.dev, pos.ino) == (path.stat().st_dev, path.stat().st_ino)


def test_a_restart_resumes_exactly_where_the_last_one_stopped(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(lines_of(300))  # more than the 4 KiB fingerprint
    got, pos = saved_after(path)
    assert len(got) == 300 and pos.head_len == 4096
    append(path, lines_of(2, start=300))
    again = LogFollower(path, start_at_end=True, resume_from=pos)  # the saved position wins
    assert again.poll() == ["step:300 - timing_s/step:300.5", "step:301 - timing_s/step:301.5"]
    assert again.unrecovered == 0


def test_a_file_renamed_while_down_is_finished_then_the_new_one_read(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(lines_of(3))
    _, pos = saved_after(path)
    append(path, lines_of(2, start=3))
    path.rename(tmp_path / "run.log.1")
    path.write_bytes(lines_of(1, start=5))
    follower = LogFollower(path, resume_from=pos)
    got = follower.poll() + follower.poll()
    assert [g.split(" ")[0] for g in got] == ["step:3", "step:4", "step:5"]
    assert follower.rotations == 1 and follower.unrecovered == 0


def test_a_file_copy_truncated_while_down_is_finished_from_its_copy(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(lines_of(3))
    _, pos = saved_after(path)
    append(path, lines_of(2, start=3))
    (tmp_path / "run.log-20261201").write_bytes(path.read_bytes())  # dateext copy
    with open(path, "r+b") as fh:
        fh.truncate(0)
    append(path, lines_of(4, start=5))  # regrown past the old offset, other bytes
    follower = LogFollower(path, resume_from=pos)
    got = follower.poll() + follower.poll()
    assert [g.split(" ")[0] for g in got] == [f"step:{i}" for i in range(3, 9)]


def test_a_file_truncated_while_down_without_a_copy_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(lines_of(3))
    _, pos = saved_after(path)
    with open(path, "r+b") as fh:
        fh.truncate(0)
    append(path, lines_of(1, start=7))
    follower = LogFollower(path, resume_from=pos)
    assert follower.poll() == ["step:7 - timing_s/step:7.5"]
    assert follower.unrecovered == 1 and len(follower.problems) == 1
    assert "no copy of it was found" in follower.problems[0]
    assert [e.data["reason"] for e in follower.drain_events()] == ["lost"]


def test_a_copy_truncate_between_two_polls_reads_the_copy_first(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(lines_of(3))
    follower = LogFollower(path)
    assert len(follower.poll()) == 3
    append(path, lines_of(2, start=3))  # written just before logrotate copies the file
    (tmp_path / "run.log.1").write_bytes(path.read_bytes())
    with open(path, "r+b") as fh:
        fh.truncate(0)
    append(path, lines_of(1, start=5))
    got = follower.poll() + follower.poll()
    assert [g.split(" ")[0] for g in got] == ["step:3", "step:4", "step:5"]


# --- issue 30: what is not a log file, and a log rewritten in place -------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_log_that_becomes_a_directory_leaks_no_descriptor_and_is_said_once(
        tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"a\n")
    follower = LogFollower(path)
    assert follower.poll() == ["a"]
    path.unlink()
    path.mkdir()
    follower.poll()
    before = open_fds()
    for _ in range(50):
        assert follower.poll() == []  # never raises
    assert open_fds() == before
    assert follower.not_regular == 1
    assert len(follower.problems) == 1 and "is a directory, not a log file" in follower.problems[0]
    path.rmdir()
    path.write_bytes(b"back\n")
    assert follower.poll() == ["back"]


def test_a_log_replaced_by_a_link_to_dev_urandom_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"a\n")
    follower = LogFollower(path, chunk_bytes=4096, max_poll_bytes=65536)
    assert follower.poll() == ["a"]
    path.unlink()
    path.symlink_to("/dev/urandom")
    read = follower.bytes_read
    for _ in range(5):
        follower.poll()
    assert follower.bytes_read == read, "the follower reads an endless device"
    assert follower.not_regular == 1
    assert "is a character device, not a log file" in follower.problems[0]
    fresh = LogFollower(path)  # a follower started on it reads nothing either
    assert fresh.poll() == [] and fresh.bytes_read == 0 and fresh.not_regular == 1


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Truncate and write ``data`` through the same inode (as `cat new > log` does)."""
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write(data)


def test_a_log_rewritten_in_place_while_down_is_read_from_the_start(tmp_path: Path) -> None:
    """Same inode, same first 4 KB, as long as before: the bytes where the reading stopped
    tell it apart; every new line is read, and it is counted."""
    path = tmp_path / "run.log"
    header = b"".join(b"config line %04d\n" % i for i in range(300))  # > 4 KB
    path.write_bytes(header + b"".join(b"old step %d\n" % i for i in range(20)))
    first = LogFollower(path)
    assert len(first.poll()) == 320
    saved = first.saved_position()
    first.close()
    assert saved is not None and saved.tail_len == 4096
    new = [f"new step {i}" for i in range(40)]
    rewrite_in_place(path, header + "".join(line + "\n" for line in new).encode())
    follower = LogFollower(path, resume_from=saved)
    lines = follower.poll()
    assert lines[-40:] == new and len(lines) == 340
    assert follower.rewritten == 1 and follower.unrecovered == 0
    assert "rewritten in place" in follower.problems[0]
    assert [e.data["reason"] for e in follower.drain_events()] == ["rewritten"]


def test_an_old_position_without_a_tail_still_resumes(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"one\ntwo\n")
    first = LogFollower(path)
    first.poll()
    saved = first.saved_position()
    first.close()
    old = LogPosition(saved.path, saved.dev, saved.ino, saved.offset, saved.head_len,
                      saved.head_hash)
    append(path, b"three\n")
    assert LogFollower(path, resume_from=old).poll() == ["three"]


def test_a_rewrite_between_two_polls_that_keeps_the_head_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    header = b"x" * 200 + b"\n"
    path.write_bytes(header + b"old 1\nold 2\n")
    follower = LogFollower(path)
    assert follower.poll()[-1] == "old 2"
    rewrite_in_place(path, header + b"new 1\nnew 2\nnew 3\n")  # longer, same head
    assert follower.poll() == ["x" * 200, "new 1", "new 2", "new 3"]
    assert follower.truncations == 1


def test_each_line_comes_with_where_it_starts_across_chunks_and_dropped_lines(tmp_path):
    """``iter_lines_at``: the byte offset of each line's start, across chunk edges, invalid
    UTF-8 and a line dropped for its length (the next line keeps its own offset)."""
    from monitor.logs.follow import iter_lines_at

    data = b"ab\nc\xffd\n" + b"x" * 50 + b"\n\nlast\r\ntail"
    path = tmp_path / "t.log"
    path.write_bytes(data)
    for chunk in (1, 3, 7, 64, 1 << 20):
        got = list(iter_lines_at(path, max_line_bytes=20, chunk_bytes=chunk))
        assert [line for _, line in got] == ["ab", "c\ufffdd", "", "last", "tail"], chunk
        assert [at for at, _ in got] == [0, 3, 58, 59, 65], chunk
