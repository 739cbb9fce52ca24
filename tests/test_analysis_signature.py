"""The GPU/host signature classifier on measured rows, real H200 recordings and simulated runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli.commands.analyze import merge_events, read_events
from monitor.analysis import signature as S
from monitor.analysis.attribution import label_samples, phase_timeline
from monitor.config import load_config
from monitor.frames import read_gpu_frame, read_host_frame
from monitor.logs.canonical_records import parse_file
from monitor.sim.engine import SimRun

FIXTURES = Path(__file__).parent / "fixtures" / "real_gpu"
TH = S.Thresholds.from_config(load_config().section("signature"))


def _one(util, sm, dram=np.nan, pcie=np.nan, cpu=np.nan, tensor=np.nan) -> str:
    return str(S.classify([util], [sm], [dram], [pcie], [cpu], [tensor], TH)[0])


def test_the_anchor_table_rows_of_the_h200_read_as_expected():
    """ANCHORS.md's GPM table (util, SM, tensor, DRAM) measured on an H200."""
    assert _one(89, 82, dram=14, tensor=79) == "busy"          # bf16 matmul loop
    assert _one(100, 99, dram=81, tensor=10) == "memory_bound"  # device-to-device copy
    assert _one(33, 15, dram=13, tensor=0) == "thin"           # stream of tiny kernels
    assert _one(3, 3, dram=1, tensor=3, cpu=20) == "idle"      # idle


@pytest.mark.parametrize(("row", "want"), [
    (dict(util=2, sm=1, cpu=100), "cpu_bound"),            # GPUs idle, one core pegged
    (dict(util=100, sm=4, cpu=100), "cpu_bound"),          # ranks spin in a barrier for the driver
    (dict(util=100, sm=4, cpu=30), "collective_spin"),     # spinning in a collective
    (dict(util=2, sm=1, cpu=30), "idle"),
    (dict(util=80, sm=52, dram=25, pcie=8e9), "pcie_bound"),  # offload copies
    (dict(util=95, sm=85, dram=30, pcie=8e9), "busy"),     # copies overlapped with busy SMs
    (dict(util=92, sm=58, dram=65, tensor=22), "memory_bound"),  # decode
    (dict(util=40, sm=18, dram=8), "thin"),                # thin decode / tiny kernels
    (dict(util=75, sm=50, dram=35), "light"),
])
def test_each_signature_by_its_rule(row, want):
    assert _one(**row) == want


def test_without_sm_activity_no_spin_is_claimed_and_unknown_rows_stay_blank():
    out = S.classify([100.0, np.nan], [np.nan, np.nan], th=TH)
    assert list(out) == ["busy", ""]


def test_thresholds_come_from_the_config_and_can_be_overridden():
    th = S.Thresholds.from_config({"cpu_pegged_pct": 99.0})
    assert th.cpu_pegged_pct == 99.0 and th.busy_sm_min == S.Thresholds().busy_sm_min
    assert str(S.classify([2], [1], cpu_max=[95], th=th)[0]) == "idle"
    assert TH == S.Thresholds()  # defaults.yaml and the dataclass agree


def test_host_cpu_is_matched_per_node_and_within_the_tolerance():
    gpu = pd.DataFrame({"ts": [10.0, 10.0, 50.0], "node": ["a", "b", "a"], "gpu": [0, 0, 0],
                        "util": [1.0, 1.0, 1.0], "sm_active": [0.5, 0.5, 0.5]})
    host = pd.DataFrame({"ts": [10.2, 10.1], "node": ["a", "b"],
                         "cpu_max_core_pct": [100.0, 20.0]})
    sig = S.sample_signatures(gpu, host, TH)
    # node a's core is pegged; node b's is not; the sample at 50 s has no host sample near it
    assert list(sig) == ["cpu_bound", "idle", "idle"]


def _recording(run: str) -> pd.DataFrame:
    d = FIXTURES / run
    parsed = parse_file(str(d / "train.jsonl"))
    events = merge_events(parsed.events, read_events(str(d / "events.json")))
    timeline = phase_timeline(parsed.steps, events)
    gpu = label_samples(read_gpu_frame(d / "gpu.csv"), timeline)
    host = read_host_frame(d / "host.csv")
    return S.summarize(gpu[gpu["phase"].notna()], ["phase"], TH, host).set_index("phase")


def test_recorded_h200_runs_show_their_signatures():
    """Real recordings (2 H200s): the driver scores rewards on one CPU core while the GPUs
    wait; the small model's decode keeps few SMs busy; the reference pass is busy; tiny
    micro-batches make the update thin."""
    healthy = _recording("2gpu_healthy")
    assert healthy.loc["reward", "signature"] == "cpu_bound"
    assert healthy.loc["gen", "signature"] == "thin"
    assert healthy.loc["ref", "signature"] == "busy"
    assert healthy.loc["update_actor", "signature"] == "busy"
    tiny = _recording("2gpu_tiny_micro")
    assert tiny.loc["update_actor", "signature"] == "thin"
    truth = json.loads((FIXTURES / "2gpu_tiny_micro" / "truth.json").read_text())
    assert truth["name"] == "tiny_micro"


def _sim(scenario: str) -> pd.DataFrame:
    run = SimRun(scenario, steps=8, gpus_per_node=2, seed=1, step_seconds=20)
    gpu = run.gpu_frame(1.0)
    gpu["phase"] = [run.phase_at(t) for t in gpu["ts"]]
    return S.summarize(gpu, ["phase"], TH, run.host_frame(1.0)).set_index("phase")


def test_simulated_runs_show_their_signatures():
    healthy = _sim("healthy")
    assert healthy.loc["update_actor", "signature"] == "busy"
    assert healthy.loc["gen", "signature"] == "memory_bound"
    assert healthy.loc["comm", "signature"] == "collective_spin"
    assert healthy.loc["gap", "signature"] == "idle"
    assert _sim("io_starvation").loc["data_wait", "signature"] == "cpu_bound"
    assert _sim("util_overstates_sm").loc["update_actor", "signature"] == "thin"


def test_pcie_columns_of_the_simulated_gpu_reach_the_summary():
    healthy = _sim("healthy")
    assert healthy["pcie_bps"].notna().all() and healthy["nvlink_bps"].notna().all()
    # the weight sync moves the most over PCIe; a healthy update stays well under the line
    assert healthy.loc["reshard", "pcie_bps"] > healthy.loc["update_actor", "pcie_bps"]
    assert healthy.loc["update_actor", "pcie_bps"] < TH.pcie_bps_min


def test_dominant_prefers_a_waiting_signature_held_by_a_third_of_the_samples():
    table = pd.DataFrame({
        "phase": ["old_log_prob", "ref", "update_actor"], "n": [20, 15, 50],
        "util": [80.0, 80.0, 95.0], "sm": [50.0, 52.0, 85.0], "dram_active": [20.0] * 3,
        "tensor_active": [10.0] * 3, "pcie_bps": [9e9, 9e9, 0.3e9], "nvlink_bps": [np.nan] * 3,
        "cpu_max": [40.0] * 3, "signature": ["pcie_bound", "pcie_bound", "busy"]})
    assert S.dominant(table).name == "busy"
    sig = S.dominant(table, prefer=("pcie_bound",))
    assert sig.name == "pcie_bound" and sig.phase == "old_log_prob"
    assert "PCIe 9.0 GB/s" in sig.evidence() and "PCIe-bound" in sig.evidence()
    assert S.dominant(table.iloc[:0]) is None


def test_a_recorded_nccl_hang_spins_in_the_collective():
    """2 H200s, rank 1 stops before an all-reduce: GPU 0 sits in the collective (util ~95%,
    SM well under 20%) until the watchdog fires."""
    d = FIXTURES / "2gpu_nccl_hang"
    last = max(s.end_time for s in parse_file(str(d / "train.jsonl")).steps)
    gpu = read_gpu_frame(d / "gpu.csv")
    gpu = gpu[(gpu["ts"] > last + 5) & (gpu["gpu"] == 0)].assign(phase="hung")
    table = S.summarize(gpu, ["phase"], TH, read_host_frame(d / "host.csv"))
    assert table["signature"].tolist() == ["collective_spin"]
