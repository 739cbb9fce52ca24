"""One interface for GPU sampling, two backends: real NVML (``nvml.py``) and simulated (``sim.py``).

A backend never raises from ``sample()`` because one GPU failed: that GPU's reading comes
back with ``up=False`` and the others keep reporting. Fields a GPU does not support are
``None`` (left out of the exposition, never exported as NaN).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GpuIdentity:
    """Stable identity of one GPU, exported in ``verlmon_gpu_info``."""

    index: int
    uuid: str
    name: str


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU (NVML's running-process list)."""

    pid: int
    used_bytes: float | None = None  # GPU memory it holds; None where NVML cannot tell


@dataclass
class GpuReading:
    """One sample of one GPU. Ratios are 0..1; ``None`` means unsupported or not read."""

    index: int
    ts: float
    up: bool = True
    util: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    power_w: float | None = None
    energy_j: float | None = None  # cumulative, read at a slower cadence
    temperature_c: float | None = None
    sm_clock_hz: float | None = None
    clock_events: dict[str, bool] = field(default_factory=dict)  # reason -> active
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    nvlink_tx_bps: float | None = None
    nvlink_rx_bps: float | None = None
    xid_counts: dict[int, int] = field(default_factory=dict)  # xid -> cumulative count
    processes: tuple[GpuProcess, ...] | None = None  # compute processes; None = not read
    error: str | None = None  # plain words when up is False


class GpuBackend(Protocol):
    """What the exporter's GPU sampler needs from a backend."""

    name: str  # "nvml" or "sim"

    def devices(self) -> list[GpuIdentity]:
        """The GPUs this backend sees (stable order by index)."""
        ...

    def sample(self) -> list[GpuReading]:
        """Read every GPU once; a failing GPU comes back with ``up=False``."""
        ...

    def close(self) -> None:
        """Release handles (NVML shutdown, event sets)."""
        ...


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (no NVIDIA driver, no GPU); the message says so in words."""
