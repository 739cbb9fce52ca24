"""Flags collector: the detectors' open flags and how many were raised, per kind and severity.

The exporter's detector loop (exporters/app.py) keeps a ``FlagTracker`` in
``ctx.extra["flag_tracker"]``; this collector only reads it. ``scope`` is the flag's bounded
scope label (``node=n0 gpus=3 phase=gen``), so an open flag is one series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.registry import BaseCollector, ExporterContext, register
from monitor import metric_names as m

TRACKER_KEY = "flag_tracker"


def _raised_items(counts: Any) -> Iterable[tuple[str, str, float]]:
    """(kind, severity, count) from ``raised_counts()``: {(kind, sev): n} or {kind: {sev: n}}."""
    if not isinstance(counts, Mapping):
        return
    for key, value in counts.items():
        if isinstance(key, tuple) and len(key) == 2:
            yield str(key[0]), str(key[1]), float(value)
        elif isinstance(value, Mapping):
            for sev, n in value.items():
                yield str(key), str(sev), float(n)


@register("flags", default=True, help="detector flags: open flags by kind, severity and scope, "
          "and flags raised so far")
class FlagsCollector(BaseCollector):
    """Exports the tracker's state at scrape time (the detector loop does the work)."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)

    def collect(self) -> Iterable[Metric]:
        """``verlmon_flag_active`` for open flags, ``verlmon_flags_raised_total`` counters."""
        tracker = self.ctx.extra.get(TRACKER_KEY)
        if tracker is None:
            return
        active = GaugeMetricFamily(m.FLAG_ACTIVE, "1 while a detector flag is open.",
                                   labels=["kind", "severity", "scope"])
        seen = set()
        for flag in tracker.active():
            labels = (flag.kind, flag.severity, flag.scope_label)
            if labels in seen:
                continue
            seen.add(labels)
            active.add_metric(list(labels), 1.0)
        yield active
        raised = CounterMetricFamily(m.FLAGS_RAISED.removesuffix("_total"),
                                     "Detector flags opened since the exporter started.",
                                     labels=["kind", "severity"])
        for kind, severity, count in sorted(_raised_items(tracker.raised_counts())):
            raised.add_metric([kind, severity], count)
        yield raised
