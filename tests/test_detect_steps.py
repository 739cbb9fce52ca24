"""step_time_spikes and throughput_regression on hand-made steps."""

from detect_builders import make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.step_detectors import (
    detect_step_time_spikes,
    detect_throughput_regression,
    period_of,
)
from monitor.frames import empty_gpu_frame, empty_host_frame


def _ctx(steps):
    return make_context(steps, empty_gpu_frame(), empty_host_frame(), [], load_config())


def _jitter(i):
    return 1.0 + 0.01 * ((i * 7) % 5 - 2)


def test_periodic_spikes_are_flagged_with_their_period():
    def edit(i, ph):
        ph["gen"] *= _jitter(i)
        if i >= 10 and i % 5 == 0:
            ph["update_actor"] *= 2.6

    steps = make_steps(40, edit=edit)
    flags = detect_step_time_spikes(_ctx(steps))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["period_steps"] == 5
    assert "periodic, every 5 steps" in f.evidence
    assert f.scope["steps"][0] == 10
    # opens once the second spike (step 15) is confirmed by a normal step 16
    assert f.start == steps[15].end_time
    assert any("trainer.save_freq" in a for a in f.advice)


def test_a_lasting_change_of_level_is_not_a_spike():
    def edit(i, ph):
        ph["gen"] *= _jitter(i) * (1.6 if i >= 15 else 1.0)

    assert detect_step_time_spikes(_ctx(make_steps(40, edit=edit))) == []


def test_one_outlier_is_not_a_pattern_and_checkpoint_steps_are_expected():
    def edit(i, ph):
        ph["gen"] *= _jitter(i)
        if i == 20:
            ph["update_actor"] *= 3
        if i % 10 == 0:
            ph["save_checkpoint"] = 40.0  # periodic by design: left out of the step time

    assert detect_step_time_spikes(_ctx(make_steps(40, edit=edit))) == []


def test_irregular_spikes_say_so():
    def edit(i, ph):
        ph["gen"] *= _jitter(i)
        if i in (12, 19, 21 + 2, 31):
            ph["update_actor"] *= 3

    flags = detect_step_time_spikes(_ctx(make_steps(40, edit=edit)))
    assert len(flags) == 1 and "irregular" in flags[0].evidence
    assert flags[0].severity == "warning"


def test_period_of():
    assert period_of([5, 10, 15, 20]) == 5
    assert period_of([3, 4, 9, 20]) is None
    assert period_of([5, 10]) is None


def test_throughput_drop_against_the_runs_baseline():
    steps = make_steps(40, throughput=lambda i: 1000.0 * _jitter(i) * (0.7 if i >= 20 else 1.0))
    flags = detect_throughput_regression(_ctx(steps))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["steps"][0] == 20 and f.end is None
    assert "30% below" in f.evidence and "tokens/s" in f.evidence
    assert f.start == steps[21].end_time  # three steps of persistence
    assert f.severity == "warning"


def test_small_drops_and_recoveries():
    steps = make_steps(40, throughput=lambda i: 1000.0 * (0.9 if i >= 20 else 1.0))
    assert detect_throughput_regression(_ctx(steps)) == []
    steps = make_steps(40, throughput=lambda i: 1000.0 * (0.5 if 20 <= i < 26 else 1.0))
    flags = detect_throughput_regression(_ctx(steps))
    assert len(flags) == 1 and flags[0].end is not None and flags[0].severity == "critical"


def test_without_token_counts_the_step_rate_is_used():
    def edit(i, ph):
        ph["gen"] *= 2.0 if i >= 20 else 1.0

    steps = make_steps(40, edit=edit, throughput=lambda i: None)
    flags = detect_throughput_regression(_ctx(steps))
    assert len(flags) == 1 and "steps/h" in flags[0].evidence
    assert "no token counts" in flags[0].evidence


def test_too_few_steps_for_a_baseline():
    assert detect_throughput_regression(_ctx(make_steps(8))) == []
    assert detect_step_time_spikes(_ctx(make_steps(3))) == []


def test_a_drop_older_than_the_live_window_is_still_measured_against_the_runs_start():
    # the run lost 35% at step 20 and stayed there; a 30-minute live window holds steps 60-100
    steps = make_steps(100, throughput=lambda i: 1000.0 * _jitter(i) * (0.65 if i >= 20 else 1.0))
    window = steps[59:]
    # without the run's start the window is its own (degraded) baseline: nothing to see
    assert detect_throughput_regression(_ctx(window)) == []
    ctx = make_context(window, empty_gpu_frame(), empty_host_frame(), [], load_config(),
                       reference_steps=steps[:32])
    flags = detect_throughput_regression(ctx)
    assert len(flags) == 1
    f = flags[0]
    assert f.end is None and "35% below" in f.evidence
    assert "steps 3-12" in f.evidence  # the baseline named is the run's start
    assert f.scope["steps"][1] == 100


def test_reference_steps_change_nothing_while_the_window_holds_the_runs_start():
    steps = make_steps(40, throughput=lambda i: 1000.0 * _jitter(i) * (0.7 if i >= 20 else 1.0))
    ctx = make_context(steps, empty_gpu_frame(), empty_host_frame(), [], load_config(),
                       reference_steps=steps[:32])
    assert detect_throughput_regression(ctx) == detect_throughput_regression(_ctx(steps))


def test_one_step_that_held_the_job_is_named_as_what_it_was():
    """A single reward call held a real run 202 s at step 12 (its neighbours took about
    25 s): one step, so no periodic-spike flag, but it is named with its phase (issue 37)."""
    from monitor.detect import run_all

    def edit(i, ph):
        ph["reward"] = 202.0 if i == 12 else 2.0

    steps = make_steps(30, step_s=25.0, edit=edit)
    for s in steps:
        s.metrics = {"timing_s/step": s.total, "timing_s/reward": s.phases["reward"]}
    flags = [f for f in run_all(steps, None, None, [], load_config())
             if f.kind == "step_time_spikes"]
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["steps"] == [12, 12]
    assert "Step 12 held the job" in f.evidence and "its reward took 202 s" in f.evidence
    assert "timeout" in f.advice[0]


def test_a_slow_first_step_is_warm_up_not_an_outlier():
    def edit(i, ph):
        if i == 1:
            ph["gen"] = 300.0

    steps = make_steps(10, step_s=20.0, edit=edit)
    from monitor.detect import run_all

    assert not [f for f in run_all(steps, None, None, [], load_config())
                if f.kind == "step_time_spikes"]
