"""Flags collector: the detectors' open flags, their evidence and advice, and counts raised.

The monitor's detector loop (monitor/live/live_monitor.py) keeps a ``FlagTracker`` in
``ctx.tracker``; this collector only reads it. Series:

- ``verlmon_flag_active{kind, severity, node, gpu, phase}``: 1 per open flag. The scope is in
  separate labels (``gpu`` is the GPU index, or indices joined by commas; empty labels are
  left out by Prometheus); ``node`` is the flag's node, this exporter's when the flag names none.
- ``verlmon_flag_info{...same labels..., evidence, advice}``: 1 per open flag, carrying its
  whole evidence (one line) and its whole advice (one line per piece, in order), so every
  reader of Prometheus (the dashboard, Grafana, the alert rules' Slack text through
  Alertmanager) shows the same words as the store and the monitor's own Slack post. These two
  labels are exempt from the exposition's 128-character cap (``TEXT_LABELS`` in
  exporters/exposition.py); only a text over ``TEXT_MAX`` characters (a runaway log quote) is
  cut, at a word, with "…", never with a digest.
- ``verlmon_flags_raised_total{kind, severity}``: every kind and severity at 0 from the start,
  so ``increase()`` counts the first flag too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from monitor import metric_names as m
from monitor.live.live_view import LiveView, ViewContext
from monitor.records import FLAG_KINDS, SEVERITIES, Flag

#: Scope labels of the flag series, in order.
SCOPE_LABELS: tuple[str, ...] = ("node", "gpu", "phase")
#: Longest evidence or advice text carried by ``verlmon_flag_info`` (characters): far above
#: any detector's text (the longest is ~600), so a flag's words arrive whole.
TEXT_MAX = 4000


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


def scope_labels(flag: Flag, default_node: str) -> tuple[str, str, str]:
    """(node, gpu, phase) label values of a flag: GPUs joined by commas, "" where absent."""
    scope = flag.scope or {}
    gpus = scope.get("gpus")
    if isinstance(gpus, (list, tuple)):
        gpu = ",".join(str(g) for g in gpus)
    else:
        gpu = "" if gpus is None else str(gpus)
    return str(scope.get("node") or default_node), gpu, str(scope.get("phase") or "")


def advice_text(advice: Iterable[str], limit: int = TEXT_MAX) -> str:
    """A flag's advice as one label value: each piece on one line, pieces joined by newlines
    (monitor/sources/prometheus.py splits it back)."""
    return short_text("\n".join(" ".join(str(a or "").split()) for a in advice if a), limit,
                      keep_lines=True)


def short_text(text: str, limit: int = TEXT_MAX, keep_lines: bool = False) -> str:
    """``text`` on one line (``keep_lines``: its lines kept, each on one line), cut at a word
    boundary to at most ``limit`` characters."""
    lines = str(text or "").split("\n") if keep_lines else [str(text or "")]
    flat = "\n".join(" ".join(line.split()) for line in lines)
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return head.rstrip(" ,;:") + "…"


class FlagsCollector(LiveView):
    """Exports the tracker's state at scrape time (the detector loop does the work)."""

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)

    def collect(self) -> Iterable[Metric]:
        """``verlmon_flag_active`` and ``verlmon_flag_info`` for open flags, and the
        ``verlmon_flags_raised_total`` counters (every kind and severity)."""
        tracker = self.ctx.tracker
        if tracker is None:
            return
        labels = ["kind", "severity", *SCOPE_LABELS]
        active = GaugeMetricFamily(m.FLAG_ACTIVE, "1 while a detector flag is open.",
                                   labels=labels)
        info = GaugeMetricFamily(m.FLAG_INFO, "Whole evidence and advice (a line per piece) "
                                 "of each open detector flag (always 1).",
                                 labels=[*labels, "evidence", "advice"])
        seen = set()
        for flag in tracker.active():
            values = (flag.kind, flag.severity, *scope_labels(flag, self.ctx.node))
            if values in seen:
                continue
            seen.add(values)
            active.add_metric(list(values), 1.0)
            info.add_metric([*values, short_text(flag.evidence), advice_text(flag.advice)],
                            1.0)
        yield active
        yield info
        done = tracker.finished is not None and tracker.finished_at is not None
        yield GaugeMetricFamily(m.RUN_FINISHED, "1 once the followed run has ended (verl's last "
                                "progress line, its final validation, or the job's exit), 0 "
                                "while it goes on: a finished run pages no one.",
                                value=1.0 if done else 0.0)
        if done:
            yield GaugeMetricFamily(m.RUN_END_TS, "When the finished run ended (unix seconds; "
                                    "its last step is verlmon_training_step).",
                                    value=float(tracker.finished_at))
        raised = CounterMetricFamily(m.FLAGS_RAISED.removesuffix("_total"),
                                     "Detector flags opened since the exporter started "
                                     "(every kind and severity, 0 until one opens).",
                                     labels=["kind", "severity"])
        counts = {(kind, sev): 0.0 for kind in FLAG_KINDS for sev in SEVERITIES}
        for kind, severity, count in _raised_items(tracker.raised_counts()):
            counts[(kind, severity)] = count
        for (kind, severity), count in sorted(counts.items()):
            raised.add_metric([kind, severity], count)
        yield raised
