"""rollout_long_tail and rollout_wait on hand-made steps and frames."""

from detect_builders import make_gpu, make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.rollout_detectors import detect_rollout_long_tail, detect_rollout_wait
from monitor.frames import empty_gpu_frame, empty_host_frame

SLOWEST = "timing_s/agent_loop/slowest/generate_sequences"
MEAN = "timing_s/agent_loop/generate_sequences/mean"


def _ctx(steps, gpu=None):
    gpu = empty_gpu_frame() if gpu is None else gpu
    return make_context(steps, gpu, empty_host_frame(), [], load_config())


def test_agent_loop_slowest_vs_mean_opens_a_long_tail_flag():
    def metrics(i):
        return {SLOWEST: 15.0, MEAN: 3.0 if i >= 10 else 8.0}

    steps = make_steps(20, metrics=metrics)
    flags = detect_rollout_long_tail(_ctx(steps))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope == {"phase": "gen", "steps": [10, 20]}
    assert "5.0x the mean" in f.evidence
    assert f.severity == "critical"
    assert f.start == steps[10].end_time  # two steps of persistence


def test_gpus_falling_idle_one_by_one_during_gen():
    steps = make_steps(20)

    def edit(df):
        gen = (df["phase"] == "gen") & (df["step"] >= 8)
        # GPU g stops generating after (25 + 8 g)% of gen; GPU 7 works to the end
        for g in range(7):
            step_start = df["step"].map({s.step: s.end_time - s.total for s in steps})
            frac = (df["ts"] - step_start) / 15.0
            sel = gen & (df["gpu"] == g) & (frac > 0.25 + 0.08 * g)
            df.loc[sel, ["util", "sm_active"]] = [2.0, 1.0]

    flags = detect_rollout_long_tail(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1
    assert flags[0].scope["steps"][0] == 8
    assert "minority of GPUs" in flags[0].evidence


def test_healthy_gen_and_missing_signals_give_nothing():
    steps = make_steps(20, metrics=lambda i: {SLOWEST: 10.0, MEAN: 6.0})
    assert detect_rollout_long_tail(_ctx(steps, make_gpu(steps))) == []
    # no agent-loop keys, no response lengths, no GPU data: nothing to judge
    assert detect_rollout_long_tail(_ctx(make_steps(20))) == []
    # no gen phase at all
    bare = make_steps(20, shares={"update_actor": 1.0})
    assert detect_rollout_long_tail(_ctx(bare, make_gpu(bare))) == []


def test_response_length_ratio_is_used_without_gpu_data():
    steps = make_steps(12, metrics=lambda i: {"response_length/max": 4096.0,
                                              "response_length/mean": 400.0 if i > 5 else 900.0})
    flags = detect_rollout_long_tail(_ctx(steps))
    assert len(flags) == 1 and "longest response" in flags[0].evidence


def _wait(seconds_by_step):
    def edit(i, phases):
        phases["rollout_wait"] = seconds_by_step(i)
    return edit


def test_rollout_wait_above_50ms_per_step():
    steps = make_steps(20, edit=_wait(lambda i: 0.4 if i >= 6 else 0.01))
    flags = detect_rollout_wait(_ctx(steps))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["steps"] == [6, 20] and "400 ms" in f.evidence
    assert f.severity == "warning"
    assert f.start == steps[7].end_time  # three steps of persistence


def test_rollout_wait_below_limit_or_absent():
    assert detect_rollout_wait(_ctx(make_steps(20, edit=_wait(lambda i: 0.02)))) == []
    assert detect_rollout_wait(_ctx(make_steps(20))) == []


def test_rollout_wait_huge_share_is_critical_and_one_blip_is_ignored():
    steps = make_steps(20, edit=_wait(lambda i: 6.0 if i >= 10 else (0.5 if i == 4 else 0.01)))
    flags = detect_rollout_wait(_ctx(steps))
    assert len(flags) == 1 and flags[0].severity == "critical"
    assert flags[0].scope["steps"][0] == 10
