"""monitor/hang/dwell.py: holds, each place's normal time and its limit, as pure functions."""

from __future__ import annotations

import math

import pandas as pd

from monitor.detect import make_context
from monitor.detect.hang import detect_hang
from monitor.hang.dwell import DwellTracker, HoldLimits, Reading, frame_function
from monitor.records import Event, StepRecord


def _r(t: float, place: str = "reward", phase: str = "reward",
       frame: str = "compute_score (user_reward.py:10)", pid: int = 1) -> Reading:
    return Reading(t, pid, "driver", place, phase, frame)


def test_a_frames_line_is_left_out_of_its_place():
    assert frame_function("compute_score (user_reward.py:10)") == "compute_score (user_reward.py)"
    assert _r(0, frame="f (a.py:1)").key == _r(0, frame="f (a.py:2)").key
    assert _r(0, frame="f (a.py:1)").key != _r(0, frame="g (a.py:1)").key


def test_a_place_held_past_twice_its_step_timer_plus_10_s_and_15_s_at_least_is_over():
    tr = DwellTracker()
    tr.add_step(100.0, {"reward": 0.8, "gen": 90.0})
    h = tr.add_reading(_r(110.0))
    for t in (120.0, 124.0):
        tr.add_reading(_r(t))
    a = tr.assess(h)
    assert (a.normal_s, a.source, a.limit_s, a.over) == (0.8, "timer", 15.0, False)
    tr.add_reading(_r(125.0))
    a = tr.assess(h)
    assert a.over and a.due == 125.0
    assert a.words() == ("in compute_score for 15 s; reward takes at most 0.80 s a step in "
                         "this run (limit 15 s)")
    assert HoldLimits().limit(90.0, False, True) == 180.0  # 2 x 90 s
    assert HoldLimits().limit(20.0, False, True) == 40.0


def test_a_step_that_ends_between_two_readings_cuts_the_hold_even_when_its_line_comes_late():
    tr = DwellTracker()
    tr.add_step(50.0, {"gen": 40.0})
    tr.add_reading(_r(60.0, "worker_call", "", "fit (t.py:1)"))
    tr.add_step(65.0, {"gen": 40.0})  # arrives in time: the next reading starts a new hold
    h = tr.add_reading(_r(70.0, "worker_call", "", "fit (t.py:1)"))
    assert h.since == 70.0
    h = tr.add_reading(_r(90.0, "worker_call", "", "fit (t.py:1)"))
    tr.add_step(85.0, {"gen": 40.0})  # the log line of a step that ended before 90 s, late
    assert tr.holds[1].since == 90.0 and tr.held_longest[h.key] == 0.0


def test_the_place_normally_takes_its_longest_earlier_hold_when_longer_than_its_timer():
    tr = DwellTracker()
    tr.add_step(10.0, {"update_actor": 5.0})
    key_frame = "fit (t.py:1)"
    tr.add_reading(_r(20.0, "worker_call", "update_actor", key_frame))
    tr.add_reading(_r(50.0, "worker_call", "update_actor", key_frame))
    tr.add_step(55.0, {"update_actor": 5.0})
    h = tr.add_reading(_r(60.0, "worker_call", "update_actor", key_frame))
    a = tr.assess(h)
    assert (a.normal_s, a.source, a.limit_s) == (30.0, "hold", 60.0)
    assert "it was held at most 30 s before in this run" in a.words()


def test_a_place_never_seen_and_a_long_place_seen_for_the_first_time():
    tr = DwellTracker()
    tr.add_step(10.0, {})
    h = tr.add_reading(_r(20.0, "dataloader", "data_wait", "__getitem__ (d.py:3)"))
    a = tr.assess(h)
    assert (a.source, a.limit_s) == ("", 15.0) and "never held before" in a.words()
    h = tr.add_reading(_r(30.0, "checkpoint", "save_checkpoint", "save (c.py:1)", pid=2))
    tr.add_reading(_r(400.0, "checkpoint", "save_checkpoint", "save (c.py:1)", pid=2))
    a = tr.assess(h)
    assert a.long and math.isinf(a.limit_s) and not a.over and a.due is None


def test_nothing_is_judged_before_the_first_step_ends_the_warm_up():
    tr = DwellTracker()
    h = tr.add_reading(_r(0.0))
    tr.add_reading(_r(300.0))
    assert not tr.assess(h).over and tr.assess(h).warmup
    tr.add_step(400.0, {"reward": 0.5})  # after the hold began: still the warm-up's hold
    assert not tr.assess(h).over


def _over(t: float, since: float, place: str, stuck: bool, long: bool) -> Event:
    where = {"stuck": stuck, "place": place, "phase": "save_checkpoint", "long_phase": long,
             "who": [{"pid": 7, "role": "worker", "place": place,
                      "frame": "save (verl/utils/checkpoint/m.py:3)"}], "others": []}
    hold = {"since": since, "held_s": t - since, "normal_s": 100.0, "source": "timer",
            "limit_s": 300.0, "over": True, "long": long, "words": "in save for 400 s; ..."}
    return Event("hang_dump", t, message="the worker (PID 7) is in checkpoint I/O",
                 data={"method": "py-spy", "node": "n0", "where": where, "hold": hold})


def _ctx(events, busy: bool):
    steps = [StepRecord(1, end_time=1000.0, total=50.0, phases={"save_checkpoint": 100.0})]
    ts = [1000.0 + i for i in range(500)]
    gpu = pd.DataFrame({"ts": ts, "node": "n0", "gpu": 0, "util": 98.0 if busy else 0.0,
                        "sm_active": 70.0 if busy else 0.0})
    return make_context(steps, gpu, None, events, now=1500.0)


def test_a_long_place_over_its_history_is_a_hang_only_while_no_gpu_computes():
    ev = _over(1410.0, 1010.0, "checkpoint", False, True)
    assert detect_hang(_ctx([ev], busy=True)) == []
    flags = detect_hang(_ctx([ev], busy=False))
    assert [f.kind for f in flags] == ["hang"] and flags[0].start == 1410.0
    assert "Held past its normal time: in save for 400 s" in flags[0].evidence


def test_the_data_loader_place_normally_takes_the_longest_wait_before_a_step():
    tr = DwellTracker()
    tr.add_steps([StepRecord(1, end_time=100.0, total=50.0, data_wait=12.0)])
    h = tr.add_reading(_r(110.0, "dataloader", "data_wait", "_next_data (fit.py:3)"))
    a = tr.assess(h)
    assert (a.normal_s, a.source, a.limit_s) == (12.0, "timer", 24.0)
