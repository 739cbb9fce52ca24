"""gpu_imbalance, low_utilization and util_overstates_sm on small hand-made frames."""

import numpy as np
import pandas as pd
import pytest
from detect_builders import make_gpu, make_host, make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.gpu_activity import (
    detect_gpu_imbalance,
    detect_low_utilization,
    detect_util_overstates_sm,
)
from monitor.frames import empty_gpu_frame, empty_host_frame
from monitor.records import TRAINING_PHASES


def _ctx(steps, gpu, events=(), now=None, config=None):
    return make_context(steps, gpu, make_host(gpu) if len(gpu) else empty_host_frame(),
                        list(events), config or load_config(), now)


def _slow_gpu(gpu_index, from_step, factor=0.35, node=None):
    def edit(df):
        sel = (df["gpu"] == gpu_index) & (df["step"] >= from_step) & (df["util"] > 20)
        if node is not None:
            sel &= df["node"] == node
        df.loc[sel, "sm_active"] *= factor
        df.loc[sel, "util"] *= 0.8
    return edit


def test_lagging_gpu_is_named_with_numbers_and_steps():
    steps = make_steps(30)
    gpu = make_gpu(steps, edit=_slow_gpu(3, 15))
    flags = detect_gpu_imbalance(_ctx(steps, gpu))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["gpus"] == [3] and f.scope["node"] == "n0"
    assert f.scope["steps"][0] == 15
    assert "GPU 3" in f.evidence and "SM activity" in f.evidence and "peer median" in f.evidence
    # opens after the persistence window, not at the first slow sample
    assert f.start > steps[14].end_time - 1
    assert f.end is None  # still lagging at the end of the data
    assert any("trainer.balance_batch" in a for a in f.advice)


def test_imbalance_closes_when_the_gpu_recovers():
    steps = make_steps(40)

    def edit(df):
        sel = (df["gpu"] == 5) & df["step"].between(10, 20) & (df["util"] > 20)
        df.loc[sel, "sm_active"] *= 0.3

    flags = detect_gpu_imbalance(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1 and flags[0].end is not None
    assert flags[0].end <= steps[21].end_time
    assert flags[0].severity in ("warning", "critical")


def test_healthy_gpus_and_single_gpu_give_no_imbalance():
    steps = make_steps(30)
    assert detect_gpu_imbalance(_ctx(steps, make_gpu(steps))) == []
    one = make_gpu(steps, n_gpus=1, edit=_slow_gpu(0, 10))
    assert detect_gpu_imbalance(_ctx(steps, one)) == []


def test_without_sm_activity_utilization_is_compared():
    steps = make_steps(30)

    def edit(df):
        sel = (df["gpu"] == 2) & (df["step"] >= 12) & (df["util"] > 20)
        df.loc[sel, "util"] *= 0.3

    flags = detect_gpu_imbalance(_ctx(steps, make_gpu(steps, edit=edit, sm=False)))
    assert len(flags) == 1 and flags[0].scope["gpus"] == [2]
    assert "utilization" in flags[0].evidence and "SM activity" not in flags[0].evidence


def test_a_whole_slow_node_is_flagged_as_the_node():
    steps = make_steps(30)
    gpu = make_gpu(steps, n_gpus=4, nodes=("n0", "n1", "n2"), edit=_slow_gpu_node("n1", 12))
    flags = detect_gpu_imbalance(_ctx(steps, gpu))
    assert len(flags) == 1
    assert flags[0].scope["node"] == "n1" and "gpus" not in flags[0].scope
    assert "Node n1" in flags[0].evidence


def _slow_gpu_node(node, from_step):
    def edit(df):
        sel = (df["node"] == node) & (df["step"] >= from_step) & (df["util"] > 20)
        df.loc[sel, "sm_active"] *= 0.35
    return edit


def test_low_utilization_in_training_phases_for_minutes():
    steps = make_steps(30)

    def edit(df):
        sel = df["phase"].isin(TRAINING_PHASES) & (df["step"] >= 10)
        df.loc[sel, "sm_active"] = 45.0
        df.loc[sel, "util"] = 62.0

    flags = detect_low_utilization(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1
    f = flags[0]
    assert "45%" in f.evidence and "training phases" in f.evidence
    # "for minutes": 120 s = four 30 s steps from step 10 (four whole steps would be as soon)
    assert f.start >= steps[12].end_time
    assert f.severity == "warning"


def test_low_activity_in_gen_only_is_not_low_utilization():
    steps = make_steps(30)

    def edit(df):
        df.loc[df["phase"] == "gen", "sm_active"] = 30.0

    assert detect_low_utilization(_ctx(steps, make_gpu(steps, edit=edit))) == []


def test_very_low_activity_is_critical():
    steps = make_steps(20)

    def edit(df):
        sel = df["phase"].isin(TRAINING_PHASES)
        df.loc[sel, "sm_active"] = 20.0

    flags = detect_low_utilization(_ctx(steps, make_gpu(steps, edit=edit)))
    assert flags and flags[0].severity == "critical"


def test_util_overstates_sm_names_the_phase():
    steps = make_steps(30)

    def edit(df):
        sel = (df["phase"] == "update_actor") & (df["step"] >= 10)
        df.loc[sel, "util"] = 92.0
        df.loc[sel, "sm_active"] = 10.0

    flags = detect_util_overstates_sm(_ctx(steps, make_gpu(steps, edit=edit)))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["phase"] == "update_actor" and f.scope["gpus"] == list(range(8))
    assert "92% utilization" in f.evidence and "10% SM activity" in f.evidence
    assert f.severity == "critical"


def test_util_overstates_sm_needs_sm_activity():
    steps = make_steps(20)

    def edit(df):
        df.loc[df["phase"] == "update_actor", "sm_active"] = 10.0

    assert detect_util_overstates_sm(_ctx(steps, make_gpu(steps, edit=edit, sm=False))) == []
    # healthy generation (util 93, SM 60) is not a tiny-kernel workload
    assert detect_util_overstates_sm(_ctx(steps, make_gpu(steps))) == []


def test_empty_inputs_and_no_steps():
    assert make_context([], empty_gpu_frame(), empty_host_frame(), [], load_config()) is None
    steps = make_steps(10)
    ctx = _ctx(steps, empty_gpu_frame())
    for fn in (detect_gpu_imbalance, detect_low_utilization, detect_util_overstates_sm):
        assert fn(ctx) == []


def test_gpu_data_without_any_log_uses_fixed_windows():
    steps = make_steps(20)
    gpu = make_gpu(steps, edit=_slow_gpu(6, 1, factor=0.2))
    flags = detect_gpu_imbalance(_ctx([], gpu))
    assert len(flags) == 1 and flags[0].scope["gpus"] == [6]
    assert "steps" not in flags[0].scope


def test_missing_phases_do_not_break_detection():
    steps = make_steps(30, shares={"gen": 0.6, "update_actor": 0.4})
    for s in steps[::3]:
        s.phases = {}
    gpu = make_gpu(steps, edit=_slow_gpu(1, 10))
    flags = detect_gpu_imbalance(_ctx(steps, gpu))
    assert [f.scope["gpus"] for f in flags] == [[1]]
    assert isinstance(pd.DataFrame, type) and np.isfinite(flags[0].start)


def _straggler(gpu_slow: int, steps_on: range, phase: str = "update_actor"):
    """In ``phase`` on ``steps_on``, GPU ``gpu_slow`` keeps working while the others spin in the
    all-reduce: utilization 100% everywhere, SM activity 96% on it and 57% on the waiters (the
    signature measured on 2 H200s)."""
    def edit(df):
        sel = (df["phase"] == phase) & df["step"].isin(list(steps_on))
        df.loc[sel, "util"] = 100.0
        df.loc[sel & (df["gpu"] == gpu_slow), "sm_active"] = 96.0
        df.loc[sel & (df["gpu"] != gpu_slow), "sm_active"] = 57.0
    return edit


def test_the_straggler_is_the_busy_gpu_not_the_one_waiting_in_collectives():
    steps = make_steps(n=20, step_s=20.0)
    gpu = make_gpu(steps, n_gpus=2, interval=0.5, edit=_straggler(1, range(8, 14)))
    flags = detect_gpu_imbalance(_ctx(steps, gpu))
    assert flags, "the straggler went unflagged"
    assert all(f.scope["gpus"] == [1] for f in flags), [f.scope for f in flags]
    f = flags[0]
    assert f.scope["phase"] == "update_actor"
    assert f.scope["steps"][0] <= 9 and f.scope["steps"][1] == 13
    assert "GPU 1 is the straggler in update_actor" in f.evidence
    assert "GPU 0 averaged 57% SM activity at 100% utilization" in f.evidence
    assert any("nvidia-smi" in a for a in f.advice)


def test_a_straggler_among_eight_is_named_and_an_idle_gpu_is_still_below_its_peers():
    steps = make_steps(n=20, step_s=20.0)
    gpu = make_gpu(steps, n_gpus=8, interval=0.5, edit=_straggler(5, range(8, 14)))
    flags = detect_gpu_imbalance(_ctx(steps, gpu))
    assert [f.scope["gpus"] for f in flags] == [[5]]
    # a GPU that is idle (low utilization too) is not waiting in a collective: old rule holds

    def idle(df):
        sel = (df["gpu"] == 3) & (df["step"] >= 8)
        df.loc[sel, ["util", "sm_active"]] = [5.0, 2.0]
    gpu2 = make_gpu(steps, n_gpus=8, interval=0.5, edit=idle)
    flags2 = detect_gpu_imbalance(_ctx(steps, gpu2))
    assert flags2 and flags2[0].scope["gpus"] == [3] and "straggler" not in flags2[0].evidence


def test_low_utilization_with_short_steps_opens_after_four_steps_not_minutes():
    """Steps of 10 s (the real-GPU bench): four whole steps, not 120 s, and never the warm-up."""
    steps = make_steps(30, step_s=10.0)

    def edit(df):
        sel = df["phase"].isin(TRAINING_PHASES) & ((df["step"] >= 10) | (df["step"] == 1))
        df.loc[sel, "sm_active"] = 30.0

    (f,) = detect_low_utilization(_ctx(steps, make_gpu(steps, interval=0.5, edit=edit)))
    assert f.severity == "critical"  # 30% is below the critical line
    assert f.scope["steps"][0] == 10  # step 1 (warm-up) was low too, and is not judged
    assert steps[12].end_time - 1 <= f.start < steps[14].end_time


# --- evidence and advice by signature (issue 23) ---------------------------------------------

def _low_training(pcie_rx: float, sm: float = 45.0, dram: float = 15.0):
    steps = make_steps(30)

    def edit(df):
        sel = df["phase"].isin(TRAINING_PHASES) & (df["step"] >= 10)
        df.loc[sel, "sm_active"] = sm
        df.loc[sel, "util"] = 62.0
        df["dram_active"] = dram
        df["pcie_tx_bps"] = 0.1e9
        df["pcie_rx_bps"] = 0.1e9
        df.loc[sel, "pcie_rx_bps"] = pcie_rx

    return detect_low_utilization(_ctx(steps, make_gpu(steps, edit=edit)))


def test_low_utilization_waiting_on_pcie_leads_with_offload_not_micro_batches():
    (flag,) = _low_training(pcie_rx=9e9)
    assert "PCIe-bound" in flag.evidence and "GB/s" in flag.evidence
    assert "fsdp_config.param_offload" in flag.advice[0]
    assert not any("micro_batch" in a or "use_dynamic_bsz" in a for a in flag.advice)


def test_low_utilization_with_thin_kernels_and_quiet_pcie_leads_with_micro_batches():
    (flag,) = _low_training(pcie_rx=0.1e9, sm=30.0)
    assert "thin" in flag.evidence
    assert "micro_batch_size_per_gpu" in flag.advice[0]
    # PCIe was read and found quiet: "turn offload off" is contradicted, not shown
    assert not any("Turn off offloading" in a for a in flag.advice)


def test_training_phases_shorter_than_a_few_samples_are_not_judged():
    """5 s steps (a 10x simulated run): the training phases last ~2 s, two 1 s samples that
    straddle the phase edges; low readings there are not low utilization. The same low SM
    activity over 30 s steps is."""
    from detect_builders import make_gpu, make_steps

    from monitor.detect import make_context
    from monitor.detect.gpu_activity import detect_low_utilization

    def low(df):
        df.loc[df["phase"].isin(["old_log_prob", "ref", "update_actor"]), "sm_active"] = 30.0

    for step_s, flagged in ((5.0, False), (30.0, True)):
        steps = make_steps(n=30, step_s=step_s)
        ctx = make_context(steps, make_gpu(steps, n_gpus=2, edit=low), None, [])
        assert bool(detect_low_utilization(ctx)) is flagged, step_s


def _low_utilization_flags(scenario: str, tmp_path):
    from monitor.detect import run_all
    from monitor.frames import read_gpu_frame, read_host_frame
    from monitor.logs.canonical_records import parse_file
    from monitor.sim.engine import SimRun
    from monitor.sim.scenarios import get_scenario

    run = SimRun(get_scenario(scenario), steps=24, nodes=1, seed=3)
    run.write(tmp_path)
    parsed = parse_file(tmp_path / "train.log")
    flags = run_all(parsed.steps, read_gpu_frame(tmp_path / "gpu.csv"),
                    read_host_frame(tmp_path / "host.csv"), parsed.events)
    return [f for f in flags if f.kind == "low_utilization"]


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_a_node_that_reads_like_a_waiter_is_told_to_look_for_the_straggler_first(tmp_path):
    """Issue 24: a node whose GPUs wait for a straggler on another node (util ~95%, SM ~46%)
    was told to raise its micro-batch size; it is now told to rule out a slower rank first."""
    (waiting,) = _low_utilization_flags("straggler_elsewhere", tmp_path / "w")
    assert "waiting in collectives for a slower rank" in waiting.evidence
    assert waiting.advice[0].startswith("Before tuning this node, rule out a slower GPU")
    # a node whose own work is light (util drops with the SMs) keeps the tuning advice alone
    (light,) = _low_utilization_flags("low_utilization", tmp_path / "l")
    assert "waiting in collectives" not in light.evidence
    assert not any("rule out a slower GPU" in a for a in light.advice)
    assert any("ppo_micro_batch_size_per_gpu" in a for a in light.advice)
