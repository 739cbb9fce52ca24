"""Simulated GPUs with the NVML backend's interface, driven by ``monitor.sim``.

For CI, demos and scale tests (64+ GPUs) without a GPU. Readings come from
``SimRun.gpu_sample_at(t)`` for one node of the simulated run; the simulated time is the shared
``LiveSim``'s (so GPU activity lines up with the verl log it writes) or, without one, this
backend's own clock anchored at its start, looping over the run when it ends. Percentages
become ratios, like the NVML backend's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exporters.gpu.backend import GpuIdentity, GpuReading
from exporters.options import ExporterOptions
from monitor.numbers import float_or_none as _num  # a float or None: never NaN in a reading

#: Name reported in ``verlmon_gpu_info`` for simulated GPUs.
SIM_GPU_NAME = "NVIDIA H200 (simulated)"

_RATIOS = ("util", "sm_active", "sm_occupancy", "tensor_active", "dram_active")
_PLAIN = ("mem_used_bytes", "mem_total_bytes", "power_w", "temperature_c", "sm_clock_hz",
          "energy_j", "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps")


def row_to_reading(row: dict[str, Any], ts: float) -> GpuReading:
    """One simulator row (0-100 percentages, extras) as a GpuReading (0..1 ratios)."""
    r = GpuReading(index=int(row["gpu"]), ts=ts, up=bool(row.get("up", True)))
    if not r.up:
        r.error = str(row.get("error") or "simulated GPU failure (calls fail)")
    else:
        for key in _RATIOS:
            v = _num(row.get(key))
            setattr(r, key, None if v is None else v / 100.0)
        for key in _PLAIN:
            setattr(r, key, _num(row.get(key)))
        r.clock_events = {str(k): bool(v) for k, v in (row.get("clock_events") or {}).items()}
    r.xid_counts = {int(k): int(v) for k, v in (row.get("xid") or {}).items()}
    return r


class SimBackend:
    """GPU readings from a simulated verl run, for one node of it."""

    name = "sim"

    def __init__(
        self,
        scenario: str = "healthy",
        *,
        nodes: int = 1,
        gpus_per_node: int = 8,
        node: str | None = None,
        seed: int = 0,
        live_sim: Any = None,
        run: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Simulate ``scenario`` (or use ``run`` / ``live_sim.run``) and report ``node``'s GPUs.

        ``node`` is one of the run's node names (``node0``...); any other name (the exporter's
        hostname default) picks the first node. Raises ValueError for an unknown scenario.
        """
        self._clock = clock
        self._live = live_sim
        if run is None and live_sim is not None:
            run = getattr(live_sim, "run", None)
        if run is None:
            from monitor.sim.engine import SimRun

            try:
                run = SimRun(scenario=scenario, nodes=nodes, gpus_per_node=gpus_per_node,
                             seed=seed, start_time=clock())
            except (KeyError, ValueError) as exc:
                raise ValueError(f"cannot simulate scenario {scenario!r}: {_words(exc)}") from exc
        self.run = run
        names = list(getattr(run, "node_names", []) or [])
        self.node = node if node in names else (names[0] if names else "node0")
        self._t0 = clock()
        first = self._rows(self._sim_time())
        self._devices = [
            GpuIdentity(index=int(r["gpu"]), uuid=_uuid(self.node, int(r["gpu"])),
                        name=SIM_GPU_NAME)
            for r in sorted(first, key=lambda r: int(r["gpu"]))
        ]

    @classmethod
    def from_options(cls, options: ExporterOptions, live_sim: Any = None) -> SimBackend:
        """Build from the exporter's options: scenario, GPUs per node, node, seed."""
        return cls(
            scenario=options.scenario or "healthy",
            gpus_per_node=int(options.sim_gpus if options.sim_gpus is not None else 8),
            node=options.node,
            seed=int(options.seed or 0),
            live_sim=live_sim,
        )

    def _sim_time(self) -> float:
        if self._live is not None:
            return float(self._live.now_sim())
        start = float(self.run.start_time)
        t = start + (self._clock() - self._t0)
        span = float(self.run.end_time) - start
        if span > 0 and t >= start + span:  # past the end: loop the run
            t = start + (t - start) % span
        return t

    def _rows(self, t: float) -> list[dict[str, Any]]:
        return [r for r in self.run.gpu_sample_at(t) if str(r.get("node")) == self.node]

    def devices(self) -> list[GpuIdentity]:
        """The simulated node's GPUs."""
        return list(self._devices)

    def sample(self) -> list[GpuReading]:
        """Every simulated GPU of the node at the current simulated time, stamped with the
        simulated time where a ``LiveSim`` plays the run (the clock its log is read on: at
        10x a step of 12 simulated seconds takes 1.2 wall seconds, and the samples must fall
        in its phases), else with the wall clock."""
        t = self._sim_time()
        stamp = t if self._live is not None else self._clock()
        rows = sorted(self._rows(t), key=lambda r: int(r["gpu"]))
        return [row_to_reading(r, stamp) for r in rows]

    def host_sample(self) -> dict[str, Any]:
        """The simulated host row (interchange host columns) of this node, now.

        The host collector reports this instead of the real machine's CPU when the GPUs are
        simulated, so a scenario's host-side signature (a pegged dataloader core, iowait)
        reaches the detectors and Prometheus together with its GPU signature.
        """
        return dict(self.run.host_sample_at(self._sim_time(), self.node))

    def close(self) -> None:
        """Nothing to release."""


def _uuid(node: str, index: int) -> str:
    """A stable, UUID-shaped id per simulated GPU."""
    import hashlib

    h = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _words(exc: BaseException) -> str:
    return str(exc.args[0]) if exc.args else exc.__class__.__name__
