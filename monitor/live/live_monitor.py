"""The monitor side of the exporter process: window, detectors, flags, store, Slack, wandb.

:class:`Recorder` is the :class:`~monitor.live.sink.Sink` the collectors publish to: each row,
step and event goes to the rolling window the detectors read and, with ``--store``, to the
run-store writer. :class:`LiveMonitor` is a Recorder that also owns the run store, runs the
detectors on the window (``run_all``, ``FlagTracker.update``), writes the flags to the store,
posts them to Slack and logs them to wandb, each on its own supervised thread.

The exporter (exporters/node_exporter.py: collectors and /metrics) and this monitor meet only through the
Sink and the read-only parts collectors export (the window for the goodput and phase counters,
the tracker for the flag series, the notifier for the goodput digest).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from monitor.detect.flag_advice import tell_job_config
from monitor.live.health_registry import HealthRegistry
from monitor.live.job_config_watch import META_KEY, JobConfigWatch, storable
from monitor.live.live_view import ViewContext
from monitor.live.rolling_window import RollingWindow
from monitor.live.sink import Row, Sink
from monitor.logs.fingerprint import step_fingerprint
from monitor.logs.modes import printed_mode
from monitor.records import Event, StepRecord
from monitor.telemetry_kinds import KIND, kinds

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from monitor.config import Config
    from monitor.integrations.wandb_sink import WandbSink
    from monitor.live.flag_tracker import FlagTracker
    from monitor.live.live_options import LiveOptions
    from monitor.logs.follow import LogPosition
    from monitor.notify.slack import SlackNotifier
    from monitor.records import Flag
    from monitor.store import RunStore, StoreWriter
    from monitor.store.lock import StoreLock

log = logging.getLogger("verl_monitor.exporter")

#: The detector loop never runs more often than this (seconds), whatever the interval.
MIN_DETECT_INTERVAL_S = 1.0
#: Seconds between Slack deliveries (queued messages; retries back off on their own).
NOTIFY_INTERVAL_S = 5.0
#: Seconds a supervised thread waits before it starts again after an exception.
RESTART_PAUSE_S = 1.0
#: Seconds between returns of freed heap memory to the system (see ``trim_heap``).
TRIM_INTERVAL_S = 30.0
#: Seconds between two log lines for the same detector failure.
DETECT_ERROR_LOG_S = 60.0
#: The store's meta key saying the run ended: ``{"time", "step", "reason"}`` (or null).
RUN_FINISHED_META = "run_finished"
#: Fingerprints of recent steps remembered to drop a step the log gives again.
RECENT_STEPS = 4096
#: Why a flag adopted from the store at start closes when the first detector pass lacks it.
CLOSED_AT_RESTART = "closed at restart: no longer seen"


class MonitorError(RuntimeError):
    """The monitor cannot start; the message is one line saying why and what to do."""


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


def supervised(name: str, target: Callable[[], object], stop: threading.Event,
               restarts: dict[str, int]) -> None:
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


class Recorder(Sink):
    """The Sink behind the collectors: the rolling window, then the store writer (if any).

    A part that refuses the rows does not keep them from the other; the call then raises one
    error naming what was not written, so the collector reports it as
    ``collector_success 0`` with the reason in words."""

    def __init__(self, window: RollingWindow, store: StoreWriter | None = None) -> None:
        self.window = window
        self.store = store
        self._recent_fps: dict[str, None] = {}  # insertion-ordered, bounded: RECENT_STEPS
        #: how far each followed log (absolute path) has been read and its records given out
        self.read_up_to: dict[str, int] = {}

    def _new_steps(self, steps: Sequence[StepRecord]) -> list[StepRecord]:
        """The steps not seen before (by content: a re-read step keeps its first record)."""
        fresh = []
        for step in steps:
            fp = step_fingerprint(step)
            if fp in self._recent_fps:
                continue
            self._recent_fps[fp] = None
            fresh.append(step)
        while len(self._recent_fps) > RECENT_STEPS:
            del self._recent_fps[next(iter(self._recent_fps))]
        return fresh

    def add_ledger(self, rows: list[dict]) -> None:
        """The goodput ledger rows the exporter counted, to the store (the dashboard on it
        reads the very seconds ``verlmon_gpu_seconds_total`` counted)."""
        if self.store is not None:
            self.store.put_ledger(rows)

    def saved_log_positions(self) -> dict[str, LogPosition]:
        """Where the store says each followed log was read up to (empty without a store)."""
        store = self.store
        return {} if store is None else store.store.log_positions()

    def add_log_positions(self, positions: Sequence[LogPosition]) -> None:
        """Positions reached in followed logs, saved with the steps and events put before."""
        for pos in positions:
            self.read_up_to[os.path.abspath(pos.path)] = int(pos.offset)
        store = self.store
        if store is not None:
            for pos in positions:
                store.put_position(pos)

    def _both(self, what: str, to_window: Callable[[], None] | None,
              to_store: Callable[[], None] | None) -> None:
        problems = []
        for part, write in (("window", to_window), ("run store", to_store)):
            if write is None:
                continue
            try:
                write()
            except Exception as exc:  # noqa: BLE001 - keep the other part; say what broke
                problems.append(f"{what} not written to the {part}: {exc}")
        if problems:
            raise RuntimeError("; ".join(problems))

    def _store(self, method: str, items: Sequence) -> Callable[[], None] | None:
        store = self.store
        if store is None:
            return None
        return lambda: getattr(store, method)(items)

    def add_rows(self, kind: str, rows: Sequence[Row]) -> None:
        """Sample rows of ``kind`` (monitor/telemetry_kinds.py) to the window (the detectors:
        NCCL rows give each step's time in collectives, rollout rows the engine detectors) and
        the store; ``add_gpu(rows)`` and the other per-kind spellings come here."""
        store = self.store
        self._both(KIND[kind].what, lambda: self.window.add_rows(kind, rows),
                   None if store is None else lambda: store.put_rows(kind, rows))

    def add_steps(self, steps: Sequence[StepRecord]) -> None:
        """Steps to the window and the store (a step given again is dropped: see
        ``step_fingerprint``)."""
        steps = self._new_steps(steps)
        if not steps:
            return
        self._both("steps", lambda: self.window.add_steps(steps),
                   self._store("put_steps", steps))

    def add_events(self, events: Sequence[Event]) -> None:
        """Events to the window and the store."""
        self._both("events", lambda: self.window.add_events(events),
                   self._store("put_events", events))


class LiveMonitor(Recorder):
    """The detectors and their outputs on this node; ``open()``, ``start()``, ``stop()``."""

    def __init__(self, options: LiveOptions, node: str, interval: float) -> None:
        super().__init__(RollingWindow(max_age_s=float(options.window)))
        self.options = options
        self.node = node
        self.interval = interval
        self.detect_interval = max(options.effective_detect_interval(), MIN_DETECT_INTERVAL_S)
        self.run_store: RunStore | None = None
        self.tracker: FlagTracker | None = None
        self.notifier: SlackNotifier | None = None
        self.wandb_sink: WandbSink | None = None
        self.detect_config: Config | None = None
        self.detect_errors = 0
        #: exceptions in the detector loop by detector ("detector-loop": the loop itself)
        self.detector_errors: dict[str, int] = {}
        self._error_logged: dict[tuple[str, str], float] = {}
        #: flags the store held open at start, adopted by the tracker
        self.adopted_flags = 0
        self._restored = False
        self.detect_runs = 0
        #: supervised threads that raised and were restarted, by thread name
        self.thread_restarts: dict[str, int] = {}
        self._run_all: Callable[..., list[Flag]] | None = None
        self._stop = threading.Event()
        self._detect_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._integrity_checked = False
        self._last_trim = 0.0
        self._store_error_logged: str | None = None
        self._store_lock: StoreLock | None = None
        self._stopped = False
        self._urgent = 0  # hang_dump events received (the detectors run soon after one)
        self._finished_steps = -1  # steps_added when the run was seen finished
        #: the time base of the detectors and the window (``use_clock``)
        self._clock: Callable[[], float] = time.time
        self._from_wall: Callable[[float], float] | None = None
        #: the job's printed config, for the advice (read from the followed logs' heads)
        self.job_config = JobConfigWatch(
            list(options.log) + ([options.sim_log] if options.sim_log else []))
        #: the exporter's own numbers: each part registers itself (monitor/live/health_registry.py)
        self.health = HealthRegistry()
        self.health.count_restarts(self.restart_counts)
        self.health.register(self.window)
        self.health.register(self)

    # ------------------------------------------------------------------ open and start

    def open(self) -> None:
        """Open the store and load the detectors (and Slack); raises MonitorError."""
        self._open_store()
        self._load_detectors()
        if self.store is not None and self.detect_config is not None:
            # the dashboard on this store reads the ledger under the same --config
            self.store.set_meta("config", dict(self.detect_config))
        if self.store is not None:
            # ... and under the job's printed config, once the followed logs show it
            self.job_config.on_found = self._save_job_config
        self._restore()
        self._register_alert_paths()

    def _save_job_config(self, config: dict) -> None:
        """Keep the job's printed config in the store's meta (``job_config``): the dashboard on
        this store judges the trainer mode from it, as the exporter and ``analyze`` do."""
        store = self.store
        if store is not None:
            store.set_meta(META_KEY, storable(config))

    def view_context(self) -> ViewContext:
        """What the derived views read (after ``open()``): window, tracker, notifier, config,
        and the job's printed config as the monitor finds it (``self.job_config``)."""
        return ViewContext(node=self.node, interval=self.interval, window=self.window,
                           tracker=self.tracker, notifier=self.notifier,
                           config=self.detect_config, options=self.options, sink=self,
                           job_config=self.job_config.config, clock=self.now,
                           wandb=lambda: self.wandb_sink)

    def use_clock(self, clock: Callable[[], float],
                  from_wall: Callable[[float], float] | None = None) -> None:
        """Judge on ``clock`` instead of the wall clock (a simulated run played at another
        speed: its own seconds, the ones its log and samples are stamped with); ``from_wall``
        turns a wall-clock time into that clock's (for what is stamped on the wall clock)."""
        self._clock = clock
        self._from_wall = from_wall
        self.window._clock = clock

    def _register_alert_paths(self) -> None:
        """Slack, wandb and the store writer report on /metrics (monitor/live/alert_paths.py)."""
        from monitor.live.alert_paths import SlackCounters, WandbCounters

        if self.notifier is not None:
            self.health.register(SlackCounters(self.notifier))
        if self.options.wandb:
            self.health.register(WandbCounters(lambda: self.wandb_sink))
        if self.store is not None:
            self.health.register(self.store)

    def start(self) -> None:
        """Start the detector loop, wandb, Slack deliveries and the store flusher."""
        self._spawn("detector-loop", self._detect_loop)
        if self.options.wandb:
            self._spawn("wandb-init", self._start_wandb, supervise=False)
        if self.notifier is not None:
            self.notifier.start(interval_s=NOTIFY_INTERVAL_S)  # its own thread: retries wait
        if self.store is not None:
            self._spawn("store-flusher", self._flush_loop)

    def _open_store(self) -> None:
        path = self.options.store
        if not path:
            return
        from monitor.store import RunStore, StoreError, StoreWriter
        from monitor.store.lock import StoreLock, StoreLocked

        lock = StoreLock(path)
        try:  # one writer per store: a second exporter would double every row
            lock.acquire()
        except StoreLocked as exc:
            raise MonitorError(f"--store {exc}") from None
        except OSError as exc:
            raise MonitorError(f"--store {path}: cannot lock it for writing ({exc.filename}: "
                               f"{exc.strerror or exc})") from None
        self._store_lock = lock
        try:
            self.run_store = RunStore(path)
        except StoreError as exc:
            raise MonitorError(f"--store {exc}") from None
        except OSError as exc:
            raise MonitorError(f"--store {path}: cannot open ({exc.strerror or exc})") from None
        try:
            owner = self.run_store.meta().get("node")
        except Exception:  # noqa: BLE001 - an unreadable meta table shows in the integrity check
            owner = None
        if owner not in (None, "", self.node):
            raise MonitorError(f"--store {path} holds node {owner}'s run (this exporter is node "
                               f"{self.node}); give it another --store, or --node {owner}")
        self.store = StoreWriter(self.run_store)
        self.store.set_meta("node", self.node)

    def _load_detectors(self) -> None:
        from monitor.config import load_config
        from monitor.detect import run_all
        from monitor.live.flag_tracker import FlagTracker

        cfg_path = self.options.config
        try:
            self.detect_config = load_config(cfg_path)
        except FileNotFoundError:
            raise MonitorError(f"--config {cfg_path}: no such file") from None
        except (ValueError, OSError) as exc:
            raise MonitorError(f"--config {exc}") from None
        self._run_all = run_all
        self.tracker = FlagTracker()
        hook = self.options.slack_webhook_file
        if hook:
            try:
                from monitor.notify.slack import SlackNotifier

                # the outbox lives in the run store when there is one (survives restarts)
                self.notifier = SlackNotifier(hook, self.run_store)
            except ImportError:
                from monitor.extras import missing_extra_message

                raise MonitorError(missing_extra_message("--slack-webhook-file", "slack")
                                   ) from None
            except (ValueError, OSError) as exc:
                raise MonitorError(f"--slack-webhook-file {exc}") from None

    def _restore(self) -> None:
        """After a restart: refill the window from the store (the last ``--window`` of steps,
        events and samples, and the run's first steps) so the first detector pass sees what
        the last process saw, and adopt the flags it left open (same flag, same start: Slack
        sees no second "opened"; those the first pass lacks close with CLOSED_AT_RESTART)."""
        store = self.run_store
        if store is None or self.tracker is None:
            return
        try:
            open_flags = store.flags(active_only=True)
            since = time.time() - self.window.max_age_s
            first = store.steps()[: self.window.first_steps_max]
            steps = store.steps(start=since)
            events = store.events(start=since)
            samples = {k.name: store.samples_frame(k.name, start=since) for k in kinds()}
        except Exception as exc:  # noqa: BLE001 - a store it cannot read back: start afresh
            log.warning("run store: could not read back the last run's state (%s); "
                        "starting with an empty window", exc)
            return
        self.window.seed_first_steps(first)
        for step in steps:
            self._recent_fps[step_fingerprint(step)] = None
        if steps:
            self.window.add_steps(steps)
        if events:
            self.window.add_events(events)
        for kind, frame in samples.items():  # every kind: GPU, host, NCCL, rollout engines
            if len(frame):  # the window keeps at most max_rows of each: read no more
                self.window.add_rows(kind, frame.tail(self.window.max_rows).to_dict("records"))
        self.adopted_flags = self.tracker.adopt(open_flags, reason=CLOSED_AT_RESTART)
        self._restored = bool(steps or events or len(samples["gpu"]) or open_flags)
        if self._restored:
            log.info("run store: resumed with %d steps, %d events and %d open flags from "
                     "the last run", len(steps), len(events), self.adopted_flags)

    def _detector_failed(self, detector: str, exc: BaseException) -> None:
        """Count a detector's exception; log it in one line, at most once a minute per reason."""
        self.detector_errors[detector] = self.detector_errors.get(detector, 0) + 1
        reason = f"{exc.__class__.__name__}: {str(exc)[:200]}"
        key = (detector, reason)
        now = time.monotonic()
        last = self._error_logged.get(key)
        if last is None or now - last >= DETECT_ERROR_LOG_S:
            self._error_logged[key] = now
            count = self.detector_errors[detector]
            log.warning("detector %s failed (%s); %d time(s) so far, counted in "
                        "verlmon_detector_errors_total", detector, reason, count)

    def _start_wandb(self) -> None:
        """Open the wandb run off the main path: ``wandb.init`` may wait for its timeout
        before falling back to offline, and metrics must be served meanwhile."""
        target = self.options.wandb
        try:
            from monitor.integrations.wandb_sink import WandbSink

            sink = WandbSink.from_target(target, config=self.detect_config,
                                         job_config=self.job_config.config)
        except Exception as exc:  # noqa: BLE001 - wandb never takes the exporter down
            log.warning("--wandb %s: disabled (%s)", target, exc)
            return
        if self._stopped:
            sink.close()
            return
        self.wandb_sink = sink

    # ------------------------------------------------------------------ loops

    def _spawn(self, name: str, target: Callable[[], object], supervise: bool = True) -> None:
        """Run ``target`` on a daemon thread; supervised, an exception is counted in
        ``thread_restarts`` (``verlmon_exporter_thread_restarts_total``), logged once per
        distinct reason, and the target starts again after a pause, until ``stop()``."""
        body = (lambda: supervised(name, target, self._stop, self.thread_restarts)
                ) if supervise else target
        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def now(self) -> float:
        """The detectors' clock: the time base of every sample and step. The wall clock, or
        the simulated run's own while ``--sim-log`` plays it at another speed (``use_clock``):
        its steps are timed by their arrival on that clock."""
        return self._clock()

    def detect_once(self) -> tuple[list[Flag], list[Flag]]:
        """Run the detectors on the window once; returns (opened, closed) flags."""
        if self._run_all is None or self.tracker is None:
            return [], []
        with self._detect_lock:  # one run at a time: the window read and the update pair up
            now = self.now()
            steps, gpu_df, host_df, events = self.window.frames()
            end = self.run_finished(steps, events)
            ended = end[1] if end else None
            if ended is None and self.tracker.finished and \
                    self.window.steps_added == self._finished_steps:
                ended = self.tracker.finished  # its end aged out of the window: still over
            if ended is not None:  # a finished run: its flags close, nothing new opens
                opened, closed = [], []
                if not self.tracker.finished:
                    # one last judgment of the whole run, as it stood at its end: a flag whose
                    # persistence the last step completed is recorded (opened, then closed),
                    # as analyze finds it; the silence after the end is no part of it
                    at = min(now, end[0]) if end else now
                    opened, closed = self.tracker.update(self._judge(
                        steps, gpu_df[gpu_df["ts"] <= at], host_df[host_df["ts"] <= at],
                        events, at), at)
                    last = max((int(s.step) for s in steps), default=None)
                    closed += self.tracker.finish(at, ended, last)  # closed when it ended
                    self._mark_finished(at, last, ended)
                self._finished_steps = self.window.steps_added
            else:
                if self.tracker.finished:
                    self.tracker.resume()
                    self._mark_finished(None)
                opened, closed = self.tracker.update(
                    self._judge(steps, gpu_df, host_df, events, now), now)
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

    def _mark_finished(self, at: float | None, step: int | None = None,
                       reason: str = "") -> None:
        """Keep in the store's meta (``run_finished``) that the run ended, when, after which
        step and what said so (None again when a new run goes on): every page of the
        dashboard on the store says "finished"."""
        if self.store is not None:
            self.store.set_meta(RUN_FINISHED_META, None if at is None else
                                {"time": at, "step": step, "reason": reason})

    def _judge(self, steps, gpu_df, host_df, events, now: float) -> list[Flag]:
        """Every detector over the window's frames at ``now`` (``run_all``), the advice told
        what the job's printed config has (``tell_job_config``), as ``analyze`` tells it; its
        trainer mode decides where the step keys cannot (``printed_mode``)."""
        job_config = self.job_config.config()
        flags = self._run_all(steps, gpu_df, host_df, events, config=self.detect_config,
                              now=now, reference_steps=self.window.first_steps(),
                              nccl=self.window.nccl(), rollout=self.window.rollout(),
                              on_error=self._detector_failed,
                              printed_mode=printed_mode(job_config),
                              job_config=job_config, actors=self.job_config.actors)
        tell_job_config(flags, job_config)
        return flags

    def run_finished(self, steps: Sequence[StepRecord],
                     events: Sequence[Event]) -> tuple[float, str] | None:
        """When the run ended and why, in words (None while it goes on): verl's last progress
        line or final validation in the log, or the exit marker ``verl-monitor run`` (or the
        simulator) wrote beside a followed log (``monitor.hang.finish``)."""
        from monitor.hang.finish import exit_after_steps, finish_time

        logs = list(self.options.log) + ([self.options.sim_log] if self.options.sim_log else [])
        said = finish_time(events, steps)
        if said is not None:
            return said
        # the job's exit: once what it wrote before exiting has been read (its last steps)
        return exit_after_steps(logs, steps) if self._logs_read(logs) else None

    def _logs_read(self, logs: Sequence[str]) -> bool:
        """Whether every followed log has been read to its end (a log never read counts as
        read: the exit marker alone then speaks)."""
        for path in logs:
            full = os.path.abspath(path)
            if full not in self.read_up_to:
                continue
            try:
                size = os.path.getsize(full)
            except OSError:
                continue
            if self.read_up_to[full] < size:
                return False
        return True

    def add_events(self, events: Sequence[Event]) -> None:
        """Events to the window and the store; a py-spy or Flight Recorder round (``hang_dump``)
        has the detectors run soon (at most once a second), so its flag does not wait for the
        next interval. On a simulated run's clock (``use_clock``) a round, stamped on the wall
        clock by the flight recorder view, is moved onto the run's clock, where its silence is."""
        if self._from_wall is not None:
            events = [replace(e, time=self._from_wall(e.time))
                      if e.kind == "hang_dump" and e.time is not None else e for e in events]
        super().add_events(events)
        if any(e.kind == "hang_dump" for e in events):
            self._urgent += 1

    def _detect_loop(self) -> None:
        """Run the detectors every ``detect_interval`` seconds, and also soon after a new step
        arrives (at most once a second): step-based flags follow the log without the cost of
        running every detector at the sampling rate."""
        last_run = time.monotonic()
        # after a restart with state read back: a first pass soon (adopted flags settle)
        seen_steps = -1 if self._restored else self.window.steps_added
        seen_urgent = self._urgent
        tick = min(1.0, self.detect_interval)
        while not self._stop.wait(tick):
            now = time.monotonic()
            new_steps = self.window.steps_added != seen_steps or self._urgent != seen_urgent
            if now - last_run < self.detect_interval and not (
                    new_steps and now - last_run >= MIN_DETECT_INTERVAL_S):
                continue
            seen_steps = self.window.steps_added
            seen_urgent = self._urgent
            last_run = now
            try:
                self.detect_once()
                if time.monotonic() - self._last_trim >= TRIM_INTERVAL_S:
                    self._last_trim = time.monotonic()
                    trim_heap()
            except Exception as exc:  # noqa: BLE001 - detectors never take the exporter down
                self.detect_errors += 1
                self._detector_failed("detector-loop", exc)

    def _flush_loop(self) -> None:
        """Flush the store every second or so. A failure is logged once per episode (the
        message again only when it changes), and once more when writes work again."""
        store = self.store
        if store is None:
            return
        if not self._integrity_checked:
            self._integrity_checked = True
            if not store.check_integrity():
                log.error("run store: %s", store.integrity_error)
        period = max(1.0, self.interval)
        while not self._stop.wait(period):
            self._flush_and_report(store)

    def _flush_and_report(self, store: StoreWriter) -> bool:
        ok = store.flush()
        error = store.last_error if not ok else None
        if error and error != self._store_error_logged:
            log.warning("run store: %s", error)
        elif ok and self._store_error_logged:
            log.info("run store: writes work again")
        self._store_error_logged = error
        return ok

    def warn_window_coverage(self, gpus: int) -> None:
        """Say so at startup when the window's row cap cannot hold ``--window`` of ``gpus``
        GPUs' rows at this interval (64 GPUs every 0.1 s fill 200,000 rows in 5 minutes)."""
        cap = self.window.max_rows
        if not gpus or not cap:
            return
        covered = cap / (gpus / self.interval)
        if covered < self.window.max_age_s:
            log.warning("the detectors' window holds %d GPU rows: %.1f min of %d GPUs every "
                        "%g s, not --window's %.0f min; older rows are dropped (counted in "
                        "verlmon_window_dropped_rows_total)", cap, covered / 60, gpus,
                        self.interval, self.window.max_age_s / 60)

    # ------------------------------------------------------------------ health and stop

    def restart_counts(self) -> dict[str, int]:
        """Restarts of each of the monitor's threads (those running show 0)."""
        out = {}
        for name in dict.fromkeys(("detector-loop", "store-flusher",
                                   *sorted(self.thread_restarts))):
            if name in self.thread_restarts or any(t.name == name for t in self._threads):
                out[name] = self.thread_restarts.get(name, 0)
        if self.notifier is not None:
            out["slack-sender"] = getattr(self.notifier, "thread_restarts", 0)
        return out

    def collect(self) -> list[Metric]:
        """``verlmon_detector_errors_total{detector}`` (the monitor's own collector)."""
        from prometheus_client.core import CounterMetricFamily

        from monitor import metric_names as m

        errors = CounterMetricFamily(
            m.DETECTOR_ERRORS.removesuffix("_total"),
            "Exceptions in the detector loop, by detector (detector-loop: the loop itself).",
            labels=["detector"])
        for name, count in sorted(self.detector_errors.items()):
            errors.add_metric([name], count)
        return [errors]

    def health_families(self) -> list[Metric]:
        """Every health family registered so far (``self.health``), as a list."""
        return list(self.health.collect())

    def _finish_if_ended(self) -> None:
        """At stop: a run that ended since the last detector run (``verl-monitor run`` writes
        the job's exit beside the log, then stops its exporter) is recorded as finished, its
        flags closed, before the store closes: the dashboard on the store then says so."""
        if self.tracker is None or self.tracker.finished or self._run_all is None:
            return
        steps, _, _, events = self.window.frames()
        if not steps or self.run_finished(steps, events) is None:
            return
        try:
            self.detect_once()
        except Exception as exc:  # noqa: BLE001 - stopping must go on
            log.warning("the run's end was not recorded: %s", exc)

    def stop(self) -> None:
        """Stop detecting and delivering; flush and close the store. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self._finish_if_ended()
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
        for thread in self._threads:
            thread.join(timeout=5.0)
        if self.store is not None:
            # a volume gone read-only or full at stop: one line with the rows lost, exit 0
            lost = None if self.store.flush() else self.store.drop_unwritten()
            if lost:
                log.warning("run store: %s", lost)
            earlier = {k: v for k, v in self.store.dropped.items()
                       if v and k != "unwritten_at_stop"}
            if earlier:
                log.warning("run store: %s rows were dropped (%s)", sum(earlier.values()),
                            ", ".join(f"{k} {v}" for k, v in earlier.items()))
        if self.run_store is not None:
            self.run_store.close()
        if self._store_lock is not None:
            self._store_lock.release()
