"""Goodput collector: every GPU-second of the run, by cause, as a live counter.

After each new step line (read from ``ctx.window``, the monitor's window, which the verl log
collector's steps reach through the sink) the collector runs the goodput ledger
(monitor/analysis/goodput.py, docs/goodput.md) on that step and the steps just before it, with
this node's GPU samples from the window, and adds the new step's seconds to
``verlmon_gpu_seconds_total{cause, node, gpu}``. The ledger runs under the monitor's config and
the job's printed config (``ViewContext.job_config``): on verl 0.9's V1 separate-async trainer,
whose step keys read as sync, its ``gen`` is then the trainer waiting for samples, as
``analyze`` books it. Every cause of every GPU seen is exported from
0, so ``increase()`` counts the first seconds too, and
``sum(rate(...{cause="productive"})) / sum(rate(...))`` is the job's goodput.

A step is counted once the GPU samples reach its end (or ``WAIT_S`` after it arrived, its
unsampled seconds then ``unattributed``). A node that follows no verl log exports nothing here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from monitor import metric_names as m
from monitor.analysis.goodput import CAUSES, distinct_steps
from monitor.analysis.run_analysis import RunAnalysis, config_of
from monitor.live.live_view import PollingView, ViewContext

if TYPE_CHECKING:
    from monitor.config import Config

#: The counter (documented in docs/metrics.md, summed by the recording rules).
GPU_SECONDS = m.GPU_SECONDS
#: Steps before the new ones given to the ledger: the previous line starts the wall interval,
#: and the run's own activity reference (``goodput.reference_sm: 0``) needs a few steps.
CONTEXT_STEPS = 20
#: Seconds after a step's end to wait for GPU samples before counting it anyway.
WAIT_S = 30.0


class GoodputTotals:
    """The running sums: seconds per (node, gpu, cause), and the steps already counted."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, int, str], float] = {}
        self.done: set[tuple[int, float]] = set()
        #: steps counted, per node (``verlmon_goodput_steps_total``): the dashboard on
        #: Prometheus finds where its last N steps begin by it
        self.steps: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, node: str, gpu: int, cause: str, value: float) -> None:
        """Add ``value`` seconds (negative or non-finite values are ignored)."""
        if not value > 0 or value == float("inf"):
            return
        with self._lock:
            key = (node, gpu, cause)
            self.seconds[key] = self.seconds.get(key, 0.0) + float(value)

    def touch(self, node: str, gpu: int) -> None:
        """Make every cause of this GPU exist (at 0 until it gets seconds)."""
        with self._lock:
            for cause in CAUSES:
                self.seconds.setdefault((node, gpu, cause), 0.0)

    def snapshot(self) -> dict[tuple[str, int, str], float]:
        """A copy of the sums."""
        with self._lock:
            return dict(self.seconds)


def count_new_steps(totals: GoodputTotals, steps: list, gpu, events: list, *,
                    now: float, config: Config | None = None,
                    flags: list | None = None,
                    job_config: Mapping[str, Any] | None = None,
                    keep: Callable[[list[dict]], None] | None = None) -> int:
    """Run the ledger on the steps not counted yet and add their seconds; returns how many.

    ``config`` is the whole ``Config`` the monitor loaded (``--config``; None: the packaged
    defaults), ``flags`` the open flags (a ``rollout_long_tail`` flag books its steps' gen
    loss as the tail, as ``analyze`` does), ``job_config`` the job's printed config (its
    trainer mode decides where the step keys cannot, as in ``analyze``), ``keep`` is given
    the ledger rows counted (the run store keeps them: the dashboard on it reads the numbers
    the counter has). Pure apart from ``totals`` and ``keep``: the exporter's thread calls it
    with the window's frames.
    """
    timed = sorted((s for s in steps if s.end_time is not None and s.total is not None),
                   key=lambda s: float(s.end_time))
    if not timed or gpu is None or len(gpu) == 0:
        return 0
    kept = {id(s) for s in distinct_steps(timed, events)}
    # a second line of a step seen already (another exporter's, a reprint) is never counted
    totals.done |= {(s.step, float(s.end_time)) for s in timed if id(s) not in kept}
    timed = [s for s in timed if id(s) in kept]
    last_sample = float(gpu["ts"].max())
    ready = [s for s in timed if (s.step, float(s.end_time)) not in totals.done
             and (last_sample >= float(s.end_time) or now - float(s.end_time) >= WAIT_S)]
    if not ready:
        return 0
    first = timed.index(ready[0])
    upto = timed.index(ready[-1])
    window = timed[max(0, first - CONTEXT_STEPS):upto + 1]
    lo = float(window[0].end_time) - float(window[0].total) - 1.0
    gpu = gpu[gpu["ts"] >= lo]
    led = RunAnalysis(window, gpu, events=events, config=config,
                      flags=list(flags or []), job_config=job_config).ledger()
    want = {(s.step, float(s.end_time)) for s in ready}
    counted = led[[(int(s), float(e)) in want for s, e in zip(led["step"], led["end"],
                                                                strict=True)]]
    for row in counted.itertuples(index=False):
        node, g = str(row.node), int(row.gpu)
        totals.touch(node, g)
        for cause in CAUSES:
            totals.add(node, g, cause, float(getattr(row, cause)))
    for node in set(counted["node"].astype(str)):
        totals.steps[node] = totals.steps.get(node, 0) + len(want)
    if keep is not None and len(counted):
        keep(counted.to_dict("records"))
    totals.done |= want
    if len(totals.done) > 10_000:  # bounded: keep the newest
        totals.done = set(sorted(totals.done, key=lambda k: k[1])[-1000:])
    return len(want)


class GoodputCollector(PollingView):
    """Adds each new step's ledger to the counters, in a background thread."""

    thread_name = "goodput"

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)
        self.totals = GoodputTotals()
        #: the monitor's config (``--config`` over the defaults): the same as analyze's
        self.config = config_of(ctx.config)
        self._last_steps_added = -1
        self._pending = False
        self.digest_s = float(ctx.options.slack_digest_hours or 0.0) * 3600.0
        self._digest_at: float | None = None  # when the current digest period started
        self._digest_base: dict[str, float] = {}

    def maybe_digest(self, now: float) -> str | None:
        """Every ``--slack-digest-hours``: queue the period's goodput digest to Slack; returns
        the text queued (None when off, not due, or there was no GPU time)."""
        notifier = self.ctx.notifier
        if self.digest_s <= 0 or notifier is None:
            return None
        from monitor.notify.digest import by_cause, digest_message, digest_text, growth

        if self._digest_at is None:
            self._digest_at, self._digest_base = now, by_cause(self.totals.snapshot())
            return None
        if now - self._digest_at < self.digest_s:
            return None
        current = by_cause(self.totals.snapshot())
        text = digest_text(growth(self._digest_base, current), self.digest_s / 3600.0)
        key = f"{self.ctx.node}|{int(now)}"
        self._digest_at, self._digest_base = now, current
        if text is None:
            return None
        notifier.notify_digest(digest_message(text, run=getattr(notifier, "run", None)), key)
        return text

    def poll_once(self) -> None:
        """Count the steps that are ready, then queue the digest when it is due."""
        self.poll()
        self.maybe_digest(self.ctx.clock())

    def poll(self, now: float | None = None) -> int:
        """Count the steps that are ready; returns how many were added."""
        window = self.ctx.window
        if window is None:
            return 0
        added = window.steps_added
        if added == self._last_steps_added and not self._pending:
            return 0
        self._last_steps_added = added
        steps, gpu, _, events = window.frames()
        tracker = self.ctx.tracker
        flags = list(tracker.active()) if tracker is not None else []
        n = count_new_steps(self.totals, steps, gpu, events,
                            now=self.ctx.clock() if now is None else now, config=self.config,
                            flags=flags, job_config=self.ctx.job_config(),
                            keep=getattr(self.ctx.sink, "add_ledger", None))
        waiting = [s for s in steps if s.end_time is not None and s.total is not None
                   and (s.step, float(s.end_time)) not in self.totals.done]
        self._pending = bool(waiting)
        return n

    def collect(self) -> Iterable[Metric]:
        """``verlmon_gpu_seconds_total{cause, node, gpu}`` (none before the first step) and
        ``verlmon_goodput_steps_total{node}`` (0 from the start, so the first steps counted
        show as an increase)."""
        snap = self.totals.snapshot()
        steps = CounterMetricFamily(
            m.GOODPUT_STEPS.removesuffix("_total"),
            "Steps whose GPU-seconds verlmon_gpu_seconds_total has counted: the increase of "
            "both over the same range is the ledger of those steps.", labels=["node"])
        for node, count in sorted({self.ctx.node: 0, **self.totals.steps}.items()):
            steps.add_metric([node], float(count))
        yield steps
        if not snap:
            return
        fam = CounterMetricFamily(
            GPU_SECONDS.removesuffix("_total"),
            "GPU-seconds of the run by cause: productive, or the cause of their loss "
            "(docs/goodput.md); the causes of a GPU add up to its wall time.",
            labels=["cause", "node", "gpu"])
        for (node, g, cause), value in sorted(snap.items()):
            fam.add_metric([cause, node, str(g)], value)
        yield fam
