"""Collector registration, node_exporter style: one collector per file, each registers itself.

A collector module declares its own command-line flags beside it (as node_exporter's
collectors declare their kingpin flags at the top of their file) and registers itself::

    def add_flags(group: FlagGroup) -> None:
        group.add_argument("--train-pid", type=int, metavar="PID", help="...")

    @register("host", default=True, help="CPU, iowait, disk, network, memory (psutil)",
              flags=add_flags)
    class HostCollector(BaseCollector):
        ...

It gets ``--collector.host`` / ``--no-collector.host`` flags for free, and its own flags in a
``host collector`` group of ``verl-monitor exporter --help`` (cli/commands/exporter.py builds
the parser from this registry); their values reach it typed, as fields of the one
``ExporterOptions`` (exporters/options.py) in ``ctx.options``. On each scrape the
server calls ``collect()`` on every enabled collector; the collector builds fresh metric
families from its latest snapshot (sampling happens in its own background thread, never in
the scrape), and the server times each call for ``verlmon_collector_duration_seconds``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from exporters.options import ExporterOptions
from monitor.live import VIEWS, AddFlags, HealthRegistry, LiveView, NullSink, Sink

if TYPE_CHECKING:
    from exporters.gpu.backend import GpuBackend
    from monitor.sim.live import LiveSim

#: Modules under ``exporters.collectors`` imported to fill the registry: the sources. The live
#: monitor's derived views (flags, phase_gpu, goodput, flight_recorder) are listed after them
#: from ``monitor.live.VIEWS`` (below).
COLLECTOR_MODULES: tuple[str, ...] = ("gpu", "host", "verl_log", "nccl", "rollout_engine")


@dataclass
class ExporterContext:
    """What every collector receives: its settings, where to publish, what it shares.

    ``sink`` is where collectors publish samples, steps and events (monitor/live/sink.py; the
    live monitor implements it); ``options`` are the typed command-line options; ``health`` is
    where a collector with numbers about itself registers (``collect()``;
    monitor/live/health_registry.py), as the log follower does. Two sources are shared:
    ``live_sim`` (the simulator writing ``--sim-log``: its clock and speed) and ``gpu_backend``
    (built by the exporter before any collector: the GPU collector samples it, the host
    collector reads the simulated host from it), so no collector writes into the context and
    their order does not matter. Nothing here reads the monitor back: the derived views get
    the live monitor's own context (``monitor.live.ViewContext``). ``clock`` is the time
    every sample, step and event is stamped with: the wall clock, or the simulated run's own
    clock while ``--sim-log`` plays it at another speed (``LiveSim.now_sim``), so a run played
    at 10x is measured in its own seconds, as at 1x.
    """

    node: str
    interval: float
    sink: Sink = field(default_factory=NullSink)
    options: ExporterOptions = field(default_factory=ExporterOptions)
    live_sim: LiveSim | None = None
    gpu_backend: GpuBackend | None = None
    health: HealthRegistry = field(default_factory=HealthRegistry)
    clock: Callable[[], float] = time.time


class BaseCollector(LiveView):
    """Base class of a source collector: override ``collect``; override ``start``/``stop`` for
    background samplers (the same shape as the live monitor's views, monitor/live/live_view.py:
    ``healthy()`` is False while ``last_error`` is set)."""

    name: ClassVar[str] = "base"

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)


@dataclass
class CollectorSpec:
    """A registered collector: its factory, whether it is on by default, its help text, and
    the command-line flags it declares (``flags``: adds them to the group it is given)."""

    name: str
    factory: Callable[[ExporterContext], BaseCollector]
    default: bool
    help: str
    #: a derived view of the live monitor: built from ``LiveMonitor.view_context()``
    view: bool = False
    flags: AddFlags | None = None


REGISTRY: dict[str, CollectorSpec] = {}


def register(name: str, *, default: bool = True, help: str = "",  # noqa: A002
             flags: AddFlags | None = None):
    """Class decorator that registers a collector under ``name``, with the flags it declares
    (``flags(group)`` adds them to its own group of the exporter's command line)."""

    def deco(cls):
        cls.name = name
        REGISTRY[name] = CollectorSpec(name=name, factory=cls, default=default, help=help,
                                       flags=flags)
        return cls

    return deco


def load_all() -> dict[str, CollectorSpec]:
    """Import every collector module so each registers itself; returns the registry."""
    for mod in COLLECTOR_MODULES:
        importlib.import_module(f"exporters.collectors.{mod}")
    for view in VIEWS:  # the sources first, then the views that read the monitor back
        REGISTRY[view.name] = REGISTRY.pop(view.name)
    return REGISTRY


def _register_views() -> None:
    """List the live monitor's derived views beside the collectors: each gets its
    ``--collector.NAME`` flag and ``verlmon_collector_success`` series, and the exporter builds
    it from the live monitor's ``view_context()``, not from the collectors' context."""
    for view in VIEWS:
        REGISTRY[view.name] = CollectorSpec(name=view.name, factory=view.factory,
                                            default=view.default, help=view.help, view=True,
                                            flags=view.flags)


_register_views()
