"""Per-phase GPU activity counters on every node (see exporters/phase_timeline.py).

Steps come from this node's own verl log (the driver) or, with ``--phase-source URL``, from the
driver's exporter. After each new step the collector labels this node's GPU samples of that
step (from the rolling window) with its phases and adds them to the ``verlmon_phase_gpu_*``
counters. A node with neither exports nothing here and is reported healthy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

from exporters.phase_timeline import (
    MIN_POLL_S,
    PhaseGpuTotals,
    PhaseSourceError,
    families,
    fetch_step,
)
from exporters.registry import BaseCollector, ExporterContext, register
from monitor.records import StepRecord

log = logging.getLogger("verl_monitor.exporter")


@register("phase_gpu", default=True,
          help="per-phase GPU activity counters: the driver's phase timeline (own log, or "
          "--phase-source) joined with this node's GPU samples")
class PhaseGpuCollector(BaseCollector):
    """Adds each new step's per-phase GPU activity to counters, in a background thread."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        self.source = getattr(ctx.options, "phase_source", None) if ctx.options else None
        self.totals = PhaseGpuTotals()
        self.poll_s = max(float(ctx.interval), MIN_POLL_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done: set[tuple[int, float]] = set()
        self._last_steps_added = -1
        self._logged_error: str | None = None

    def start(self) -> None:
        """Start the thread that looks for new steps every ``poll_s`` seconds."""
        self._thread = threading.Thread(target=self._loop, name="phase-gpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        # wait one poll first: the step's last GPU samples are still arriving when it ends
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
                self.last_error = None
                self._logged_error = None
            except PhaseSourceError as exc:
                self.last_error = str(exc)
                if self._logged_error != self.last_error:
                    log.warning("phase_gpu: %s", exc)
                    self._logged_error = self.last_error
            except Exception as exc:  # noqa: BLE001 - a bad step must not end the thread
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self._logged_error != self.last_error:
                    log.warning("phase_gpu: %s", self.last_error)
                    self._logged_error = self.last_error

    def poll(self) -> int:
        """Attribute every step not done yet; returns how many steps were added."""
        window = self.ctx.window
        new: list[StepRecord] = []
        if self.source:
            rec = fetch_step(self.source)
            if rec is not None and rec.end_time is not None:
                new = [rec]
        elif window.steps_added != self._last_steps_added:
            self._last_steps_added = window.steps_added
            steps, _, _, _ = window.frames()
            new = [s for s in steps if s.end_time is not None and s.phases]
        new = [s for s in new if (s.step, float(s.end_time)) not in self._done]
        if not new:
            return 0
        _, gpu, _, _ = window.frames()
        for rec in new:
            self.totals.add_step(rec, gpu)
            self._done.add((rec.step, float(rec.end_time)))
        if len(self._done) > 10_000:  # bounded: keep the newest
            self._done = set(sorted(self._done, key=lambda k: k[1])[-1000:])
        return len(new)

    def collect(self) -> Iterable[Metric]:
        """The counters (none before the first attributed step)."""
        yield from families(self.totals)
