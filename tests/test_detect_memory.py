"""memory_creep: steady growth per step forecast to the capacity, a jump after a checkpoint save,
and flat runs that stay quiet (hand-made frames, the simulator, the real-GPU recordings)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitor.detect import run_all
from monitor.detect.memory import detect_memory_creep, forecast_text, theil_sen
from monitor.frames import read_gpu_frame
from monitor.logs.canonical_records import parse_file
from monitor.sim.engine import SimRun

sys.path.insert(0, str(Path(__file__).parent))
from detect_builders import make_gpu, make_steps  # noqa: E402

from monitor.detect import make_context  # noqa: E402

GIB = 1024**3
H200 = 140.4 * GIB


def _ctx(steps, edit, capacity=H200, n_gpus=2):
    def set_mem(df):
        df["mem_total_bytes"] = capacity
        edit(df)

    return make_context(steps, make_gpu(steps, n_gpus=n_gpus, edit=set_mem), None, [])


def _creeps(ctx):
    return [f for f in detect_memory_creep(ctx) if f.kind == "memory_creep"]


def test_the_issue_case_18_gib_per_step_is_forecast_to_run_out_within_a_step():
    # issue 23: 7.7 -> 115.7 GiB in six steps on an H200, nothing flagged before
    steps = make_steps(n=7, step_s=20.0)

    def grow(df):
        s = df["step"].fillna(1).clip(1, 7)
        df["mem_used_bytes"] = (7.7 + 18.0 * (s - 1)) * GIB

    flags = _creeps(_ctx(steps, grow))
    assert len(flags) == 1, flags
    f = flags[0]
    assert f.severity == "critical"
    assert "at +18.0 GiB per step, out of memory in about 1 step" in f.evidence
    assert "115.7 GiB of 140 GiB" in f.evidence
    assert f.scope["gpus"] == [0, 1] and "2 GPUs of this node grow alike" in f.evidence
    # past the two warm-up steps, it opens at the fourth fitted step, before the capacity line
    assert f.start <= steps[5].end_time + 1e-6
    # the leak first; no save or validation ran, so their frequencies are not advised
    assert f.advice[0].startswith("Memory that grows every step is kept across steps")
    assert not any("trainer.save_freq" in a for a in f.advice)
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in f.advice[-1]


def test_a_slow_steady_leak_is_a_warning_with_a_far_forecast():
    steps = make_steps(n=12, step_s=20.0)

    def grow(df):
        df["mem_used_bytes"] = (30.0 + 1.5 * df["step"].fillna(1)) * GIB

    (f,) = _creeps(_ctx(steps, grow))
    assert f.severity == "warning"
    assert "at +1.5 GiB per step, out of memory in about" in f.evidence
    left = int(f.evidence.split("out of memory in about ")[1].split()[0])
    assert 58 <= left <= 66  # (140.4 - 48) / 1.5 at step 12


def test_a_flat_run_and_a_noisy_flat_run_stay_quiet():
    steps = make_steps(n=12, step_s=20.0)
    rng = np.random.default_rng(1)

    def noisy(df):
        df["mem_used_bytes"] = (60.0 + rng.normal(0, 2.0, len(df))) * GIB

    assert _creeps(_ctx(steps, lambda df: None)) == []
    assert _creeps(_ctx(steps, noisy)) == []


def _levels_per_step(levels):
    """A run whose every GPU sits at ``levels[k]`` GiB throughout step k + 1."""
    def set_levels(df):
        s = df["step"].fillna(1).clip(1, len(levels)).astype(int)
        df["mem_used_bytes"] = np.asarray(levels, float)[s.to_numpy() - 1] * GIB

    return _ctx(make_steps(n=len(levels), step_s=20.0), set_levels)


def test_a_level_that_swings_back_up_to_where_it_was_is_not_a_creep():
    # a fully-async trainer's steps mix waiting and training: the level drifts down, then climbs
    # 1.5 GiB a step for six steps, back to the highs of the start (504-run bench: the most
    # frequent false memory_creep); the same climb past every earlier level is a creep
    back = [90, 90, 104, 103, 100, 98, 96, 97.5, 99, 100.5, 102, 103.5]
    assert _creeps(_levels_per_step(back)) == []
    past = [90, 90, 96, 95, 94, 93, 92, 93.5, 95, 96.5, 98, 99.5, 101]
    (f,) = _creeps(_levels_per_step(past))
    assert "memory grows steadily" in f.evidence


def test_a_level_that_steps_up_once_and_stays_is_not_a_creep():
    # a mode change (two weight copies kept from step 6 on): one rise of 6 GiB, then flat
    step_up = [90, 90, 96, 96.5, 96, 102.5, 104, 104.5, 105, 105, 105]
    assert _creeps(_levels_per_step(step_up)) == []
    # the same growth spread over the steps is one
    spread = [90, 90, 96, 97.5, 99, 100.5, 102, 103.5, 105, 106.5, 108]
    assert len(_creeps(_levels_per_step(spread))) == 1


def test_a_jump_right_after_a_checkpoint_save_that_stays_is_named():
    def save_at_5(step, phases):
        if step == 5:
            phases["save_checkpoint"] = 4.0

    steps = make_steps(n=10, step_s=20.0, edit=save_at_5)

    def jump(df):
        df["mem_used_bytes"] = np.where(df["step"].fillna(0) >= 6, 50.0, 40.0) * GIB

    (f,) = _creeps(_ctx(steps, jump))
    assert "jumped by 10.0 GiB right after save_checkpoint" in f.evidence
    assert f.scope["steps"] == [5, 6]
    assert "trainer.save_freq" in f.advice[0]  # the most likely cause first
    # the same jump with no save or validation before it is not a creep
    plain = make_steps(n=10, step_s=20.0)
    assert _creeps(_ctx(plain, jump)) == []


def test_the_workers_host_memory_creeping_is_named_per_node():
    from detect_builders import make_host

    steps = make_steps(n=10, step_s=20.0)
    gpu = make_gpu(steps, n_gpus=2)

    def leak(df):
        s = pd.Series(np.searchsorted([x.end_time for x in steps], df["ts"]) + 1)
        df["train_rss_bytes"] = (20.0 + 2.0 * s.clip(1, 10)).to_numpy() * GIB

    flags = _creeps(make_context(steps, gpu, make_host(gpu, edit=leak), []))
    (f,) = flags
    assert f.scope == {"node": "n0", "steps": f.scope["steps"]}
    assert f.evidence.startswith("Host memory (RSS) of the training processes on node n0")
    assert "at +2.0 GiB per step" in f.evidence
    # offloading to the host would make it worse: no GPU headroom or offload advice here
    assert not any("param_offload" in a or "gpu_memory_utilization" in a for a in f.advice)
    flat = make_host(gpu, edit=lambda df: df.__setitem__("train_rss_bytes", 30.0 * GIB))
    assert _creeps(make_context(steps, gpu, flat, [])) == []


def test_without_steps_the_rate_is_per_minute():
    # 30 minutes: without steps the levels are 5-minute medians, judged from the 4th on
    steps = make_steps(n=90, step_s=20.0)
    ctx = _ctx(steps, lambda df: df.__setitem__(
        "mem_used_bytes", (20.0 + 3.0 * (df["ts"] - df["ts"].min()) / 60.0) * GIB))
    ctx.steps.clear()  # the log gave no step lines: analysis windows stand in
    ctx.__dict__.pop("sf", None)
    flags = _creeps(ctx)
    assert flags and "GiB per minute" in flags[0].evidence


def test_without_steps_a_varying_mix_of_phases_is_not_a_creep():
    """A node without the log: its 30 s windows catch generation (less memory) and training
    (more) in varying shares; a healthy 10-minute job is not creeping."""
    steps = make_steps(n=20, step_s=30.0)

    def mix(df):
        df["mem_used_bytes"] = np.where(df["phase"] == "gen", 84.0, 104.0) * GIB

    ctx = _ctx(steps, mix)
    ctx.steps.clear()
    ctx.__dict__.pop("sf", None)
    assert _creeps(ctx) == []


def test_theil_sen_ignores_one_odd_point_and_the_forecast_reads_plainly():
    y = np.array([1.0, 2.0, 3.0, 40.0, 5.0, 6.0])
    assert theil_sen(y) == pytest.approx(1.0)
    assert forecast_text(18 * GIB, 0.6, "step") == (
        "at +18.0 GiB per step, out of memory in about 1 step")
    assert forecast_text(2 * GIB, 12.2, "minute").endswith("about 12 minutes")


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_the_simulated_creep_is_flagged_and_the_healthy_simulation_is_not(tmp_path):
    for scenario, expect in (("memory_creep", True), ("healthy", False), ("reshard_spike", False)):
        run = SimRun(scenario, steps=20, seed=3)
        run.write(tmp_path / scenario)
        parsed = parse_file(tmp_path / scenario / "train.log")
        flags = run_all(parsed.steps, read_gpu_frame(tmp_path / scenario / "gpu.csv"), None,
                        parsed.events)
        creep = [f for f in flags if f.kind == "memory_creep"]
        assert bool(creep) == expect, (scenario, [f.evidence for f in creep])
        if expect:
            truth = next(t for t in run.truth if t["kind"] == "memory_creep")
            assert truth["start"] <= creep[0].start
            assert "out of memory in about" in creep[0].evidence


REAL = Path(__file__).parent / "fixtures" / "real_gpu"


@pytest.mark.parametrize("run", sorted(p.name for p in REAL.iterdir()
                                       if (p / "truth.json").exists() and "oom" not in p.name
                                       and "memory_creep" not in p.name))
def test_the_real_recordings_without_a_leak_stay_quiet(run):
    parsed = parse_file(str(REAL / run / "train.jsonl"))
    flags = run_all(parsed.steps, read_gpu_frame(REAL / run / "gpu.csv"), None, parsed.events)
    assert [f.evidence for f in flags if f.kind == "memory_creep"] == []


@pytest.mark.parametrize("run", ["1gpu_oom", "2gpu_oom"])
def test_the_real_oom_runs_are_forecast_before_they_run_out(run):
    import json

    from cli.commands.analyze import merge_events, read_events

    # the workload keeps 32 GiB per step from step 5; the OOM comes in step 7
    truth = json.loads((REAL / run / "truth.json").read_text())
    parsed = parse_file(str(REAL / run / "train.jsonl"))
    console = parse_file(str(REAL / run / "train.log"), log_end=truth["job_end"])
    events = merge_events(merge_events(parsed.events, read_events(str(REAL / run / "events.json"))),
                          console.events)
    flags = run_all(parsed.steps, read_gpu_frame(REAL / run / "gpu.csv"), None, events)
    (creep,) = [f for f in flags if f.kind == "memory_creep"]
    assert creep.severity == "critical" and creep.scope["gpus"] == [0]
    assert "out of memory in about 2 steps" in creep.evidence
    step6 = next(s.end_time for s in parsed.steps if s.step == 6)
    assert creep.start == pytest.approx(step6, abs=1.0)
    oom = [f for f in flags if f.kind == "oom"]
    assert oom and creep.start < oom[0].start


# --- levels per phase (issue 28 item 6) ---------------------------------------------------------


def _longer_generations(leak_gib_per_step: float = 0.0):
    """12 steps of 40 s whose generation share grows from 50% to 90% (responses getting longer),
    as verl frees and refills memory by phase: generation's memory climbs from 30 to 100 GiB
    through each generation (an HF rollout's KV cache; the engine wakes from sleep), the
    training phases hold 20 GiB. ``leak_gib_per_step`` is added to every phase each step."""
    from monitor.analysis.attribution import phase_timeline

    def mix(step, phases):
        gen = 0.5 + 0.4 * (step - 1) / 11
        rest = 40.0 * (1 - gen)
        phases.update(gen=40.0 * gen, old_log_prob=0.2 * rest, ref=0.16 * rest,
                      update_actor=0.54 * rest, other=0.1 * rest)

    steps = make_steps(n=12, step_s=40.0, edit=mix)
    gen = phase_timeline(steps).query("phase == 'gen'").set_index("step")

    def memory(df):
        step = df["step"].fillna(1).astype(int)
        start = gen["start"].reindex(step).to_numpy()
        end = gen["end"].reindex(step).to_numpy()
        through = np.clip((df["ts"].to_numpy() - start) / (end - start), 0, 1)
        level = np.where(df["phase"] == "gen", 30.0 + 70.0 * through, 20.0)
        df["mem_used_bytes"] = (level + leak_gib_per_step * (step.to_numpy() - 1)) * GIB

    return _ctx(steps, memory)


def test_memory_that_differs_by_phase_is_compared_phase_by_phase():
    # the step's median over all phases climbs 25 -> 60 GiB as generation grows; each phase's
    # own level stays where it was: no leak (the old all-phase level flagged +1.9 GiB a step)
    ctx = _longer_generations()
    mixed = ctx.act_windowed.groupby("step")["mem_used_bytes"].median()
    assert mixed.iloc[-1] - mixed.iloc[2] > 15 * GIB  # the mix alone moves the mixed level
    assert _creeps(ctx) == []


def test_a_leak_under_memory_that_differs_by_phase_is_still_named_with_its_phase():
    (f,) = _creeps(_longer_generations(leak_gib_per_step=1.5))
    assert "at +1.5 GiB per step" in f.evidence
    assert f.evidence.startswith("GPU 0 on node n0 (gen):")  # the longest phase names it
    assert f.scope["gpus"] == [0, 1]


def test_a_rollout_engine_that_sleeps_through_training_is_not_a_creep():
    # sleep mode: 96 GiB while the engine is awake, 24 GiB while it sleeps; the share of
    # generation grows step after step
    def mix(step, phases):
        gen = 0.4 + 0.04 * step
        phases.update(gen=30.0 * gen, update_actor=30.0 * (1 - gen))

    steps = make_steps(n=12, step_s=30.0, edit=mix)
    awake = _ctx(steps, lambda df: df.__setitem__(
        "mem_used_bytes", np.where(df["phase"] == "gen", 96.0, 24.0) * GIB))
    assert _creeps(awake) == []


def test_one_phase_climbing_alone_is_not_a_leak_when_another_phase_stays_flat():
    # memory kept across steps is held through every phase: the actor update's level climbing
    # while generation's stays flat is that phase's own noise or mix (bench: the false flags
    # of single phases), not a leak; both climbing is one (the test above)
    steps = make_steps(n=12, step_s=40.0)

    def update_only(df):
        step = df["step"].fillna(1).to_numpy()
        df["mem_used_bytes"] = np.where(df["phase"] == "update_actor", 40.0 + 1.5 * step,
                                        60.0) * GIB

    assert _creeps(_ctx(steps, update_only)) == []


# --- short steps (real verl: 2-3 s steps sampled each second) ---------------------------------


def _short_steps(leak_gib_per_step: float = 0.0, from_step: int = 2):
    """12 steps of 2.5 s sampled each second: generation holds 40 GiB, training 10 GiB, and the
    generation share grows from 40% to 90%, so the step's middle sample is whichever phase it
    hit. ``leak_gib_per_step`` is kept every step from ``from_step`` (held through every phase)."""
    def mix(step, phases):
        gen = 0.4 + 0.5 * (step - 1) / 11
        phases.clear()
        phases.update(gen=2.5 * gen, update_actor=2.5 * (1 - gen))

    steps = make_steps(n=12, step_s=2.5, edit=mix)

    def memory(df):
        step = df["step"].fillna(1).to_numpy()
        kept = leak_gib_per_step * np.clip(step - from_step, 0, None)
        df["mem_used_bytes"] = (np.where(df["phase"] == "gen", 40.0, 10.0) + kept) * GIB

    return steps, _ctx(steps, memory, n_gpus=1)


def test_short_steps_whose_samples_hit_different_phases_are_not_a_creep():
    steps, ctx = _short_steps()
    assert _creeps(ctx) == []


def test_a_fast_leak_in_short_steps_is_named_within_3_steps_of_its_start():
    # each step's floor (its lowest sample) rises by the 4 GiB kept: named at the end of step 5,
    # three steps after the leak starts at step 2 (min_points would wait for step 6)
    steps, ctx = _short_steps(leak_gib_per_step=4.0)
    (f,) = _creeps(ctx)
    assert f.evidence.startswith("GPU 0 on node n0 (each step's lowest sample):")
    assert "at +4.0 GiB per step" in f.evidence
    assert f.start <= steps[4].end_time + 1e-6
    assert f.advice[0].startswith("Memory that grows every step is kept across steps")
