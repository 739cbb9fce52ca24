"""The NVML backend: no driver here (real library failing to load), and its per-GPU rules.

CI has no NVIDIA driver, so the real ``pynvml`` fails to load: that is the first test, with no
stand-in. The rules that need a GPU (a GPU that is lost and comes back, unsupported fields not
asked again, GPM units, XID counting) run against ``ScriptedDriver``, a small stand-in for the
driver's answers that raises pynvml's own NVMLError classes; the same code ran on a real H200
(bench/results/device_exporter_*_H200.txt).
"""

from __future__ import annotations

import ctypes
import time

import pynvml
import pytest

from exporters.gpu import make_backend
from exporters.gpu.backend import BackendUnavailable
from exporters.gpu.nvml import (
    CLOCK_EVENT_REASONS,
    NvmlBackend,
    decode_clock_events,
    throttled,
)


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_loads(), reason="this machine has a working NVIDIA driver")
def test_no_driver_gives_backend_unavailable_in_words():
    with pytest.raises(BackendUnavailable) as err:
        NvmlBackend()
    msg = str(err.value)
    assert "no NVIDIA driver/GPU found" in msg
    assert "NVML" in msg
    assert "--gpu-backend sim" in msg
    assert "\n" not in msg


@pytest.mark.skipif(_nvml_loads(), reason="this machine has a working NVIDIA driver")
def test_factory_raises_the_same_for_nvml():
    with pytest.raises(BackendUnavailable, match="--gpu-backend sim"):
        make_backend("nvml", None)


def test_clock_event_mask_decodes_to_named_reasons():
    events = decode_clock_events(0x004 | 0x040)
    assert events["sw_power_cap"] is True
    assert events["hw_thermal_slowdown"] is True
    assert events["gpu_idle"] is False
    assert set(events) == set(CLOCK_EVENT_REASONS.values())


def test_clock_events_list_only_supported_reasons():
    events = decode_clock_events(0x001, supported=0x001 | 0x004)
    assert events == {"gpu_idle": True, "sw_power_cap": False}


def test_throttled_means_power_or_heat_not_idle():
    assert throttled({"gpu_idle": True, "sw_power_cap": False}) is False
    assert throttled({"gpu_idle": False, "hw_thermal_slowdown": True}) is True
    assert throttled({}) is None


# ----------------------------------------------------------------------------- driver stand-in


class _Util:
    def __init__(self, gpu: int) -> None:
        self.gpu = gpu


class _Mem:
    def __init__(self, used: int, total: int) -> None:
        self.used, self.total = used, total


class _Support:
    isSupportedDevice = 1


class ScriptedDriver:
    """Answers like NVML for ``count`` GPUs; tests flip ``lost``/``unsupported``/``xids``."""

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = 1
    NVMLError = pynvml.NVMLError

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.lost: set[int] = set()
        self.unsupported: set[str] = set()
        self.calls: dict[str, int] = {}
        self.xids: list[tuple[int, int]] = []  # (gpu, xid) pending events
        self.procs: dict[int, list[tuple[int, int | None]]] = {}  # gpu -> [(pid, used bytes)]
        self.gpm_values = {2: 50.0, 3: 10.0, 5: 40.0, 10: 20.0, 20: 1.0, 21: 2.0, 60: 3.0,
                           61: 4.0}

    def _h(self, h: int, what: str) -> int:
        self.calls[what] = self.calls.get(what, 0) + 1
        i = h - 1000
        if i in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if what in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return i

    # life cycle
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return self._h(1000 + i, "handle") + 1000

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{self._h(h, 'uuid')}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        self._h(h, "name")
        return b"NVIDIA H200"

    # fields
    def nvmlDeviceGetSupportedClocksEventReasons(self, h: int) -> int:
        self._h(h, "reasons_supported")
        return 0x1 | 0x4

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._h(h, "clock_events")
        return 0x4

    def nvmlDeviceGetUtilizationRates(self, h: int) -> _Util:
        return _Util(70 + self._h(h, "util"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _Mem:
        self._h(h, "memory")
        return _Mem(1 << 30, 1 << 34)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._h(h, "power")
        return 350_000

    def nvmlDeviceGetTemperature(self, h: int, _sensor: int) -> int:
        self._h(h, "temperature")
        return 55

    def nvmlDeviceGetClockInfo(self, h: int, _clock: int) -> int:
        self._h(h, "sm_clock")
        return 1980

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        i = self._h(h, "processes")
        return [pynvml.c_nvmlProcessInfo_t(pid=pid, usedGpuMemory=used)
                for pid, used in self.procs.get(i, [])]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self._h(h, "energy")
        return 5_000_000

    # GPM
    def nvmlGpmQueryDeviceSupport(self, h: int) -> _Support:
        self._h(h, "gpm_support")
        return _Support()

    def nvmlGpmSampleAlloc(self) -> object:
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, _s: object) -> None: ...

    def nvmlGpmSampleGet(self, h: int, s: object) -> object:
        self._h(h, "gpm_sample")
        return s

    def nvmlGpmMetricsGet(self, mg):  # noqa: ANN001, ANN201
        for k in range(mg.numMetrics):
            m = mg.metrics[k]
            m.nvmlReturn = 0
            m.value = self.gpm_values[m.metricId]
        return mg

    # events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, _es: str) -> None: ...

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        self._h(h, "event_types")
        return 0x8

    def nvmlDeviceRegisterEvents(self, h: int, _types: int, _es: str) -> None:
        self._h(h, "register")

    def nvmlEventSetWait(self, _es: str, _timeout: int) -> pynvml.c_nvmlEventData_t:
        if not self.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.xids.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.device = ctypes.cast(1000 + gpu, pynvml.c_nvmlDevice_t)
        data.eventType = 0x8
        data.eventData = xid
        return data


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def _backend(driver: ScriptedDriver, **kw) -> NvmlBackend:
    return NvmlBackend(nvml=driver, **kw)


def test_readings_are_in_base_units_and_ratios():
    driver = ScriptedDriver(count=1)
    be = _backend(driver)
    first = be.sample()[0]
    assert first.util == pytest.approx(0.70)
    assert first.mem_total_bytes == 1 << 34
    assert first.power_w == pytest.approx(350.0)
    assert first.sm_clock_hz == pytest.approx(1.98e9)
    assert first.energy_j == pytest.approx(5000.0)
    assert first.clock_events == {"gpu_idle": False, "sw_power_cap": True}
    assert first.sm_active is None  # GPM needs two samples
    time.sleep(0.11)  # GPM samples closer than 100 ms are not used
    second = be.sample()[0]
    assert second.sm_active == pytest.approx(0.50)
    assert second.tensor_active == pytest.approx(0.40)
    assert second.dram_active == pytest.approx(0.20)
    assert second.pcie_tx_bps == pytest.approx(1024 * 1024)
    assert second.nvlink_tx_bps == pytest.approx(4 * 1024 * 1024)
    be.close()


def test_unsupported_field_is_none_and_not_asked_again():
    driver = ScriptedDriver(count=1)
    driver.unsupported.add("power")
    be = _backend(driver)
    for _ in range(5):
        r = be.sample()[0]
        assert r.up and r.power_w is None
    assert driver.calls["power"] == 1
    assert "power" in be.unsupported()[0]


def test_lost_gpu_reports_down_while_others_report_then_comes_back():
    driver = ScriptedDriver(count=2)
    be = _backend(driver, retry_every=3)
    driver.lost.add(1)
    r = be.sample()
    assert r[0].up and r[0].util == pytest.approx(0.70)
    assert r[1].up is False
    assert "GPU is lost" in (r[1].error or "")
    assert r[1].util is None
    driver.lost.clear()
    ups = [be.sample()[1].up for _ in range(3)]
    assert ups == [False, False, True]  # retried on the third tick, then picked up again
    assert be.sample()[1].util == pytest.approx(0.71)


def test_xid_events_are_counted_per_gpu_and_code():
    driver = ScriptedDriver(count=2)
    be = _backend(driver)
    driver.xids = [(1, 79), (1, 79), (0, 48)]
    r = be.sample()
    assert r[1].xid_counts == {79: 2}
    assert r[0].xid_counts == {48: 1}
    assert be.sample()[1].xid_counts == {79: 2}  # cumulative, not per tick


def test_energy_is_read_at_its_own_slow_cadence():
    driver = ScriptedDriver(count=1)
    be = _backend(driver, energy_interval=3600.0)
    for _ in range(4):
        assert be.sample()[0].energy_j == pytest.approx(5000.0)  # last value kept
    assert driver.calls["energy"] == 1


def test_gpu_that_never_opened_is_down_with_words():
    driver = ScriptedDriver(count=2)
    driver.lost.add(0)
    be = _backend(driver)
    r = be.sample()
    assert not r[0].up and "GPU is lost" in (r[0].error or "")
    assert r[1].up
    assert [d.index for d in be.devices()] == [0, 1]


def test_compute_processes_are_read_once_a_second_and_kept_between():
    driver = ScriptedDriver(count=2)
    driver.procs = {0: [(4242, 2 << 30), (17, 1 << 30)]}
    be = _backend(driver, process_interval=3600.0)
    r = be.sample()
    assert [(p.pid, p.used_bytes) for p in r[0].processes] == [(17, 1 << 30), (4242, 2 << 30)]
    assert r[1].processes == ()
    driver.procs = {}
    assert len(be.sample()[0].processes) == 2  # the list is kept until the next read is due
    assert driver.calls["processes"] == 2  # once per GPU
    assert _backend(ScriptedDriver(count=1), process_interval=0).sample()[0].processes is None
