"""Metric sources for the dashboards: the local run store or a Prometheus server."""

from __future__ import annotations

from dashboards.sources.base import (
    NCCL_COLUMNS,
    NODE_SUMMARY_COLUMNS,
    MetricSource,
    SourceError,
    SourceStatus,
    steps_to_frame,
)


def open_source(
    store: str | None = None, prometheus: str | None = None, job: str | None = None
) -> MetricSource:
    """The source the options name: Prometheus when a URL is given, else the run store."""
    if prometheus:
        from dashboards.sources.prometheus import PrometheusSource

        return PrometheusSource(prometheus, job=job)
    if not store:
        raise SourceError("no source: give a run store path or a Prometheus URL")
    from dashboards.sources.store import StoreSource

    return StoreSource(store)


__all__ = [
    "NCCL_COLUMNS",
    "NODE_SUMMARY_COLUMNS",
    "MetricSource",
    "SourceError",
    "SourceStatus",
    "open_source",
    "steps_to_frame",
]
