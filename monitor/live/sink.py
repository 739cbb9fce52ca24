"""The seam between the exporter and the monitor: the :class:`Sink` protocol.

Collectors (the exporter side) publish what they read through one ``Sink``: GPU and host
sample rows, verl steps and events, NCCL and rollout-engine rows, and the positions reached in
the followed logs (which the sink gives back at a restart). The monitor side (monitor/live/live_monitor.py:
the rolling window the detectors read, the run-store writer) implements it; the collectors
never see which parts are behind it. :class:`NullSink` drops everything (a bare exporter,
and collectors under test that only export).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from monitor.records import Event, StepRecord

if TYPE_CHECKING:
    from monitor.logs.follow import LogPosition

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

    def add_log_positions(self, positions: Sequence[LogPosition]) -> None:
        """Where each followed log was read up to, after the steps and events read before."""

    def saved_log_positions(self) -> Mapping[str, LogPosition]:
        """The positions saved earlier, by absolute log path (a restart resumes there)."""


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

    def add_log_positions(self, positions: Sequence[LogPosition]) -> None:
        """Drop the positions."""

    def saved_log_positions(self) -> Mapping[str, LogPosition]:
        """None saved."""
        return {}
