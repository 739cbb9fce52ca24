"""monitor/live/hang_action.py: ``--on-hang`` on a real stuck process (py-spy, signals, the
Slack outbox in a real run store)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from exporters.options import ExporterOptions
from monitor.hang.procs import JobProcess
from monitor.hang.terminate import job_root
from monitor.live import ViewContext
from monitor.live.flag_tracker import FlagTracker
from monitor.live.hang_action import HangActionView
from monitor.live.rolling_window import RollingWindow
from monitor.notify.slack import SlackNotifier
from monitor.records import Flag, StepRecord
from monitor.store import RunStore

pytestmark = pytest.mark.slow

_RUN = r"""
import subprocess, sys, time
job = subprocess.Popen([sys.executable, sys.argv[1]])
print(job.pid, flush=True)
job.wait()
time.sleep(30)
"""
_JOB = '''
import time


def compute_score(solution):
    while True:
        time.sleep(0.05)


print("scoring", flush=True)
compute_score("x")
'''


class Events:
    """A sink that keeps the events it is given."""

    def __init__(self) -> None:
        self.events = []

    def add_events(self, events) -> None:
        self.events.extend(events)


@pytest.fixture
def stuck(tmp_path):
    """A stand-in ``verl-monitor run`` (its command line says so) whose child, the job, is
    stuck in ``compute_score`` (rewards.py)."""
    (tmp_path / "rewards.py").write_text(_JOB)
    run = subprocess.Popen([sys.executable, "-c", _RUN, str(tmp_path / "rewards.py"),
                            "verl-monitor", "run"], stdout=subprocess.PIPE, text=True)
    job = int(run.stdout.readline())
    time.sleep(0.5)  # the job is in compute_score
    yield run.pid, job
    run.kill()
    run.wait()
    if psutil.pid_exists(job):
        psutil.Process(job).kill()


def _view(tmp_path, run_pid, job, mode, flag_start, **opts):
    window = RollingWindow()
    window.add_steps([StepRecord(k, flag_start - 20.0 + 2.0 * k, 1.5, {"reward": 0.5},
                                 time_source="arrival") for k in range(1, 6)])
    tracker = FlagTracker()
    tracker.update([Flag("hang", "critical", flag_start, None, {"node": "n0"},
                         "No progress for 60 s after step 5", [])], flag_start)
    hook = tmp_path / "hook"
    hook.write_text("https://hooks.slack.com/services/T0/B0/XXXXXXXX\n")
    store = RunStore(tmp_path / "run.db")
    sink = Events()
    ctx = ViewContext(node="n0", interval=1.0, window=window, tracker=tracker, sink=sink,
                      notifier=SlackNotifier(str(hook), store),
                      options=ExporterOptions(on_hang=mode, **opts))
    view = HangActionView(ctx)
    view.find_root = lambda: job_root(run_pid)
    view.find_procs = lambda: [JobProcess(job, "driver", "tree", "python rewards.py")]
    return view, sink, store


def _poll_until(view, done, limit_s: float = 30.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        d = view.poll(time.time())
        if done(d):
            return d
        time.sleep(0.2)
    raise AssertionError("no decision came")


def test_terminate_ends_the_stuck_job_once_the_hang_held_and_says_why_everywhere(
        tmp_path, stuck, caplog):
    run_pid, job = stuck
    view, sink, store = _view(tmp_path, run_pid, job, "terminate", time.time(),
                              on_hang_after=1.5, on_hang_restack=1.0, on_hang_grace=2.0)
    d = _poll_until(view, lambda d: d is not None and d.act)
    assert "compute_score" in d.place and "scoring rewards" in d.place
    psutil.Process(job).wait(5) if psutil.pid_exists(job) else None
    assert not psutil.pid_exists(job) or psutil.Process(job).status() == "zombie"
    evidence = [e for e in sink.events if e.kind == "hang_evidence"]
    assert len(evidence) == 1 and any("compute_score" in t
                                      for t in evidence[0].data["stacks"].values())
    acted = [e for e in sink.events if e.kind == "hang_action"]
    assert len(acted) == 1 and acted[0].data["acted"] and acted[0].data["terminated"] == [job]
    assert "SIGTERM to 1 process(es)" in acted[0].message and "held" in acted[0].message
    queued = [i.payload["text"] for i in store.outbox_pending()]
    assert any(t.startswith("Hang: job terminated") for t in queued), queued
    assert "on-hang terminate: Terminated the hung job" in caplog.text
    assert view.counts[("terminate", "acted")] == 1
    assert view.poll(time.time()) is None  # done once


def test_a_job_whose_tree_is_not_known_is_left_running_and_the_reason_said_once(
        tmp_path, stuck):
    run_pid, job = stuck
    view, sink, store = _view(tmp_path, run_pid, job, "terminate", time.time(),
                              on_hang_after=1.0, on_hang_restack=1.0)
    view.find_root = lambda: (None, "the job's process tree is not known: no verl-monitor run")
    _poll_until(view, lambda d: d is not None and d.guard == "tree")
    for _ in range(3):
        view.poll(time.time())
    assert psutil.Process(job).is_running()
    said = [e for e in sink.events if e.kind == "hang_action"]
    assert said and not any(e.data["acted"] for e in said)
    # the tree's reason once (a slow py-spy round on a loaded machine may add the stacks
    # guard's own reason, once, before it)
    tree = [e for e in said if "not known" in e.message]
    assert len(tree) == 1 and [e.data["guard"] for e in said].count("tree") == 1
    assert all(e.data["guard"] in ("stacks", "tree") for e in said), said
    assert any(i.payload["text"].startswith("Hang: job not terminated")
               for i in store.outbox_pending())


def test_dump_saves_the_evidence_and_ends_nothing(tmp_path, stuck):
    run_pid, job = stuck
    log = tmp_path / "train.log"
    log.write_text("step:5 - timing_s/step:1.5\nscoring\n")
    view, sink, _ = _view(tmp_path, run_pid, job, "dump", time.time() - 700.0,
                          log=(str(log),))
    view.poll(time.time())
    view.poll(time.time())
    assert psutil.Process(job).is_running()
    assert [e.kind for e in sink.events] == ["hang_evidence"]
    data = sink.events[0].data
    assert data["log_tail"][-1] == "scoring" and data["flight_recorder"] == ""
    assert view.counts[("dump", "saved")] == 1


def test_alert_does_nothing_at_all(tmp_path, stuck):
    run_pid, job = stuck
    view, sink, _ = _view(tmp_path, run_pid, job, "alert", time.time() - 700.0)
    assert view.poll(time.time()) is None and sink.events == []
