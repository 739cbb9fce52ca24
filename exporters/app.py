"""The node exporter, put together: collectors, detectors, run store, web server.

``Exporter(options)`` takes the parsed ``verl-monitor exporter`` options (an argparse
namespace; :func:`monitor.commands.exporter.parse_options` builds one from a list of
arguments) and on :meth:`Exporter.start`:

1. opens the run store (``--store``) behind a ``StoreWriter``;
2. with ``--sim-log`` starts a ``LiveSim`` writing the scenario's verl log (and follows it);
3. builds and starts every enabled collector (each samples on its own thread);
4. starts the detector loop (``run_all`` on the rolling window, ``FlagTracker.update``, flags
   to the store and to Slack when configured) and the store flusher;
5. serves /metrics and / (TLS and basic auth from ``--web.config.file``).

:meth:`Exporter.stop` undoes all of it in reverse order and flushes the store one last time.
Every problem that stops the start is an :class:`ExporterError` with one line in words.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from exporters.exposition import Exposition
from exporters.landing import landing_page
from exporters.registry import BaseCollector, CollectorSpec, ExporterContext, load_all
from exporters.server import MetricsServer, parse_listen_address
from exporters.webconfig import WebConfigError, load_web_config
from exporters.window import RollingWindow

log = logging.getLogger("verl_monitor.exporter")

#: Shortest sampling interval accepted, seconds.
MIN_INTERVAL_S = 0.1
#: Default listen address: a port outside the crowded 9100-9999 exporter range.
DEFAULT_LISTEN = "0.0.0.0:9048"
#: The detector loop never runs more often than this (seconds), whatever the interval.
MIN_DETECT_INTERVAL_S = 1.0
#: Seconds between Slack deliveries (queued messages; retries back off on their own).
NOTIFY_INTERVAL_S = 5.0
#: Default seconds between detector runs: ``run_all`` on a 30-minute window of 8 GPUs costs
#: about 0.4 s of CPU here (bench/exporter.py), so running it every second would cost 40% of a
#: core and every 30 s costs ~1.3%. The detectors' persistence windows are 30 s to minutes, so
#: the cadence adds little latency, and a new step in the log also triggers a run (at most one
#: a second), so step-based flags do not wait for the tick.
DEFAULT_DETECT_INTERVAL_S = 30.0


class ExporterError(RuntimeError):
    """The exporter cannot start; the message is one line saying why and what to do."""


#: Seconds a supervised thread waits before it starts again after an exception.
RESTART_PAUSE_S = 1.0
#: Seconds between returns of freed heap memory to the system (see ``trim_heap``).
TRIM_INTERVAL_S = 30.0


def trim_heap() -> bool:
    """Give freed heap pages back to the system (glibc ``malloc_trim``); False elsewhere.

    Each detector run builds and drops frames of up to the window's 200,000 rows; glibc keeps
    the freed pages in its arenas, so without this the RSS creeps up run after run although
    nothing is kept (bench/soak.py shows it at 64 GPUs every 0.1 s)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def supervised(name: str, target, stop: threading.Event, restarts: dict[str, int]) -> None:
    """Run ``target()`` until it returns with ``stop`` set; restart it after an exception.

    Each exception adds one to ``restarts[name]`` and is logged with its reason (once per
    distinct reason); the thread then pauses ``RESTART_PAUSE_S`` and runs ``target`` again.
    A target that returns while ``stop`` is not set is restarted too (it must not end)."""
    logged: set[str] = set()
    while True:
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - the point: this thread must not die
            reason = f"{exc.__class__.__name__}: {str(exc)[:200]}"
            restarts[name] = restarts.get(name, 0) + 1
            if reason not in logged:
                logged.add(reason)
                log.error("thread %s failed (%s); restarting it", name, reason)
        if stop.wait(RESTART_PAUSE_S):
            return


def _opt(options: Any, name: str, default: Any = None) -> Any:
    value = getattr(options, name, None)
    return default if value is None else value


def enabled_collectors(options: Any, specs: dict[str, CollectorSpec]) -> list[str]:
    """Names of the collectors to run: each spec's default unless a flag said otherwise."""
    names = []
    for name, spec in specs.items():
        flag = getattr(options, f"collector_{name}", None)
        if (spec.default if flag is None else flag):
            names.append(name)
    return names


class Exporter:
    """One node's exporter; ``start()``, then ``stop()`` (safe to call twice)."""

    def __init__(self, options: Any) -> None:
        self.options = options
        interval = float(_opt(options, "interval", 1.0))
        if interval < MIN_INTERVAL_S:
            raise ExporterError(f"--interval must be at least {MIN_INTERVAL_S:g} seconds "
                                f"(got {interval:g})")
        self.interval = interval
        self.detect_interval = max(
            float(_opt(options, "detect_interval", max(interval, DEFAULT_DETECT_INTERVAL_S))),
            MIN_DETECT_INTERVAL_S)
        self.node = _opt(options, "node") or socket.gethostname()
        try:
            self.address = parse_listen_address(_opt(options, "listen_address", DEFAULT_LISTEN))
        except ValueError as exc:
            raise ExporterError(str(exc)) from None
        try:
            self.web = load_web_config(_opt(options, "web_config_file"))
        except WebConfigError as exc:
            raise ExporterError(f"--web.config.file {exc}") from None
        self.window = RollingWindow(max_age_s=float(_opt(options, "window", 1800.0)))
        self.run_store: Any = None
        self.store: Any = None
        self.live_sim: Any = None
        self.collectors: dict[str, BaseCollector] = {}
        self.ctx: ExporterContext | None = None
        self.exposition: Exposition | None = None
        self.server: MetricsServer | None = None
        self.tracker: Any = None
        self.notifier: Any = None
        self.wandb_sink: Any = None
        self.detect_config: Any = None
        self.detect_errors = 0
        self.detect_runs = 0
        self._run_all: Any = None
        self._specs: dict[str, CollectorSpec] = {}
        self._stop = threading.Event()
        self._detect_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: supervised threads that raised and were restarted, by thread name
        self.thread_restarts: dict[str, int] = {}
        self._integrity_checked = False
        self._last_trim = 0.0
        self._store_error_logged: str | None = None
        self._store_lock: Any = None
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
        opts = self.options
        try:  # bind first: a busy port fails before anything starts sampling
            self.server = MetricsServer(self.address, self._render, self._landing, self.web)
        except OSError as exc:
            raise ExporterError(f"cannot listen on {self.address[0]}:{self.address[1]} "
                                f"({exc.strerror or exc}); choose another --listen-address"
                                ) from None
        self._open_store()
        self._load_detectors()
        self._start_sim()
        self.ctx = ExporterContext(node=self.node, interval=self.interval, window=self.window,
                                   store=self.store, options=opts)
        if self.live_sim is not None:
            self.ctx.extra["live_sim"] = self.live_sim
        if self.tracker is not None:
            self.ctx.extra["flag_tracker"] = self.tracker
        if self.notifier is not None:
            self.ctx.extra["notifier"] = self.notifier  # the goodput digest posts through it
        self._specs = load_all()
        for name in enabled_collectors(opts, self._specs):
            self.collectors[name] = self._build_collector(name)
        for collector in self.collectors.values():
            collector.start()
        backend = self.ctx.extra.get("gpu_backend_name") or (
            _opt(opts, "gpu_backend", "none") if "gpu" in self.collectors else "none")
        from monitor import __version__

        self.exposition = Exposition(self.collectors, node=self.node, version=__version__,
                                     backend=str(backend), store=self.store)
        self.exposition.extra = self._health_families
        self._warn_window_coverage()
        self._spawn("detector-loop", self._detect_loop)
        if _opt(opts, "wandb"):
            self._spawn("wandb-init", self._start_wandb, supervise=False)
        if self.notifier is not None:
            self.notifier.start(interval_s=NOTIFY_INTERVAL_S)  # its own thread: retries wait
        if self.store is not None:
            self._spawn("store-flusher", self._flush_loop)
        self.server.start()

    def _health_families(self) -> list:
        """The exporter's own counters: thread restarts and every buffer's drops."""
        from prometheus_client.core import CounterMetricFamily

        from monitor import metric_names as m

        restarts = CounterMetricFamily(
            m.THREAD_RESTARTS.removesuffix("_total"),
            "Exporter threads restarted after an exception (each logged with its reason).",
            labels=["thread"])
        for name in dict.fromkeys(("detector-loop", "store-flusher",
                                   *sorted(self.thread_restarts))):
            if name in self.thread_restarts or any(t.name == name for t in self._threads):
                restarts.add_metric([name], self.thread_restarts.get(name, 0))
        if self.server is not None:
            restarts.add_metric(["metrics-server"], self.server.restarts)
        notifier = self.notifier
        slack: list = []
        if notifier is not None:
            restarts.add_metric(["slack-sender"], getattr(notifier, "thread_restarts", 0))
            messages = CounterMetricFamily(
                m.SLACK_MESSAGES.removesuffix("_total"),
                "Slack messages finished: sent, unknown (no answer after sending; not "
                "retried), skipped (resolved whose opened never went).", labels=["outcome"])
            for outcome, count in sorted(notifier.outcomes.items()):
                messages.add_metric([outcome], count)
            slack = [messages, CounterMetricFamily(
                m.SLACK_DROPPED.removesuffix("_total"),
                "Slack messages the in-memory outbox dropped at its bound.",
                value=notifier.dropped)]
        window = CounterMetricFamily(
            m.WINDOW_DROPPED.removesuffix("_total"),
            "GPU/host rows the detectors' window dropped at its row cap before they aged out.",
            labels=["kind"])
        for kind, count in sorted(getattr(self.window, "dropped", {}).items()):
            window.add_metric([kind], count)
        out = [restarts, window, *slack]
        logs = getattr(self.collectors.get("verl_log"), "logs", None)
        if logs:
            oversize = CounterMetricFamily(
                m.LOG_DROPPED.removesuffix("_total"),
                "Lines of each followed log dropped unread for being longer than 16 MiB.",
                labels=["log"])
            for followed in logs:
                oversize.add_metric([str(followed.path)],
                                    getattr(followed.follower, "oversize_lines", 0))
            out.append(oversize)
        if self.store is not None:
            dropped = CounterMetricFamily(
                m.STORE_DROPPED.removesuffix("_total"),
                "Rows the run-store writer dropped: buffer_full (past its bound while writes "
                "fail) or invalid (a value SQLite cannot hold).", labels=["reason"])
            for reason, count in sorted(self.store.dropped.items()):
                dropped.add_metric([reason], count)
            out.append(dropped)
        return out

    def _warn_window_coverage(self) -> None:
        """Say so at startup when the window's row cap cannot hold ``--window`` of GPU rows
        at this interval (64 GPUs every 0.1 s fill 200,000 rows in about 5 minutes)."""
        collector = self.collectors.get("gpu")
        snapshot = getattr(collector, "snapshot", None)
        gpus = len(snapshot()) if callable(snapshot) else 0  # the GPUs of its last sample
        cap = getattr(getattr(self.window, "_gpu", None), "maxlen", None)
        if not gpus or not cap:
            return
        covered = cap / (gpus / self.interval)
        if covered < self.window.max_age_s:
            log.warning("the detectors' window holds %d GPU rows: %.1f min of %d GPUs every "
                        "%g s, not --window's %.0f min; older rows are dropped (counted in "
                        "verlmon_window_dropped_rows_total)", cap, covered / 60, gpus,
                        self.interval, self.window.max_age_s / 60)

    def _render(self) -> bytes:
        return self.exposition.render() if self.exposition is not None else b""

    def _build_collector(self, name: str) -> BaseCollector:
        try:
            return self._specs[name].factory(self.ctx)
        except ExporterError:
            raise
        except Exception as exc:  # noqa: BLE001 - turned into one line for the user
            from exporters.gpu.backend import BackendUnavailable

            if isinstance(exc, BackendUnavailable):
                raise ExporterError(
                    f"{str(exc).rstrip('.')}; or leave GPUs out with --no-collector.gpu"
                ) from None
            raise ExporterError(f"collector {name} cannot start: {exc}") from None

    def _open_store(self) -> None:
        path = _opt(self.options, "store")
        if not path:
            return
        from monitor.store import RunStore, StoreError, StoreWriter
        from monitor.store.lock import StoreLock, StoreLocked

        lock = StoreLock(path)
        try:  # one writer per store: a second exporter would double every row
            lock.acquire()
        except StoreLocked as exc:
            raise ExporterError(f"--store {exc}") from None
        except OSError as exc:
            raise ExporterError(f"--store {path}: cannot create its lock file "
                                f"({exc.strerror or exc})") from None
        self._store_lock = lock
        try:
            self.run_store = RunStore(path)
        except StoreError as exc:
            raise ExporterError(f"--store {exc}") from None
        except OSError as exc:
            raise ExporterError(f"--store {path}: cannot open ({exc.strerror or exc})") from None
        try:
            owner = self.run_store.meta().get("node")
        except Exception:  # noqa: BLE001 - an unreadable meta table shows in the integrity check
            owner = None
        if owner not in (None, "", self.node):
            raise ExporterError(f"--store {path} holds node {owner}'s run (this exporter is node "
                                f"{self.node}); give it another --store, or --node {owner}")
        self.store = StoreWriter(self.run_store)
        self.store.set_meta("node", self.node)

    def _load_detectors(self) -> None:
        from monitor.config import load_config
        from monitor.detect import run_all
        from monitor.detect.live import FlagTracker

        cfg_path = _opt(self.options, "config")
        try:
            self.detect_config = load_config(cfg_path)
        except FileNotFoundError:
            raise ExporterError(f"--config {cfg_path}: no such file") from None
        except (ValueError, OSError) as exc:
            raise ExporterError(f"--config {exc}") from None
        self._run_all = run_all
        self.tracker = FlagTracker()
        hook = _opt(self.options, "slack_webhook_file")
        if hook:
            try:
                from monitor.notify.slack import SlackNotifier

                # the outbox lives in the run store when there is one (survives restarts)
                self.notifier = SlackNotifier(hook, self.run_store)
            except ImportError:
                from monitor.extras import missing_extra_message

                raise ExporterError(missing_extra_message("--slack-webhook-file", "slack")
                                    ) from None
            except (ValueError, OSError) as exc:
                raise ExporterError(f"--slack-webhook-file {exc}") from None

    def _start_wandb(self) -> None:
        """Open the wandb run off the main path: ``wandb.init`` may wait for its timeout
        before falling back to offline, and metrics must be served meanwhile."""
        target = _opt(self.options, "wandb")
        try:
            from monitor.integrations.wandb_sink import WandbSink

            sink = WandbSink.from_target(target)
        except Exception as exc:  # noqa: BLE001 - wandb never takes the exporter down
            log.warning("--wandb %s: disabled (%s)", target, exc)
            return
        if self._stopped:
            sink.close()
            return
        self.wandb_sink = sink

    def _start_sim(self) -> None:
        sim_log = _opt(self.options, "sim_log")
        if not sim_log:
            return
        if _opt(self.options, "gpu_backend") != "sim" or not _opt(self.options, "scenario"):
            raise ExporterError("--sim-log needs --gpu-backend sim and --scenario NAME")
        from monitor.sim.engine import SimRun
        from monitor.sim.live import LiveSim

        try:
            run = SimRun(scenario=_opt(self.options, "scenario"), nodes=1,
                         gpus_per_node=int(_opt(self.options, "sim_gpus", 8)),
                         seed=int(_opt(self.options, "seed", 0)))
        except (ValueError, KeyError) as exc:
            raise ExporterError(f"--scenario {_opt(self.options, 'scenario')}: "
                                f"{str(exc).strip(chr(39))}") from None
        speed = float(_opt(self.options, "sim_speed", 1.0))
        if speed <= 0:
            raise ExporterError(f"--sim-speed must be above 0 (got {speed:g})")
        self.live_sim = LiveSim(run, sim_log, speed)
        self.live_sim.start()
        logs = list(_opt(self.options, "log", []) or [])
        if os.path.abspath(sim_log) not in [os.path.abspath(p) for p in logs]:
            logs.append(str(sim_log))
            self.options.log = logs

    # ------------------------------------------------------------------ loops

    def _spawn(self, name: str, target, supervise: bool = True) -> None:
        """Run ``target`` on a daemon thread; supervised, an exception is counted in
        ``thread_restarts`` (``verlmon_exporter_thread_restarts_total``), logged once per
        distinct reason, and the target starts again after a pause, until ``stop()``."""
        body = (lambda: supervised(name, target, self._stop, self.thread_restarts)
                ) if supervise else target
        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def now(self) -> float:
        """The detectors' clock: the wall clock, the time base of every sample and step.

        (With ``--sim-log`` the simulated log carries no timestamps, so its steps too are
        timed by arrival, on the wall clock.)"""
        return time.time()

    def detect_once(self) -> tuple[list, list]:
        """Run the detectors on the window once; returns (opened, closed) flags."""
        if self._run_all is None or self.tracker is None:
            return [], []
        with self._detect_lock:  # one run at a time: the window read and the update pair up
            now = self.now()
            steps, gpu_df, host_df, events = self.window.frames()
            flags = self._run_all(steps, gpu_df, host_df, events, config=self.detect_config,
                                  now=now, reference_steps=self.window.first_steps())
            opened, closed = self.tracker.update(flags, now)
            self.detect_runs += 1
        sink = self.wandb_sink
        if sink is not None:
            try:
                sink.log_window(steps, gpu_df, opened, closed)
            except Exception as exc:  # noqa: BLE001 - the sink counts and disables itself
                log.warning("wandb: %s", exc)
        if self.store is not None:
            changed = list(self.tracker.active()) + list(closed)
            if changed:
                self.store.put_flags(changed)
        if self.notifier is not None:
            for flag in opened:
                self.notifier.notify_opened(flag)
            for flag in closed:
                self.notifier.notify_resolved(flag)
        return opened, closed

    def _detect_loop(self) -> None:
        """Run the detectors every ``detect_interval`` seconds, and also soon after a new step
        arrives (at most once a second): step-based flags follow the log without the cost of
        running every detector at the sampling rate."""
        last_error = None
        last_run = time.monotonic()
        seen_steps = self.window.steps_added
        tick = min(1.0, self.detect_interval)
        while not self._stop.wait(tick):
            now = time.monotonic()
            new_steps = self.window.steps_added != seen_steps
            if now - last_run < self.detect_interval and not (
                    new_steps and now - last_run >= MIN_DETECT_INTERVAL_S):
                continue
            seen_steps = self.window.steps_added
            last_run = now
            try:
                self.detect_once()
                last_error = None
                if time.monotonic() - self._last_trim >= TRIM_INTERVAL_S:
                    self._last_trim = time.monotonic()
                    trim_heap()
            except Exception as exc:  # noqa: BLE001 - detectors never take the exporter down
                self.detect_errors += 1
                message = f"{exc.__class__.__name__}: {exc}"
                if message != last_error:
                    log.warning("detector loop failed: %s", message)
                    last_error = message

    def _flush_loop(self) -> None:
        """Flush the store every second or so. A failure is logged once per episode (the
        message again only when it changes), and once more when writes work again."""
        if not self._integrity_checked:
            self._integrity_checked = True
            if not self.store.check_integrity():
                log.error("run store: %s", self.store.integrity_error)
        period = max(1.0, self.interval)
        while not self._stop.wait(period):
            self._flush_and_report()

    def _flush_and_report(self) -> bool:
        ok = self.store.flush()
        error = self.store.last_error if not ok else None
        if error and error != self._store_error_logged:
            log.warning("run store: %s", error)
        elif ok and self._store_error_logged:
            log.info("run store: writes work again")
        self._store_error_logged = error
        return ok

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
        extra = f"; simulating {_opt(self.options, 'scenario')} into " \
                f"{_opt(self.options, 'sim_log')}" if self.live_sim is not None else ""
        return (f"verl-monitor exporter: serving {self.url} (node {self.node}, every "
                f"{self.interval:g} s, GPU backend {backend}; collectors: {names}{extra})")

    def stop(self) -> None:
        """Stop serving, sampling and detecting; flush and close the store. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self.server is not None:
            self.server.stop()
        for collector in self.collectors.values():
            try:
                collector.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log.warning("collector %s did not stop cleanly: %s", collector.name, exc)
        if self.notifier is not None:
            try:
                self.notifier.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("Slack notifier did not stop cleanly: %s", exc)
        if self.wandb_sink is not None:
            try:
                self.wandb_sink.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("wandb run did not close cleanly: %s", exc)
        if self.live_sim is not None:
            try:
                self.live_sim.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("simulator did not stop cleanly: %s", exc)
        for thread in self._threads:
            thread.join(timeout=5.0)
        if self.store is not None:
            if not self.store.flush() and self.store.last_error:
                log.warning("run store: last flush failed: %s", self.store.last_error)
            if self.store.dropped_rows:
                log.warning("run store: %s rows were dropped (%s)", self.store.dropped_rows,
                            ", ".join(f"{k} {v}" for k, v in self.store.dropped.items() if v))
        if self.run_store is not None:
            self.run_store.close()
        if self._store_lock is not None:
            self._store_lock.release()
