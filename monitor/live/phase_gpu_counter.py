"""Per-phase GPU activity counters on every node (see monitor/live/phase_timeline.py).

Steps come from this node's own verl log (the driver) or, with ``--phase-source URL``, from the
driver's exporter. After each new step the collector labels this node's GPU samples of that
step (from the rolling window) with its phases and adds them to the ``verlmon_phase_gpu_*``
counters. A node with neither exports nothing here and is reported healthy.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

from monitor.live.live_view import FlagGroup, PollingView, ViewContext
from monitor.live.phase_timeline import (
    PhaseGpuTotals,
    PhaseSource,
    PhaseSourceError,
    families,
)
from monitor.records import StepRecord


def add_flags(group: FlagGroup) -> None:
    """This view's flag: the driver's exporter to read the phases from."""
    group.add_argument(
        "--phase-source", metavar="URL",
        help="the driver's exporter /metrics (e.g. http://node0:9048/metrics): on a node "
        "without the verl log, its last step's phases label this node's GPU samples "
        "(verlmon_phase_gpu_* counters); http://USER:PASS@HOST... is sent as basic "
        "authentication and shown nowhere")


class PhaseGpuCollector(PollingView):
    """Adds each new step's per-phase GPU activity to counters, in a background thread."""

    thread_name = "phase-gpu"

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)
        self.source = ctx.options.phase_source
        self._source = PhaseSource(self.source) if self.source else None
        self.totals = PhaseGpuTotals()
        self._done: set[tuple[int, float]] = set()
        self._last_steps_added = -1

    def poll_once(self) -> None:
        """Attribute the new steps."""
        self.poll()

    def error_text(self, exc: Exception) -> str:
        """A phase source's error says it all in words; others get their type."""
        return str(exc) if isinstance(exc, PhaseSourceError) else super().error_text(exc)

    def poll(self) -> int:
        """Attribute every step not done yet; returns how many steps were added."""
        window = self.ctx.window
        if window is None:
            return 0
        new: list[StepRecord] = []
        if self._source is not None:
            rec = self._source.fetch()
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
