"""The exporter process under SIGHUP/SIGTERM/SIGINT and with a FIFO as --log (issue 12,
items 3 and 13): startup never blocks, every signal flushes and closes the store, exit 0."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def start(tmp_path: Path, *argv: str) -> subprocess.Popen:
    out = (tmp_path / "stdout.txt").open("w")
    err = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "exporter", "--listen-address", "127.0.0.1:0",
         "--gpu-backend", "sim", "--sim-gpus", "1", "--interval", "0.5", *argv],
        stdout=out, stderr=err, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "serving http" in (tmp_path / "stdout.txt").read_text():
            return proc
        if proc.poll() is not None:
            raise AssertionError((tmp_path / "stderr.txt").read_text())
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=10)
    raise AssertionError("no startup line within 60 s (blocked?)")


def test_a_fifo_as_log_neither_blocks_startup_nor_sigterm(tmp_path):
    """Before: open() of the FIFO blocked the main thread: no startup, SIGTERM ignored."""
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    proc = start(tmp_path, "--log", str(fifo))
    try:
        with open(fifo, "w") as writer:  # a writer appears later: its lines are read
            writer.write("step:1 - timing_s/step:10\nstep:2 - timing_s/step:11\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_every_stop_signal_flushes_and_closes_the_store(tmp_path, sig):
    """Before: SIGHUP killed the process without the final flush. SIGHUP then exits 129
    (issue 20: a hangup is no requested stop, so Restart=on-failure restarts it)."""
    log, store = tmp_path / "train.log", tmp_path / "run.db"
    log.write_text("")
    proc = start(tmp_path, "--log", str(log), "--store", str(store), "--node", "sig-node")
    with log.open("a") as fh:
        fh.write("step:1 - timing_s/step:10\nstep:2 - timing_s/step:11\n")
    time.sleep(1.5)  # the collector reads them (it polls every 0.5 s)
    proc.send_signal(sig)
    expected = 129 if sig == signal.SIGHUP else 0
    assert proc.wait(timeout=30) == expected, (tmp_path / "stderr.txt").read_text()
    with sqlite3.connect(store) as db:
        steps = [r[0] for r in db.execute("SELECT step FROM steps ORDER BY step")]
        node = db.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
    assert steps == [1, 2] and node == ('"sig-node"',)
    assert not Path(f"{store}-wal").exists() or Path(f"{store}-wal").stat().st_size == 0
    lock = Path(f"{store}.lock")
    assert not lock.exists() or lock.read_text() == ""  # released
