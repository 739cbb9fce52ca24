"""LiveSim: lines appear in the log file as (sped-up) wall-clock time passes."""

from __future__ import annotations

import time

import pytest

from monitor.sim.engine import SimRun
from monitor.sim.live import LiveSim

#: The live simulator writes in real time: these tests wait on it on purpose.
pytestmark = pytest.mark.slow


def _wait(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_lines_are_appended_over_time_and_run_is_rebased(tmp_path):
    run = SimRun(steps=4, gpus_per_node=2, step_seconds=2.0, seed=1)
    log = tmp_path / "train.log"
    log.write_text("existing line\n")
    live = LiveSim(run, log, speed=4.0)
    before = time.time()
    live.start()
    try:
        assert before <= run.start_time <= time.time()
        # the preamble is written at once, step lines only as their times pass
        assert _wait(lambda: "Training Progress:   0%" in log.read_text())
        assert "step:1 " not in log.read_text()
        assert _wait(lambda: "step:1 " in log.read_text())
        assert "step:4 " not in log.read_text()
        assert _wait(lambda: log.read_text().count("timing_s/step") == 4)
        assert _wait(lambda: live.finished)
    finally:
        live.stop()
    text = log.read_text().splitlines()
    assert text[0] == "existing line"
    assert text[1:] == [line for _, line in run.timed_lines()]
    assert live.error is None


def test_now_sim_runs_faster_with_speed_and_matches_gpu_samples(tmp_path):
    run = SimRun(steps=20, gpus_per_node=1, step_seconds=30.0)
    live = LiveSim(run, tmp_path / "t.log", speed=100.0)
    live.start()
    try:
        t1 = live.now_sim()
        assert _wait(lambda: live.now_sim() - t1 > 10.0, timeout=5.0)
        rows = run.gpu_sample_at(live.now_sim())
        assert len(rows) == 1 and rows[0]["up"]
    finally:
        live.stop()
    assert not live.running


def test_stop_ends_the_thread_before_all_lines_are_written(tmp_path):
    run = SimRun(steps=50, gpus_per_node=1, step_seconds=30.0)
    log = tmp_path / "t.log"
    live = LiveSim(run, log, speed=1.0)
    live.start()
    assert _wait(lambda: log.exists() and "0%" in log.read_text())
    live.stop()
    assert not live.running
    assert "step:50" not in log.read_text()


def test_a_run_with_engines_serves_them_on_the_simulated_clock(tmp_path):
    import httpx

    run = SimRun("kv_cache_preemption", steps=6, step_seconds=6.0, seed=2)
    live = LiveSim(run, tmp_path / "train.log", speed=10.0)
    assert live.engine_urls == []
    live.start()
    try:
        assert len(live.engine_urls) == 4  # 8 GPUs at tensor parallel 2

        def metric(url: str, name: str) -> float:
            text = httpx.get(url + "/metrics", timeout=5).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name + "{"))

        url = live.engine_urls[0]
        # the problem segment preempts: the counter climbs as simulated time passes
        assert _wait(lambda: metric(url, "vllm:num_preemptions_total") > 0, timeout=30)
        assert metric(url, "vllm:generation_tokens_total") > 0
        assert live.error is None
    finally:
        live.stop()
    try:
        httpx.get(url + "/metrics", timeout=1)
    except httpx.HTTPError:
        return
    raise AssertionError("an engine server still answers after stop()")


def test_a_sync_run_serves_no_engines(tmp_path):
    live = LiveSim(SimRun(steps=2, gpus_per_node=2, step_seconds=1.0), tmp_path / "t.log",
                   speed=50.0)
    live.start()
    try:
        assert live.engine_urls == []
    finally:
        live.stop()


def test_each_line_is_captured_on_the_simulated_clock_and_the_end_is_marked(tmp_path):
    """Beside the log: when each line was written on the run's own clock (``.arrivals``, as
    ``verl-monitor run`` records a job's lines) and, at the end, the exit marker on that
    clock too, so a run played at 20x is read in its own seconds."""
    from monitor.hang.finish import read_exit
    from monitor.logs.arrivals import read_arrivals

    run = SimRun(steps=3, gpus_per_node=1, step_seconds=4.0, seed=2)
    log = tmp_path / "train.log"
    live = LiveSim(run, log, speed=20.0)
    live.start()
    try:
        assert _wait(lambda: live.finished and read_exit(log) is not None)
    finally:
        live.stop()
    times = [t for _, t in read_arrivals(log)]
    assert times == pytest.approx([t for t, _ in run.timed_lines()], abs=1e-5)
    assert read_exit(log)[0] >= run.log_end_time  # after the last step on the same clock
