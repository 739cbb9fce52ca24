"""The exporter's own numbers, gathered the way prometheus_client's ``CollectorRegistry`` does.

Whatever has numbers about itself (the rolling window, the detector loop, the store writer,
Slack, wandb, the metrics server, the log follower) answers ``collect()`` with its families
and registers itself here once; a scrape asks each in turn. The one family with several owners,
``verlmon_exporter_thread_restarts_total{thread}``, is built here from each owner's counts
(:meth:`HealthRegistry.count_restarts`), so every thread is listed once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from monitor import metric_names as m

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class Collects(Protocol):
    """Anything that answers ``collect()`` with metric families (a custom collector)."""

    def collect(self) -> Iterable[Metric]:
        """Fresh families; fast, never blocking."""
        ...


class HealthRegistry:
    """The parts that report on themselves, in the order they registered."""

    def __init__(self) -> None:
        self._parts: list[Collects] = []
        self._restarts: list[Callable[[], Mapping[str, int]]] = []

    def register(self, part: Collects) -> None:
        """Ask ``part`` for its families at every scrape (a part registered twice: once)."""
        if not any(p is part for p in self._parts):
            self._parts.append(part)

    def count_restarts(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Add ``read()`` (thread name to restarts) to the thread-restarts family."""
        self._restarts.append(read)

    def collect(self) -> Iterator[Metric]:
        """The thread restarts, then every registered part's families."""
        from prometheus_client.core import CounterMetricFamily

        restarts = CounterMetricFamily(
            m.THREAD_RESTARTS.removesuffix("_total"),
            "Exporter threads restarted after an exception (each logged with its reason).",
            labels=["thread"])
        for read in self._restarts:
            for name, count in read().items():
                restarts.add_metric([name], count)
        yield restarts
        for part in list(self._parts):
            yield from part.collect()
