"""Data wait: the wall time before a step's timer that no verl timer covers."""

from monitor.logs.gaps import DataWaitTracker, covered_seconds, data_wait, fill_data_wait
from monitor.records import StepRecord


def _step(n, end, total, source="arrival", **phases):
    return StepRecord(step=n, end_time=end, total=total, phases=dict(phases), time_source=source)


def test_a_stall_before_the_timer_is_the_gap_less_the_step_time():
    prev = _step(3, 100.0, 10.0)
    rec = _step(4, 115.2, 10.0)  # 5.2 s passed before step 4's timer started
    assert abs(data_wait(prev, rec) - 5.15) < 1e-6


def test_back_to_back_steps_wait_nothing():
    assert data_wait(_step(1, 100.0, 10.0), _step(2, 110.0, 10.0)) == 0.0


def test_rebuilt_end_times_resumes_and_bursts_are_unknown_not_zero():
    # no timestamps: end times rebuilt from the step times themselves say nothing of the gap
    assert data_wait(_step(1, 100.0, 10.0, "rebuilt"), _step(2, 115.0, 10.0, "rebuilt")) is None
    # a resume: the step number goes back, the previous line is another run's
    assert data_wait(_step(9, 100.0, 10.0), _step(3, 150.0, 10.0)) is None
    # lines read in one burst when following starts arrive together: not comparable
    assert data_wait(_step(1, 100.0, 10.0), _step(2, 100.01, 10.0)) is None


def test_testing_and_checkpoint_time_outside_the_step_timer_is_not_a_data_wait():
    # 0.6+: timing_s/step excludes testing and save_checkpoint
    rec = _step(5, 138.0, 10.0, gen=6.0, update_actor=4.0, testing=20.0, save_checkpoint=8.0)
    assert covered_seconds(rec) == 38.0
    assert data_wait(_step(4, 100.0, 10.0), rec) == 0.0
    # older versions count them inside the step time
    old = _step(5, 140.0, 38.0, gen=6.0, update_actor=4.0, testing=20.0, save_checkpoint=8.0)
    assert covered_seconds(old) == 38.0


def test_fill_keeps_live_values_and_the_tracker_measures_on_arrival():
    a, b, c = _step(1, 100.0, 10.0), _step(2, 116.0, 10.0), _step(3, 126.0, 10.0)
    c.data_wait = 7.0  # measured live already
    fill_data_wait([c, a, b])  # any order: by end time
    assert a.data_wait is None and round(b.data_wait, 2) == 5.95 and c.data_wait == 7.0
    tr = DataWaitTracker()
    x, y = _step(1, 10.0, 5.0), _step(2, 18.0, 5.0)
    assert tr.update(x) is None
    assert round(tr.update(y), 2) == 2.95


def test_a_replayed_simulation_scales_arrival_gaps_to_the_logs_own_seconds():
    # 30 s steps replayed at 15x arrive 2 wall seconds apart; a 0.5 s wall gap more is 7.5 s
    tr = DataWaitTracker(scale=15.0)
    tr.update(_step(1, 1000.0, 30.0))
    assert tr.update(_step(2, 1002.0, 30.0)) == 0.0
    assert round(tr.update(_step(3, 1004.5, 30.0)), 2) == 7.45
