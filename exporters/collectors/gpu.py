"""The ``gpu`` collector: a background sampler over a GPU backend (NVML or simulated).

Every ``ctx.interval`` seconds the sampler thread reads all GPUs once, keeps the readings as
the latest snapshot, and pushes interchange rows (``monitor.frames.GPU_COLUMNS`` plus ``up``,
``xid_total``, ``throttle``) to the sink (the monitor's window and run store). A scrape only turns the
snapshot into metric families; it never touches the GPU.

Options read from ``ctx.options``: ``gpu_backend`` (``nvml``/``sim``), ``dcgm_compat``, and
what the chosen backend reads (see ``exporters.gpu.make_backend``). ``ctx.gpu_backend`` is
the backend the exporter built (shared with the host collector's simulated host); without one
the collector builds its own, with ``ctx.live_sim`` as a shared simulator clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.dcgm import dcgm_families, latest_xid
from exporters.gpu import default_backend_name, make_backend
from exporters.gpu.backend import GpuBackend, GpuIdentity, GpuReading
from exporters.gpu.nvml import throttled
from exporters.gpu.processes import ProcessWatch
from exporters.registry import ExporterContext, register
from exporters.sampling import SampledCollector
from monitor import metric_names as mn
from monitor.live import FlagGroup

#: (metric name, help, GpuReading attribute) for the plain per-GPU gauges.
GAUGES: tuple[tuple[str, str, str], ...] = (
    (mn.GPU_UTIL, "NVML utilization: share of time a kernel was running (0..1).", "util"),
    (mn.GPU_SM_ACTIVE, "GPM SM activity: share of SMs busy (0..1).", "sm_active"),
    (mn.GPU_SM_OCCUPANCY, "GPM SM occupancy: resident warps over the maximum (0..1).",
     "sm_occupancy"),
    (mn.GPU_TENSOR_ACTIVE, "GPM share of time any tensor pipe was active (0..1).",
     "tensor_active"),
    (mn.GPU_DRAM_ACTIVE, "GPM DRAM bandwidth used over the peak (0..1).", "dram_active"),
    (mn.GPU_MEM_USED, "Framebuffer memory in use.", "mem_used_bytes"),
    (mn.GPU_MEM_TOTAL, "Framebuffer memory size.", "mem_total_bytes"),
    (mn.GPU_POWER, "Power draw.", "power_w"),
    (mn.GPU_TEMP, "GPU core temperature.", "temperature_c"),
    (mn.GPU_SM_CLOCK, "SM clock frequency.", "sm_clock_hz"),
    (mn.GPU_PCIE_TX, "PCIe bytes sent per second (GPM).", "pcie_tx_bps"),
    (mn.GPU_PCIE_RX, "PCIe bytes received per second (GPM).", "pcie_rx_bps"),
    (mn.GPU_NVLINK_TX, "NVLink bytes sent per second, all links (GPM).", "nvlink_tx_bps"),
    (mn.GPU_NVLINK_RX, "NVLink bytes received per second, all links (GPM).", "nvlink_rx_bps"),
)


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def reading_to_row(r: GpuReading, node: str) -> dict[str, Any]:
    """One interchange row (percentages 0-100, bytes, watts) from a reading.

    Extra keys for the detectors: ``up`` (bool), ``xid_total`` (all XIDs so far),
    ``throttle`` (1.0 while a power/thermal clock-event reason is active, None if unknown).
    """
    t = throttled(r.clock_events)
    return {
        "ts": r.ts,
        "node": node,
        "gpu": r.index,
        "util": _pct(r.util),
        "sm_active": _pct(r.sm_active),
        "mem_used_bytes": r.mem_used_bytes,
        "mem_total_bytes": r.mem_total_bytes,
        "power_w": r.power_w,
        "tensor_active": _pct(r.tensor_active),
        "dram_active": _pct(r.dram_active),
        "pcie_tx_bps": r.pcie_tx_bps,
        "pcie_rx_bps": r.pcie_rx_bps,
        "nvlink_tx_bps": r.nvlink_tx_bps,
        "nvlink_rx_bps": r.nvlink_rx_bps,
        "up": r.up,
        "xid_total": sum(r.xid_counts.values()),
        "throttle": None if t is None else float(t),
    }


def add_flags(group: FlagGroup) -> None:
    """The gpu collector's flags: the GPU source, the simulator behind ``sim``, DCGM names."""
    add = group.add_argument
    add("--gpu-backend", choices=("nvml", "sim"),
        help="GPU source: nvml (the driver; the default) or sim (simulated GPUs following "
        "--scenario)")
    add("--scenario", metavar="NAME", help="simulated run for --gpu-backend sim (e.g. healthy)")
    add("--sim-gpus", type=int, metavar="N",
        help="number of simulated GPUs on this node (sim backend)")
    add("--seed", type=int, metavar="N", help="random seed of the simulator")
    add("--sim-log", metavar="PATH",
        help="with --gpu-backend sim and --scenario: also write the scenario's verl log to "
        "PATH as it runs, and follow it (one process stands in for a job)")
    add("--sim-speed", type=float, default=1.0, metavar="X",
        help="simulated seconds per wall second for --sim-log (default 1)")
    add("--dcgm-compat", action="store_true",
        help="also write dcgm-exporter names (DCGM_FI_*) for existing dashboards")


@register(
    "gpu",
    default=True,
    help="GPU utilization, SM/tensor/DRAM activity (GPM), memory, power, clocks, XID "
    "(NVML, or simulated with --gpu-backend sim)",
    flags=add_flags,
)
class GpuCollector(SampledCollector):
    """Samples GPUs in a background thread; ``collect()`` renders the latest snapshot.

    Building it builds the backend, so a node without a GPU fails here with
    ``BackendUnavailable`` (a message in words) before the server starts.
    """

    def __init__(self, ctx: ExporterContext, backend: GpuBackend | None = None) -> None:
        super().__init__(ctx)
        if backend is None:
            backend = ctx.gpu_backend
        if backend is None:
            name = ctx.options.gpu_backend or default_backend_name()
            backend = make_backend(name, ctx.options, live_sim=ctx.live_sim)
        self.backend: GpuBackend = backend
        self.dcgm_compat = ctx.options.dcgm_compat
        self._identities: dict[int, GpuIdentity] = {d.index: d for d in backend.devices()}
        self._lock = threading.Lock()
        self._snapshot: list[GpuReading] = []
        self._last_xid: dict[int, int] = {}
        self._processes = ProcessWatch(ctx.node)
        self._integral = ActivityIntegral(max_step_s=3 * max(float(ctx.interval), 0.01))
        #: the sampler thread's CPU seconds so far (for overhead figures)
        self.sample_cpu_s = 0.0

    # ---------------------------------------------------------------- sampling
    def sample(self) -> None:
        """Read every GPU once, keep the snapshot, publish the rows to the sink.

        Raises (after the snapshot is kept) when the sink refused the rows, so the failure
        shows as ``collector_success 0`` with the reason in words.
        """
        cpu0 = time.thread_time()
        readings = self.backend.sample()
        with self._lock:
            previous = {r.index: r.xid_counts for r in self._snapshot}
            for r in readings:
                x = latest_xid(previous.get(r.index, {}), r.xid_counts)
                if x is not None:
                    self._last_xid[r.index] = x
            self._snapshot = readings
            self._integral.add(readings, time.monotonic())
            if any(not self._identities.get(r.index, _NO_ID).uuid for r in readings if r.up):
                self._identities = {d.index: d for d in self.backend.devices()}
            changes = self._processes.update(readings)
        rows = [reading_to_row(r, self.ctx.node) for r in readings]
        try:
            self.ctx.sink.add_gpu(rows)
            if changes:
                self.ctx.sink.add_events(changes)
        finally:
            self.sample_cpu_s += time.thread_time() - cpu0

    def close(self) -> None:
        """Release the backend (NVML handles, event set)."""
        self.backend.close()

    def snapshot(self) -> list[GpuReading]:
        """The latest readings (a copy of the list)."""
        with self._lock:
            return list(self._snapshot)

    # ---------------------------------------------------------------- exposition
    def collect(self) -> Iterable[Metric]:
        """Fresh families from the latest snapshot; series with no value are left out."""
        with self._lock:
            readings = list(self._snapshot)
            identities = dict(self._identities)
            last_xid = dict(self._last_xid)
            n_procs = self._processes.counts()
            integral = self._integral.families()
        info = GaugeMetricFamily(mn.GPU_INFO, "GPU identity; always 1.",
                                 labels=["gpu", "uuid", "name"])
        up = GaugeMetricFamily(mn.GPU_UP, "1 while the GPU answers, 0 when its calls fail.",
                               labels=["gpu"])
        gauges = {attr: GaugeMetricFamily(name, help_, labels=["gpu"])
                  for name, help_, attr in GAUGES}
        clock = GaugeMetricFamily(mn.GPU_CLOCK_EVENT,
                                  "1 while a clock-event (throttle) reason is active.",
                                  labels=["gpu", "reason"])
        procs = GaugeMetricFamily(mn.GPU_PROCESSES, "Compute processes on the GPU (NVML).",
                                  labels=["gpu"])
        energy = CounterMetricFamily(mn.GPU_ENERGY, "Energy used since the driver loaded.",
                                     labels=["gpu"])
        xid = CounterMetricFamily(mn.GPU_XID, "XID errors reported by NVML.",
                                  labels=["gpu", "xid"])
        for r in readings:
            gpu = str(r.index)
            ident = identities.get(r.index, _NO_ID)
            info.add_metric([gpu, ident.uuid, ident.name], 1.0)
            up.add_metric([gpu], 1.0 if r.up else 0.0)
            for code, count in sorted(r.xid_counts.items()):
                xid.add_metric([gpu, str(code)], float(count))
            if not r.up:
                continue
            for attr, fam in gauges.items():
                value = getattr(r, attr)
                if value is not None:
                    fam.add_metric([gpu], float(value))
            for reason, active in sorted(r.clock_events.items()):
                clock.add_metric([gpu, reason], 1.0 if active else 0.0)
            if r.energy_j is not None:
                energy.add_metric([gpu], float(r.energy_j))
            if r.index in n_procs:
                procs.add_metric([gpu], float(n_procs[r.index]))
        families: list[Metric] = [info, up]
        families += [f for f in gauges.values() if f.samples]
        families += [f for f in (clock, energy, xid, procs) if f.samples]
        families += [f for f in integral if f.samples]
        if self.dcgm_compat:
            families += dcgm_families(readings, identities, self.ctx.node, last_xid)
        return families


class ActivityIntegral:
    """Per-GPU seconds of activity integrated over the sampler's own readings.

    Each reading stands for the time since the previous sample (at most ``max_step_s``, so a
    stalled sampler does not stretch one reading over a gap). ``rate()`` of these counters over
    any window, divided by the rate of the sampled seconds, is the GPU's mean activity in that
    window however rarely Prometheus scrapes: every sample counts, not only the one a scrape
    happens to see. Cross-node rules compare GPUs with these.
    """

    def __init__(self, max_step_s: float) -> None:
        self.max_step_s = max_step_s
        self._last: float | None = None
        #: gpu -> [sampled seconds, busy (utilization) seconds, SM-active seconds, samples]
        self.totals: dict[int, list[float]] = {}
        self._has_sm: set[int] = set()

    def add(self, readings: list[GpuReading], now: float) -> None:
        """Count ``readings`` as the activity since the previous call (the first only starts
        the clock)."""
        last, self._last = self._last, now
        if last is None:
            return
        dt = min(max(now - last, 0.0), self.max_step_s)
        for r in readings:
            if not r.up or r.util is None:
                continue
            tot = self.totals.setdefault(r.index, [0.0, 0.0, 0.0, 0.0])
            tot[0] += dt
            tot[3] += 1
            tot[1] += dt * float(r.util)
            if r.sm_active is not None:
                tot[2] += dt * float(r.sm_active)
                self._has_sm.add(r.index)

    def families(self) -> list[CounterMetricFamily]:
        """The counters; SM activity only for GPUs that have reported it (GPM)."""
        sampled = CounterMetricFamily(
            mn.GPU_SAMPLED_SECONDS, "Seconds covered by this exporter's GPU samples.",
            labels=["gpu"])
        busy = CounterMetricFamily(
            mn.GPU_BUSY_SECONDS, "Sampled seconds times NVML utilization (0..1): "
            "rate(this) / rate(verlmon_gpu_sampled_seconds_total) is the mean utilization.",
            labels=["gpu"])
        sm = CounterMetricFamily(
            mn.GPU_SM_ACTIVE_SECONDS, "Sampled seconds times GPM SM activity (0..1): "
            "rate(this) / rate(verlmon_gpu_sampled_seconds_total) is the mean SM activity.",
            labels=["gpu"])
        count = CounterMetricFamily(
            mn.GPU_SAMPLES, "GPU samples counted in verlmon_gpu_sampled_seconds_total.",
            labels=["gpu"])
        for gpu, (s, b, a, n) in sorted(self.totals.items()):
            sampled.add_metric([str(gpu)], s)
            count.add_metric([str(gpu)], n)
            busy.add_metric([str(gpu)], b)
            if gpu in self._has_sm:
                sm.add_metric([str(gpu)], a)
        return [sampled, busy, sm, count]


_NO_ID = GpuIdentity(index=-1, uuid="", name="")
