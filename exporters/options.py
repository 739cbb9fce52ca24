"""The exporter's options: one frozen dataclass, built once from the command line.

``verl-monitor exporter`` parses its flags with argparse: its own (cli/commands/exporter.py)
and each collector's, declared beside the collector (``add_flags`` passed to
``exporters.registry.register``; the flight recorder's in monitor/live/hang_dumps.py). It turns
the namespace into :class:`ExporterOptions` once, with :meth:`ExporterOptions.from_namespace`;
everything after that (the exporter, the monitor side, each collector, the GPU backends) reads
typed fields, never the namespace.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

from monitor.live.live_options import DEFAULT_DETECT_INTERVAL_S, LiveOptions

#: Default listen address: a port outside the crowded 9100-9999 exporter range.
DEFAULT_PORT = 9048
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
__all__ = ["DEFAULT_DETECT_INTERVAL_S", "DEFAULT_LISTEN", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_PORT",
           "ExporterOptions"]
#: Default HTTP connections served at once (``--web.max-connections``; exporters/metrics_server.py).
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class ExporterOptions(LiveOptions):
    """Every ``verl-monitor exporter`` setting (see ``verl-monitor exporter --help``): the live
    monitor's own (``LiveOptions``: window, detectors, store, Slack, wandb, the views) and the
    exporter's (listen address, web, node) and its collectors' (each field is the flag of the
    same name, declared by the collector that reads it).

    ``collectors`` holds the explicit ``--collector.NAME`` / ``--no-collector.NAME`` choices;
    a collector not named there runs when it is on by default.
    """

    # the exporter's own (cli/commands/exporter.py)
    listen_address: str = DEFAULT_LISTEN
    web_config_file: str | None = None
    web_max_connections: int = DEFAULT_MAX_CONNECTIONS
    node: str | None = None
    verbose: bool = False
    collectors: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    # each collector's, declared beside it (``add_flags`` in exporters/collectors/NAME.py):
    # gpu, and the backends it builds (exporters/gpu/)
    gpu_backend: str | None = None
    scenario: str | None = None
    sim_gpus: int | None = None
    seed: int | None = None
    sim_speed: float = 1.0
    gpu_energy_interval: float = 10.0
    dcgm_compat: bool = False
    # host
    train_pid: int | None = None
    # verl_log (its ``--log`` is the monitor's too: ``LiveOptions.log``)
    log_from_end: bool = False
    log_timezone: str | None = None
    # nccl
    nccl_dir: str | None = None
    nccl_window: float = 30.0
    # rollout_engine
    rollout_server: tuple[str, ...] = ()
    rollout_discovery_file: str | None = None
    rollout_interval: float = 5.0
    rollout_timeout: float = 2.0

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ExporterOptions:
        """The options of a parsed ``verl-monitor exporter`` command line (None: default)."""
        values = vars(ns)
        kwargs = {f.name: values[f.name] for f in fields(cls)
                  if f.name != "collectors" and values.get(f.name) is not None}
        if "log" in kwargs:
            kwargs["log"] = tuple(str(p) for p in kwargs["log"])
        if "rollout_server" in kwargs:
            kwargs["rollout_server"] = tuple(str(u) for u in kwargs["rollout_server"])
        chosen = {key.removeprefix("collector_"): bool(value) for key, value in values.items()
                  if key.startswith("collector_") and value is not None}
        return cls(**kwargs, collectors=MappingProxyType(chosen))

    def collector_enabled(self, name: str, default: bool) -> bool:
        """Whether collector ``name`` runs: the flag that named it, else its default."""
        return self.collectors.get(name, default)

    def live_options(self) -> LiveOptions:
        """The live monitor's part of these options (monitor/live/live_options.py)."""
        return LiveOptions(**{f.name: getattr(self, f.name) for f in fields(LiveOptions)})

    def with_log(self, path: str) -> ExporterOptions:
        """These options following one more log (the simulator's ``--sim-log``)."""
        return replace(self, log=(*self.log, str(path)))
