"""phase_imbalance, comm_heavy and reshard_spike on hand-made steps and frames."""

from detect_builders import make_gpu, make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.phases import detect_comm_heavy, detect_phase_imbalance, detect_reshard_spike
from monitor.frames import empty_gpu_frame, empty_host_frame
from monitor.records import Event

SHARES = {"gen": 0.45, "reward": 0.02, "old_log_prob": 0.08, "ref": 0.07, "values": 0.05,
          "update_critic": 0.06, "update_actor": 0.22, "reshard": 0.03, "other": 0.02}


def _ctx(steps, gpu=None, events=()):
    gpu = empty_gpu_frame() if gpu is None else gpu
    return make_context(steps, gpu, empty_host_frame(), list(events), load_config())


def test_scoring_out_of_proportion_with_generation():
    def edit(i, ph):
        if i >= 12:
            ph["values"] *= 6
            ph["reward"] *= 8

    steps = make_steps(30, shares=SHARES, edit=edit)
    flags = detect_phase_imbalance(_ctx(steps))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["phase"] == "values" and f.scope["steps"][0] == 12
    assert "Scoring (values + reward)" in f.evidence and "bottleneck" in f.evidence
    assert any("log_prob_micro_batch_size_per_gpu" in a for a in f.advice)


def test_a_phase_share_jump_against_its_history():
    def edit(i, ph):
        if i >= 15:
            ph["ref"] *= 3.5

    steps = make_steps(30, shares=SHARES, edit=edit)
    flags = detect_phase_imbalance(_ctx(steps))
    assert [f.scope["phase"] for f in flags] == ["ref"]
    assert "ref took" in flags[0].evidence and "in the steps before" in flags[0].evidence
    # the baseline does not absorb the jump: still open at the end
    assert flags[0].end is None


def test_steady_phases_and_grpo_without_critic_are_not_flagged():
    assert detect_phase_imbalance(_ctx(make_steps(30, shares=SHARES))) == []
    grpo = {k: v for k, v in SHARES.items() if k not in ("values", "update_critic")}
    assert detect_phase_imbalance(_ctx(make_steps(30, shares=grpo))) == []
    assert detect_phase_imbalance(_ctx(make_steps(1, shares=SHARES))) == []


def test_comm_phase_over_a_quarter_of_the_step():
    def edit(i, ph):
        ph["comm"] = 14.0 if i >= 10 else 0.6

    steps = make_steps(25, shares=SHARES, edit=edit)
    flags = detect_comm_heavy(_ctx(steps))
    assert len(flags) == 1
    assert flags[0].scope["steps"][0] == 10 and "communication took 3" in flags[0].evidence
    assert any("tensor_model_parallel_size" in a for a in flags[0].advice)


def test_nccl_share_metric_flags_comm():
    steps = make_steps(20, metrics=lambda i: {"nccl/comm_share": 0.3 if i > 5 else 0.05})
    flags = detect_comm_heavy(_ctx(steps))
    assert len(flags) == 1 and "NCCL time was 30%" in flags[0].evidence


def _collective_tail(from_step, seconds):
    """The last ``seconds`` of update_actor run at util 88 / SM 15 (collectives)."""
    def edit(df):
        ends = {}
        for st, grp in df[df["phase"] == "update_actor"].groupby("step"):
            ends[st] = grp["ts"].max()
        end = df["step"].map(ends)
        sel = (df["phase"] == "update_actor") & (df["step"] >= from_step) & (
            df["ts"] > end - seconds)
        df.loc[sel, "util"] = 88.0
        df.loc[sel, "sm_active"] = 15.0
    return edit


def test_comm_seen_on_the_gpus_when_the_log_has_no_comm_timer():
    def edit(i, ph):
        if i >= 10:
            ph["update_actor"] += 12.0

    steps = make_steps(25, edit=edit)
    flags = detect_comm_heavy(_ctx(steps, make_gpu(steps, edit=_collective_tail(10, 12.0))))
    assert len(flags) == 1
    assert "few SMs active" in flags[0].evidence


def test_tiny_kernels_everywhere_are_not_communication():
    steps = make_steps(25)

    def edit(df):
        sel = df["phase"].isin(["old_log_prob", "ref", "update_actor"]) & (df["step"] >= 10)
        df.loc[sel, "util"] = 90.0
        df.loc[sel, "sm_active"] = 12.0

    assert detect_comm_heavy(_ctx(steps, make_gpu(steps, edit=edit))) == []
    assert detect_comm_heavy(_ctx(steps, make_gpu(steps, sm=False))) == []


def test_reshard_far_above_its_median_is_a_spike():
    def edit(i, ph):
        ph["reshard"] = 8.5 if i >= 15 else 0.9 + 0.02 * (i % 3)

    steps = make_steps(30, shares=SHARES, edit=edit)
    flags = detect_reshard_spike(_ctx(steps))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["steps"][0] == 15 and f.end is None
    assert "8.5 s" in f.evidence and "0.9 s" in f.evidence
    assert f.severity == "critical"
    assert f.start == steps[14].end_time  # one step: a spike is a spike


def test_small_reshard_changes_stay_under_the_floor():
    def edit(i, ph):
        ph["reshard"] = 0.3 if i % 4 == 0 else 0.1

    steps = make_steps(30, shares=SHARES, edit=edit)
    assert detect_reshard_spike(_ctx(steps)) == []


def test_old_verl_without_reshard_timing_gives_no_reshard_flag():
    old = {k: v for k, v in SHARES.items() if k != "reshard"}
    steps = make_steps(30, shares=old)
    assert detect_reshard_spike(_ctx(steps)) == []


def test_reshard_from_hybrid_engine_events():
    steps = make_steps(30, shares={k: v for k, v in SHARES.items() if k != "reshard"})
    events = [Event("reshard", s.end_time - 5, s.step,
                    data={"seconds": 9.0 if s.step >= 20 else 1.0}) for s in steps]
    flags = detect_reshard_spike(_ctx(steps, events=events))
    assert len(flags) == 1 and flags[0].scope["steps"][0] == 20


def test_memory_jump_during_a_long_switch():
    def edit(i, ph):
        ph["reshard"] = 4.0

    steps = make_steps(30, shares=SHARES, edit=edit)

    def mem(df):
        sel = (df["phase"] == "reshard")
        df.loc[sel, "mem_used_bytes"] = df.loc[sel, "mem_total_bytes"] * 0.80
        df.loc[sel & (df["step"] >= 20), "mem_used_bytes"] = (
            df.loc[sel & (df["step"] >= 20), "mem_total_bytes"] * 0.97)

    flags = detect_reshard_spike(_ctx(steps, make_gpu(steps, edit=mem)))
    assert len(flags) == 1 and flags[0].scope["steps"][0] == 20
    assert "memory peaked at 97%" in flags[0].evidence
