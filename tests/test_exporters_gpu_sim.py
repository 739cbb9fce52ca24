"""The simulated GPU backend: monitor.sim runs seen through the NVML backend's interface."""

from __future__ import annotations

import math

import pytest

from exporters.gpu.sim import SIM_GPU_NAME, SimBackend, row_to_reading
from monitor.sim import SimRun
from monitor.sim.live import LiveSim


class StepClock:
    """A wall clock the test moves by hand."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def fault_run() -> SimRun:
    return SimRun("gpu_fault", steps=8, gpus_per_node=4, seed=1)


def test_readings_are_ratios_for_every_gpu():
    be = SimBackend("healthy", gpus_per_node=4, seed=3)
    readings = be.sample()
    assert [r.index for r in readings] == [0, 1, 2, 3]
    for r in readings:
        assert r.up
        for v in (r.util, r.sm_active, r.tensor_active, r.dram_active, r.sm_occupancy):
            assert v is not None and 0.0 <= v <= 1.0
        assert r.mem_total_bytes and r.mem_used_bytes <= r.mem_total_bytes
        # the simulator models PCIe and NVLink traffic too, so Grafana panels have data
        assert r.pcie_tx_bps is not None and r.pcie_tx_bps >= 0
        assert r.nvlink_rx_bps is not None and r.nvlink_rx_bps >= 0


def test_devices_have_stable_uuid_and_simulated_name():
    a = SimBackend("healthy", gpus_per_node=2).devices()
    b = SimBackend("healthy", gpus_per_node=2).devices()
    assert a == b
    assert a[0].uuid.startswith("GPU-") and a[0].uuid != a[1].uuid
    assert a[0].name == SIM_GPU_NAME


def test_values_follow_the_simulated_time(fault_run: SimRun):
    clock = StepClock(5_000.0)
    be = SimBackend(run=fault_run, clock=clock)
    truth = fault_run.truth[0]
    bad = truth["scope"]["gpus"][0]
    clock.t += (truth["end"] - fault_run.start_time) - 1.0  # just before the fault ends
    readings = be.sample()
    assert sum(readings[bad].xid_counts.values()) >= 1
    assert all(not r.xid_counts for i, r in enumerate(readings) if i != bad)
    expected = fault_run.gpu_sample_at(truth["end"] - 1.0)[0]["util"] / 100.0
    assert readings[0].util == pytest.approx(expected)


def test_time_loops_after_the_run_ends(fault_run: SimRun):
    clock = StepClock(100.0)
    be = SimBackend(run=fault_run, clock=clock)
    span = fault_run.end_time - fault_run.start_time
    first = [r.util for r in be.sample()]
    clock.t += span  # exactly one loop later: same simulated moment
    assert [r.util for r in be.sample()] == pytest.approx(first)


def test_shared_live_sim_sets_the_time(tmp_path, fault_run: SimRun):
    live = LiveSim(fault_run, tmp_path / "train.log")
    be = SimBackend(live_sim=live)
    assert be.run is fault_run
    expected = [row["util"] / 100.0 for row in fault_run.gpu_sample_at(live.now_sim())]
    assert [r.util for r in be.sample()] == pytest.approx(expected)


def test_node_is_picked_by_name_else_the_first():
    run = SimRun("gpu_imbalance", steps=4, nodes=2, gpus_per_node=2, seed=2)
    t = StepClock(0.0)
    second = SimBackend(run=run, node="node1", clock=t)
    other = SimBackend(run=run, node="my-hostname", clock=t)
    assert second.node == "node1" and other.node == "node0"
    rows = {(r["node"], r["gpu"]): r for r in run.gpu_sample_at(run.start_time)}
    assert second.sample()[1].util == pytest.approx(rows[("node1", 1)]["util"] / 100.0)


def test_scale_of_64_gpus():
    be = SimBackend("healthy", gpus_per_node=64)
    assert len(be.sample()) == 64
    assert len(be.devices()) == 64


def test_unknown_scenario_is_a_clear_error():
    with pytest.raises(ValueError, match="no_such_scenario"):
        SimBackend("no_such_scenario")


def test_row_conversion_turns_nan_into_none_and_keeps_down_gpus():
    r = row_to_reading({"gpu": 2, "util": 50.0, "sm_active": math.nan, "up": True,
                        "clock_events": {"sw_power_cap": 1}, "xid": {"79": 3}}, ts=1.0)
    assert r.util == 0.5 and r.sm_active is None
    assert r.clock_events == {"sw_power_cap": True} and r.xid_counts == {79: 3}
    down = row_to_reading({"gpu": 1, "up": False, "util": 10.0}, ts=1.0)
    assert not down.up and down.util is None and "simulated" in (down.error or "")


def test_from_options_reads_the_exporter_flags():
    from cli.commands.exporter import parse_options

    be = SimBackend.from_options(parse_options(["--scenario", "healthy", "--sim-gpus", "3",
                                                "--seed", "4"]))
    assert len(be.sample()) == 3


def test_samples_of_a_played_run_are_stamped_on_its_own_clock(tmp_path, fault_run: SimRun):
    """A run played at 10x: the readings carry the simulated instant they show, the clock its
    log lines are captured on, so each sample falls in the phase it was taken in."""
    live = LiveSim(fault_run, tmp_path / "train.log", speed=10.0)
    be = SimBackend(live_sim=live, clock=StepClock(5.0))
    t0 = live.now_sim()
    stamps = {r.ts for r in be.sample()}
    assert len(stamps) == 1 and t0 <= stamps.pop() <= live.now_sim()
