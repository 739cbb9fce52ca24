"""Premises (issue 37): each detector states what must be true of the job for a reading to
apply, and nothing is raised where a premise fails or cannot be judged; the report lists what
could not be judged and why."""

from __future__ import annotations

import pytest
from detect_builders import make_gpu, make_steps

from monitor.config import load_config
from monitor.detect import DETECTORS, make_context, run_all
from monitor.detect.premise_tables import TABLES
from monitor.detect.premises import PREMISE_LIBRARY, advice_premises, configured_gpus
from monitor.frames import empty_host_frame
from monitor.report import premises_section


def _collective_tail(from_step: int, seconds: float):
    """The last ``seconds`` of update_actor at util 88 / SM 15: what collectives look like."""
    def edit(df):
        ends = df[df["phase"] == "update_actor"].groupby("step")["ts"].max()
        end = df["step"].map(ends)
        sel = (df["phase"] == "update_actor") & (df["step"] >= from_step) & (
            df["ts"] > end - seconds)
        df.loc[sel, ["util", "sm_active"]] = [88.0, 15.0]
    return edit


def _comm_run(n_gpus: int = 1):
    def edit(i, ph):
        if i >= 10:
            ph["update_actor"] += 12.0

    steps = make_steps(25, edit=edit)
    return steps, make_gpu(steps, n_gpus=n_gpus, edit=_collective_tail(10, 12.0))


def _kinds(flags):
    return {f.kind for f in flags}


def test_every_detector_has_a_premise_table_of_known_premises():
    assert set(DETECTORS) <= set(TABLES)
    for reading, premises in TABLES.items():
        for p in premises:
            assert PREMISE_LIBRARY[p.key] is p, reading
            assert p.needs, p.key


def test_comm_heavy_needs_more_than_one_gpu_talking():
    """Real one-GPU verl runs got comm_heavy from the GPUs' collective-like tail and the advice
    "lower tensor_model_parallel_size (1 in this job)": a one-GPU job has no collective."""
    steps, gpu = _comm_run(n_gpus=1)
    one = {"trainer": {"n_gpus_per_node": 1, "nnodes": 1}}
    judged: list = []
    flags = run_all(steps, gpu, empty_host_frame(), [], load_config(), job_config=one,
                    judged=judged)
    assert "comm_heavy" not in _kinds(flags)
    (j,) = [j for j in judged if j.reading == "comm_heavy"]
    assert j.holds is False and "1 GPU" in j.why
    eight = {"trainer": {"n_gpus_per_node": 8, "nnodes": 1}}
    assert "comm_heavy" in _kinds(run_all(steps, gpu, empty_host_frame(), [], load_config(),
                                          job_config=eight))


def test_a_premise_that_cannot_be_judged_raises_nothing_and_says_why():
    steps, gpu = _comm_run(n_gpus=1)
    judged: list = []
    flags = run_all(steps, gpu, empty_host_frame(), [], load_config(), judged=judged)
    assert "comm_heavy" not in _kinds(flags)
    text = premises_section([j.to_dict() for j in judged if j.holds is not True])
    assert "comm_heavy: unknown: needs more than one GPU talking" in text
    assert "no printed config" in text
    # two GPUs sampled: the job has more than one GPU, the reading applies
    steps, gpu2 = _comm_run(n_gpus=2)
    assert "comm_heavy" in _kinds(run_all(steps, gpu2, empty_host_frame(), [], load_config()))


@pytest.mark.parametrize("config,expected", [
    ({"trainer.n_gpus_per_node": 8, "trainer.nnodes": 2}, 16),
    ({"trainer.n_gpus_per_node": 4, "trainer.nnodes": 1, "rollout.n_gpus_per_node": 4,
      "rollout.nnodes": 1}, 8),
    ({"trainer.nnodes": 2}, None),
])
def test_the_jobs_gpus_come_from_its_printed_config(config, expected):
    assert configured_gpus(config) == expected


def test_advice_to_lower_a_knob_already_at_its_floor_does_not_apply():
    steps, gpu = _comm_run(n_gpus=2)
    ctx = make_context(steps, gpu, None, [], load_config(), job_config={
        "actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 1}}})
    advice = ["Communication dominates the step: lower actor_rollout_ref.rollout."
              "tensor_model_parallel_size if the model fits.",
              "Larger micro-batches (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)."]
    assert advice_premises(ctx, advice) == advice[1:]
    ctx4 = make_context(steps, gpu, None, [], load_config(), job_config={
        "actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 4}}})
    assert advice_premises(ctx4, advice) == advice


def test_dataloader_advice_needs_a_trainer_that_loads_batches():
    steps, gpu = _comm_run(n_gpus=2)
    for r in steps:
        r.metrics = {"fully_async/trainer/idle_ratio": 0.2, "timing_s/step": r.total}
    ctx = make_context(steps, gpu, None, [], load_config())
    advice = ["Raise data.dataloader_num_workers so batches are ready.", "Check the disk."]
    assert advice_premises(ctx, advice) == ["Check the disk."]


def _silent_run(source: str):
    """20 steps of 30 s, then 10 minutes without a step before step 21."""
    steps = make_steps(21, step_s=30.0)
    steps[-1].end_time += 600.0
    for s in steps:
        s.time_source = source
    return steps


def test_a_silence_is_a_stall_only_where_a_clock_measured_it():
    judged: list = []
    flags = run_all(_silent_run("line"), None, None, [], load_config(), judged=judged)
    assert "stalled" in _kinds(flags)
    judged = []
    flags = run_all(_silent_run("rebuilt"), None, None, [], load_config(), judged=judged)
    assert "stalled" not in _kinds(flags)


def test_a_silence_after_the_run_finished_is_no_stall():
    from monitor.records import Event

    steps = make_steps(20, step_s=30.0)
    for s in steps:
        s.time_source = "line"
    end = steps[-1].end_time
    done = Event("progress", end, data={"current": 20, "total": 20, "percent": 100.0})
    now = end + 1800.0
    judged: list = []
    flags = run_all(steps, None, None, [done], load_config(), now=now, judged=judged)
    assert "stalled" not in _kinds(flags)
    assert "stalled" in _kinds(run_all(steps, None, None, [], load_config(), now=now))


def test_the_long_last_step_that_ended_the_run_is_no_stall():
    """A real 18-step run: step 18 validated for 27 min and saved before its line; the bar
    reached 18/18 first. The silence after step 17 is that last step, not a stall."""
    from monitor.records import Event

    steps = make_steps(18, step_s=200.0)
    for s in steps:
        s.time_source = "line"
    steps[-1].phases["testing"] = 1624.0
    steps[-1].end_time += 1624.0
    done = Event("progress", steps[-1].end_time - 180.0,
                 data={"current": 18, "total": 18, "percent": 100.0})
    flags = run_all(steps, None, None, [done], load_config(), now=steps[-1].end_time)
    assert "stalled" not in _kinds(flags)
