"""dcgm-exporter compatible series (``--dcgm-compat``), so existing DCGM dashboards keep working.

Same names, units and labels as NVIDIA's dcgm-exporter: ``gpu``, ``UUID``, ``device``
(``nvidiaN``), ``modelName``, ``Hostname``. Values come from the same GpuReading snapshot as the
``verlmon_gpu_*`` series; a field that is None is left out. Everything is a gauge here:
dcgm-exporter's energy "counter" has no ``_total`` suffix, which the text format reserves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.gpu.backend import GpuIdentity, GpuReading

_MIB = 1024.0 * 1024.0
LABELS: tuple[str, ...] = ("gpu", "UUID", "device", "modelName", "Hostname")

#: (name, help, function of the reading giving the value in DCGM's unit or None)
_FIELDS: tuple[tuple[str, str, object], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: _scale(r.util, 100.0)),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
     lambda r: _scale(r.mem_used_bytes, 1 / _MIB)),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda r: _fb_free(r)),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temperature_c),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).",
     lambda r: _scale(r.sm_clock_hz, 1e-6)),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).",
     lambda r: _scale(r.energy_j, 1000.0)),
    ("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned.",
     lambda r: r.sm_active),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident on an SM to the maximum.",
     lambda r: r.sm_occupancy),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles any tensor pipe is active.",
     lambda r: r.tensor_active),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.",
     lambda r: r.dram_active),
)


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _fb_free(r: GpuReading) -> float | None:
    if r.mem_used_bytes is None or r.mem_total_bytes is None:
        return None
    return max(0.0, r.mem_total_bytes - r.mem_used_bytes) / _MIB


def dcgm_families(
    readings: Iterable[GpuReading],
    identities: Mapping[int, GpuIdentity],
    hostname: str,
    last_xid: Mapping[int, int] | None = None,
) -> list[Metric]:
    """DCGM-named gauge families for the GPUs that are up.

    ``last_xid`` maps GPU index to the most recent XID seen (``DCGM_FI_DEV_XID_ERRORS`` is 0
    until one arrives, as in dcgm-exporter).
    """
    families = {name: GaugeMetricFamily(name, help_, labels=LABELS) for name, help_, _ in _FIELDS}
    xid = GaugeMetricFamily(
        "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=LABELS
    )
    last_xid = last_xid or {}
    for r in readings:
        if not r.up:
            continue
        ident = identities.get(r.index) or GpuIdentity(index=r.index, uuid="", name="")
        labels = [str(r.index), ident.uuid, f"nvidia{r.index}", ident.name, hostname]
        for name, _help, get in _FIELDS:
            value = get(r)  # type: ignore[operator]
            if value is not None:
                families[name].add_metric(labels, float(value))
        xid.add_metric(labels, float(last_xid.get(r.index, 0)))
    return [f for f in families.values() if f.samples] + ([xid] if xid.samples else [])


def latest_xid(previous: Mapping[int, int], current: Mapping[int, int]) -> int | None:
    """The XID whose count grew between two cumulative count maps (highest if several)."""
    grown = [x for x, n in current.items() if n > previous.get(x, 0)]
    return max(grown) if grown else None
