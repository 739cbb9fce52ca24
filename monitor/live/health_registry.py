"""The exporter's own numbers, gathered the way prometheus_client's ``CollectorRegistry`` does.

Whatever has numbers about itself (the rolling window, the detector loop, the store writer,
Slack, wandb, the metrics server, the log follower) answers ``collect()`` with its families
and registers itself here once; a scrape asks each in turn. The one family with several owners,
``verlmon_exporter_thread_restarts_total{thread}``, is built here from each owner's counts
(:meth:`HealthRegistry.count_restarts`), so every thread is listed once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Protocol

from monitor import metric_names as m

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


def labelled_counter(name: str, doc: str, label: str,
                     counts: Iterable[tuple[str, float]]) -> Metric:
    """A counter family of one label: ``name`` (ending in ``_total``) with one sample per
    (label value, count) in ``counts``, in their order."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name.removesuffix("_total"), doc, labels=[label])
    for value, count in counts:
        family.add_metric([value], count)
    return family


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
        yield labelled_counter(
            m.THREAD_RESTARTS,
            "Exporter threads restarted after an exception (each logged with its reason).",
            "thread", chain.from_iterable(read().items() for read in self._restarts))
        for part in list(self._parts):
            yield from part.collect()
