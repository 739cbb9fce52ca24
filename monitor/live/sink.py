"""The seam between the exporter and the monitor: the :class:`Sink` protocol.

Collectors (the exporter side) publish what they read through one ``Sink``: sample rows of
each telemetry kind (GPU, host, NCCL, rollout engines: ``add_rows(kind, rows)``, or its
spellings ``add_gpu(rows)`` ...), verl steps and events, and the positions reached in the
followed logs (which the sink gives back at a restart). The monitor side
(monitor/live/live_monitor.py: the rolling window the detectors read, the run-store writer)
implements it; the collectors never see which parts are behind it. :class:`NullSink` drops
everything (a bare exporter, and collectors under test that only export).

A sink that subclasses ``Sink`` implements ``add_rows`` once and gets the per-kind spellings
(``KindRows`` in monitor/telemetry_kinds.py); a new kind needs no new method.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from monitor.records import Event, StepRecord
from monitor.telemetry_kinds import KindRows

if TYPE_CHECKING:
    from monitor.logs.follow import LogPosition

#: One sample row: column name to value (``ts``, ``node``, ``gpu``, ``sm_active``, ...).
Row = Mapping[str, Any]


@runtime_checkable
class Sink(KindRows, Protocol):
    """Where collectors publish; each method may raise (the collector reports it in words).

    The bodies here keep nothing: a subclass that does not override a method drops what it
    is given (:class:`NullSink` overrides none but ``saved_log_positions``)."""

    def add_rows(self, kind: str, rows: Sequence[Row]) -> None:
        """Sample rows of ``kind`` (a key of ``monitor.telemetry_kinds.KIND``)."""

    def add_steps(self, steps: Sequence[StepRecord]) -> None:
        """Steps parsed from the verl log, oldest first."""

    def add_events(self, events: Sequence[Event]) -> None:
        """Events from the verl log (restarts, OOMs, truncations, ...)."""

    def add_log_positions(self, positions: Sequence[LogPosition]) -> None:
        """Where each followed log was read up to, after the steps and events read before."""

    def saved_log_positions(self) -> Mapping[str, LogPosition]:
        """The positions saved earlier, by absolute log path (a restart resumes there)."""


class NullSink(Sink):
    """A sink that keeps nothing: rows, steps, events and positions are dropped."""

    def saved_log_positions(self) -> Mapping[str, LogPosition]:
        """None saved."""
        return {}
