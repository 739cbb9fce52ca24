"""monitor/hang/sampler.py, in simulated time: a verl-shaped job with steps of 110 s (a 90 s
generation the GPU computes, a 0.8 s reward, log-probs, the update), a 3-minute validation and
a 2-minute checkpoint, read every 10 s as the exporter reads it; the ``hang`` detector turns
what it publishes into the flag."""

from __future__ import annotations

from monitor.detect import make_context
from monitor.detect.hang import detect_hang
from monitor.hang.dwell import HoldLimits, replay
from monitor.hang.procs import JobProcess
from monitor.hang.sampler import HoldSampler
from monitor.sim.hang_timeline import DRIVER_PID, WORKER_PID, JobTimeline

PROCS = [JobProcess(DRIVER_PID, "driver", "tree"), JobProcess(WORKER_PID, "worker", "ray")]


def _play(tl: JobTimeline, until: float, sample_s: float = 10.0):
    """The collector's loop: a poll every second, the steps as the log gives them."""
    sampler = HoldSampler(HoldLimits(), sample_s, 30.0, "n0")
    events, rounds = [], []
    t = tl.t0 + 0.5
    while t < until:
        sampler.add_steps(tl.steps_until(t))
        if sampler.due(t):
            def take(procs, full, t=t):
                rounds.append((t, full, [p.pid for p in procs]))
                return tl.round(t, full)
            events += sampler.run(t, PROCS, take)
        t += 1.0
    return events, sampler, rounds


def _flags(tl: JobTimeline, events, now: float):
    ctx = make_context(tl.steps_until(now), tl.gpu_frame(now), None, list(events), now=now)
    return detect_hang(ctx)


def test_a_reward_that_blocks_in_110_s_steps_is_named_within_30_s_and_nothing_before():
    tl = JobTimeline()
    now = tl.blocked_at + 120.0
    events, sampler, _ = _play(tl, now)
    flags = _flags(tl, events, now)
    assert [f.kind for f in flags] == ["hang"], [f.evidence for f in flags]
    f = flags[0]
    assert f.severity == "critical" and f.end is None
    assert 0 < f.start - tl.blocked_at <= 30.0, f.start - tl.blocked_at
    assert f"the driver (PID {DRIVER_PID}, node n0) is scoring rewards" in f.evidence
    assert "at normalize_final_answer (user_reward.py:5)" in f.evidence
    assert "in normalize_final_answer for " in f.evidence
    assert "reward takes at most 0.80 s a step in this run (limit 15 s)" in f.evidence
    state = sampler.state()
    assert state.hang and state.place == "reward" and state.normal_s == 0.8
    assert state.held_s >= 100.0 and state.words.startswith("in normalize_final_answer for")


def test_a_90_s_generation_a_3_minute_validation_and_a_2_minute_checkpoint_raise_nothing():
    tl = JobTimeline(steps=8, block_step=0)
    events, sampler, rounds = _play(tl, tl.end + 60.0)
    assert _flags(tl, events, tl.end + 60.0) == []
    assert events == []  # nothing was published: no place held past its time
    # the validation and the checkpoint were read in full once each (their verdict is kept
    # for the rest of the hold), the generations never: steady readings are the driver's
    full = [t for t, is_full, _ in rounds if is_full]
    steady = [pids for _, is_full, pids in rounds if not is_full]
    assert all(pids == [DRIVER_PID] for pids in steady)
    assert len(full) <= 4, full
    assert len(steady) >= (tl.end - tl.t0) / 10.0 - 2  # every 10 s through the whole run


def test_a_second_validation_as_long_as_the_first_is_quiet_and_one_three_times_longer_is_named_when_the_gpu_idles():
    """Long places are judged against their own history: the first is never a hang; a later
    one far past it is, once the GPU stops computing."""
    from monitor.hang.dwell import DwellTracker, Reading

    tr = DwellTracker()
    tr.add_step(100.0, {"testing": 180.0})  # the first validation took 3 minutes
    h = tr.add_reading(Reading(200.0, 1, "driver", "validation", "testing", "_validate (t.py:6)"))
    tr.add_reading(Reading(380.0, 1, "driver", "validation", "testing", "_validate (t.py:6)"))
    a = tr.assess(h, long=True)
    assert not a.over and a.limit_s == 540.0  # 3 x 180 s
    tr.add_reading(Reading(750.0, 1, "driver", "validation", "testing", "_validate (t.py:6)"))
    assert tr.assess(h, long=True).over


def test_the_offline_replay_of_the_saved_rounds_names_the_same_hang():
    """``analyze --stacks``: every round saved through the run, replayed with the steps."""
    tl = JobTimeline()
    now = tl.blocked_at + 120.0
    rounds = [tl.round(t).to_event(t, "n0") for t in range(int(tl.t0) + 5, int(now), 10)]
    overs = replay(rounds, tl.steps_until(now))
    assert overs and 0 < overs[0].time - tl.blocked_at <= 30.0
    flags = _flags(tl, rounds, now)
    assert [f.kind for f in flags] == ["hang"]
    assert "reward takes at most 0.80 s a step" in flags[0].evidence


def test_before_the_first_step_ends_nothing_is_judged():
    tl = JobTimeline(block_step=1)  # the reward of the warm-up step never returns
    events, _, _ = _play(tl, tl.blocked_at + 300.0)
    assert events == []
