"""Telemetry sampling: exact signatures without noise, faults, host signals, bounds."""

from __future__ import annotations

import pytest

from monitor.sim.engine import SimRun
from monitor.sim.telemetry import GPU_SIGNATURES, power_of


def test_without_noise_samples_read_the_phase_signature():
    run = SimRun(steps=3, gpus_per_node=2, noise=0.0)
    st = run.steps[1]
    a, b = [(x, y) for lab, x, y in st.timeline if lab == "update_actor"][0]
    row = run.gpu_sample_at((a + b) / 2)[1]
    util, sm, tensor, dram, _occ = GPU_SIGNATURES["update_actor"]
    assert (row["util"], row["sm_active"], row["tensor_active"], row["dram_active"]) == (
        util, sm, tensor, dram)
    assert row["power_w"] == pytest.approx(power_of(util, sm, tensor))


def test_values_stay_in_range_everywhere():
    run = SimRun("io_starvation", steps=8, gpus_per_node=2, noise=3.0, seed=5)
    df = run.gpu_frame(0.5)
    for col in ("util", "sm_active", "tensor_active", "dram_active"):
        assert df[col].between(0, 100).all(), col
    assert (df["sm_active"] <= df["util"]).all()
    assert (df["mem_used_bytes"] <= df["mem_total_bytes"]).all()
    host = run.host_frame(0.5)
    assert host["cpu_max_core_pct"].between(0, 100).all()
    assert (host["cpu_max_core_pct"] >= host["cpu_avg_pct"]).all()


def test_gen_has_a_mild_tail_where_gpus_finish_at_different_times():
    run = SimRun(steps=10, gpus_per_node=8, seed=2)
    finished_early = 0
    for st in run.steps:
        a, b = [(x, y) for lab, x, y in st.timeline if lab == "gen"][0]
        rows = run.gpu_sample_at(a + 0.985 * (b - a))
        finished_early += sum(1 for r in rows if r["util"] < 10)
        assert any(r["util"] > 80 for r in rows)
    assert finished_early > 0


def test_unknown_node_is_a_clear_error():
    run = SimRun(steps=2, gpus_per_node=1)
    with pytest.raises(KeyError, match="unknown node 'node9'"):
        run.host_sample_at(run.start_time, "node9")
