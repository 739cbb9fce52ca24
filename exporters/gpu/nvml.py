"""Real GPU sampling through NVML (``pynvml``), with GPM for SM/tensor/DRAM activity on Hopper+.

Per GPU and tick it reads utilization, memory, power, temperature, SM clock and the clock-event
(throttle) reasons, takes one GPM sample and computes SM activity, SM occupancy, tensor
activity, DRAM bandwidth, PCIe and NVLink throughput from the last two GPM samples. Energy (a
slow call, ~4 ms) is read at a slower cadence; XID errors come from an NVML event set polled
with a zero timeout. The blocking PCIe-throughput call is never used.

Rules the sampler keeps: a field the GPU does not support is ``None`` and is not asked for
again; a GPU whose calls fail comes back ``up=False`` with the error in words while the others
keep reporting, and its handle is retried every few ticks so a GPU that returns is picked up.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporters.gpu.backend import BackendUnavailable, GpuIdentity, GpuProcess, GpuReading

#: Clock-event (throttle) reason bits of ``nvmlDeviceGetCurrentClocksEventReasons``.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: Reasons that mean the GPU is being slowed against the workload's will (power or heat).
THROTTLE_REASONS: frozenset[str] = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)

#: GPM metric id -> (GpuReading field, scale from NVML's unit to ours).
#: Percentages become ratios; MiB/s become bytes/s.
_MIB = 1024.0 * 1024.0
GPM_METRICS: dict[int, tuple[str, float]] = {
    2: ("sm_active", 0.01),  # NVML_GPM_METRIC_SM_UTIL
    3: ("sm_occupancy", 0.01),  # NVML_GPM_METRIC_SM_OCCUPANCY
    5: ("tensor_active", 0.01),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    10: ("dram_active", 0.01),  # NVML_GPM_METRIC_DRAM_BW_UTIL
    20: ("pcie_tx_bps", _MIB),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    21: ("pcie_rx_bps", _MIB),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    60: ("nvlink_rx_bps", _MIB),  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    61: ("nvlink_tx_bps", _MIB),  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
}

#: GPM samples closer together than this give inaccurate metrics; such ticks reuse the last values.
GPM_MIN_GAP_S = 0.1

_XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError
_ERR_NOT_SUPPORTED = 3
_ERR_TIMEOUT = 10
_ERR_FUNCTION_NOT_FOUND = 13
#: Errors that mean "this GPU is gone or broken", not "this field is missing".
_ERR_GPU_DOWN = {
    1,  # uninitialized
    2,  # invalid argument (stale handle)
    15,  # GPU is lost
    16,  # reset required
    999,  # unknown
}


def decode_clock_events(mask: int, supported: int | None = None) -> dict[str, bool]:
    """Named clock-event reasons from NVML's bitmask.

    Only reasons in ``supported`` (all known reasons when None) are listed, so a GPU exports
    a stable set of series, each 1 while active.
    """
    return {
        name: bool(mask & bit)
        for bit, name in CLOCK_EVENT_REASONS.items()
        if supported is None or supported & bit
    }


def throttled(clock_events: dict[str, bool]) -> bool | None:
    """True while a power or thermal reason slows the clocks; None when no reason is known."""
    if not clock_events:
        return None
    return any(clock_events.get(r, False) for r in THROTTLE_REASONS)


def _err_value(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def _describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return f"NVML: {text}"


@dataclass
class _Gpu:
    """Per-GPU state kept between ticks."""

    index: int
    handle: Any = None
    identity: GpuIdentity | None = None
    unsupported: set[str] = field(default_factory=set)
    supported_reasons: int | None = None
    reason_bits: list[tuple[int, str]] = field(default_factory=list)
    gpm: bool = False
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, current]
    gpm_primed: bool = False
    gpm_last: float = 0.0
    gpm_struct: Any = None
    gpm_values: dict[str, float | None] = field(default_factory=dict)
    #: reads at their own slower cadence (energy, processes): last value and when next due
    slow_values: dict[str, Any] = field(default_factory=dict)
    slow_next: dict[str, float] = field(default_factory=dict)
    mem_total: float | None = None
    xid_counts: dict[int, int] = field(default_factory=dict)
    down_error: str | None = None
    down_ticks: int = 0


class NvmlBackend:
    """GPU readings from the local NVIDIA driver. Raises BackendUnavailable without one."""

    name = "nvml"

    def __init__(
        self,
        *,
        energy_interval: float = 10.0,
        process_interval: float = 1.0,
        retry_every: int = 5,
        gpm: bool = True,
        xid: bool = True,
        nvml: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Initialise NVML and every GPU.

        ``energy_interval`` is the cadence of the slow energy call in seconds (0 disables it);
        ``process_interval`` that of the running-process list (0 disables it);
        ``retry_every`` is how many ticks a failed GPU waits before its handle is tried again;
        ``nvml`` is the binding module (``pynvml`` when None).
        """
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
                raise BackendUnavailable(
                    f"no NVIDIA driver/GPU found (nvidia-ml-py not installed: {exc}); "
                    "use --gpu-backend sim to try the exporter without a GPU"
                ) from exc
        self._nvml = nvml
        self._clock = clock
        self.energy_interval = float(energy_interval)
        self.process_interval = float(process_interval)
        self.retry_every = max(1, int(retry_every))
        self._want_gpm = gpm
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - library missing, driver not loaded, ...
            raise BackendUnavailable(
                f"no NVIDIA driver/GPU found ({_describe(exc)}); "
                "use --gpu-backend sim to try the exporter without a GPU"
            ) from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            nvml.nvmlShutdown()
            raise BackendUnavailable(
                f"no NVIDIA driver/GPU found ({_describe(exc)}); "
                "use --gpu-backend sim to try the exporter without a GPU"
            ) from exc
        if count == 0:
            nvml.nvmlShutdown()
            raise BackendUnavailable(
                "no NVIDIA driver/GPU found (NVML sees 0 GPUs); "
                "use --gpu-backend sim to try the exporter without a GPU"
            )
        self._gpus = [_Gpu(index=i) for i in range(count)]
        self._event_set: Any = None
        self._handle_to_index: dict[int, int] = {}
        self._xid_enabled = xid
        if xid:
            self._create_event_set()
        for gpu in self._gpus:
            self._open(gpu)
        self._closed = False

    # ------------------------------------------------------------------ set-up
    def _create_event_set(self) -> None:
        try:
            self._event_set = self._nvml.nvmlEventSetCreate()
        except Exception:  # noqa: BLE001 - events unsupported here: no XID series
            self._event_set = None

    def _open(self, gpu: _Gpu) -> bool:
        """Get a GPU's handle and set up what it supports; False (and down) on failure."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
        except Exception as exc:  # noqa: BLE001
            gpu.handle = None
            gpu.down_error = _describe(exc)
            if gpu.identity is None:
                gpu.identity = GpuIdentity(index=gpu.index, uuid="", name="")
            return False
        gpu.handle = handle
        gpu.identity = GpuIdentity(index=gpu.index, uuid=uuid, name=name)
        gpu.down_error = None
        gpu.down_ticks = 0
        gpu.supported_reasons = self._optional(gpu, "reasons_supported", _supported_reasons)
        gpu.reason_bits = [
            (bit, name)
            for bit, name in CLOCK_EVENT_REASONS.items()
            if gpu.supported_reasons is None or gpu.supported_reasons & bit
        ]
        self._setup_gpm(gpu)
        self._register_xid(gpu)
        return True

    def _setup_gpm(self, gpu: _Gpu) -> None:
        self._free_gpm(gpu)
        gpu.gpm = False
        gpu.gpm_values = {}
        if not self._want_gpm or "gpm" in gpu.unsupported:
            return
        nvml = self._nvml
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(gpu.handle)
            if not support.isSupportedDevice:
                gpu.unsupported.add("gpm")
                return
            gpu.gpm_samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            gpu.gpm_struct = self._gpm_struct(list(GPM_METRICS))
        except Exception:  # noqa: BLE001 - old driver, pre-Hopper GPU, no GPM symbol
            gpu.unsupported.add("gpm")
            self._free_gpm(gpu)
            return
        gpu.gpm = True
        gpu.gpm_primed = False

    def _gpm_struct(self, metric_ids: list[int]) -> Any:
        nvml = self._nvml
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(metric_ids)
        for k, mid in enumerate(metric_ids):
            mg.metrics[k].metricId = mid
        return mg

    def _free_gpm(self, gpu: _Gpu) -> None:
        for s in gpu.gpm_samples:
            try:
                self._nvml.nvmlGpmSampleFree(s)
            except Exception:  # noqa: BLE001, S110 - freeing on a lost GPU may fail
                pass
        gpu.gpm_samples = []
        gpu.gpm_struct = None
        gpu.gpm_primed = False

    def _register_xid(self, gpu: _Gpu) -> None:
        if self._event_set is None or "xid" in gpu.unsupported:
            return
        nvml = self._nvml
        try:
            supported = nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle)
            if not supported & _XID_EVENT:
                gpu.unsupported.add("xid")
                return
            nvml.nvmlDeviceRegisterEvents(gpu.handle, _XID_EVENT, self._event_set)
        except Exception:  # noqa: BLE001 - not supported (e.g. in some VMs): no XID series
            gpu.unsupported.add("xid")
            return
        self._handle_to_index[_addr(gpu.handle)] = gpu.index

    def _optional(self, gpu: _Gpu, key: str, call: Callable[[Any, Any], Any]) -> Any:
        """One optional read: None when unsupported (remembered) or on a transient error.

        Raises ``_GpuDown`` when the error means the GPU itself is gone.
        """
        if key in gpu.unsupported:
            return None
        try:
            return call(self._nvml, gpu.handle)
        except Exception as exc:  # noqa: BLE001
            code = _err_value(exc)
            if code in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND) or code is None:
                gpu.unsupported.add(key)
                return None
            if code in _ERR_GPU_DOWN:
                raise _GpuDown(_describe(exc)) from exc
            return None

    # ------------------------------------------------------------------ interface
    def devices(self) -> list[GpuIdentity]:
        """Every GPU NVML enumerated, by index (uuid/name empty for one never opened)."""
        return [
            g.identity or GpuIdentity(index=g.index, uuid="", name="") for g in self._gpus
        ]

    def sample(self) -> list[GpuReading]:
        """Read every GPU once; one failing GPU comes back ``up=False``."""
        now = self._clock()
        mono = time.monotonic()
        readings = []
        self._poll_xid()
        for gpu in self._gpus:
            if gpu.handle is None:
                gpu.down_ticks += 1
                if gpu.down_ticks % self.retry_every != 0 or not self._open(gpu):
                    readings.append(self._down(gpu, now))
                    continue
            try:
                readings.append(self._read(gpu, now, mono))
            except _GpuDown as exc:
                gpu.handle = None
                gpu.down_error = str(exc)
                gpu.down_ticks = 0
                self._free_gpm(gpu)
                readings.append(self._down(gpu, now))
        return readings

    def close(self) -> None:
        """Free GPM buffers and the event set, then shut NVML down."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for gpu in self._gpus:
            self._free_gpm(gpu)
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except Exception:  # noqa: BLE001, S110
                pass
            self._event_set = None
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110
            pass

    def unsupported(self) -> dict[int, list[str]]:
        """What each GPU does not support (for logs and the device report)."""
        return {g.index: sorted(g.unsupported) for g in self._gpus}

    # ------------------------------------------------------------------ reading
    def _down(self, gpu: _Gpu, now: float) -> GpuReading:
        return GpuReading(
            index=gpu.index,
            ts=now,
            up=False,
            error=gpu.down_error or "NVML: GPU not reachable",
            xid_counts=dict(gpu.xid_counts),
        )

    def _read(self, gpu: _Gpu, now: float, mono: float) -> GpuReading:
        nvml = self._nvml
        h = gpu.handle
        # Utilization is the one required field: any failure but "not supported" is a down GPU.
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
        except Exception as exc:  # noqa: BLE001
            if _err_value(exc) == _ERR_NOT_SUPPORTED:
                util = None
            else:
                raise _GpuDown(_describe(exc)) from exc
        r = GpuReading(index=gpu.index, ts=now, util=util)
        mem = self._optional(gpu, "memory", _memory)
        if mem is not None:
            r.mem_used_bytes, r.mem_total_bytes = mem
        r.power_w = self._optional(gpu, "power", _power)
        r.temperature_c = self._optional(gpu, "temperature", _temperature)
        r.sm_clock_hz = self._optional(gpu, "sm_clock", _sm_clock)
        mask = self._optional(gpu, "clock_events", _clock_events)
        if mask is not None:
            r.clock_events = {name: bool(mask & bit) for bit, name in gpu.reason_bits}
        r.energy_j = self._slow(gpu, "energy", _energy, self.energy_interval, mono)
        r.processes = self._slow(gpu, "processes", _processes, self.process_interval, mono)
        if gpu.gpm:
            self._read_gpm(gpu, mono)
            for name, value in gpu.gpm_values.items():
                setattr(r, name, value)
        r.xid_counts = dict(gpu.xid_counts)
        return r

    def _slow(self, gpu: _Gpu, key: str, call: Callable[[Any, Any], Any], interval: float,
              mono: float) -> Any:
        """An optional read at its own cadence (``interval`` s; 0 disables it): read when due,
        else (or when the read fails) the last value kept."""
        if interval > 0 and mono >= gpu.slow_next.get(key, 0.0):
            value = self._optional(gpu, key, call)
            if value is not None:
                gpu.slow_values[key] = value
            gpu.slow_next[key] = mono + interval
        return gpu.slow_values.get(key)

    def _read_gpm(self, gpu: _Gpu, mono: float) -> None:
        """Take a GPM sample (at most one per GPM_MIN_GAP_S) and compute metrics from two."""
        if gpu.gpm_primed and mono - gpu.gpm_last < GPM_MIN_GAP_S:
            return
        nvml = self._nvml
        try:
            nvml.nvmlGpmSampleGet(gpu.handle, gpu.gpm_samples[1])
        except Exception as exc:  # noqa: BLE001
            code = _err_value(exc)
            if code in _ERR_GPU_DOWN:
                raise _GpuDown(_describe(exc)) from exc
            gpu.unsupported.add("gpm")
            self._free_gpm(gpu)
            gpu.gpm = False
            gpu.gpm_values = {}
            return
        gpu.gpm_last = mono
        if gpu.gpm_primed:
            mg = gpu.gpm_struct
            mg.sample1 = gpu.gpm_samples[0]
            mg.sample2 = gpu.gpm_samples[1]
            try:
                nvml.nvmlGpmMetricsGet(mg)
            except Exception:  # noqa: BLE001 - keep last values this tick
                pass
            else:
                values: dict[str, float | None] = {}
                dropped = []
                for k in range(mg.numMetrics):
                    m = mg.metrics[k]
                    name, scale = GPM_METRICS[m.metricId]
                    if m.nvmlReturn == 0:
                        values[name] = max(0.0, float(m.value)) * scale
                    elif m.nvmlReturn == _ERR_NOT_SUPPORTED:
                        dropped.append(m.metricId)
                    else:
                        values[name] = None
                gpu.gpm_values = values
                if dropped:
                    keep = [mg.metrics[k].metricId for k in range(mg.numMetrics)]
                    keep = [mid for mid in keep if mid not in dropped]
                    gpu.gpm_struct = self._gpm_struct(keep)
        gpu.gpm_samples.reverse()  # the sample just taken becomes the previous one
        gpu.gpm_primed = True

    def _poll_xid(self) -> None:
        """Drain pending XID events (zero timeout, never blocks)."""
        if self._event_set is None or not self._handle_to_index:
            return
        nvml = self._nvml
        for _ in range(256):
            try:
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except Exception as exc:  # noqa: BLE001
                if _err_value(exc) != _ERR_TIMEOUT:
                    # the event set itself broke: stop polling it rather than fail every tick
                    if _err_value(exc) in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND):
                        self._event_set = None
                return
            if not data.eventType & _XID_EVENT:
                continue
            index = self._handle_to_index.get(_addr(data.device))
            if index is None:
                continue
            xid = int(data.eventData)
            counts = self._gpus[index].xid_counts
            counts[xid] = counts.get(xid, 0) + 1


class _GpuDown(Exception):
    """Internal: the GPU's calls fail in a way that means it is gone."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _addr(handle: Any) -> int:
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _supported_reasons(nvml: Any, h: Any) -> int:
    fn = getattr(nvml, "nvmlDeviceGetSupportedClocksEventReasons", None)
    if fn is None:
        fn = nvml.nvmlDeviceGetSupportedClocksThrottleReasons
    return int(fn(h))


def _clock_events(nvml: Any, h: Any) -> int:
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is None:
        fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(h))


def _memory(nvml: Any, h: Any) -> tuple[float, float]:
    m = nvml.nvmlDeviceGetMemoryInfo(h)
    return float(m.used), float(m.total)


def _power(nvml: Any, h: Any) -> float:
    return nvml.nvmlDeviceGetPowerUsage(h) / 1000.0


def _temperature(nvml: Any, h: Any) -> float:
    return float(nvml.nvmlDeviceGetTemperature(h, 0))  # NVML_TEMPERATURE_GPU


def _sm_clock(nvml: Any, h: Any) -> float:
    return nvml.nvmlDeviceGetClockInfo(h, 1) * 1e6  # NVML_CLOCK_SM, MHz -> Hz


def _processes(nvml: Any, h: Any) -> tuple[GpuProcess, ...]:
    """Compute processes on the GPU; ``usedGpuMemory`` is None where the driver hides it."""
    out = []
    for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(pid=int(p.pid), used_bytes=None if used is None else float(used)))
    return tuple(sorted(out, key=lambda p: p.pid))


def _energy(nvml: Any, h: Any) -> float:
    return nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0  # mJ -> J
