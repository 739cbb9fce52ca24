"""monitor/hang/stack_files.py: dumps written only into a folder of ours, never through a link
planted at their name, and trimmed like the store (issue 41: a root exporter overwrote a file a
local user linked at the next dump's predictable name)."""

from __future__ import annotations

import os
import stat

import pytest

from monitor.hang.stack_files import StackFolder, UnsafeFolder, dump_name, open_private_dir


def test_the_folder_is_created_0700_and_a_dump_0600(tmp_path):
    folder = StackFolder(tmp_path / "run.db.stacks")
    name = folder.save(1796162745.5, "driver", 42, "Process 42: x\n")
    assert name == "1796162745.500_driver_42.txt"
    assert stat.S_IMODE(os.stat(folder.path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(folder.path / name).st_mode) == 0o600
    assert (folder.path / name).read_text() == "Process 42: x\n"
    assert dump_name(1.0, "data loader worker", 7) == "1.000_data_loader_worker_7.txt"


def test_a_link_planted_at_a_dumps_name_is_not_followed_and_nothing_is_overwritten(tmp_path):
    target = tmp_path / "target_file"
    target.write_text("IMPORTANT CONTENT")
    folder = StackFolder(tmp_path / "s.db.stacks")
    folder.path.mkdir(mode=0o700)
    os.symlink(target, folder.path / dump_name(1796162745.0, "driver", 7))
    with pytest.raises(OSError, match="exists already: not overwritten"):
        folder.save(1796162745.0, "driver", 7, "Process 7: py-spy dump")
    assert target.read_text() == "IMPORTANT CONTENT"


def test_a_stacks_folder_that_is_a_link_or_someone_elses_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "s.db.stacks"
    os.symlink(elsewhere, link)
    with pytest.raises(UnsafeFolder, match="is a symbolic link: not written through"):
        StackFolder(link).save(1.0, "driver", 7, "x")
    assert list(elsewhere.iterdir()) == []
    theirs = tmp_path / "theirs.stacks"
    theirs.mkdir()
    with pytest.raises(UnsafeFolder, match=r"belongs to uid \d+, not to this exporter's"):
        os.close(open_private_dir(theirs, uid=os.geteuid() + 1))


def test_a_folder_of_ours_left_open_to_others_is_closed_to_0700(tmp_path):
    path = tmp_path / "old.stacks"
    path.mkdir()
    os.chmod(path, 0o777)
    StackFolder(path).save(1.0, "driver", 7, "x")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_dumps_older_than_the_stores_retention_or_past_the_size_cap_are_trimmed(tmp_path):
    folder = StackFolder(tmp_path / "s.stacks", retention_s=3600.0, max_bytes=250)
    for ts in (0.0, 100.0, 5000.0):
        folder.save(ts, "driver", 7, "x" * 100)
    # the save at 5000 s trims by itself (every 5 minutes): 0 and 100 are over an hour older
    assert sorted(p.name for p in folder.path.iterdir()) == ["5000.000_driver_7.txt"]
    for ts in (5001.0, 5002.0):
        folder.save(ts, "driver", 7, "x" * 100)
    (folder.path / "notes.txt").write_text("not a dump: kept")
    assert folder.trim() == 1  # 300 bytes of dumps over the 250 cap: the oldest goes
    left = sorted(p.name for p in folder.path.iterdir())
    assert left == ["5001.000_driver_7.txt", "5002.000_driver_7.txt", "notes.txt"]


def test_the_retention_is_the_run_stores_own():
    import inspect

    from monitor.hang.stack_files import RETENTION_S
    from monitor.store.runstore import RunStore

    assert RETENTION_S == inspect.signature(RunStore).parameters["retention_s"].default
