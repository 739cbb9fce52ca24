"""Files beside the log read with the log's care (issue 41 item 2): regular files only, opened
without blocking, links followed only inside their folder, sizes capped, folders walked without
recursion, each problem said once and counted. Real FIFOs, links and devices."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from monitor.logs.safe_read import (
    Unreadable,
    count_for,
    note,
    open_beside,
    read_capped,
    read_tail,
    walk_files,
)


def test_a_regular_file_and_a_link_inside_its_folder_are_read(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"hello\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_bytes(b"world\n")
    (tmp_path / "link").symlink_to("sub/b.txt")
    assert read_capped(tmp_path / "a.txt", 100, tmp_path) == b"hello\n"
    assert read_capped(tmp_path / "link", 100, tmp_path) == b"world\n"
    with open_beside(tmp_path / "link") as fh:  # no folder: links are followed, as the log's
        assert fh.read() == b"world\n"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "link_out", "missing"])
def test_what_is_not_a_regular_file_inside_its_folder_is_unreadable_in_words(
        tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "x.exit"
    words = {"fifo": "a FIFO", "device": "a device", "directory": "a directory",
             "link_out": "a symbolic link out of", "missing": "no such file"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
        folder = None  # even where links are followed, a device is not read
    elif kind == "directory":
        path.mkdir()
    elif kind == "link_out":
        (tmp_path / "secret").write_text("x")
        path.symlink_to(tmp_path / "secret")
    with pytest.raises(Unreadable, match=words):
        read_capped(path, 100, folder)


def test_a_file_over_the_cap_is_not_read_and_the_tail_is_the_last_bytes(tmp_path: Path
                                                                       ) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"0123456789" * 10)
    with pytest.raises(Unreadable, match="100 bytes, over the 99 read"):
        read_capped(path, 99)
    assert read_tail(path, 5) == b"56789"
    assert read_tail(path, 1000) == b"0123456789" * 10


def test_the_walk_goes_down_without_following_linked_folders(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.txt").write_text("x")
    (tmp_path / "y.txt").write_text("y")
    (tmp_path / "z.log").write_text("z")
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(tmp_path / "f.txt")
    found = sorted(p.relative_to(tmp_path).as_posix()
                   for p in walk_files(tmp_path, lambda n: n.endswith(".txt")))
    assert found == ["a/b/x.txt", "f.txt", "y.txt"]  # the FIFO is given: reading it says why
    assert [p.name for p in walk_files(tmp_path, lambda n: n.endswith(".txt"),
                                       max_depth=1)] == ["f.txt", "y.txt"]


def test_a_problem_is_said_once_and_counted_once(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "train.log"
    with caplog.at_level(logging.WARNING):
        assert note("train.log.exit: a FIFO, not a regular file; not read", log)
        assert not note("train.log.exit: a FIFO, not a regular file; not read", log)
        assert note("train.log.arrivals: a device, not a regular file; not read", log)
    assert count_for(log) == 2
    assert [r.getMessage() for r in caplog.records].count(
        "train.log.exit: a FIFO, not a regular file; not read") == 1
