"""The alert paths' counters on /metrics: every Slack message delivered, failed, waiting or
dropped, and every wandb alert sent, failed or dropped.

A revoked webhook (HTTP 404) must show on the exporter's own /metrics, not only in a log no one
reads: ``verlmon_slack_failed_attempts_total{reason}`` grows and
``verlmon_slack_pending_messages`` climbs (docs/runbooks.md#slack-delivery-failing). Every value
is read from the notifier's and the sink's counters in memory: a scrape never touches the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


def slack_families(notifier: Any) -> list[Metric]:
    """The Slack notifier's families: messages finished by outcome, failed attempts by reason,
    messages waiting, messages dropped at the in-memory outbox's bound."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from monitor import metric_names as m
    from monitor.notify.slack import FAILURE_REASONS

    messages = CounterMetricFamily(
        m.SLACK_MESSAGES.removesuffix("_total"),
        "Slack messages finished: sent, unknown (no answer after sending; not retried), "
        "skipped (resolved whose opened never went).", labels=["outcome"])
    for outcome, count in sorted(notifier.outcomes.items()):
        messages.add_metric([outcome], count)
    failed = CounterMetricFamily(
        m.SLACK_FAILED.removesuffix("_total"),
        "Failed Slack deliveries by reason: rejected (4xx, e.g. a revoked webhook), "
        "rate_limited (429), server_error (5xx), unreachable; the message stays queued.",
        labels=["reason"])
    failures = dict(notifier.failures)
    for reason in dict.fromkeys((*FAILURE_REASONS, *sorted(failures))):
        failed.add_metric([reason], failures.get(reason, 0))
    pending = GaugeMetricFamily(
        m.SLACK_PENDING, "Messages waiting in the Slack outbox (as of the last delivery round).",
        value=notifier.pending_seen)
    dropped = CounterMetricFamily(
        m.SLACK_DROPPED.removesuffix("_total"),
        "Slack messages the in-memory outbox dropped at its bound.", value=notifier.dropped)
    return [messages, failed, pending, dropped]


def wandb_families(sink: Any) -> list[Metric]:
    """``verlmon_wandb_alerts_total{outcome}``: sent, failed, dropped (all 0 while the wandb
    run is still starting, ``sink`` None)."""
    from prometheus_client.core import CounterMetricFamily

    from monitor import metric_names as m

    alerts = CounterMetricFamily(
        m.WANDB_ALERTS.removesuffix("_total"),
        "wandb run.alert calls: sent, failed (the call raised), dropped (the sink was off).",
        labels=["outcome"])
    counts = dict(getattr(sink, "alerts", None) or {})
    for outcome in dict.fromkeys(("sent", "failed", "dropped", *sorted(counts))):
        alerts.add_metric([outcome], counts.get(outcome, 0))
    return [alerts]


class SlackCounters:
    """The Slack notifier's families as a collector (registered by the live monitor)."""

    def __init__(self, notifier: Any) -> None:
        self.notifier = notifier

    def collect(self) -> list[Metric]:
        """See :func:`slack_families`."""
        return slack_families(self.notifier)


class WandbCounters:
    """``verlmon_wandb_alerts_total`` as a collector; ``sink()`` is the wandb sink now (None
    while the run is still starting)."""

    def __init__(self, sink: Callable[[], Any]) -> None:
        self.sink = sink

    def collect(self) -> list[Metric]:
        """See :func:`wandb_families`."""
        return wandb_families(self.sink())
