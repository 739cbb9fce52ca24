"""memory_pressure, oom, gpu_fault and stalled on hand-made frames and events."""

import numpy as np
from detect_builders import CAPACITY, make_gpu, make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.health import (
    detect_gpu_fault,
    detect_memory_pressure,
    detect_oom,
    detect_stalled,
)
from monitor.frames import empty_gpu_frame, empty_host_frame
from monitor.records import TRAINING_PHASES, Event


def _ctx(steps, gpu=None, events=(), now=None):
    gpu = empty_gpu_frame() if gpu is None else gpu
    return make_context(steps, gpu, empty_host_frame(), list(events), load_config(), now)


def test_memory_near_capacity_is_flagged_with_the_gpus():
    steps = make_steps(30)

    def edit(df):
        sel = df["phase"].isin(TRAINING_PHASES) & (df["step"] >= 12) & df["gpu"].isin([2, 5])
        df.loc[sel, "mem_used_bytes"] = 0.975 * CAPACITY

    flags = detect_memory_pressure(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["gpus"] == [2, 5] and f.scope["steps"][0] == 12
    assert "98% of capacity" in f.evidence and f.severity == "critical"
    assert any("gpu_memory_utilization" in a for a in f.advice)


def test_verl_reserved_peak_near_capacity():
    steps = make_steps(20)
    for s in steps[10:]:
        s.mem_reserved_peak_bytes = 0.94 * CAPACITY
    flags = detect_memory_pressure(_ctx(steps, make_gpu(steps)))
    assert len(flags) == 1 and "reserved peak reached 94%" in flags[0].evidence
    assert flags[0].severity == "warning"


def test_a_short_memory_peak_and_normal_use_are_fine():
    steps = make_steps(20)

    def edit(df):
        sel = (df["phase"] == "update_actor") & (df["step"] == 8)
        df.loc[sel & (df["ts"] < df.loc[sel, "ts"].min() + 1.5), "mem_used_bytes"] = CAPACITY

    assert detect_memory_pressure(_ctx(steps, make_gpu(steps, edit=edit))) == []
    assert detect_memory_pressure(_ctx(steps)) == []


def test_oom_event_is_critical_and_stays_open_when_the_run_died():
    steps = make_steps(10)
    ev = Event("oom", steps[-1].end_time + 3, 10, "torch.OutOfMemoryError: CUDA out of memory.")
    flags = detect_oom(_ctx(steps, events=[ev]))
    assert len(flags) == 1
    f = flags[0]
    assert f.severity == "critical" and f.end is None and f.start == ev.time
    assert "CUDA out of memory" in f.evidence and "after step 10" in f.evidence


def test_ooms_close_together_are_one_flag_that_ends_when_training_goes_on():
    steps = make_steps(10)
    evs = [Event("oom", steps[3].end_time + 1 + i, 4, "CUDA out of memory") for i in range(3)]
    flags = detect_oom(_ctx(steps, events=evs))
    assert len(flags) == 1 and flags[0].end == steps[4].end_time
    assert flags[0].evidence.startswith("3 CUDA out-of-memory")
    assert detect_oom(_ctx(steps)) == []


def test_gpu_down_from_the_up_column():
    steps = make_steps(12)

    def edit(df):
        df["up"] = True
        df.loc[(df["gpu"] == 4) & (df["ts"] > steps[5].end_time), "up"] = False

    flags = detect_gpu_fault(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope == {"node": "n0", "gpus": [4]} and f.severity == "critical"
    assert "stopped answering" in f.evidence and f.end is None


def test_gpu_down_without_extras_is_seen_from_missing_readings():
    steps = make_steps(12)

    def edit(df):
        sel = (df["gpu"] == 1) & (df["ts"] > steps[5].end_time)
        df.loc[sel, ["util", "sm_active", "mem_used_bytes"]] = np.nan

    flags = detect_gpu_fault(_ctx(steps, make_gpu(steps, edit=edit)))
    assert [f.scope["gpus"] for f in flags] == [[1]]


def test_xid_counts_and_throttling_dicts_from_the_exporter():
    steps = make_steps(12)
    t_xid = steps[3].end_time

    def edit(df):
        df["xid"] = [{} for _ in range(len(df))]
        df["clock_events"] = [{"sw_power_cap": True} for _ in range(len(df))]
        hit = (df["gpu"] == 6) & (df["ts"] >= t_xid)
        df.loc[hit, "xid"] = [{94: 1} for _ in range(int(hit.sum()))]
        hot = (df["gpu"] == 2) & (df["ts"] >= steps[6].end_time)
        df.loc[hot, "clock_events"] = [{"hw_thermal_slowdown": True} for _ in range(int(hot.sum()))]

    flags = detect_gpu_fault(_ctx(steps, make_gpu(steps, edit=edit)))
    by_gpu = {f.scope["gpus"][0]: f for f in flags}
    assert set(by_gpu) == {2, 6}  # the software power cap alone is not a fault
    assert "XID error(s) 94" in by_gpu[6].evidence and by_gpu[6].severity == "critical"
    assert by_gpu[6].start == t_xid
    assert "hw_thermal_slowdown" in by_gpu[2].evidence and by_gpu[2].severity == "warning"


def test_xid_as_a_plain_code_and_no_extras_at_all():
    steps = make_steps(12)

    def edit(df):
        df["xid"] = 0
        df.loc[(df["gpu"] == 3) & (df["ts"] >= steps[8].end_time), "xid"] = 79

    flags = detect_gpu_fault(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1 and "79" in flags[0].evidence
    assert detect_gpu_fault(_ctx(steps, make_gpu(steps))) == []


def test_a_gpu_that_stops_reporting():
    steps = make_steps(12)
    gpu = make_gpu(steps)
    gpu = gpu[~((gpu["gpu"] == 7) & (gpu["ts"] > steps[4].end_time))]
    flags = detect_gpu_fault(_ctx(steps, gpu))
    assert len(flags) == 1 and "no sample" in flags[0].evidence


def test_no_new_step_for_minutes_is_a_stall():
    steps = make_steps(20)
    gpu = make_gpu(steps, tail_s=600)
    flags = detect_stalled(_ctx(steps, gpu))
    assert len(flags) == 1
    f = flags[0]
    assert f.end is None and f.start == steps[-1].end_time + 180  # 3 x 30 s, at least 3 min
    assert "after step 20" in f.evidence


def test_a_gap_in_the_middle_closes_when_steps_come_back():
    late = make_steps(10, t0=make_steps(10)[-1].end_time + 400)
    steps = make_steps(10) + [type(s)(**{**s.__dict__, "step": s.step + 10}) for s in late]
    flags = detect_stalled(_ctx(steps))
    assert len(flags) == 1 and flags[0].end == steps[10].end_time
    assert "resumed" in flags[0].evidence


def _long_warm_up(time_source):
    """20 steps of 30 s whose first three took 7 min each by their own timers."""
    def edit(i, ph):
        if i <= 3:
            for name in ph:
                ph[name] *= 14

    steps = make_steps(20, edit=edit)
    for s in steps:
        s.time_source = time_source
    return steps


def test_a_timeline_rebuilt_from_the_step_timers_shows_no_stall():
    """A log without a clock (wandb's capture): each gap is the step's own time by
    construction; a 7-minute warm-up step is no stall (before: 'No new step for 7.0 min')."""
    assert detect_stalled(_ctx(_long_warm_up("rebuilt"))) == []


def test_a_dated_gap_the_steps_own_timer_covers_is_no_stall():
    """Dated lines 7 min apart around a step that says it ran 7 min: it ran, nothing
    stalled. A gap longer than the step's timer by minutes still is one."""
    steps = _long_warm_up("line")
    assert detect_stalled(_ctx(steps)) == []
    for s in steps[10:]:
        s.end_time += 400.0  # 400 s of silence before step 11 that no timer covers
    flags = detect_stalled(_ctx(steps))
    assert len(flags) == 1 and "after step 10" in flags[0].evidence


def test_steady_run_is_not_stalled_and_now_decides():
    steps = make_steps(20)
    assert detect_stalled(_ctx(steps)) == []
    flags = detect_stalled(_ctx(steps, now=steps[-1].end_time + 1000))
    assert len(flags) == 1 and flags[0].severity == "critical"


def test_all_gpus_idle_with_a_silent_log_and_no_steps_yet():
    steps = make_steps(20)

    def edit(df):
        df["util"] = 0.5
        df["sm_active"] = 0.2

    flags = detect_stalled(_ctx([], make_gpu(steps, edit=edit)))
    assert len(flags) == 1 and "All GPUs idle" in flags[0].evidence
    events = [Event("progress", s.end_time, s.step) for s in steps]
    assert detect_stalled(_ctx([], make_gpu(steps, edit=edit), events=events)) == []
