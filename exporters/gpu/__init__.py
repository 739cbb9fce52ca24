"""GPU sampling backends: ``nvml`` (the real driver) and ``sim`` (the simulator).

``make_backend(name, options)`` builds one from the exporter's parsed options;
``default_backend_name()`` is the one ``--gpu-backend`` uses when not given.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from exporters.gpu.backend import BackendUnavailable, GpuBackend, GpuIdentity, GpuReading
from exporters.options import ExporterOptions

if TYPE_CHECKING:
    from monitor.sim.live import LiveSim

#: Backend names accepted by ``--gpu-backend``.
BACKENDS: tuple[str, ...] = ("nvml", "sim")

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "GpuBackend",
    "GpuIdentity",
    "GpuReading",
    "default_backend_name",
    "make_backend",
]


def default_backend_name() -> str:
    """``$VERLMON_GPU_BACKEND`` when it names a backend, else ``nvml``.

    The default is never silently ``sim``: an exporter on a GPU node whose driver is broken
    must say so (BackendUnavailable), not export simulated numbers.
    """
    env = os.environ.get("VERLMON_GPU_BACKEND", "").strip().lower()
    return env if env in BACKENDS else "nvml"


def make_backend(name: str, options: ExporterOptions | None = None, *,
                 live_sim: LiveSim | None = None) -> GpuBackend:
    """Build the backend called ``name`` from the exporter's options (None: the defaults).

    nvml reads ``gpu_energy_interval`` (seconds, default 10); sim reads ``scenario``,
    ``sim_gpus``, ``node``, ``seed`` and takes its clock from ``live_sim`` when the exporter
    shares one. Raises BackendUnavailable
    when the backend cannot run here and ValueError for an unknown name.
    """
    name = (name or default_backend_name()).lower()
    options = options or ExporterOptions()
    if name == "nvml":
        from exporters.gpu.nvml import NvmlBackend

        return NvmlBackend(energy_interval=float(options.gpu_energy_interval))
    if name == "sim":
        from exporters.gpu.sim import SimBackend

        return SimBackend.from_options(options, live_sim=live_sim)
    raise ValueError(f"unknown GPU backend {name!r}; choose one of {', '.join(BACKENDS)}")

