"""The gpu collector: background sampling, rows to the window, exposition that promtool accepts."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.collectors.gpu import GpuCollector, reading_to_row
from exporters.gpu.backend import GpuIdentity, GpuReading
from exporters.gpu.sim import SimBackend
from exporters.options import ExporterOptions
from exporters.registry import REGISTRY, ExporterContext, load_all
from monitor import metric_names as mn
from monitor.live.live_monitor import Recorder
from monitor.live.rolling_window import RollingWindow
from monitor.sim import SimRun


class ListBackend:
    """A backend that plays back given readings, one list per sample (the last repeats)."""

    name = "sim"

    def __init__(self, ticks: list[list[GpuReading]]) -> None:
        self.ticks = ticks
        self.closed = False

    def devices(self) -> list[GpuIdentity]:
        return [GpuIdentity(r.index, f"GPU-{r.index}", "Test GPU") for r in self.ticks[0]]

    def sample(self) -> list[GpuReading]:
        return self.ticks.pop(0) if len(self.ticks) > 1 else self.ticks[0]

    def close(self) -> None:
        self.closed = True


def _ctx(**options) -> ExporterContext:
    opts = ExporterOptions(**{"gpu_backend": "sim", "scenario": "healthy", "sim_gpus": 4,
                              "seed": 0, **options})
    window = RollingWindow()
    return ExporterContext(node="node-a", interval=0.05, sink=Recorder(window), options=opts)


def _exposition(collector: GpuCollector) -> str:
    class Wrap:
        def collect(self):
            return collector.collect()

    reg = CollectorRegistry()
    reg.register(Wrap())
    return generate_latest(reg).decode()


def _series(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture(scope="module")
def sim_run() -> SimRun:
    return SimRun("healthy", steps=6, gpus_per_node=4, seed=0)


def test_registered_as_gpu_and_on_by_default():
    load_all()
    spec = REGISTRY["gpu"]
    assert spec.default is True and "GPU" in spec.help


@pytest.mark.slow
def test_sim_exposition_has_every_gpu_and_passes_promtool(sim_run):
    ctx = _ctx()
    col = GpuCollector(ctx, backend=SimBackend(run=sim_run))
    col.sample_once()
    text = _exposition(col)
    s = _series(text)
    assert len(s[mn.GPU_UP]) == 4 and set(s[mn.GPU_UP].values()) == {1.0}
    assert len(s[mn.GPU_SM_ACTIVE]) == 4
    info = next(iter(s[mn.GPU_INFO]))
    assert dict(info)["name"] == "NVIDIA H200 (simulated)"
    assert len(s[mn.GPU_PCIE_TX]) == 4 and len(s[mn.GPU_NVLINK_RX]) == 4  # simulated too
    assert "NaN" not in text
    assert mn.GPU_ENERGY in s  # counter keeps its _total name
    if shutil.which("promtool"):
        out = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                             capture_output=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr


def test_rows_reach_the_window_in_interchange_units(sim_run):
    ctx = _ctx()
    col = GpuCollector(ctx, backend=SimBackend(run=sim_run))
    assert col.sample_once()
    readings = col.snapshot()
    _steps, gpu_df, _host, _events = ctx.sink.window.frames()
    assert len(gpu_df) == 4
    assert set(gpu_df["node"]) == {"node-a"}
    row0 = gpu_df[gpu_df["gpu"] == 0].iloc[0]
    assert row0["util"] == pytest.approx(readings[0].util * 100.0)
    assert 0.0 <= row0["sm_active"] <= 100.0


def test_down_gpu_shows_up_zero_and_no_data_series():
    ok = GpuReading(index=0, ts=1.0, util=0.9, power_w=300.0, clock_events={"gpu_idle": False})
    down = GpuReading(index=1, ts=1.0, up=False, error="NVML: GPU is lost", xid_counts={79: 1})
    col = GpuCollector(_ctx(), backend=ListBackend([[ok, down]]))
    col.sample_once()
    s = _series(_exposition(col))
    assert s[mn.GPU_UP] == {(("gpu", "0"),): 1.0, (("gpu", "1"),): 0.0}
    assert set(s[mn.GPU_UTIL]) == {(("gpu", "0"),)}
    assert s[mn.GPU_XID] == {(("gpu", "1"), ("xid", "79")): 1.0}
    assert s[mn.GPU_CLOCK_EVENT] == {(("gpu", "0"), ("reason", "gpu_idle")): 0.0}
    row = reading_to_row(down, "n")
    assert row["up"] is False and row["xid_total"] == 1 and row["util"] is None


def test_rows_carry_the_gpm_link_rates():
    """PCIe and NVLink bytes per second reach the store (offload and collective signatures)."""
    r = GpuReading(index=0, ts=1.0, util=0.5, pcie_tx_bps=1e9, pcie_rx_bps=8e9,
                   nvlink_tx_bps=5e10, nvlink_rx_bps=6e10)
    row = reading_to_row(r, "n")
    assert (row["pcie_tx_bps"], row["pcie_rx_bps"]) == (1e9, 8e9)
    assert (row["nvlink_tx_bps"], row["nvlink_rx_bps"]) == (5e10, 6e10)
    assert reading_to_row(GpuReading(index=1, ts=1.0), "n")["pcie_rx_bps"] is None


def test_dcgm_compat_adds_dcgm_names_with_last_xid():
    first = GpuReading(index=0, ts=1.0, util=0.5, mem_used_bytes=1024.0 ** 3,
                       mem_total_bytes=4 * 1024.0 ** 3)
    second = GpuReading(index=0, ts=2.0, util=0.5, mem_used_bytes=1024.0 ** 3,
                        mem_total_bytes=4 * 1024.0 ** 3, xid_counts={48: 1})
    col = GpuCollector(_ctx(dcgm_compat=True), backend=ListBackend([[first], [second]]))
    col.sample_once()
    col.sample_once()
    s = _series(_exposition(col))
    labels = next(iter(s["DCGM_FI_DEV_FB_USED"]))
    assert dict(labels)["Hostname"] == "node-a" and dict(labels)["device"] == "nvidia0"
    assert s["DCGM_FI_DEV_FB_USED"][labels] == pytest.approx(1024.0)
    assert s["DCGM_FI_DEV_GPU_UTIL"][labels] == pytest.approx(50.0)
    assert s["DCGM_FI_DEV_XID_ERRORS"][labels] == 48.0
    assert mn.GPU_UTIL in s  # our own names stay


def test_background_thread_samples_and_stops(sim_run):
    backend = SimBackend(run=sim_run)
    col = GpuCollector(_ctx(), backend=backend)
    col.start()
    try:
        deadline = time.monotonic() + 10
        while col.samples < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert col.samples >= 3
        assert col.healthy()
    finally:
        col.stop()
    assert col._thread is None  # noqa: SLF001 - stopped, not leaked
    n = col.samples
    time.sleep(0.15)
    assert col.samples == n


def test_window_failure_marks_collector_unhealthy_in_words():
    ok = GpuReading(index=0, ts=1.0, util=0.2)
    ctx = _ctx()
    ctx.sink = Recorder(object())  # not a window: add_gpu is missing
    col = GpuCollector(ctx, backend=ListBackend([[ok]]))
    assert col.sample_once() is False
    assert not col.healthy()
    assert "window" in (col.last_error or "")
    assert _series(_exposition(col))[mn.GPU_UTIL]  # the snapshot still serves scrapes


def test_backend_chosen_from_options_when_not_given():
    col = GpuCollector(_ctx(sim_gpus=2))
    assert col.backend.name == "sim"
    col.sample_once()
    assert len(col.snapshot()) == 2


def test_activity_counters_give_the_mean_of_every_sample_between_two_scrapes():
    """Scraped rarely at a fixed point of a 3-sample cycle, the gauge shows one phase only;
    the counters' deltas give the mean over every 1 s sample in between (issue 24)."""
    from exporters.collectors.gpu import ActivityIntegral

    cycle = [(0.9, 0.8), (0.9, 0.5), (0.3, 0.2)]  # (util, sm_active) in a 3-second "step"
    integral = ActivityIntegral(max_step_s=3.0)
    seen = []
    for t in range(31):
        util, sm = cycle[t % 3]
        integral.add([GpuReading(index=0, ts=float(t), util=util, sm_active=sm),
                      GpuReading(index=1, ts=float(t), util=0.5)], now=float(t))
        if t in (1, 28):  # two "scrapes", both at the second sample of the cycle
            seen.append([list(f.samples) for f in integral.families()])
    (s0, b0, a0, n0), (s1, b1, a1, n1) = seen
    assert n1[0].value - n0[0].value == 27
    sampled = s1[0].value - s0[0].value
    assert sampled == pytest.approx(27.0)
    assert (b1[0].value - b0[0].value) / sampled == pytest.approx(0.7)  # mean util, not 0.9
    assert (a1[0].value - a0[0].value) / sampled == pytest.approx(0.5)  # mean SM, not 0.5-only
    # GPU 1 has no GPM: no SM counter for it, utilization still counted
    assert [s.labels["gpu"] for s in a1] == ["0"] and len(b1) == 2


def test_activity_counters_skip_gaps_and_down_gpus():
    from exporters.collectors.gpu import ActivityIntegral

    integral = ActivityIntegral(max_step_s=2.0)
    integral.add([GpuReading(index=0, ts=0.0, util=1.0)], now=0.0)
    integral.add([GpuReading(index=0, ts=60.0, util=1.0)], now=60.0)  # a stalled sampler
    integral.add([GpuReading(index=0, ts=61.0, up=False)], now=61.0)
    assert integral.totals[0] == [2.0, 2.0, 0.0, 1.0]


def test_activity_counters_are_exported_and_pass_promtool(sim_run):
    col = GpuCollector(_ctx(), backend=SimBackend(run=sim_run))
    for _ in range(3):
        col.sample_once()
        time.sleep(0.01)
    text = _exposition(col)
    s = _series(text)
    assert len(s[mn.GPU_SAMPLED_SECONDS]) == 4 and len(s[mn.GPU_SM_ACTIVE_SECONDS]) == 4
    for labels, secs in s[mn.GPU_SAMPLED_SECONDS].items():
        assert 0 < s[mn.GPU_SM_ACTIVE_SECONDS][labels] <= secs
        assert 0 < s[mn.GPU_BUSY_SECONDS][labels] <= secs
    if shutil.which("promtool"):
        res = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                             capture_output=True)
        assert res.returncode == 0, res.stdout + res.stderr
