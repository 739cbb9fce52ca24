"""The seam between the exporter and the monitor: the :class:`Sink` protocol.

Collectors (the exporter side) publish what they read through one ``Sink``: GPU and host
sample rows, verl steps and events, NCCL rows. The monitor side (monitor/live/live_monitor.py:
the rolling window the detectors read, the run-store writer) implements it; the collectors
never see which parts are behind it. :class:`NullSink` drops everything (a bare exporter,
and collectors under test that only export).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from monitor.records import Event, StepRecord

#: One sample row: column name to value (``ts``, ``node``, ``gpu``, ``sm_active``, ...).
Row = Mapping[str, Any]


@runtime_checkable
class Sink(Protocol):
    """Where collectors publish; each method may raise (the collector reports it in words)."""

    def add_gpu(self, rows: Sequence[Row]) -> None:
        """One sample of every GPU (rows as in ``exporters.collectors.gpu.reading_to_row``)."""

    def add_host(self, rows: Sequence[Row]) -> None:
        """Host rows: CPU busiest core and mean, iowait, disk reads."""

    def add_steps(self, steps: Sequence[StepRecord]) -> None:
        """Steps parsed from the verl log, oldest first."""

    def add_events(self, events: Sequence[Event]) -> None:
        """Events from the verl log (restarts, OOMs, truncations, ...)."""

    def add_nccl(self, rows: Sequence[Row]) -> None:
        """Growth of the NCCL Inspector totals per (collective, communicator) since last time."""

    def add_rollout(self, rows: Sequence[Row]) -> None:
        """One scrape of each rollout engine (``monitor.frames.ROLLOUT_COLUMNS``)."""


class NullSink:
    """A sink that keeps nothing."""

    def add_gpu(self, rows: Sequence[Row]) -> None:
        """Drop the rows."""

    def add_host(self, rows: Sequence[Row]) -> None:
        """Drop the rows."""

    def add_steps(self, steps: Sequence[StepRecord]) -> None:
        """Drop the steps."""

    def add_events(self, events: Sequence[Event]) -> None:
        """Drop the events."""

    def add_nccl(self, rows: Sequence[Row]) -> None:
        """Drop the rows."""

    def add_rollout(self, rows: Sequence[Row]) -> None:
        """Drop the rows."""
