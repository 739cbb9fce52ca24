"""The node exporter, put together: collectors and /metrics beside the monitor.

Two parts joined by one typed seam (docs/architecture.md):

- the *exporter* (this module): the collectors, each sampling on its own thread, and the
  ``/metrics`` endpoint (TLS and basic auth from ``--web.config.file``);
- the *monitor* (monitor/live/live_monitor.py): the rolling window, the detectors, the flag
  tracker, the run-store writer, Slack and wandb.

Collectors publish samples, steps and events through the :class:`~monitor.live.sink.Sink`
protocol, which the monitor implements; options are the frozen
:class:`~exporters.options.ExporterOptions` built once from the command line
(:func:`cli.commands.exporter.parse_options`). ``Exporter(options).start()``:

1. binds the server (a busy port fails before anything starts sampling);
2. opens the monitor: the run store (``--store``), the detectors, Slack;
3. with ``--sim-log`` starts a ``LiveSim`` writing the scenario's verl log (and follows it);
4. builds and starts every enabled collector;
5. starts the monitor's threads (detector loop, store flusher, Slack, wandb) and serves.

:meth:`Exporter.stop` undoes all of it in reverse order; the monitor flushes the store one last
time. Every problem that stops the start is an :class:`ExporterError` with one line in words.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from exporters.exposition import Exposition
from exporters.landing import landing_page
from exporters.metrics_server import MetricsServer, parse_listen_address
from exporters.options import ExporterOptions
from exporters.registry import BaseCollector, CollectorSpec, ExporterContext, load_all
from exporters.webconfig import WebConfigError, load_web_config
from monitor.live import LiveMonitor, MonitorError

if TYPE_CHECKING:
    from exporters.gpu.backend import GpuBackend
    from monitor.sim.live import LiveSim

log = logging.getLogger("verl_monitor.exporter")

T = TypeVar("T")

#: Shortest sampling interval accepted, seconds.
MIN_INTERVAL_S = 0.1


class ExporterError(RuntimeError):
    """The exporter cannot start; the message is one line saying why and what to do."""


def enabled_collectors(options: ExporterOptions, specs: dict[str, CollectorSpec]) -> list[str]:
    """Names of the collectors to run: each spec's default unless a flag said otherwise."""
    return [name for name, spec in specs.items()
            if options.collector_enabled(name, spec.default)]


def listening_words(address: tuple[str, int]) -> str:
    """Where the exporter listens, as bound: "listening on 0.0.0.0:9048, every interface" (the
    URL printed beside it names this host, which is only one of them), else "listening on
    127.0.0.1:9048 only"."""
    host, port = address[0], address[1]
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::", ""):
        return f"listening on {shown or '0.0.0.0'}:{port}, every interface"
    return f"listening on {shown}:{port} only"


class Exporter:
    """One node's exporter and its monitor; ``start()``, then ``stop()`` (safe to call twice)."""

    def __init__(self, options: ExporterOptions) -> None:
        self.options = options
        interval = float(options.interval)
        if interval < MIN_INTERVAL_S:
            raise ExporterError(f"--interval must be at least {MIN_INTERVAL_S:g} seconds "
                                f"(got {interval:g})")
        self.interval = interval
        self.node = options.node or socket.gethostname()
        try:
            self.address = parse_listen_address(options.listen_address)
        except ValueError as exc:
            raise ExporterError(str(exc)) from None
        try:
            self.web = load_web_config(options.web_config_file)
        except WebConfigError as exc:
            raise ExporterError(f"--web.config.file {exc}") from None
        #: the monitor side: window, detectors, flags, store, Slack, wandb (the collectors' sink)
        self.monitor = LiveMonitor(options.live_options(), self.node, interval)
        self.live_sim: LiveSim | None = None
        self.collectors: dict[str, BaseCollector] = {}
        self.ctx: ExporterContext | None = None
        self.exposition: Exposition | None = None
        self.server: MetricsServer | None = None
        self._specs: dict[str, CollectorSpec] = {}
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Start everything; raises ExporterError (after cleaning up) when it cannot."""
        if self._started:
            return
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        try:  # bind first: a busy port fails before anything starts sampling
            self.server = MetricsServer(self.address, self._render, self._landing, self.web,
                                        scrape=self._scrape,
                                        max_connections=self.options.web_max_connections)
        except OSError as exc:
            raise ExporterError(f"cannot listen on {self.address[0]}:{self.address[1]} "
                                f"({exc.strerror or exc}); choose another --listen-address"
                                ) from None
        monitor = self.monitor
        try:
            monitor.open()
        except MonitorError as exc:
            raise ExporterError(str(exc)) from None
        self._start_sim()
        if self.live_sim is not None and self.live_sim.speed != 1.0:
            # a run played faster is measured in its own seconds (its log's step times), so
            # at 10x the detectors see what they see at 1x
            monitor.use_clock(self.live_sim.now_sim, self.live_sim.sim_time_of)
        self._build_collectors()
        for collector in self.collectors.values():
            collector.start()
        backend = self.ctx.gpu_backend.name if self.ctx.gpu_backend is not None else "none"
        from monitor import __version__

        self.exposition = Exposition(self.collectors, node=self.node, version=__version__,
                                     backend=str(backend))
        # the exporter's own numbers: every part registered itself (monitor/live/health_registry.py)
        server = self.server
        monitor.health.count_restarts(lambda: {"metrics-server": server.restarts})
        monitor.health.register(server)
        self.exposition.extra = monitor.health.collect
        from exporters.collectors.gpu import GpuCollector

        collector = self.collectors.get("gpu")
        monitor.warn_window_coverage(len(collector.snapshot())  # the GPUs of its last sample
                                     if isinstance(collector, GpuCollector) else 0)
        monitor.start()
        self.server.start()

    def _render(self) -> bytes:
        return self._scrape(None, False)

    def _scrape(self, names: frozenset[str] | None, openmetrics: bool) -> bytes:
        if self.exposition is None:
            return b""
        return self.exposition.render(names, openmetrics)

    def _build_collectors(self) -> None:
        """The sources on the collectors' context, then the live monitor's derived views on
        its own; the GPU backend first, shared by the gpu and host collectors."""
        monitor = self.monitor
        self._specs = load_all()
        names = enabled_collectors(self.options, self._specs)
        backend = self._guarded("gpu", self._gpu_backend) if "gpu" in names else None
        self.ctx = ExporterContext(node=self.node, interval=self.interval, sink=monitor,
                                   options=self.options, live_sim=self.live_sim,
                                   gpu_backend=backend, health=monitor.health,
                                   clock=monitor.now)
        views = monitor.view_context()
        for name in names:
            spec = self._specs[name]
            self.collectors[name] = self._guarded(
                name, lambda spec=spec: spec.factory(views if spec.view else self.ctx))

    def _gpu_backend(self) -> GpuBackend:
        from exporters.gpu import default_backend_name, make_backend

        name = self.options.gpu_backend or default_backend_name()
        return make_backend(name, self.options, live_sim=self.live_sim)

    def _guarded(self, name: str, build: Callable[[], T]) -> T:
        """``build()``, its failure turned into one ExporterError line naming ``name``."""
        try:
            return build()
        except ExporterError:
            raise
        except Exception as exc:  # noqa: BLE001 - turned into one line for the user
            from exporters.gpu.backend import BackendUnavailable

            if isinstance(exc, BackendUnavailable):
                raise ExporterError(
                    f"{str(exc).rstrip('.')}; or leave GPUs out with --no-collector.gpu"
                ) from None
            raise ExporterError(f"collector {name} cannot start: {exc}") from None

    def _start_sim(self) -> None:
        opts = self.options
        sim_log = opts.sim_log
        if not sim_log:
            return
        if opts.gpu_backend != "sim" or not opts.scenario:
            raise ExporterError("--sim-log needs --gpu-backend sim and --scenario NAME")
        from monitor.sim.engine import SimRun
        from monitor.sim.live import LiveSim

        try:
            run = SimRun(scenario=opts.scenario, nodes=1,
                         gpus_per_node=int(opts.sim_gpus if opts.sim_gpus is not None else 8),
                         seed=int(opts.seed or 0))
        except (ValueError, KeyError) as exc:
            raise ExporterError(f"--scenario {opts.scenario}: "
                                f"{str(exc).strip(chr(39))}") from None
        speed = float(opts.sim_speed)
        if speed <= 0:
            raise ExporterError(f"--sim-speed must be above 0 (got {speed:g})")
        self.live_sim = LiveSim(run, sim_log, speed)
        self.live_sim.start()
        if os.path.abspath(sim_log) not in [os.path.abspath(p) for p in opts.log]:
            self.options = opts.with_log(sim_log)
        if self.live_sim.engine_urls and not self.options.rollout_server:
            # an agent-loop / fully-async scenario serves its engines: the rollout collector
            # scrapes them as it would verl's vLLM / SGLang servers
            from dataclasses import replace

            self.options = replace(self.options, rollout_server=tuple(self.live_sim.engine_urls))

    def _landing(self) -> bytes:
        from monitor import __version__

        rows = [(name, spec.help, name in self.collectors)
                for name, spec in sorted(self._specs.items())]
        backend = self.exposition.backend if self.exposition else None
        return landing_page(self.node, __version__, rows, backend=backend,
                            interval=self.interval)

    # ------------------------------------------------------------------ info and stop

    @property
    def url(self) -> str:
        """The /metrics URL (after start)."""
        return self.server.url if self.server else ""

    def startup_line(self) -> str:
        """The one line printed at startup: URL, node, collectors, backend."""
        names = ", ".join(self.collectors) or "none"
        backend = self.exposition.backend if self.exposition else "none"
        extra = f"; simulating {self.options.scenario} into " \
                f"{self.options.sim_log}" if self.live_sim is not None else ""
        port = self.server.port if self.server is not None else self.address[1]
        return (f"verl-monitor exporter: serving {self.url} ("
                f"{listening_words((self.address[0], port))}; "
                f"node {self.node}, every {self.interval:g} s, GPU backend {backend}; "
                f"collectors: {names}{extra})")

    def detect_once(self) -> tuple[list, list]:
        """Run the monitor's detectors once now; returns (opened, closed) flags."""
        return self.monitor.detect_once()

    def stop(self) -> None:
        """Stop serving, sampling and detecting; flush and close the store. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.server is not None:
            self.server.stop()
        for collector in self.collectors.values():
            try:
                collector.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log.warning("collector %s did not stop cleanly: %s", collector.name, exc)
        if self.live_sim is not None:
            try:
                self.live_sim.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("simulator did not stop cleanly: %s", exc)
        self.monitor.stop()
