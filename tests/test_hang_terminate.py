"""``--on-hang terminate``'s guards, on made-up rounds and on the real verl recordings
replayed (``tests/fixtures/real_verl``: py-spy rounds every 10 s), and ending a real process
tree."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from monitor.hang.stacks import stacks_report
from monitor.hang.terminate import HangPolicy, decide, end_tree, job_root, longest_interval
from monitor.logs.files import parse_file
from monitor.records import Event, Flag, StepRecord

FIXTURES = Path(__file__).parent / "fixtures" / "real_verl"
RUNS = sorted(p.name for p in FIXTURES.iterdir() if (p / "meta.json").exists())
HANGS = ["hang_data", "hang_reward", "hang_http", "hang_data_live", "hang_reward_live",
         "hang_http_live"]
#: The replays' settings: the recordings' hangs were ended about 95 s after the last step.
REPLAY = HangPolicy(after_s=20.0, restack_s=10.0)


#: Tests of one recording run on one worker under xdist (tests/scheduling.py): its analysis
#: is cached per process, so it is read once.
GROUP_BY_PARAM = "run"


def _round(t: float, place: str = "reward", pid: int = 7, frame: str = "compute_score "
           "(rewards.py:9)", stuck: bool = True) -> Event:
    who = [{"role": "driver", "pid": pid, "frame": frame}]
    return Event("hang_dump", t, None, f"the driver (PID {pid}) is scoring rewards, at {frame}.",
                 {"method": "py-spy", "where": {"stuck": stuck, "place": place,
                                                "phase": "reward", "who": who}})


def _flag(start: float = 100.0) -> Flag:
    return Flag("hang", "critical", start, None, {"node": "n0"}, "No progress", [])


def _steps(n: int = 5, every: float = 10.0, reward: float = 1.0) -> list[StepRecord]:
    return [StepRecord(k, 40.0 + every * k, 8.0, {"gen": 5.0, "reward": reward},
                       time_source="sidecar") for k in range(1, n + 1)]


POL = HangPolicy(after_s=60.0, restack_s=10.0)


def test_a_hang_held_past_the_hold_at_one_place_in_every_round_is_ended():
    rounds = [_round(100.0 + 10 * i) for i in range(7)]
    d = decide(_flag(), rounds, _steps(), 165.0, POL)
    assert d.act and d.guard == "" and d.rounds == 7
    assert "held 65 s" in d.why and "compute_score (rewards.py:9)" in d.why


@pytest.mark.parametrize(("flag", "now", "rounds", "guard", "words"), [
    (None, 200.0, [], "flag", "no critical hang flag"),
    (Flag("hang", "warning", 100.0, None, {}, "", []), 200.0, [], "flag", "no critical"),
    (Flag("hang", "critical", 100.0, 150.0, {}, "", []), 200.0, [], "flag", "no critical"),
    (_flag(), 150.0, [_round(100.0 + 10 * i) for i in range(6)], "hold", "held 50 s of the 60"),
    (_flag(), 165.0, [_round(165.0)], "stacks", "at least 2"),
    (_flag(), 165.0, [_round(100.0), _round(130.0), _round(160.0)], "stacks", "30 s apart"),
    (_flag(), 165.0, [_round(125.0), _round(135.0), _round(155.0)], "stacks",
     "came 25 s after the flag's start"),
    (_flag(), 190.0, [_round(100.0 + 10 * i) for i in range(7)], "stacks", "is 30 s old"),
    (_flag(), 165.0, [_round(100.0 + 10 * i, frame=f"f (x.py:{i})") for i in range(7)],
     "stacks", "it moves"),
    (_flag(), 165.0, [_round(100.0 + 10 * i, stuck=i < 6) for i in range(7)], "stacks",
     "no process stuck"),
])
def test_each_guard_that_fails_says_so_and_nothing_is_ended(flag, now, rounds, guard, words):
    d = decide(flag, rounds, _steps(), now, POL)
    assert not d.act and d.guard == guard and words in d.why, d.why


def test_one_late_round_restarts_the_count_instead_of_refusing_for_the_rest_of_the_hang():
    # a py-spy round 40 s late (a loaded node) early in the hang: the count starts again at the
    # round after the gap, and the job is ended once the place has held 60 s from there
    rounds = [_round(100.0), _round(140.0)] + [_round(150.0 + 10 * i) for i in range(7)]
    early = decide(_flag(), rounds[:6], _steps(), 190.0, POL)
    assert not early.act and early.guard == "stacks"
    assert "same place for 50 s of the 60 s" in early.why and "40 s apart" in early.why
    later = decide(_flag(), rounds, _steps(), 205.0, POL)
    assert later.act and later.rounds == 7 and "held 105 s" in later.why, later.why


def test_rounds_still_coming_at_one_place_are_a_wait_not_a_refusal():
    # one round so far, on time (the next is due): the place has not held long enough *yet*;
    # the live wing says a refusal once per guard, so this must not read as the stacks guard
    d = decide(_flag(), [_round(100.0)], _steps(), 160.0, HangPolicy(60.0, 60.0))
    assert not d.act and d.guard == "hold" and "at least 2" in d.why, d.why
    d = decide(_flag(), [_round(100.0), _round(130.0), _round(155.0)], _steps(), 160.0,
               HangPolicy(60.0, 10.0))
    assert d.guard == "stacks" and "25 s apart" in d.why, d.why  # a gap: the count restarted


def test_a_job_that_moved_once_is_ended_when_its_new_place_has_held_the_hold():
    moved = [_round(100.0 + 10 * i, frame="load (data.py:3)") for i in range(4)]
    stuck = [_round(140.0 + 10 * i) for i in range(8)]
    d = decide(_flag(), moved + stuck, _steps(), 205.0, POL)
    assert d.act and d.rounds == 7 and "compute_score (rewards.py:9)" in d.why, d.why
    d = decide(_flag(), moved + stuck[:5], _steps(), 185.0, POL)
    assert not d.act and "4 of 9 stack rounds found the job elsewhere" in d.why, d.why


def test_a_phase_the_jobs_history_shows_lasting_as_long_is_never_ended():
    # steps 80 s apart with a 70 s reward: this 75 s silence in the reward is like theirs
    steps = _steps(every=80.0, reward=70.0)
    last = float(steps[-1].end_time)
    rounds = [_round(last + 10.0 + 10 * i) for i in range(7)]
    d = decide(_flag(last + 10.0), rounds, steps, last + 75.0, HangPolicy(60.0, 10.0))
    assert not d.act and d.guard == "phase" and "80 s between two step lines" in d.why, d.why
    assert longest_interval(steps, "reward") == (80.0, 4)
    assert longest_interval(steps, "testing") == (0.0, 0)


def test_an_unknown_process_tree_is_never_ended():
    rounds = [_round(100.0 + 10 * i) for i in range(7)]
    d = decide(_flag(), rounds, _steps(), 165.0, POL, tree="the tree is not known")
    assert not d.act and d.guard == "tree"


# ---------------------------------------------------------------------------- the recordings
@functools.cache
def _recording(run: str) -> tuple[list[StepRecord], list[Event]]:
    d = FIXTURES / run
    parsed = parse_file(d / "train.log")
    return parsed.steps, stacks_report(d / "stacks")[1]


@functools.cache
def _hang_flag(run: str) -> Flag:
    """The hang flag: the live exporter's own (``flags_live.json``) where it was recorded,
    else the one ``analyze`` raises on the recording."""
    live = FIXTURES / run / "flags_live.json"
    found = [f for f in json.loads(live.read_text()) if f["kind"] == "hang"] \
        if live.exists() else []
    if not found:
        import contextlib
        import io

        from monitor.cli import main

        out = io.StringIO()
        d = FIXTURES / run
        with contextlib.redirect_stdout(out):
            main(["analyze", str(d / "train.log"), "--gpu", str(d / "gpu.csv"), "--host",
                  str(d / "host.csv"), "--events", str(d / "events.json"), "--stacks",
                  str(d / "stacks"), "--json"])
        found = [f for f in json.loads(out.getvalue())["flags"] if f["kind"] == "hang"]
    f = found[0]
    return Flag("hang", f["severity"], f["start"], None, f["scope"], f["evidence"], f["advice"])


def _replay(run: str, flag_at, policy: HangPolicy) -> list[tuple[float, object]]:
    """The decision at each recorded stack round, with the steps seen by then."""
    steps, rounds = _recording(run)
    out = []
    for r in rounds:
        t = float(r.time)
        flag = flag_at(t)
        seen = [e for e in rounds if float(e.time) <= t]
        out.append((t, decide(flag, seen, [s for s in steps if s.end_time <= t], t, policy)))
    return out


@pytest.mark.parametrize("run", HANGS)
def test_terminate_fires_on_the_real_hangs_once_they_held_the_hold(run):
    flag = _hang_flag(run)
    decisions = _replay(run, lambda t: flag if t >= flag.start else None, REPLAY)
    acted = [t for t, d in decisions if d.act]
    assert acted, [(t, d.why) for t, d in decisions]
    assert REPLAY.after_s <= acted[0] - flag.start <= REPLAY.after_s + REPLAY.restack_s
    assert not any(d.act for t, d in decisions if t < flag.start + REPLAY.after_s)
    first = next(d for t, d in decisions if d.act)
    pid = next(iter(json.loads((FIXTURES / run / "meta.json").read_text())["injected"]
                    .values()))["pid"]
    assert f"PID {pid}" in first.place, first.place


@pytest.mark.parametrize("run", HANGS)
def test_with_the_default_hold_of_10_min_none_of_the_real_hangs_is_ended(run):
    flag = _hang_flag(run)
    decisions = _replay(run, lambda t: flag if t >= flag.start else None, HangPolicy())
    assert not any(d.act for _, d in decisions)


@pytest.mark.parametrize("run", [r for r in RUNS if r not in HANGS])
def test_terminate_never_fires_on_the_real_runs_that_did_not_hang(run):
    """A critical hang flag forced open at every silence of a run that did not hang (as if
    the detector had misjudged it), under the replays' settings: never acted on."""
    steps, _ = _recording(run)

    def forced(t: float) -> Flag:
        last = max((float(s.end_time) for s in steps if s.end_time <= t), default=t - 1.0)
        return _flag(last)

    decisions = _replay(run, forced, REPLAY)
    assert not [(t, d.why) for t, d in decisions if d.act]


LONG = ("validation", "checkpoint", "generation", "kernel")


@pytest.mark.parametrize("run", [r for r in RUNS if r not in HANGS])
def test_rounds_in_a_validation_checkpoint_or_generation_are_never_acted_on(run):
    """Every recorded round in a long healthy phase, with a flag open since just before it,
    no hold at all, and the round seen twice: refused, for the place."""
    steps, rounds = _recording(run)
    long = [r for r in rounds if (r.data["where"] or {}).get("place") in LONG]
    for r in long:
        t = float(r.time)
        twice = [Event(r.kind, t - 5.0, None, r.message, r.data), r]
        d = decide(_flag(t - 6.0), twice, [s for s in steps if s.end_time <= t], t,
                   HangPolicy(after_s=0.0, restack_s=10.0))
        assert not d.act and "no process stuck" in d.why, (t, d.why)


def test_the_recordings_hold_validations_checkpoints_and_generations():
    places = {(r.data["where"] or {}).get("place") for run in RUNS if run not in HANGS
              for r in _recording(run)[1]}
    assert {"validation", "generation", "kernel"} <= places, places


def test_the_long_validation_of_healthy_val_is_refused_for_its_place():
    steps, rounds = _recording("healthy_val")
    val = [r for r in rounds if (r.data["where"] or {}).get("place") == "validation"]
    assert val, "the recording's validation round"
    d = decide(_flag(float(val[0].time) - 5.0), val * 2, steps, float(val[0].time),
               HangPolicy(after_s=0.0, restack_s=10.0))
    assert not d.act and "no process stuck" in d.why


def test_a_second_reward_stall_shorter_than_the_first_is_left_alone():
    """hang_reward: the reward stuck ~100 s, then finished; the job's history now shows the
    reward lasting that long. The same stuck rounds again later, 60 s into a silence: no."""
    steps, rounds = _recording("hang_reward")
    stuck = [r for r in rounds if (r.data["where"] or {}).get("stuck")]
    last = float(steps[-1].end_time)
    shifted = [Event(r.kind, last + 5.0 + 10.0 * i, None, r.message, r.data)
               for i, r in enumerate(stuck[:6])]
    d = decide(_flag(last + 5.0), shifted, steps, last + 60.0, HangPolicy(30.0, 10.0))
    assert not d.act and d.guard == "phase", d.why


# ---------------------------------------------------------------------------- the real tree
_RUN = r"""
import subprocess, sys, time
job = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(job.pid, flush=True)
job.wait()
time.sleep(30)
"""
_JOB = r"""
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('x', flush=True);"
    " time.sleep(60)"], stdout=subprocess.PIPE)
child.stdout.readline()
time.sleep(60)
"""


@pytest.mark.slow
def test_the_jobs_tree_under_verl_monitor_run_is_found_and_ended_term_then_kill():
    run = subprocess.Popen([sys.executable, "-c", _RUN, _JOB, "verl-monitor", "run"],
                           stdout=subprocess.PIPE, text=True)
    try:
        job = int(run.stdout.readline())
        deadline = time.monotonic() + 20
        while len(psutil.Process(job).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job_root(run.pid) == (job, "")
        tree = [job] + [c.pid for c in psutil.Process(job).children(recursive=True)]
        ended = end_tree(job, grace_s=1.0)
        assert sorted(ended.terminated) == sorted(tree)
        assert ended.killed == [tree[1]]  # the child that ignores SIGTERM
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                       for p in tree)
        assert "SIGKILL to 1 still running" in ended.words()
    finally:
        run.kill()
        run.wait()


def test_a_process_not_started_by_verl_monitor_run_has_no_known_tree():
    pid, why = job_root()
    assert pid is None and "not started by verl-monitor run" in why
