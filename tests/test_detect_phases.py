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


def test_slow_scoring_side_is_flagged_by_its_share_of_the_step():
    """values 6x and reward 8x: no ratio rule (gen is still longer than the critic's scoring),
    but both phases' share of the step jumps against their history."""
    def edit(i, ph):
        if i >= 12:
            ph["values"] *= 6
            ph["reward"] *= 8

    steps = make_steps(30, shares=SHARES, edit=edit)
    flags = detect_phase_imbalance(_ctx(steps))
    assert flags and {f.scope["phase"] for f in flags} <= {"values", "reward"}
    assert min(f.scope["steps"][0] for f in flags) == 12
    assert all("in the steps before" in f.evidence for f in flags)
    assert not any("generation dominates" in f.evidence for f in flags)


def _breakdown_steps(tmp_path, gen_ms, critic_ms, n=12):
    """A breakdown-format log (the guide's line, with these two fields), parsed."""
    from monitor.logs.canonical_records import parse_file

    lines = []
    for i in range(n):
        total = gen_ms + critic_ms + 12 + 21 + 310 + 100
        lines.append(f"2026-05-01 00:{i:02d}:00,000 Step {1234 + i}: total={total}ms | "
                     f"actor_gen={gen_ms}ms | critic_score={critic_ms}ms | rollout_wait=12ms | "
                     "loss_comp=21ms | comm=310ms")
    path = tmp_path / "breakdown.log"
    path.write_text("\n".join(lines) + "\n")
    return parse_file(path).steps


def test_the_guides_own_example_line_raises_nothing(tmp_path):
    steps = _breakdown_steps(tmp_path, 412, 387)
    assert round(steps[0].phases["gen"], 6) == 0.412 and round(steps[0].phases["values"], 6) == 0.387
    assert detect_phase_imbalance(_ctx(steps)) == []


def test_guide_rule_generation_four_times_the_critic_or_more(tmp_path):
    flags = detect_phase_imbalance(_ctx(_breakdown_steps(tmp_path, 600, 150)))  # 4:1 exactly
    assert len(flags) == 1
    f = flags[0]
    assert f.severity == "warning" and f.scope["phase"] == "gen"
    assert "Actor_gen took 0.6 s per step vs 0.1 s for critic_score (4.0:1" in f.evidence
    assert "generation dominates" in f.evidence
    assert any("gpu_memory_utilization" in a for a in f.advice)
    worse = detect_phase_imbalance(_ctx(_breakdown_steps(tmp_path, 900, 100)))
    assert [f.severity for f in worse] == ["critical"]
    # just under the guide's number: quiet
    assert detect_phase_imbalance(_ctx(_breakdown_steps(tmp_path, 590, 150))) == []


def test_scoring_longer_than_generation_is_its_own_case(tmp_path):
    flags = detect_phase_imbalance(_ctx(_breakdown_steps(tmp_path, 300, 450)))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["phase"] == "values" and f.severity == "warning"
    assert f.evidence.startswith("The critic's scoring took longer than generation: 0.5 s")

    def edit(i, ph):
        ph["values"] = ph["gen"] * 2.5  # verl keys too: the critic far slower than generation

    flags = detect_phase_imbalance(_ctx(make_steps(20, shares=SHARES, edit=edit)))
    assert [(f.scope["phase"], f.severity) for f in flags] == [("values", "critical")]


def test_healthy_v01_ppo_ratio_and_long_rollouts_in_verl_keys_are_quiet():
    def v01(i, ph):  # the v0.1 quickstart: timing/gen:18.859 - timing/values:5.664 (3.3:1)
        ph["gen"], ph["values"] = 18.859, 5.664

    assert detect_phase_imbalance(_ctx(make_steps(30, shares=SHARES, edit=v01))) == []

    def long(i, ph):  # long responses: generation 12x the critic's pass, still healthy
        ph["values"] = ph["gen"] / 12

    assert detect_phase_imbalance(_ctx(make_steps(30, shares=SHARES, edit=long))) == []


def test_verl_key_ratio_rule_when_configured(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("phase_imbalance:\n  verl_gen_over_values_max: 4.0\n")

    def long(i, ph):
        ph["values"] = ph["gen"] / 5

    steps = make_steps(20, shares=SHARES, edit=long)
    ctx = make_context(steps, empty_gpu_frame(), empty_host_frame(), [], load_config(str(cfg)))
    flags = detect_phase_imbalance(ctx)
    assert len(flags) == 1 and "(5.0:1, 4:1 or more" in flags[0].evidence
    assert "Generation took" in flags[0].evidence


def test_grpo_without_critic_never_trips_the_ratio_rules():
    """A rule-based reward is not a critic, however long it takes against generation."""
    grpo = {k: v for k, v in SHARES.items() if k not in ("values", "update_critic")}

    def slow_reward(i, ph):
        ph["reward"] = ph["gen"] * 3

    assert detect_phase_imbalance(_ctx(make_steps(30, shares=grpo, edit=slow_reward))) == []

    def tiny_reward(i, ph):
        ph["reward"] = ph["gen"] / 50

    assert detect_phase_imbalance(_ctx(make_steps(30, shares=grpo, edit=tiny_reward))) == []


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
    assert "8.5 s" in f.evidence and "920 ms" in f.evidence
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


def test_the_guides_example_line_and_a_healthy_v01_ppo_log_raise_no_warning(tmp_path):
    """Through the whole pipeline (parse_file, run_all): no warning or critical flag at all."""
    from pathlib import Path

    from monitor.detect import run_all
    from monitor.logs.canonical_records import parse_file

    guide = ("Step {n}: total=1242ms | actor_gen=412ms | critic_score=387ms | rollout_wait=12ms"
             " | loss_comp=21ms | comm=310ms")
    path = tmp_path / "guide.log"
    path.write_text("".join(f"2026-05-01 00:00:{i * 1.242:06.3f} ".replace(".", ",")
                            + guide.format(n=1234 + i) + "\n" for i in range(30)))
    healthy = Path(__file__).parent / "fixtures" / "logs" / "failures" / "healthy_v0.1_ppo.log"
    for log in (path, healthy):
        parsed = parse_file(log, log_end=1_750_000_000.0)
        assert len(parsed.steps) == 30
        flags = run_all(parsed.steps, empty_gpu_frame(), empty_host_frame(), parsed.events)
        loud = [(f.kind, f.evidence) for f in flags if f.severity in ("warning", "critical")]
        assert loud == [], (log.name, loud)
    first = parse_file(healthy, log_end=1_750_000_000.0).steps[0]
    assert round(first.phases["gen"] / first.phases["values"], 1) == 3.3


# --- evidence and advice by phase and signature (issue 23) ----------------------------------

def _host_by_phase(steps, gpu, busy: dict[str, float], base: float = 40.0):
    """Host samples whose busiest core reads ``busy[phase]`` in those phases, else ``base``."""
    from detect_builders import make_host

    from monitor.analysis.attribution import label_samples, phase_timeline

    def edit(df):
        phase = label_samples(df, phase_timeline(steps))["phase"]
        for name, pct in busy.items():
            df.loc[(phase == name).to_numpy(), "cpu_max_core_pct"] = pct

    return make_host(gpu, cpu_max=base, edit=edit)


def _ctx_host(steps, gpu, host):
    return make_context(steps, gpu, host, [], load_config())


def test_cpu_bound_reward_gets_reward_advice_first_and_no_critic_advice():
    """The issue's case: the driver scores on one core for seconds while every GPU idles."""
    grpo = {k: v for k, v in SHARES.items() if k not in ("values", "update_critic")}

    def edit(i, ph):
        if i >= 12:
            ph["reward"] *= 20

    steps = make_steps(30, shares=grpo, edit=edit)
    gpu = make_gpu(steps, n_gpus=2)
    flags = detect_phase_imbalance(_ctx_host(steps, gpu, _host_by_phase(steps, gpu,
                                                                         {"reward": 100.0})))
    assert [f.scope["phase"] for f in flags] == ["reward"]
    flag = flags[0]
    assert "CPU-bound" in flag.evidence and "busiest CPU core 100%" in flag.evidence
    assert flag.advice[0].startswith("The reward is computed on the CPU")
    assert not any("critic" in a for a in flag.advice)
    assert not any("micro_batch" in a or "use_dynamic_bsz" in a for a in flag.advice)


def test_reward_keys_follow_the_version_the_log_reveals():
    grpo = {k: v for k, v in SHARES.items() if k not in ("values", "update_critic")}

    def edit(i, ph):
        if i >= 12:
            ph["reward"] *= 20

    new = make_steps(30, shares=grpo, edit=edit,
                     metrics=lambda i: {"actor/perf/max_memory_allocated_gb": 10.0})
    gpu = make_gpu(new, n_gpus=2)
    flag = detect_phase_imbalance(_ctx_host(new, gpu, _host_by_phase(new, gpu,
                                                                     {"reward": 100.0})))[0]
    assert "reward.num_workers" in flag.advice[0]
    assert "launch_reward_fn_async" not in flag.advice[0]
    unknown = make_steps(30, shares=grpo, edit=edit)
    flag = detect_phase_imbalance(_ctx_host(unknown, gpu, _host_by_phase(unknown, gpu,
                                                                         {"reward": 100.0})))[0]
    assert "reward.num_workers" in flag.advice[0]
    assert "reward_model.launch_reward_fn_async" in flag.advice[0]


def _offload_run():
    """Parameter offload from step 12: log-prob and ref take twice as long at SM ~52% while
    ~8 GB/s cross PCIe (pageable host memory to the GPU)."""
    def edit(i, ph):
        if i >= 12:
            ph["old_log_prob"] *= 2
            ph["ref"] *= 2

    shares = dict(SHARES, gen=0.3, old_log_prob=0.16, ref=0.16)
    steps = make_steps(30, shares=shares, edit=edit)

    def gpu_edit(df):
        hit = df["phase"].isin(["old_log_prob", "ref"]) & (df["step"] >= 12)
        df.loc[hit, "sm_active"] = 52.0
        df["pcie_tx_bps"] = 0.2e9
        df["pcie_rx_bps"] = 0.2e9
        df.loc[hit, "pcie_rx_bps"] = 8e9

    gpu = make_gpu(steps, n_gpus=2, edit=gpu_edit)
    return steps, gpu


def test_offload_gets_offload_advice_first_in_one_flag_without_micro_batch_advice():
    steps, gpu = _offload_run()
    flags = detect_phase_imbalance(_ctx_host(steps, gpu, _host_by_phase(steps, gpu, {})))
    assert len(flags) == 1, [f.evidence for f in flags]
    flag = flags[0]
    assert flag.scope["phase"] in ("old_log_prob", "ref")
    assert "PCIe-bound" in flag.evidence
    assert {"old_log_prob took", "ref took"} <= {p for p in ("old_log_prob took", "ref took")
                                                 if p in flag.evidence}
    assert "fsdp_config.param_offload" in flag.advice[0]
    assert not any("micro_batch" in a for a in flag.advice)
    assert not any("critic" in a for a in flag.advice)


def test_the_same_jump_without_pcie_traffic_keeps_log_prob_advice():
    """Contradiction works both ways: log-prob slower with PCIe measured quiet is not
    offload, and gets the log-prob micro-batch advice first."""
    def edit(i, ph):
        if i >= 12:
            ph["old_log_prob"] *= 2

    steps = make_steps(30, shares=dict(SHARES, gen=0.3, old_log_prob=0.15, ref=0.13), edit=edit)

    def gpu_edit(df):
        df["pcie_tx_bps"] = 0.2e9
        df["pcie_rx_bps"] = 0.2e9
        df.loc[(df["phase"] == "old_log_prob") & (df["step"] >= 12), "sm_active"] = 30.0

    gpu = make_gpu(steps, n_gpus=2, edit=gpu_edit)
    flags = detect_phase_imbalance(_ctx_host(steps, gpu, _host_by_phase(steps, gpu, {})))
    assert [f.scope["phase"] for f in flags] == ["old_log_prob"]
    assert "log_prob_micro_batch_size_per_gpu" in flags[0].advice[0]
    assert not any("offload" in a and "False" in a for a in flags[0].advice)


def _agent_loop_steps(n, tool_s, sync_s):
    """verl 0.6-0.7.0 agent-loop steps (no sync timer): gen holds the weight sync plus the
    slowest sample's generation and tool calls (``tool_s(i)``, ``sync_s(i)`` seconds)."""
    from monitor.logs.keys import phases_and_total
    from monitor.records import StepRecord

    out, t = [], 1_000_000.0
    for i in range(1, n + 1):
        gen = 40.0 + tool_s(i) + sync_s(i)
        metrics = {"timing_s/gen": gen, "timing_s/agent_loop/slowest/generate_sequences": 40.0,
                   "timing_s/agent_loop/slowest/tool_calls": tool_s(i),
                   "timing_s/update_actor": 20.0, "timing_s/step": gen + 21.0,
                   "response/aborted_ratio": 0.0}
        phases, total = phases_and_total(metrics)
        t += total
        out.append(StepRecord(step=i, end_time=t, total=total, phases=phases, metrics=metrics))
    return out


def test_the_slowest_samples_tool_calls_are_no_weight_sync():
    """verl's slowest sample is the one with the most generation + tool time: a 30 s tool call
    in it (step 7 of a real agent-loop run) is no sync spike; the sync stays 2.5 s."""
    steps = _agent_loop_steps(30, lambda i: 30.0 if i in (7, 8, 9, 15) else 0.5,
                              lambda i: 2.5)
    assert {round(s.phases["reshard"], 6) for s in steps} == {2.5}
    assert detect_reshard_spike(_ctx(steps)) == []


def test_a_derived_sync_spike_is_a_warning_that_says_it_is_estimated():
    """Without a sync timer the sync is gen less the slowest sample: a spike there is told,
    never critical (the estimate also holds the batch's gathering)."""
    steps = _agent_loop_steps(30, lambda i: 0.5, lambda i: 40.0 if i >= 15 else 2.5)
    flags = detect_reshard_spike(_ctx(steps))
    assert len(flags) == 1 and flags[0].severity == "warning"  # 16x its median
    assert "estimated" in flags[0].evidence and "40.0 s" in flags[0].evidence


def test_a_share_that_rises_because_the_rest_shrank_is_no_imbalance():
    """Generation falls from 60% of a long step to almost nothing (shorter responses):
    update_actor's share doubles while its seconds fall. Not this phase's problem."""
    def edit(i, ph):
        if i >= 11:
            for name in ph:
                ph[name] *= 0.25
            ph["gen"] = 0.5

    steps = make_steps(40, shares=SHARES, edit=edit)
    assert steps[20].phases["update_actor"] / steps[20].total > 1.5 * 0.22
    assert detect_phase_imbalance(_ctx(steps)) == []


def test_the_warm_up_steps_are_no_baseline_for_a_share():
    """The first steps (goodput.warmup_steps, here 3) compile and fill caches: their long
    generation makes update_actor's share small there, and the steps after are not judged
    against them (before: 'update_actor took 22% ... vs 4% in the steps before')."""
    def edit(i, ph):
        if i <= 3:
            ph["gen"] *= 12
        else:
            ph["update_actor"] *= 1.02  # the same work, a trifle more seconds than warm-up

    steps = make_steps(30, shares=SHARES, edit=edit)
    cfg = load_config()
    cfg["goodput"]["warmup_steps"] = 3
    ctx = make_context(steps, empty_gpu_frame(), empty_host_frame(), [], cfg)
    assert detect_phase_imbalance(ctx) == []


# --- issue 37 item 5: the largest waste named from the step timers alone -----------------------

def test_a_reward_that_holds_most_of_the_wall_time_is_flagged_from_the_timers_alone():
    """A real run's reward took 80.8% of the wall time: with no GPU samples the timers say
    it, and the flag names the reward with its share (was: no flag at all)."""
    from monitor.detect import run_all

    def edit(i, ph):
        ph["reward"] = 40.0

    steps = make_steps(20, step_s=10.0, edit=edit)
    for s in steps:
        s.metrics = {"timing_s/step": s.total, "timing_s/reward": 40.0}
    flags = [f for f in run_all(steps, None, None, [], load_config())
             if f.kind == "phase_imbalance" and f.scope.get("phase") == "reward"]
    assert len(flags) == 1
    f = flags[0]
    assert f.severity == "critical" and "reward took 80% of the wall time" in f.evidence
    assert "reward.num_workers" in " ".join(f.advice) or "reward" in f.advice[0]
    assert not any("jumped" in a for a in f.advice)


def test_a_phase_share_is_not_the_gpus_wait_in_a_trainer_that_overlaps_its_phases():
    from monitor.detect import run_all

    def edit(i, ph):
        ph["reward"] = 40.0

    steps = make_steps(20, step_s=10.0, edit=edit)
    for s in steps:
        s.metrics = {"timing_s/step": s.total, "timing_s/param_sync": 1.0,
                     "fully_async/trainer/idle_ratio": 0.1}
    judged: list = []
    flags = run_all(steps, None, None, [], load_config(), judged=judged)
    assert not [f for f in flags if f.scope.get("phase") == "reward"]
    assert any(j.reading == "phase_imbalance.timer_share" and j.holds is False
               for j in judged)
