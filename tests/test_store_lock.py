"""One writer per run store under any of its names (issue 20): a symlink or a hard link to a
store being written is refused, by the lock itself and by a second exporter process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.store import RunStore
from monitor.store.lock import StoreLock, StoreLocked, lock_path

ROOT = Path(__file__).resolve().parents[1]


def hold(store: Path) -> subprocess.Popen:
    """Another process that takes the store's lock and keeps it until killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from monitor.store.lock import StoreLock; "
         f"StoreLock({str(store)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def test_the_lock_file_is_named_by_the_real_path(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert lock_path(tmp_path / "alias" / "r.db") == tmp_path / "real" / "r.db.lock"


def test_taking_the_lock_creates_a_store_sqlite_opens(tmp_path: Path) -> None:
    """The identity lock needs the file: an empty one is a new store to SQLite."""
    lock = StoreLock(tmp_path / "r.db")
    lock.acquire()
    try:
        assert (tmp_path / "r.db").stat().st_size == 0
        with RunStore(tmp_path / "r.db") as store:
            store.set_meta("node", "n0")
            assert store.meta() == {"node": "n0"}
    finally:
        lock.release()


@pytest.mark.slow
@pytest.mark.parametrize("link", ["symlink", "hardlink", "symlinked folder"])
def test_another_name_of_a_held_store_is_refused(tmp_path: Path, link: str) -> None:
    """Before: ``<name>.lock`` was per name, so a second writer through a link doubled rows."""
    store = tmp_path / "run.db"
    holder = hold(store)
    try:
        if link == "symlink":
            other = tmp_path / "alias.db"
            other.symlink_to(store)
        elif link == "hardlink":
            other = tmp_path / "other" / "same.db"
            other.parent.mkdir()
            os.link(store, other)
        else:
            (tmp_path / "dir").symlink_to(tmp_path)
            other = tmp_path / "dir" / "run.db"
        with pytest.raises(StoreLocked) as refused:
            StoreLock(other).acquire()
        text = str(refused.value)
        assert str(other) in text and "\n" not in text
        if link == "hardlink":  # another name of the file: no shared lock file to read a pid
            assert "another name" in text
        else:
            assert f"pid {holder.pid}" in text
    finally:
        stop(holder)
    lock = StoreLock(other)  # the holder died: the kernel dropped both of its locks
    lock.acquire()
    lock.release()


@pytest.mark.slow
def test_a_second_exporter_on_a_hard_link_exits_with_one_line(tmp_path: Path) -> None:
    store = tmp_path / "run.db"
    holder = hold(store)
    try:
        os.link(store, tmp_path / "link.db")
        second = subprocess.run(
            [sys.executable, "-m", "monitor", "exporter", "--listen-address", "127.0.0.1:0",
             "--gpu-backend", "sim", "--sim-gpus", "1", "--store", str(tmp_path / "link.db")],
            capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        stop(holder)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "another exporter" in lines[0], second.stderr
    assert "Traceback" not in second.stderr


def test_release_on_a_lock_file_that_cannot_be_cleared_does_not_raise(tmp_path: Path) -> None:
    """Before: a volume gone read-only made release() raise EROFS out of the exporter's stop.
    Here the lock file descriptor is swapped for a read-only one, which refuses the same way."""
    lock = StoreLock(tmp_path / "r.db")
    lock.acquire()
    ro = os.open(lock.path, os.O_RDONLY)
    os.close(lock._fd)
    lock._fd = ro
    lock.release()
    again = StoreLock(tmp_path / "r.db")
    again.acquire()
    again.release()


def test_a_folder_given_as_the_store_is_refused_without_a_lock_file(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    with pytest.raises(IsADirectoryError):
        StoreLock(tmp_path / "runs").acquire()
    assert not (tmp_path / "runs.lock").exists()
