"""monitor/live/hang_dumps.py: one dump round per silence, with stand-in ranks."""

from __future__ import annotations

import os
import signal
import time

import pytest
from hang_standins import (
    as_rank,
    job_argv,
    real_dump,
    start_standin,
    start_tree,
    stop,
    stop_tree,
    worker_argv,
    write_dump,
    write_job_tree,
)
from prometheus_client.core import CollectorRegistry

from exporters.options import ExporterOptions
from monitor.live import ViewContext
from monitor.live.hang_dumps import FlightRecorderCollector
from monitor.live.rolling_window import RollingWindow
from monitor.records import StepRecord


class Events:
    """A sink that keeps the events it is given."""

    def __init__(self) -> None:
        self.events = []

    def add_events(self, events) -> None:
        self.events.extend(events)

    def add_gpu(self, rows) -> None: ...
    def add_host(self, rows) -> None: ...
    def add_steps(self, steps) -> None: ...
    def add_nccl(self, rows) -> None: ...


def _collector(tmp_path, silent_s: float, **opts) -> tuple[FlightRecorderCollector, Events]:
    window = RollingWindow()
    end = time.time() - silent_s
    window.add_steps([StepRecord(step=i, end_time=end - 10.0 * (5 - i), total=10.0)
                      for i in range(1, 6)])
    sink = Events()
    opts.setdefault("hang_pyspy", False)  # py-spy is on by default: these tests ask for it
    ctx = ViewContext(node="n0", interval=1.0, sink=sink, window=window,
                          options=ExporterOptions(**opts))
    return FlightRecorderCollector(ctx), sink


def _scrape(c: FlightRecorderCollector) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(c)
    return reg


def test_a_silent_job_gets_one_round_naming_the_rank_that_never_issued_it(tmp_path):
    run = tmp_path / "fr"
    run.mkdir()
    procs = [start_standin(run, 0, write_dump(tmp_path / "d0", as_rank(real_dump(), 0, 2))),
             start_standin(run, 1, write_dump(tmp_path / "d1",
                                              as_rank(real_dump(), 1, 2, drop_after=13)))]
    try:
        c, sink = _collector(tmp_path, silent_s=60.0, fr_dir=str(run))
        c.poll_once()
        c.poll_once()  # the same silence: not asked again
    finally:
        stop(procs)
    assert len(sink.events) == 1
    ev = sink.events[0]
    assert ev.kind == "hang_dump" and ev.message.startswith("rank 1 (node n0")
    assert f"PID {procs[1].pid}" in ev.message
    assert ev.data["culprits"][0]["seq"] == 14 and ev.data["waiting"] == {
        "0": ev.data["waiting"]["0"]}
    reg = _scrape(c)
    assert reg.get_sample_value("verlmon_fr_collective_seq",
                                {"rank": "1", "pg": "0", "state": "enqueued"}) == 13
    assert reg.get_sample_value("verlmon_hang_culprit_info",
                                {"rank": "1", "pid": str(procs[1].pid), "gpu": "",
                                 "collective": "nccl:all_reduce", "seq": "14",
                                 "frame": ev.data["culprits"][0]["frame"]}) == 1
    assert reg.get_sample_value("verlmon_hang_dump_rounds_total",
                                {"method": "flight_recorder", "result": "ok"}) == 1


def test_while_steps_keep_coming_nobody_is_asked(tmp_path):
    c, sink = _collector(tmp_path, silent_s=5.0, fr_dir=str(tmp_path))
    c.poll_once()
    assert sink.events == []


def test_without_fifos_the_round_says_what_to_set_and_the_collector_reports_it(tmp_path):
    c, sink = _collector(tmp_path, silent_s=60.0, fr_dir=str(tmp_path))
    c.poll_once()
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in sink.events[0].message
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in c.last_error
    assert _scrape(c).get_sample_value("verlmon_hang_dump_rounds_total",
                                       {"method": "flight_recorder", "result": "failed"}) == 1


def test_py_spy_without_a_process_of_the_job_says_so(tmp_path):
    c, sink = _collector(tmp_path, silent_s=60.0, hang_pyspy=True, log=(str(tmp_path / "x"),))
    c.poll_once()
    ev = sink.events[0]
    assert ev.data["method"] == "py-spy" and "stuck" in ev.data["where"]
    assert ev.data["where"]["who"] == []  # nothing proven the job's: said in words
    assert ev.data["problems"]["py-spy"].startswith("no process of the job is proven on this "
                                                   "node, so no stacks are taken")
    assert ev.message.startswith("no stacks: no process of the job is proven")
    assert _scrape(c).get_sample_value("verlmon_hang_job_processes") == 0


def test_py_spy_is_on_by_default_where_installed_and_off_with_the_option(tmp_path):
    from monitor.hang.pyspy import find_pyspy

    on, _ = _collector(tmp_path, silent_s=1.0, hang_pyspy=None)
    off, _ = _collector(tmp_path, silent_s=1.0, hang_pyspy=False)
    assert on.pyspy == (find_pyspy() is not None) and on.enabled == on.pyspy
    assert not off.pyspy and not off.enabled


def test_off_unless_asked(tmp_path):
    c, sink = _collector(tmp_path, silent_s=600.0)
    c.poll_once()
    assert sink.events == [] and list(c.collect()) == []


def _waiting_rows(seconds: float, sm: float) -> list[dict]:
    now = time.time()
    return [{"ts": now - seconds + i, "node": "n1", "gpu": g, "util": 100.0, "sm_active": sm}
            for i in range(int(seconds)) for g in (0, 1)]


def test_a_node_without_the_log_asks_once_its_gpus_wait_in_a_collective(tmp_path):
    run = tmp_path / "fr"
    run.mkdir()
    procs = [start_standin(run, 5, write_dump(tmp_path / "d", as_rank(real_dump(), 5, 8)))]
    try:
        window = RollingWindow()
        window.add_gpu(_waiting_rows(60, sm=2.0))
        sink = Events()
        c = FlightRecorderCollector(ViewContext(
            node="n1", interval=1.0, sink=sink, window=window,
            options=ExporterOptions(fr_dir=str(run), hang_pyspy=False)))
        c.poll_once()
        c._wait_checked = 0.0
        c.poll_once()  # the same waiting episode: not asked again
    finally:
        stop(procs)
    assert len(sink.events) == 1
    reg = _scrape(c)
    assert reg.get_sample_value("verlmon_fr_collective_seq",
                                {"rank": "5", "pg": "0", "state": "enqueued"}) == 17


def test_gpus_that_compute_are_not_a_trigger_and_progress_clears_the_last_round(tmp_path):
    window = RollingWindow()
    window.add_gpu(_waiting_rows(60, sm=70.0))
    sink = Events()
    c = FlightRecorderCollector(ViewContext(node="n1", interval=1.0, sink=sink,
                                                window=window,
                                                options=ExporterOptions(fr_dir=str(tmp_path),
                                                                        hang_pyspy=False)))
    c.poll_once()
    assert sink.events == []
    c._handled, c._dumps = 1.0, {0: None}
    c.poll_once()
    assert c._handled is None and c._dumps == {}


def test_the_hang_settings_are_the_monitors_own_copy_of_config(tmp_path):
    """The collector judges silences with the detectors' settings as the monitor loaded them
    (one read of --config, so both always agree); without a monitor it reads --config itself."""
    from monitor.config import load_config

    path = tmp_path / "verlmon.yaml"
    path.write_text("hang:\n  min_seconds: 300.0\n")
    window = RollingWindow()
    shared = FlightRecorderCollector(ViewContext(
        node="n0", interval=1.0, window=window, config=load_config(str(path)),
        options=ExporterOptions()))
    assert shared.cfg.get_float("min_seconds") == 300.0
    alone = FlightRecorderCollector(ViewContext(
        node="n0", interval=1.0, window=window, options=ExporterOptions(config=str(path))))
    assert alone.cfg.get_float("min_seconds") == 300.0
    default = FlightRecorderCollector(ViewContext(node="n0", interval=1.0, window=window))
    assert default.cfg.get_float("min_seconds") == 45.0


def test_a_worker_killed_in_the_silence_is_published_as_the_culprit(tmp_path):
    from monitor.hang.pyspy import find_pyspy

    if find_pyspy() is None:
        pytest.skip("py-spy not installed")
    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    raylet, (driver, worker) = start_tree(
        [job_argv(root, "worker", log, steps=1, step_s=0.1),
         worker_argv(root, log, "idle")], argv0=str(tmp_path / "ray/core/src/ray/raylet/raylet"))
    c, sink = _collector(tmp_path, silent_s=60.0, hang_pyspy=True, log=(str(log),))
    try:
        deadline = time.monotonic() + 20
        while f"(WorkerDict pid={worker}" not in log.read_text():
            assert time.monotonic() < deadline, "the worker stand-in never logged"
            time.sleep(0.05)
        c.watch_processes()  # in the silence, both alive
        os.kill(worker, signal.SIGKILL)
        c.poll_once()  # past the stack limit: one py-spy round, the worker gone
    finally:
        stop_tree(raylet, [driver, worker])
    ev = sink.events[-1]
    if any("ptrace" in v for v in ev.data["problems"].values()):
        pytest.skip(str(ev.data["problems"]))
    assert ev.data["where"]["place"] == "gone" and ev.data["where"]["stuck"]
    assert ev.message.startswith(f"the worker (PID {worker}, node n0) is gone: it exited")
    got = _scrape(c).get_sample_value("verlmon_hang_culprit_info", {
        "rank": "", "pid": str(worker), "gpu": "", "collective": "", "seq": "",
        "frame": ""})
    assert got == 1.0


def test_without_py_spy_the_log_metrics_and_the_flags_say_so_with_the_fix(tmp_path, monkeypatch,
                                                                         caplog):
    """Issue 38: the core install without py-spy got a `stalled` warning with no PID, no frame
    and no word why. Now: once in the log, a /metrics series, and the flags' evidence."""
    import logging

    import monitor.live.hang_dumps as hd
    from monitor.detect import run_all
    from monitor.detect.flag_advice import advice_for

    monkeypatch.setattr(hd, "find_pyspy", lambda: None)
    c, sink = _collector(tmp_path, silent_s=400.0, hang_pyspy=None)
    with caplog.at_level(logging.WARNING):
        c.poll_once()
        c.poll_once()  # the same silence: said once
    said = [r.getMessage() for r in caplog.records if "py-spy is not installed" in r.getMessage()]
    assert len(said) == 1 and "pip install py-spy" in said[0]
    reg = _scrape(c)
    assert reg.get_sample_value("verlmon_hang_pyspy_ready") == 0
    problem = [s for m in reg.collect() if m.name == "verlmon_hang_pyspy_problem_info"
               for s in m.samples]
    assert len(problem) == 1 and "pip install py-spy" in problem[0].labels["problem"]
    assert [e.message for e in sink.events] == [
        "no stacks: py-spy is not installed, so a stuck job's process and line cannot be named: "
        "pip install py-spy"]
    steps = c.ctx.window.recent_steps(8)
    flags = run_all(steps, None, None, sink.events, now=time.time())
    stalled = [f for f in flags if f.kind == "stalled"]
    assert stalled and "Where (py-spy): no stacks: py-spy is not installed" in \
        stalled[0].evidence and "pip install py-spy" in stalled[0].evidence
    assert stalled[0].advice == advice_for("stalled")  # no place read: no place's advice


def test_the_proven_tree_and_the_hang_state_are_there_for_other_modules(tmp_path):
    """``job_tree_now`` / ``hang_state_now``: what an action on a hang (issue 40) reads."""
    from monitor.live.hang_dumps import hang_state_now, job_tree_now

    c, _ = _collector(tmp_path, silent_s=1.0, hang_pyspy=True, log=(str(tmp_path / "x"),))
    c.watch_processes()
    tree = job_tree_now()
    assert tree is c.job_tree() and tree.pids == frozenset() and tree.why
    assert hang_state_now() is None  # no steady reading yet
