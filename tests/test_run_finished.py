"""A finished run is finished (issue 31 item 1): its open flags close as "run finished" and
nothing new opens, whether the end shows in the log (verl's last progress line, the final
validation), in the exit marker ``verl-monitor run`` writes, or in the simulator's end."""

from __future__ import annotations

import time

import pytest
from live_replay import Replay
from threads import in_thread

from exporters.options import ExporterOptions
from monitor.hang.finish import clear_exit, exit_after_steps, finish_time, mark_exit, read_exit
from monitor.live.flag_tracker import FlagTracker
from monitor.live.live_monitor import LiveMonitor
from monitor.records import Event, Flag, StepRecord


def _flag(kind: str = "hang", start: float = 100.0) -> Flag:
    return Flag(kind=kind, severity="critical", start=start, end=None, scope={},
                evidence="No progress for 61 s after step 42.", advice=[])


def test_finish_closes_every_open_flag_and_nothing_opens_until_a_new_run():
    t = FlagTracker()
    t.update([_flag(), _flag("stalled")], now=110.0)
    closed = t.finish(120.0, "the last progress line (42/42)")
    assert {f.kind for f in closed} == {"hang", "stalled"} and t.active() == []
    assert all(f.end == 120.0 and f.evidence.endswith("(run finished: the last progress line "
                                                      "(42/42))") for f in closed)
    assert t.update([_flag(start=130.0)], now=140.0) == ([], [])  # opens nothing
    t.resume()
    opened, _ = t.update([_flag(start=150.0)], now=160.0)
    assert [f.kind for f in opened] == ["hang"]


def test_the_log_says_the_run_ended_at_its_total_or_its_final_validation():
    steps = [StepRecord(step=42, end_time=1000.0, total=10.0)]
    done = Event("progress", 1000.0, 42, "", {"current": 42, "total": 42})
    assert finish_time([done], steps) == (1000.0, "the last progress line (42/42)")
    final = Event("validation", 1010.0, 42, "", {"origin": "final_block"})
    assert finish_time([done, final], steps)[1] == "the final validation"
    half = Event("progress", 1000.0, 21, "", {"current": 21, "total": 42})
    assert finish_time([half], steps) is None
    later = steps + [StepRecord(step=43, end_time=1100.0, total=10.0)]
    assert finish_time([done], later) is None  # a new run appended to the same log


def test_the_exit_marker_beside_the_log(tmp_path):
    log = tmp_path / "train.log"
    assert read_exit(log) is None
    mark_exit(log, 137, when=2000.0)
    assert read_exit(log) == (2000.0, 137)
    steps = [StepRecord(step=1, end_time=1990.0, total=10.0)]
    assert exit_after_steps([log], steps) == (2000.0, "the job exited with status 137")
    newer = [StepRecord(step=2, end_time=2100.0, total=10.0)]
    assert exit_after_steps([log], newer) is None  # a previous run's marker
    clear_exit(log)
    assert read_exit(log) is None


def test_the_live_monitor_closes_the_flags_when_the_job_exits(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    mon = LiveMonitor(ExporterOptions(log=(str(log),)), "n0", 1.0)
    mon.open()
    now = time.time()
    mon.window.add_steps([StepRecord(step=i, end_time=now - 300 + 10 * i, total=10.0)
                          for i in range(1, 6)])
    opened, _ = mon.detect_once()
    assert any(f.kind == "stalled" for f in opened)  # 250 s without a step: still running
    mark_exit(log, 0)
    opened, closed = mon.detect_once()
    assert opened == [] and {f.kind for f in closed} >= {"stalled"}
    assert all("run finished: the job exited with status 0" in f.evidence for f in closed)
    assert mon.tracker.active() == [] and mon.detect_once() == ([], [])
    mon.stop()


@pytest.mark.slow
def test_the_demos_simulated_run_ends_with_no_open_warning_or_critical_flag(tmp_path):
    """The simulated run (NCCL dumps on, as the demo has them) ends; well past the hang and
    stalled limits no warning or critical flag is open (before: a critical hang "No progress
    for 61 s after step 42 ... Who: unknown")."""
    from cli.commands.exporter import parse_options
    from exporters.node_exporter import Exporter

    cfg = tmp_path / "fast.yaml"
    cfg.write_text("hang:\n  min_seconds: 2.0\n  nccl_quiet_s: 1.0\n"
                   "stalled:\n  min_seconds: 3.0\n  idle_seconds: 3.0\n")
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    opts = parse_options([
        "--listen-address", "127.0.0.1:0", "--interval", "0.2", "--gpu-backend", "sim",
        "--scenario", "healthy", "--sim-gpus", "2", "--sim-log", str(tmp_path / "train.log"),
        "--sim-speed", "120", "--nccl-dir", str(nccl), "--config", str(cfg),
        "--detect-interval", "0.5", "--node", "demo", "--no-hang-pyspy"])
    exporter = Exporter(opts)
    exporter.start()
    try:
        sim = exporter.live_sim
        deadline = time.monotonic() + 120
        while not sim.finished:
            assert time.monotonic() < deadline, "the simulated run did not end"
            time.sleep(0.2)
        time.sleep(8.0)  # past every limit above
        tracker = exporter.monitor.tracker
        loud = [f for f in tracker.active() if f.severity in ("warning", "critical")]
        assert loud == [] and tracker.finished
    finally:
        exporter.stop()


@pytest.mark.slow
def test_verl_monitor_run_writes_the_jobs_exit_beside_the_log(tmp_path):
    import subprocess
    import sys

    log = tmp_path / "train.log"
    mark_exit(log, 0, when=1.0)  # a previous run's marker: cleared when the job starts
    r = subprocess.run([sys.executable, "-m", "monitor", "run", "--no-exporter", "--log",
                        str(log), "--", sys.executable, "-c", "raise SystemExit(3)"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    when, status = read_exit(log)
    assert status == 3 and when > 1.0


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
@pytest.mark.parametrize("late_s", [2.0, 600.0])
def test_a_flag_the_last_step_completes_is_recorded_when_the_run_ends(late_s):
    """Real verl on the H200 with micro-batches of one (5 steps): low utilization needs 4 whole
    steps after the warm-up, so only the last step completes it, and verl's final validation
    comes with that step. The live monitor judges the run once more as it stood at its end:
    the flag is recorded (opened, then closed as run finished), as ``analyze`` finds it; the
    silence after the end (an exporter that read the end 10 minutes late) opens no stall or
    hang. Before, the end closed the books first and the store had no flag."""
    run = Replay("tiny_micro", ExporterOptions(window=1e9))
    try:
        *before, last = run.parsed.steps
        early = [run.until(s.end_time + 2.0) for s in before]
        opened, closed = run.until(last.end_time + late_s)
    finally:
        run.close()
    # this sdpa run's gradients were NaN on every step (verl skipped each update): only the
    # skipped_updates flag opens before the last step, with step 1
    assert [f.kind for o, c in early for f in o + c] == ["skipped_updates"]
    assert [(f.kind, f.severity) for f in opened] == [("low_utilization", "critical")]
    assert sorted(f.kind for f in closed) == ["low_utilization", "skipped_updates"]
    low = next(f for f in closed if f.kind == "low_utilization")
    assert "(run finished: the final validation)" in low.evidence
    assert low.scope == {"steps": [2, 5]}
    assert low.end < last.end_time + 2.0  # closed when the run ended, however late read


def test_a_run_that_ended_just_before_its_exporter_stopped_is_recorded_as_finished(tmp_path):
    """``verl-monitor run`` writes the job's exit beside the log and stops its exporter at
    once: the exporter records the end (the store's ``run_finished``) before it closes, so the
    dashboard on the store says the run finished, with its end time and last step."""
    from cli.commands.exporter import parse_options
    from monitor.store import RunStore

    log = tmp_path / "train.log"
    log.write_text("")
    opts = parse_options(["--log", str(log), "--store", str(tmp_path / "run.db"),
                          "--no-collector.gpu"])
    mon = LiveMonitor(opts.live_options(), "n0", 1.0)
    mon.open()
    now = time.time()
    mon.window.add_steps([StepRecord(step=i, end_time=now - 30 + 10 * i, total=10.0)
                          for i in (1, 2)])
    mark_exit(log, 0, when=now - 5)
    mon.stop()
    with RunStore(tmp_path / "run.db", create=False) as rs:
        done = rs.meta()["run_finished"]
    assert done["step"] == 2 and done["time"] == pytest.approx(now - 5, abs=1.0)
    assert done["reason"] == "the job exited with status 0"


def test_an_exit_marker_that_is_a_fifo_a_device_or_huge_is_not_read(tmp_path):
    """Round 5 N9: a FIFO at ``<log>.exit`` blocked the detector loop for good (no flag ever
    opened). Now it is not read, and said once."""
    import os

    log = tmp_path / "train.log"
    os.mkfifo(str(log) + ".exit")
    assert in_thread(lambda: read_exit(log)) is None
    os.unlink(str(log) + ".exit")
    os.symlink("/dev/zero", str(log) + ".exit")
    assert in_thread(lambda: read_exit(log)) is None
    os.unlink(str(log) + ".exit")
    with open(str(log) + ".exit", "w") as fh:
        fh.write('{"time": 1000.0, "status": 0, "pad": "' + "x" * 100_000 + '"}')
    assert read_exit(log) is None


def test_an_exit_marker_dated_in_the_future_does_not_finish_the_run(tmp_path):
    """Round 5 N9: ``{"time": 1e12}`` counted as "not older than the newest step", so every
    flag closed and nothing new opened. A marker no exit can have written (after now, or not
    a finite time) finishes nothing."""
    log = tmp_path / "train.log"
    steps = [StepRecord(step=1, end_time=time.time() - 60, total=10.0)]
    for when in (1e12, time.time() + 3600, float("inf")):
        (tmp_path / "train.log.exit").write_text(f'{{"time": {when}, "status": 0}}'
                                                 .replace("inf", "1e999"))
        assert exit_after_steps([log], steps) is None, when
    mark_exit(log, 0)  # now: the job exited
    assert exit_after_steps([log], steps) is not None
