"""The exporter's stop when the store's volume went read-only or full (issue 20): one plain
line with the count of buffered rows that could not be written, no traceback, exit 0.

Real volumes, mounted for the test (root only; skipped with the reason otherwise): an ext4
image on a loop device turned read-only by the kernel's own error path
(``/sys/fs/ext4/<dev>/trigger_fs_error`` with ``errors=remount-ro``, as a failing disk does),
and a 2 MiB tmpfs filled to the last byte. ``chmod`` is no test here: root writes through it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
LOST = "buffered rows could not be written and are lost"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a test volume needs root")


@contextmanager
def mounted(target: Path, *mount_args: str) -> Iterator[Path]:
    target.mkdir()
    done = _run("mount", *mount_args, str(target))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a test volume here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        _run("umount", "-l", str(target))


@contextmanager
def ext4_volume(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(mount point, the ext4 sysfs file that makes the kernel turn it read-only)."""
    _need_root()
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed")
    image = tmp_path / "volume.img"
    with image.open("wb") as fh:
        fh.truncate(32 * 2**20)
    made = _run("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    with mounted(tmp_path / "ext4", "-o", "loop,errors=remount-ro", str(image)) as mnt:
        device = _run("findmnt", "-n", "-o", "SOURCE", str(mnt)).stdout.strip()
        trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
        if not trigger.exists():
            pytest.skip(f"this kernel has no {trigger}")
        yield mnt, trigger


def start(tmp_path: Path, store: Path, log: Path) -> subprocess.Popen:
    out = (tmp_path / "stdout.txt").open("w")
    err = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "exporter", "--listen-address", "127.0.0.1:0",
         "--gpu-backend", "sim", "--sim-gpus", "1", "--interval", "0.5", "--log", str(log),
         "--store", str(store), "--node", "vol-node"],
        stdout=out, stderr=err, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while "serving http" not in (tmp_path / "stdout.txt").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError((tmp_path / "stderr.txt").read_text())
        time.sleep(0.1)
    return proc


def stop_and_read(tmp_path: Path, proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return code, (tmp_path / "stderr.txt").read_text()


def steps_arrive(log: Path) -> None:
    with log.open("a") as fh:
        fh.write("step:1 - timing_s/step:10\nstep:2 - timing_s/step:11\n")
    time.sleep(2.0)  # read by the log collector (polls every 0.5 s), refused by the store


def assert_one_plain_line(code: int, stderr: str, cause: str) -> None:
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    lost = [line for line in stderr.splitlines() if LOST in line]
    assert len(lost) == 1, stderr
    assert cause in lost[0] and "2 steps" in lost[0], lost[0]
    count = int(lost[0].split(LOST)[0].rsplit(":", 1)[1])
    assert count >= 2


def test_sigterm_after_the_volume_went_read_only(tmp_path: Path) -> None:
    """Before: the lock's release raised EROFS: a traceback and exit 1, the rows lost
    without a count."""
    log = tmp_path / "train.log"
    log.write_text("")
    with ext4_volume(tmp_path) as (mnt, trigger):
        proc = start(tmp_path, mnt / "run.db", log)
        try:
            time.sleep(1.5)  # the first rows are written while the volume works
            trigger.write_text("verl-monitor test: volume goes read-only\n")
            steps_arrive(log)
        finally:
            code, stderr = stop_and_read(tmp_path, proc)
    assert_one_plain_line(code, stderr, "the volume holding the run store is read-only")


def test_sigterm_with_the_volume_full(tmp_path: Path) -> None:
    """Before: "rows are kept in memory until space is freed" at exit, and they were lost."""
    _need_root()
    log = tmp_path / "train.log"
    log.write_text("")
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=2m", "tmpfs") as mnt:
        proc = start(tmp_path, mnt / "run.db", log)
        try:
            time.sleep(1.5)
            with (mnt / "filler").open("wb", buffering=0) as fh:  # take every free byte
                try:
                    while True:
                        fh.write(b"\0" * 65536)
                        fh.flush()
                except OSError:
                    pass
            steps_arrive(log)
        finally:
            code, stderr = stop_and_read(tmp_path, proc)
    assert_one_plain_line(code, stderr, "is full")
