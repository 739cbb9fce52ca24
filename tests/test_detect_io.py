"""io_starvation: GPU troughs with a pegged host, and unexplained step time that grows."""

from detect_builders import make_gpu, make_host, make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.io import detect_io_starvation
from monitor.frames import empty_gpu_frame, empty_host_frame
from monitor.records import TRAINING_PHASES


def _ctx(steps, gpu, host, job_config=None, actors=("TaskRunner",)):
    """The builders' steps as verl's synchronous trainer prints them (its driver TaskRunner)."""
    return make_context(steps, gpu, host, [], load_config(), job_config=job_config,
                        actors=actors)


def _troughs(from_step):
    def edit(df):
        busy = df["phase"].isin(TRAINING_PHASES + ("gen",)) & (df["step"] >= from_step)
        trough = (df["ts"] % 3.0) < 1.0
        df.loc[busy & trough, ["util", "sm_active"]] = [3.0, 1.0]
    return edit


def _pegged(after):
    def edit(h):
        h.loc[h["ts"] >= after, "cpu_max_core_pct"] = 99.5
        h.loc[h["ts"] >= after, "iowait_pct"] = 30.0
    return edit


def test_troughs_while_a_core_is_pegged():
    steps = make_steps(30)
    gpu = make_gpu(steps, edit=_troughs(12))
    host = make_host(gpu, edit=_pegged(steps[10].end_time))
    flags = detect_io_starvation(_ctx(steps, gpu, host))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["steps"][0] == 12
    assert "busiest CPU core averaged 100%" in f.evidence and "iowait 30%" in f.evidence
    assert any("data.dataloader_num_workers" in a for a in f.advice)


def test_troughs_with_an_idle_host_or_a_busy_host_alone_are_not_starvation():
    steps = make_steps(30)
    gpu = make_gpu(steps, edit=_troughs(12))
    assert detect_io_starvation(_ctx(steps, gpu, make_host(gpu))) == []
    healthy = make_gpu(steps)
    assert detect_io_starvation(_ctx(steps, healthy, make_host(
        healthy, edit=_pegged(steps[10].end_time)))) == []
    # no host samples at all: only the step-time rule can speak
    assert detect_io_starvation(_ctx(steps, gpu, empty_host_frame())) == []


def test_a_growing_share_of_unexplained_step_time():
    def edit(i, ph):
        if i >= 15:
            ph["other"] = 1.5 + 0.9 * (i - 14)

    steps = make_steps(35, edit=edit)
    flags = detect_io_starvation(_ctx(steps, empty_gpu_frame(), empty_host_frame()))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["phase"] == "other"
    assert "went to no logged phase" in f.evidence
    assert f.severity == "critical"  # it ends above 30% of the step


def test_a_constant_other_share_is_the_runs_normal():
    steps = make_steps(30, shares={"gen": 0.5, "update_actor": 0.25, "other": 0.25})
    assert detect_io_starvation(_ctx(steps, empty_gpu_frame(), empty_host_frame())) == []


def _stalled_steps(stall_s=5.0, steps=range(10, 16), n=24, step_s=20.0):
    """Steps whose batch fetch (before the step timer) takes ``stall_s`` on ``steps``."""
    recs = make_steps(n=n, step_s=step_s)
    shift = 0.0
    for r in recs:
        if r.step in steps:
            shift += stall_s
        r.end_time += shift
    return recs


def test_a_data_stall_before_the_step_timer_is_flagged_with_host_evidence():
    steps = _stalled_steps()
    gpu = make_gpu(steps, n_gpus=2)
    host = make_host(gpu, edit=_pegged(0))
    flags = detect_io_starvation(_ctx(steps, gpu, host))
    wait = [f for f in flags if f.scope.get("phase") == "data_wait"]
    assert len(wait) == 1
    f = wait[0]
    assert f.scope["steps"][0] in (10, 11) and f.scope["steps"][1] == 15
    assert "5.0 s per step passed before the step timer started" in f.evidence
    assert "busiest CPU core averaged 100%" in f.evidence
    assert any("data.dataloader_num_workers" in a for a in f.advice)


def _data_wait_flags(ctx):
    return [f for f in detect_io_starvation(ctx) if f.scope.get("phase") == "data_wait"]


def test_a_gap_before_the_timer_is_no_data_stall_where_the_trainer_fetches_no_batch_there():
    """The same 5 s gaps: verl's V1 trainer fetches its batch inside the step timer, the
    fully-async trainer takes samples from its queue inside timing_s/gen; neither waited on a
    data loader between steps, so neither gets the data-wait reading (issue 37)."""
    steps = _stalled_steps()
    gpu = make_gpu(steps, n_gpus=2)
    host = make_host(gpu, edit=_pegged(0))
    assert len(_data_wait_flags(_ctx(steps, gpu, host))) == 1  # the legacy trainer: flagged
    v1 = _ctx(steps, gpu, host, job_config={"trainer": {"use_v1": True}}, actors=())
    assert _data_wait_flags(v1) == []
    assert any(j.premise == "fetches_batches_before_timer" and j.holds is False
               and "V1" in j.why for j in v1.judged)
    assert _data_wait_flags(_ctx(steps, gpu, host, actors=("TaskRunnerV1",))) == []
    for r in steps:
        r.metrics = {"fully_async/trainer/idle_ratio": 0.1, "timing_s/step": r.total}
    fa = _ctx(steps, gpu, host, actors=())
    assert _data_wait_flags(fa) == []
    assert any("message queue" in j.why for j in fa.judged)


def test_a_gap_before_the_timer_is_not_read_where_nothing_says_which_trainer_ran():
    """No printed config, no driver name, keys of no known version: unknown, so nothing is
    raised, and the premise is kept with why (the report's "not judged" list)."""
    steps = _stalled_steps()
    gpu = make_gpu(steps, n_gpus=2)
    ctx = _ctx(steps, gpu, make_host(gpu, edit=_pegged(0)), actors=())
    assert _data_wait_flags(ctx) == []
    (j,) = [j for j in ctx.judged if j.premise == "fetches_batches_before_timer"]
    assert j.holds is None and "trainer.use_v1" in j.why


def test_steps_back_to_back_or_without_measured_times_raise_no_data_wait():
    steps = make_steps(n=24, step_s=20.0)
    gpu = make_gpu(steps, n_gpus=2)
    assert not [f for f in detect_io_starvation(_ctx(steps, gpu, make_host(gpu)))
                if f.scope.get("phase") == "data_wait"]
    rebuilt = _stalled_steps()
    for r in rebuilt:
        r.time_source = "rebuilt"
    assert not [f for f in detect_io_starvation(_ctx(rebuilt, gpu, make_host(gpu)))
                if f.scope.get("phase") == "data_wait"]


def test_no_io_starvation_on_a_trainer_that_loads_no_batches():
    """A real fully-async run (2 h 55) got io_starvation ("81 s a step in no logged phase"):
    its trainer takes samples from the rollouter's queue, it loads no batches (issue 37)."""
    from monitor.detect import run_all

    def edit(i, ph):
        ph["other"] = 2.0 if i < 15 else 14.0

    steps = make_steps(30, shares={"gen": 0.5, "update_actor": 0.25, "other": 0.25}, edit=edit)
    for r in steps:
        r.metrics = {"timing_s/step": r.total, "timing_s/gen": r.phases["gen"]}
    assert "io_starvation" in {f.kind for f in run_all(steps, None, None, [],
                                                         actors=("TaskRunner",))}
    for r in steps:
        r.metrics = {"fully_async/trainer/idle_ratio": 0.2, "timing_s/step": r.total}
    judged: list = []
    assert "io_starvation" not in {f.kind for f in run_all(steps, None, None, [],
                                                             judged=judged)}
    assert any(j.reading == "io_starvation" and j.premise == "loads_batches"
               and j.holds is False for j in judged)
