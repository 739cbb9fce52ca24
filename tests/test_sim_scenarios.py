"""Scenarios: each injects its problem after a healthy baseline, and truth says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monitor.records import FLAG_KINDS
from monitor.sim.engine import SimRun
from monitor.sim.scenarios import (
    SCENARIOS,
    SCRIPTS,
    GpuFault,
    StepTimeSpikes,
    UnknownScenario,
    list_scenarios,
    resolve_script,
)

PROBLEMS = [name for name, sc in SCENARIOS.items() if name != "healthy" and sc.kind is not None]


def _runs(name: str, **kw) -> SimRun:
    kw.setdefault("steps", 15)
    kw.setdefault("gpus_per_node", 4)
    kw.setdefault("seed", 11)
    return SimRun(name, **kw)


def _mean_in(run: SimRun, steps, phase: str, column: str, gpus=None) -> float:
    vals = []
    for st in steps:
        for label, a, b in st.timeline:
            if label != phase:
                continue
            for frac in (0.2, 0.4, 0.6, 0.8):
                rows = run.gpu_sample_at(a + frac * (b - a))
                vals += [r[column] for i, r in enumerate(rows) if gpus is None or i in gpus]
    return float(np.mean(vals))


def _split(run: SimRun):
    base = [s for s in run.steps if s.scenario == "healthy"]
    bad = [s for s in run.steps if s.scenario != "healthy"]
    return base, bad


def test_list_scenarios_names_every_flag_kind_and_the_demo_script():
    names = list_scenarios()
    assert names[0] == "healthy" and "demo" in names
    # fatal_error comes from failure lines (NCCL, Ray, signals, CUDA errors) the simulator does
    # not write; tests/test_detect_fatal_error.py covers it on logs shaped like users' posts.
    # skipped_updates (NaN grad norms) is judged on real verl's own NaN runs
    # (tests/test_real_verl.py) and tests/test_detect_skipped_updates.py; the simulator's grad
    # norms are always finite.
    assert set(FLAG_KINDS) - {"fatal_error", "skipped_updates"} <= set(names)


@pytest.mark.parametrize("name", sorted(SCENARIOS) + sorted(SCRIPTS))
def test_every_scenario_writes_all_files_with_matching_truth(name, tmp_path):
    run = SimRun(name, steps=9, gpus_per_node=2, seed=1, step_seconds=10)
    run.write(tmp_path)
    for f in ("train.log", "gpu.csv", "host.csv", "truth.json"):
        assert (tmp_path / f).stat().st_size > 0, f
    truth = json.loads((tmp_path / "truth.json").read_text())["truth"]
    kinds = {e["kind"] for e in truth}
    assert kinds <= set(FLAG_KINDS)
    if name == "healthy" or (name in SCENARIOS and SCENARIOS[name].kind is None):
        assert truth == []  # nothing wrong on this node (straggler_elsewhere: it only waits)
    elif name in SCENARIOS:
        assert SCENARIOS[name].kind in kinds  # rollouter_idle: pool_imbalance the other way
    else:
        assert kinds == {SCENARIOS[s].kind for s, _ in SCRIPTS[name] if SCENARIOS[s].kind}
    for e in truth:
        assert run.start_time < e["start"] <= e["end"] <= run.end_time
        assert set(e["related"]) <= set(FLAG_KINDS) and e["kind"] not in e["related"]


@pytest.mark.parametrize("name", PROBLEMS)
def test_problem_starts_after_a_healthy_third(name):
    run = _runs(name)
    first = min(e["start"] for e in run.truth)
    assert first - run.start_time >= (run.end_time - run.start_time) / 3 * 0.8 or (
        sum(1 for s in run.steps if s.end <= first) >= 15 / 3
    )


def test_io_starvation_waits_between_steps_with_a_pegged_core_and_idle_gpus():
    """As measured on the H200s: the stall is before the step timer, not inside the step."""
    run = _runs("io_starvation")
    base, bad = _split(run)
    # the logged steps do not grow: no timer covers the batch fetch
    other = [s.durations()["other"] / s.total for s in bad]
    assert max(other) < 0.05
    # the wall time between step lines does, more each step
    gaps = [b.start - a.end for a, b in zip(bad, bad[1:], strict=False)]
    assert gaps[-1] > gaps[0] and gaps[-1] > 0.25 * bad[-1].total
    base_gaps = [b.start - a.end for a, b in zip(base, base[1:], strict=False)]
    assert max(base_gaps) < 0.01
    mid = [(a.end + b.start) / 2 for a, b in zip(bad, bad[1:], strict=False)]
    hosts = [run.host_sample_at(t, "node0") for t in mid]
    assert min(h["cpu_max_core_pct"] for h in hosts) >= 98
    gpus = [r for t in mid for r in run.gpu_sample_at(t)]
    assert max(r["util"] for r in gpus) < 15
    assert run.truth[0]["needs"] == "times"


def test_gpu_imbalance_the_straggler_keeps_busy_while_peers_spin_in_collectives():
    """As measured on 2 H200s: waiters at ~100% utilization, SM ~0.58x the straggler's."""
    run = _runs("gpu_imbalance")
    (entry,) = run.truth
    target = entry["scope"]["gpus"][0]
    _, bad = _split(run)
    peers = [g for g in range(4) if g != target]
    sm_target = _mean_in(run, bad, "update_actor", "sm_active", [target])
    sm_peers = _mean_in(run, bad, "update_actor", "sm_active", peers)
    util_peers = _mean_in(run, bad, "update_actor", "util", peers)
    assert sm_target > 75 and sm_peers < 0.65 * sm_target and util_peers > 95
    # generation is not a synchronous phase here: no waiting there
    assert _mean_in(run, bad, "gen", "sm_active", peers) > 0.85 * _mean_in(
        run, bad, "gen", "sm_active", [target])


def test_gpu_imbalance_with_several_nodes_targets_one_node():
    run = _runs("gpu_imbalance", nodes=3, gpus_per_node=2)
    (entry,) = run.truth
    node = entry["scope"]["node"]
    assert entry["scope"]["gpus"] == [0, 1]
    _, bad = _split(run)
    st = bad[2]
    a, b = [(x, y) for lab, x, y in st.timeline if lab == "update_actor"][0]
    rows = run.gpu_sample_at((a + b) / 2)
    slow = [r["sm_active"] for r in rows if r["node"] == node]
    fast = [r["sm_active"] for r in rows if r["node"] != node]
    assert min(slow) * 0.7 > max(fast)


def test_rollout_long_tail_gpus_fall_idle_while_a_few_keep_working():
    run = _runs("rollout_long_tail", gpus_per_node=8)
    base, bad = _split(run)
    for st in bad:
        a, b = [(x, y) for lab, x, y in st.timeline if lab == "gen"][0]
        late = run.gpu_sample_at(a + 0.8 * (b - a))
        busy = sum(1 for r in late if r["util"] > 50)
        assert 1 <= busy <= 2
    m = bad[-1].metrics
    ratio = m["timing_s/agent_loop/slowest/generate_sequences"] / m[
        "timing_s/agent_loop/generate_sequences/mean"]
    base_m = base[-1].metrics
    base_ratio = base_m["timing_s/agent_loop/slowest/generate_sequences"] / base_m[
        "timing_s/agent_loop/generate_sequences/mean"]
    assert ratio > 4 and base_ratio < 2.5
    assert m["response_length/max"] / m["response_length/mean"] > 6


def test_reshard_spike_is_about_nine_seconds_with_a_memory_peak():
    run = _runs("reshard_spike")
    base, bad = _split(run)
    r_base = np.mean([s.durations()["reshard"] for s in base])
    r_bad = np.mean([s.durations()["reshard"] for s in bad])
    assert 0.6 < r_base < 1.3 and 6.5 < r_bad < 11
    def peak(steps):
        vals = []
        for st in steps:
            a, b = [(x, y) for lab, x, y in st.timeline if lab == "reshard"][0]
            vals += [r["mem_used_bytes"] for r in run.gpu_sample_at(a + 0.3 * (b - a))]
        return float(np.mean(vals)) / 150_754_820_096

    assert peak(bad) > 0.92 and peak(base) < 0.88


def test_comm_heavy_breakdown_reports_comm_over_a_quarter_of_the_step():
    run = _runs("comm_heavy", log_format="breakdown")
    base, bad = _split(run)
    line = run.log_lines(len(run.steps) - 1)[-1]
    assert line.startswith(f"Step {bad[-1].step}: total=") and "comm=" in line
    assert all(s.durations()["comm"] / s.total > 0.25 for s in bad)
    assert all(s.durations()["comm"] / s.total < 0.12 for s in base)
    assert _mean_in(run, bad, "comm", "sm_active") < 25


def test_comm_heavy_console_grows_update_actor_with_low_sm_tail():
    run = _runs("comm_heavy")
    base, bad = _split(run)
    ua_base = np.mean([s.metrics["timing_s/update_actor"] / s.total for s in base])
    ua_bad = np.mean([s.metrics["timing_s/update_actor"] / s.total for s in bad])
    assert ua_bad > ua_base + 0.15


def test_memory_pressure_near_capacity_with_reserved_peak():
    run = _runs("memory_pressure", verl_version="0.8")
    base, bad = _split(run)
    used = _mean_in(run, bad, "update_actor", "mem_used_bytes") / 150_754_820_096
    assert used > 0.94
    assert _mean_in(run, base, "update_actor", "mem_used_bytes") / 150_754_820_096 < 0.8
    assert bad[-1].metrics["actor/perf/max_memory_reserved_gb"] > 0.93 * 140.4


def test_oom_prints_a_traceback_and_the_run_stops():
    run = _runs("oom")
    assert run.outcome == "oom"
    lines = run.log_lines(len(run.steps) - 1)
    assert any("CUDA out of memory" in ln for ln in lines)
    assert len(run.steps) < 15
    after = run.gpu_sample_at(run.end_time - 1)
    assert max(r["util"] for r in after) < 5 and max(r["mem_used_bytes"] for r in after) < 1e9
    oom = [e for e in run.truth if e["kind"] == "oom"][0]
    assert oom["start"] > run.steps[-1].end


def test_stalled_log_goes_silent_and_gpus_idle_with_memory_held():
    run = _runs("stalled")
    assert run.outcome == "stalled"
    last_line_time = max(t for t, _ in run.timed_lines())
    assert run.end_time - last_line_time > 5 * 30
    mid = (run.steps[-1].end + run.end_time) / 2
    rows = run.gpu_sample_at(mid)
    assert max(r["util"] for r in rows) < 5
    assert min(r["mem_used_bytes"] for r in rows) > 0.5 * 150_754_820_096
    (entry,) = run.truth
    assert entry["start"] == pytest.approx(run.steps[-1].end)


def test_step_time_spikes_repeat_every_period():
    run = _runs("step_time_spikes", steps=30)
    base, bad = _split(run)
    median = np.median([s.total for s in base])
    spikes = [s.step for s in bad if s.total > 1.4 * median]
    assert len(spikes) >= 3
    assert set(np.diff(spikes)) == {5}
    assert run.truth[0]["spike_steps"] == spikes


def test_util_overstates_sm_in_training_phases():
    run = _runs("util_overstates_sm")
    _, bad = _split(run)
    assert _mean_in(run, bad, "update_actor", "util") > 85
    assert _mean_in(run, bad, "update_actor", "sm_active") < 16
    assert _mean_in(run, bad, "gen", "sm_active") > 45


def test_throughput_regression_drops_tokens_per_second_a_quarter_and_stays():
    run = _runs("throughput_regression")
    base, bad = _split(run)
    tp_base = np.mean([s.metrics["perf/throughput"] for s in base])
    assert all(s.metrics["perf/throughput"] < 0.75 * tp_base for s in bad)


def test_phase_imbalance_makes_scoring_slow():
    run = _runs("phase_imbalance")
    base, bad = _split(run)
    gen_to_values = [s.durations()["gen"] / s.durations()["values"] for s in bad]
    assert max(gen_to_values) < 4
    assert min(s.durations()["gen"] / s.durations()["values"] for s in base) > 6


def test_rollout_wait_over_fifty_ms_in_console_key_and_breakdown():
    run = _runs("rollout_wait")
    base, bad = _split(run)
    assert all(s.metrics["timing_s/rollout_wait"] > 0.05 for s in bad)
    assert all(s.metrics["timing_s/rollout_wait"] < 0.05 for s in base)
    bd = _runs("rollout_wait", log_format="breakdown")
    assert "rollout_wait=" in bd.log_lines(len(bd.steps) - 1)[-1]
    assert "timing_s/rollout_wait" not in SimRun(steps=2).steps[0].metrics


def test_low_utilization_sm_below_55_in_training_for_minutes():
    run = _runs("low_utilization")
    _, bad = _split(run)
    assert _mean_in(run, bad, "update_actor", "sm_active") < 55
    assert bad[-1].end - bad[0].start > 180


def test_gpu_fault_xid_counts_and_thermal_throttling_on_one_gpu():
    run = _runs("gpu_fault")
    (entry,) = run.truth
    g = entry["scope"]["gpus"][0]
    _, bad = _split(run)
    end = run.gpu_sample_at(run.end_time - 0.5)
    assert end[g]["xid"].get(94, 0) >= 2
    assert all(not r["xid"] for i, r in enumerate(end) if i != g)
    a, b = [(x, y) for lab, x, y in bad[-1].timeline if lab == "update_actor"][0]
    rows = run.gpu_sample_at((a + b) / 2)
    assert rows[g]["clock_events"]["hw_thermal_slowdown"] is True
    assert rows[g]["temperature_c"] > 85 and rows[g]["sm_clock_hz"] < 1.5e9
    assert not any(r["clock_events"]["hw_thermal_slowdown"] for i, r in enumerate(rows) if i != g)


def test_gpu_fault_down_mode_gpu_leaves_and_run_stalls():
    run = SimRun([("healthy", 5), (GpuFault(mode="down"), 5)], gpus_per_node=4, seed=2)
    kinds = {e["kind"] for e in run.truth}
    assert kinds == {"gpu_fault", "stalled"}
    g = [e for e in run.truth if e["kind"] == "gpu_fault"][0]["scope"]["gpus"][0]
    rows = run.gpu_sample_at(run.end_time - 1)
    assert rows[g]["up"] is False and rows[g]["xid"] == {79: 1}
    assert all(r["up"] for i, r in enumerate(rows) if i != g)


def test_scripts_from_strings_lists_and_parameters():
    run = SimRun("healthy:3,reshard_spike:2,healthy:2", gpus_per_node=2)
    assert [s.scenario for s in run.steps] == ["healthy"] * 3 + ["reshard_spike"] * 2 + [
        "healthy"] * 2
    (entry,) = run.truth
    assert entry["scope"]["steps"] == [4, 5]
    custom = SimRun([("healthy", 4), (StepTimeSpikes(period=2), 6)], gpus_per_node=2)
    assert custom.truth[0]["spike_steps"] == [6, 8, 10]
    with pytest.raises(UnknownScenario, match="valid: healthy"):
        resolve_script("healthy:3,bogus:2", None, 0.4)
    with pytest.raises(UnknownScenario, match="NAME:STEPS"):
        resolve_script("healthy:x", None, 0.4)


def test_demo_script_is_about_ten_minutes_and_covers_each_segment():
    run = SimRun("demo")
    minutes = (run.end_time - run.start_time) / 60
    assert 8.5 <= minutes <= 11.5
    kinds = [e["kind"] for e in run.truth]
    assert kinds == ["io_starvation", "reshard_spike", "gpu_imbalance", "rollout_long_tail"]
    assert [s.scenario for s in run.steps][-1] == "healthy"
    for e in run.truth:
        a, b = e["scope"]["steps"]
        assert b - a + 1 >= 4
