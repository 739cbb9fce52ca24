"""Phase attribution: phases laid out per step, samples joined to them, per-phase summaries."""

import numpy as np
import pandas as pd
from detect_builders import make_gpu, make_steps

from monitor.analysis.attribution import attribute, phase_summary, phase_timeline
from monitor.records import StepRecord


def test_phases_end_at_the_step_end_in_verl_order_with_other_last():
    rec = StepRecord(step=7, end_time=1000.0, total=30.0,
                     phases={"update_actor": 8.0, "gen": 15.0, "ref": 3.0, "reshard": 1.0},
                     metrics={"timing_s/update_weights": 1.0})
    tl = phase_timeline([rec])
    assert tl["phase"].tolist() == ["gen", "ref", "update_actor", "reshard", "other"]
    assert tl["start"].iloc[0] == 970.0 and tl["end"].iloc[-1] == 1000.0
    assert (tl["end"].iloc[:-1].to_numpy() == tl["start"].iloc[1:].to_numpy()).all()
    assert tl.iloc[-1]["end"] - tl.iloc[-1]["start"] == 3.0  # the unexplained remainder


def test_reshard_goes_first_before_verl_0_7_1():
    rec = StepRecord(step=1, end_time=100.0, total=20.0,
                     phases={"gen": 10.0, "reshard": 2.0, "update_actor": 8.0},
                     metrics={"timing_s/reshard": 2.0})
    assert phase_timeline([rec])["phase"].tolist() == ["reshard", "gen", "update_actor"]


def test_breakdown_logs_put_the_unlogged_time_after_generation():
    rec = StepRecord(step=1, end_time=100.0, total=30.0,
                     phases={"gen": 12.0, "values": 2.0, "update_actor": 6.0, "comm": 1.0,
                             "other": 9.0})
    assert phase_timeline([rec])["phase"].tolist() == [
        "gen", "other", "values", "update_actor", "comm"]


def test_steps_without_end_time_or_phases():
    assert len(phase_timeline([StepRecord(step=1, end_time=None, total=5.0)])) == 0
    tl = phase_timeline([StepRecord(step=1, end_time=50.0, total=5.0)])
    assert tl["phase"].tolist() == ["other"]
    assert len(phase_timeline([])) == 0


def test_attribute_joins_samples_to_their_phase():
    steps = make_steps(4, shares={"gen": 0.5, "update_actor": 0.5})

    def edit(df):
        df.loc[(df["phase"] == "gen") & (df["gpu"] == 1), "sm_active"] = 20.0

    gpu = make_gpu(steps, n_gpus=2, edit=edit)
    att = attribute(steps, gpu)
    assert set(att["phase"]) == {"gen", "update_actor"}
    assert len(att) == 4 * 2 * 2
    row = att[(att["step"] == 2) & (att["phase"] == "gen") & (att["gpu"] == 1)].iloc[0]
    assert row["sm_mean"] == 20.0 and row["sm_p10"] == 20.0 and row["samples"] == 15
    other = att[(att["step"] == 2) & (att["phase"] == "update_actor") & (att["gpu"] == 0)]
    assert abs(other["util_mean"].iloc[0] - 95.0) < 2.0


def test_phase_summary_answers_how_busy_each_gpu_was_in_gen():
    steps = make_steps(6, shares={"gen": 0.5, "update_actor": 0.5})

    def edit(df):
        df.loc[df["phase"] == "gen", "sm_active"] = 31.0

    summ = phase_summary(attribute(steps, make_gpu(steps, edit=edit)))
    gen = summ[summ["phase"] == "gen"]
    assert len(gen) == 8 and (gen["sm_mean"] == 31.0).all() and (gen["steps"] == 6).all()
    assert summ["phase"].tolist()[0] == "gen"  # verl's order


def test_missing_sm_activity_and_samples_outside_steps():
    steps = make_steps(3, shares={"gen": 1.0})
    gpu = make_gpu(steps, n_gpus=1, sm=False, tail_s=20)
    att = attribute(steps, gpu)
    assert att["sm_mean"].isna().all() and att["util_mean"].notna().all()
    assert att["samples"].sum() == 90  # the 20 s after the last step belong to no phase
    summ = phase_summary(att)
    assert summ["sm_mean"].isna().all()


def test_empty_inputs():
    assert len(attribute([], pd.DataFrame())) == 0
    assert len(attribute(make_steps(2), None)) == 0
    assert len(phase_summary(pd.DataFrame())) == 0
    gpu = make_gpu(make_steps(2))
    assert len(attribute([], gpu)) == 0
    assert np.isfinite(gpu["util"]).all()


def test_a_timestamped_switch_late_in_the_step_puts_reshard_after_the_update():
    from monitor.records import Event

    rec = StepRecord(step=1, end_time=100.0, total=20.0,
                     phases={"gen": 10.0, "reshard": 2.0, "update_actor": 8.0})
    late = Event("reshard", 99.5, 1, data={"seconds": 2.0})
    early = Event("reshard", 82.0, 1, data={"seconds": 2.0})
    assert phase_timeline([rec], [late])["phase"].tolist() == ["gen", "update_actor", "reshard"]
    assert phase_timeline([rec], [early])["phase"].tolist() == ["reshard", "gen", "update_actor"]


def _truth_run(offset: float = 0.5):
    """gen 10 s at 95%, reward 3 s at 12%, adv 0.4 s at 8%, ref 10 s at 90% (the simulator's
    shape); 1 s samples starting ``offset`` into the step, each the mean over [ts, ts + 1)."""
    levels = [("gen", 10.0, 95.0), ("reward", 3.0, 12.0), ("adv", 0.4, 8.0), ("ref", 10.0, 90.0)]
    total = sum(d for _, d, _ in levels)
    steps, rows, t0 = [], [], 1000.0
    for n in range(3):
        start = t0 + n * total
        steps.append(StepRecord(step=n + 1, end_time=start + total, total=total,
                                phases={p: d for p, d, _ in levels}))
    level = {p: u for p, _, u in levels}
    tl = phase_timeline(steps)  # verl's order: gen, ref, reward, adv
    edges = [(r.start, r.end, level[r.phase]) for r in tl.itertuples()]
    t = float(tl["end"].max())

    def mean_util(a: float, b: float) -> float:
        acc = sum(max(0.0, min(b, hi) - max(a, lo)) * u for lo, hi, u in edges)
        return acc / (b - a)

    ts = np.arange(t0 + offset, t - 1.0, 1.0)
    for x in ts:
        rows.append({"ts": x, "node": "n0", "gpu": 0, "util": mean_util(x, x + 1.0),
                     "sm_active": np.nan})
    return steps, pd.DataFrame(rows)


def test_sub_interval_phase_is_withheld_and_neighbours_are_not_misassigned():
    steps, gpu = _truth_run()
    att = attribute(steps, gpu)
    assert {"seconds", "full_samples"} <= set(att.columns)
    assert list(att.columns[:9]) == ["step", "phase", "node", "gpu", "util_mean", "util_p10",
                                     "sm_mean", "sm_p10", "samples"]  # older callers' columns
    summ = phase_summary(att).set_index("phase")
    # the 0.4 s phase has no sample wholly inside it: no figure, and the reason
    assert summ.loc["adv", "full_samples"] == 0
    assert np.isnan(summ.loc["adv", "util_mean"]) and "fewer than" in summ.loc["adv", "withheld"]
    # the phases around it carry their own level (by the sample instant, a sample starting
    # 0.5 s before a phase's end was counted whole in it although half of it is the next one)
    assert abs(summ.loc["reward", "util_mean"] - 12.0) < 0.5
    assert abs(summ.loc["ref", "util_mean"] - 90.0) < 0.5
    assert abs(summ.loc["gen", "util_mean"] - 95.0) < 0.5
    assert summ.loc["reward", "withheld"] == "" and summ.loc["reward", "full_samples"] >= 3
    assert (summ["samples"] >= summ["full_samples"]).all()


def test_a_phase_gets_the_sample_time_it_overlaps():
    steps, gpu = _truth_run(offset=0.0)
    att = attribute(steps, gpu)
    step2 = att[att["step"] == 2].set_index("phase")
    assert abs(step2.loc["adv", "seconds"] - 0.4) < 1e-6
    assert abs(step2.loc["gen", "seconds"] - 10.0) < 1e-6
    assert phase_summary(att, min_samples=0).loc[lambda d: d["phase"] == "adv", "withheld"].iloc[0] == ""
