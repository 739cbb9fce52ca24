"""GPU sampling backends: ``nvml`` (the real driver) and ``sim`` (the simulator).

``make_backend(name, options)`` builds one from the exporter's parsed options;
``default_backend_name()`` is the one ``--gpu-backend`` uses when not given.
"""

from __future__ import annotations

import os
from typing import Any

from exporters.gpu.backend import BackendUnavailable, GpuBackend, GpuIdentity, GpuReading

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


def make_backend(name: str, options: Any = None, *, live_sim: Any = None) -> GpuBackend:
    """Build the backend called ``name`` from parsed options (an argparse namespace or None).

    nvml reads ``gpu_energy_interval`` (seconds, default 10); sim reads ``scenario``,
    ``sim_nodes``/``nodes``, ``sim_gpus``/``gpus_per_node``/``gpus``, ``node``, ``seed`` and
    takes its clock from ``live_sim`` when the exporter shares one. Raises BackendUnavailable
    when the backend cannot run here and ValueError for an unknown name.
    """
    name = (name or default_backend_name()).lower()
    if name == "nvml":
        from exporters.gpu.nvml import NvmlBackend

        return NvmlBackend(energy_interval=float(_opt(options, "gpu_energy_interval", 10.0)))
    if name == "sim":
        from exporters.gpu.sim import SimBackend

        return SimBackend.from_options(options, live_sim=live_sim)
    raise ValueError(f"unknown GPU backend {name!r}; choose one of {', '.join(BACKENDS)}")


def _opt(options: Any, key: str, default: Any) -> Any:
    value = getattr(options, key, None) if options is not None else None
    return default if value is None else value
