"""Derived views: numbers the live monitor computes from what the collectors published.

A view reads the monitor's window, flag tracker or notifier (never a source outside the
process) and answers ``collect()`` with metric families, as a prometheus_client custom
collector does. The exporter lists the views beside its collectors (``VIEWS`` in
monitor/live/__init__.py) and serves them on /metrics; a view runs without the exporter too
(tests, ``bench/``).

:class:`ViewContext` is what a view is given: the node, the sampling interval, the parts of
the monitor it reads and the monitor's options (never the exporter's context). :class:`PollingView` is a
view that looks for new work every ``poll_s`` seconds on its own thread (goodput, per-phase GPU
time) or hang dumps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from monitor.live.live_options import LiveOptions
from monitor.live.sink import NullSink

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from monitor.config import Config
    from monitor.live.flag_tracker import FlagTracker
    from monitor.live.rolling_window import RollingWindow
    from monitor.notify.slack import SlackNotifier

log = logging.getLogger("verl_monitor.exporter")

#: Shortest poll interval of a PollingView (seconds).
MIN_POLL_S = 1.0


class FlagGroup(Protocol):
    """Where a collector or a view declares its command-line flags: an argparse argument
    group (or parser); ``verl-monitor exporter`` gives each its own, titled by its name."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        """argparse's ``add_argument``."""
        ...


#: What a collector or a view passes as ``flags=``: adds its own flags to the group given.
AddFlags = Callable[[FlagGroup], None]
#: The job's printed config, as the live monitor has found it so far (None: not yet, or none).
JobConfigSource = Callable[[], Mapping[str, Any] | None]


def no_job_config() -> Mapping[str, Any] | None:
    """The :data:`JobConfigSource` of a view outside the live monitor: no printed config."""
    return None


@dataclass
class ViewContext:
    """What a view reads: its node and interval, the monitor's parts, the monitor's options.

    The live monitor gives its own (``LiveMonitor.view_context()``); ``sink`` is where a view
    that publishes (hang dumps' ``hang_dump`` events) sends them; ``job_config`` gives the
    job's printed config once the monitor found it (its ``JobConfigWatch.config``), so a view
    that builds a ``RunAnalysis`` (goodput) judges the trainer mode as the detectors and
    ``analyze`` do. ``clock`` is the monitor's (``LiveMonitor.now``: the wall clock, or a
    simulated run's own)."""

    node: str
    interval: float
    window: RollingWindow | None = None
    tracker: FlagTracker | None = None
    notifier: SlackNotifier | None = None
    config: Config | None = None
    options: LiveOptions = field(default_factory=LiveOptions)
    sink: Any = field(default_factory=NullSink)
    job_config: JobConfigSource = no_job_config
    clock: Callable[[], float] = time.time
    #: the wandb sink once open (None: off, or not yet): the attempt ledger logs there
    wandb: Callable[[], Any] = lambda: None


class LiveView:
    """Base of a derived view: override ``collect``; ``start``/``stop`` for a thread."""

    name: ClassVar[str] = "view"

    def __init__(self, ctx: ViewContext) -> None:
        self.ctx = ctx
        self.last_error: str | None = None

    def start(self) -> None:
        """Start background work (optional)."""

    def stop(self) -> None:
        """Stop background work (optional)."""

    def collect(self) -> Iterable[Metric]:
        """Fresh metric families; must be fast and never block."""
        return ()

    def healthy(self) -> bool:
        """False when the last round failed (reported as collector_success 0)."""
        return self.last_error is None


class PollingView(LiveView):
    """A view that looks for new work every ``poll_s`` seconds on its thread.

    An exception from :meth:`poll_once` never ends the thread: it is kept in ``last_error``
    (``collector_success 0``) and logged once per message; a poll that works clears it.
    """

    #: the thread's name
    thread_name: ClassVar[str] = "poller"

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)
        self.poll_s = max(float(ctx.interval), MIN_POLL_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged_error: str | None = None

    def poll_once(self) -> None:
        """Do one round of work (override)."""

    def error_text(self, exc: Exception) -> str:
        """The words for a failed poll (override for errors that already say it all)."""
        return f"{type(exc).__name__}: {exc}"

    def start(self) -> None:
        """Start the thread that calls :meth:`poll_once` every ``poll_s`` seconds."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits up to a few seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - a bad round must not end the thread
                self.last_error = self.error_text(exc)
                if self._logged_error != self.last_error:
                    log.warning("%s: %s", self.name, self.last_error)
                    self._logged_error = self.last_error
                continue
            self.last_error = None
            self._logged_error = None


class ViewSpec:
    """A view as the exporter lists it: name, class, on by default, help text, and the
    command-line flags it declares (``flags``: see :data:`AddFlags`; None: none of its own)."""

    def __init__(self, name: str, factory: type[LiveView], help_text: str,
                 default: bool = True, flags: AddFlags | None = None) -> None:
        self.name = name
        self.factory = factory
        self.help = help_text
        self.default = default
        self.flags = flags
        factory.name = name
