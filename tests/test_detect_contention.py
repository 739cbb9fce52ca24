"""A process joining a GPU mid-run and slowing the steps: gpu_imbalance names the GPU and PID."""

from __future__ import annotations

from detect_builders import make_steps

from monitor.config import load_config
from monitor.detect import make_context, run_all
from monitor.detect.contention import contention_flags
from monitor.frames import empty_gpu_frame, empty_host_frame
from monitor.records import Event


def _steps(factor: float, slow=range(4, 8)):
    def edit(i, ph):
        if i in slow:
            for k in ph:
                ph[k] *= factor
    return make_steps(10, step_s=5.0, edit=edit)


def _events(steps, first=4, last=7, pid=4242, gpu=0, exits=True):
    by = {s.step: s for s in steps}
    start = by[first].end_time - by[first].total + 1.0
    data = {"node": "n0", "gpu": gpu, "pid": pid, "name": "python3", "used_bytes": 2 << 30}
    out = [Event("gpu_process_started", start, data=data)]
    if exits:
        out.append(Event("gpu_process_exited", by[last].end_time - 0.5, data=data))
    return out


def _flags(steps, events):
    ctx = make_context(steps, empty_gpu_frame(), empty_host_frame(), events, load_config())
    return contention_flags(ctx)


def test_a_process_that_slows_the_steps_it_overlaps_is_named_with_its_gpu():
    steps = _steps(1.4)
    flags = _flags(steps, _events(steps))
    assert len(flags) == 1
    f = flags[0]
    assert (f.kind, f.severity) == ("gpu_imbalance", "warning")
    assert f.scope == {"node": "n0", "gpus": [0], "steps": [4, 7]}
    assert "process 4242 (python3), holding 2.0 GiB, started on GPU 0 during step 4" in f.evidence
    assert "+40%" in f.evidence and f.end is not None
    assert "nvidia-smi" in f.advice[0]


def test_a_much_slower_run_is_critical_and_stays_open_while_the_process_runs():
    steps = _steps(1.8, slow=range(4, 11))
    f = _flags(steps, _events(steps, exits=False))[0]
    assert f.severity == "critical" and f.end is None and f.scope["steps"] == [4, 10]


def test_no_flag_without_a_slowdown_or_for_the_jobs_own_processes():
    steps = _steps(1.05)
    assert _flags(steps, _events(steps)) == []
    slow = _steps(1.4, slow=range(2, 11))
    assert _flags(slow, _events(slow, first=1)) == []  # there by the end of step 1: the job


def test_run_all_reports_it_once_on_a_single_gpu():
    steps = _steps(1.5)
    flags = run_all(steps, empty_gpu_frame(), empty_host_frame(), _events(steps))
    alarms = [f for f in flags if f.severity != "info"]
    assert [f.kind for f in alarms] == ["gpu_imbalance"], [(f.kind, f.evidence) for f in flags]


def test_the_job_restarting_is_not_another_process():
    steps = _steps(1.4)
    by = {s.step: s for s in steps}
    own = {"node": "n0", "gpu": 0, "pid": 100, "name": "python3", "used_bytes": 1 << 30}
    gone = Event("gpu_process_exited", by[3].end_time + 0.2, data=own)
    assert _flags(steps, [gone, *_events(steps)]) == []
    resumed = Event("resume", by[3].end_time + 0.1, step=3)
    assert _flags(steps, [resumed, *_events(steps)]) == []


def test_a_straggler_on_the_shared_gpu_is_told_in_the_process_flag():
    """Two GPUs; another process on GPU 1 slows its update (GPU 0 waits in the all-reduce):
    one gpu_imbalance flag for GPU 1, the process's, carrying the straggler's evidence."""
    from detect_builders import make_gpu

    steps = _steps(1.4)

    def slow_gpu1(df):
        sel = (df["phase"] == "update_actor") & (df["step"] >= 4) & (df["step"] <= 7)
        df.loc[sel & (df["gpu"] == 1), ["util", "sm_active"]] = [99.0, 92.0]
        df.loc[sel & (df["gpu"] == 0), ["util", "sm_active"]] = [99.0, 50.0]

    gpu = make_gpu(steps, n_gpus=2, interval=0.25, edit=slow_gpu1)
    flags = [f for f in run_all(steps, gpu, empty_host_frame(), _events(steps, gpu=1))
             if f.kind == "gpu_imbalance"]
    assert len(flags) == 1, [(f.scope, f.evidence[:80]) for f in flags]
    f = flags[0]
    assert f.scope["gpus"] == [1] and "process 4242" in f.evidence
    assert "GPU 1 is the straggler in update_actor" in f.evidence
