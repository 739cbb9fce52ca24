"""A hang seen by the real exporter process: the simulated job goes silent while its GPUs spin
in a collective; the exporter asks two stand-in ranks for their Flight Recorder through their
FIFOs (real processes, real FIFOs, dumps made from a real H200 dump) and names the rank that
never issued the all-reduce, on /metrics and in the store, with one dump round."""

from __future__ import annotations

import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hang_standins import as_rank, real_dump, start_standin, stop, write_dump

from monitor.store import RunStore
from tests.e2e.procs import free_port, start_process, wait_until

pytestmark = pytest.mark.e2e

CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"


def test_the_exporter_flags_the_hang_critical_and_names_the_rank(tmp_path):
    run = tmp_path / "fr"
    run.mkdir()
    ranks = [start_standin(run, 0, write_dump(tmp_path / "d0", as_rank(real_dump(), 0, 2))),
             start_standin(run, 1, write_dump(tmp_path / "d1",
                                              as_rank(real_dump(), 1, 2, drop_after=13)))]
    # the simulated log prints simulated step times (30 s) while steps arrive 10x faster: the
    # limit is scaled to match, 0.3 x 30 s, at least 10 s
    (tmp_path / "cfg.yaml").write_text("hang:\n  median_multiple: 0.3\n  min_seconds: 10.0\n")
    port = free_port()
    store = tmp_path / "run.db"
    exporter = start_process(
        [CLI, "exporter", "--listen-address", f"127.0.0.1:{port}", "--gpu-backend", "sim",
         "--sim-gpus", "2", "--scenario", "healthy:5,hang:30", "--sim-log",
         str(tmp_path / "train.log"), "--sim-speed", "10", "--interval", "0.5",
         "--detect-interval", "2", "--store", str(store), "--config", str(tmp_path / "cfg.yaml"),
         "--fr-dir", str(run)],
        tmp_path / "exporter", "exporter", port, f"http://127.0.0.1:{port}/metrics", timeout=60)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        def named() -> str | None:
            text = httpx.get(url, timeout=5).text
            hang = re.search(r'^verlmon_flag_active\{[^}]*kind="hang"[^}]*\} 1', text, re.M)
            who = re.search(r'^verlmon_hang_culprit_info\{[^}]*rank="1"[^}]*\} 1', text, re.M)
            return text if hang and who else None

        t0 = time.monotonic()
        text = wait_until(named, 120, interval=1.0, what="the hang flag naming rank 1")
        print(f"hang flagged and rank named {time.monotonic() - t0:.0f} s after start")
        assert re.search(r'^verlmon_hang_dump_rounds_total\{method="flight_recorder",'
                         r'result="ok"\} 1(\.0)?$', text, re.M)
        seq = [ln for ln in text.splitlines() if ln.startswith("verlmon_fr_collective_seq{")
               and 'rank="1"' in ln and 'state="enqueued"' in ln]
        assert len(seq) == 1 and float(seq[0].rsplit(" ", 1)[1]) == 13, seq

        def stored():
            flags = [f for f in RunStore(store, create=False).flags() if f.kind == "hang"]
            return flags if flags and "Who: rank 1" in flags[0].evidence else None

        flags = wait_until(stored, 30, interval=1.0, what="the hang flag in the store")
        assert flags[0].severity == "critical" and "never issued nccl:all_reduce #14" in \
            flags[0].evidence
        assert not [f for f in RunStore(store, create=False).flags() if f.kind == "stalled"]
    finally:
        exporter.stop()
        stop(ranks)


def test_under_run_a_blocked_reward_is_named_once_held_past_its_normal_time(tmp_path):
    """The wiring of issue 39 on real processes: ``verl-monitor run`` starts the exporter and
    a verl-shaped job (steps of 0.5 s, the reward 0.01 s a step); the exporter reads the
    driver every second (``hang.sample_s``) and, once the reward has been held past its limit,
    names it with how long it was held and how long it normally takes, long before the old
    silence rule (``min_seconds`` 120 s here) would have looked."""
    from hang_standins import write_job_tree

    from monitor.hang.pyspy import find_pyspy

    if find_pyspy() is None:
        pytest.skip("py-spy not installed")
    root = write_job_tree(tmp_path / "job")
    log, store, cfg = tmp_path / "train.log", tmp_path / "run.db", tmp_path / "cfg.yaml"
    cfg.write_text("hang:\n  sample_s: 1.0\n  hold_min_s: 4.0\n  hold_margin_s: 2.0\n"
                   "  min_seconds: 120.0\nstalled:\n  min_seconds: 600.0\n")
    port = free_port()
    run = subprocess.Popen(
        [CLI, "run", "--log", str(log), "--listen-address", f"127.0.0.1:{port}", "--linger",
         "0", "--exporter-args", f"--gpu-backend sim --scenario healthy --interval 1 "
         f"--detect-interval 1 --store {store} --config {cfg}", "--", sys.executable,
         str(root / "job.py"), "reward_sleep", str(log), "3", "0.5", "-", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        text = wait_until(lambda: log.exists() and log.read_text().count(" step:") >= 3 and
                          log.read_text(), 60, interval=0.05, what="three steps in the log")
        blocked = time.time() + 0.5  # the next step's 0.5 s generation, then the reward
        job = int(re.search(r"\(TaskRunner pid=(\d+)\)", text).group(1))

        def named():
            if not store.exists():
                return None
            flags = [f for f in RunStore(store, create=False).flags() if f.kind == "hang"]
            return flags[0] if flags else None

        flag = wait_until(named, 60, interval=0.5, what="the hang flag")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
    print(f"named {flag.start - blocked:.1f} s after the reward blocked")
    assert flag.severity == "critical" and 0 < flag.start - blocked <= 30.0
    assert f"the driver (PID {job}" in flag.evidence
    assert "at _stuck_in_verifier (user_reward.py:" in flag.evidence
    assert re.search(r"Held past its normal time: in _stuck_in_verifier for \d+(\.\d)? s; "
                     r"reward takes at most 0\.01 s a step in this run \(limit 4\.0 s\)",
                     flag.evidence), flag.evidence
    held = re.search(rf'^verlmon_hang_held_seconds\{{[^}}]*pid="{job}",place="reward"[^}}]*\}} '
                     r"(\S+)$", metrics, re.M)
    assert held and float(held.group(1)) >= 4.0, metrics[-3000:]
    stacks = Path(f"{store}.stacks")
    assert stat.S_IMODE(stacks.stat().st_mode) == 0o700
    pids = {int(p.stem.rsplit("_", 1)[1]) for p in stacks.glob("*.txt")}
    assert pids == {job}  # the job's driver only: never the run, nor the exporter
