"""monitor/safe_write.py: the files the monitor writes beside the user's are never written
through a link or into a FIFO planted at their names (issue 41, item 3)."""

from __future__ import annotations

import json
import os

import pytest

from monitor.hang.finish import exit_marker, mark_exit, read_exit
from monitor.logs.arrivals import ArrivalWriter
from monitor.safe_write import create_new_file, open_append


def test_the_exit_marker_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "target_file"
    target.write_text("IMPORTANT CONTENT")
    log = tmp_path / "train.log"
    log.write_text("")
    os.symlink(target, exit_marker(log))
    mark_exit(log, 3, when=1796162745.0)
    assert target.read_text() == "IMPORTANT CONTENT"
    assert not exit_marker(log).is_symlink() and read_exit(log) == (1796162745.0, 3)


def test_a_name_planted_between_the_unlink_and_the_create_makes_it_fail(tmp_path, monkeypatch):
    target = tmp_path / "target_file"
    target.write_text("KEEP")
    path = tmp_path / "marker"
    real_unlink = os.unlink

    def race(p, *a, **k):
        real_unlink(p, *a, **k) if os.path.lexists(p) else None
        os.symlink(target, p)  # the attacker wins the race

    monkeypatch.setattr(os, "unlink", race)
    with pytest.raises(FileExistsError):
        create_new_file(path, json.dumps({"x": 1}))
    assert target.read_text() == "KEEP"


def test_the_arrivals_sidecar_and_appended_files_refuse_a_link_or_a_fifo(tmp_path):
    target = tmp_path / "target_file"
    target.write_text("KEEP")
    log = tmp_path / "train.log"
    log.write_text("x\n")
    os.symlink(target, tmp_path / "train.log.arrivals")
    with pytest.raises(OSError, match="symbolic link"):
        ArrivalWriter(log)
    assert target.read_text() == "KEEP"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError):  # no reader: refused at once, never blocks
        open_append(tmp_path / "fifo")
    fd = open_append(tmp_path / "plain")
    os.write(fd, b"a")
    os.close(fd)
    assert (tmp_path / "plain").read_bytes() == b"a"
