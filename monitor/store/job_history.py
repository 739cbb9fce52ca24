"""What the ledger across a job's attempts reads from a run store: every step, the events
that start, resume, end or fail an attempt, and the flags (``monitor.analysis.attempts``)."""

from __future__ import annotations

from dataclasses import replace

from monitor.analysis.attempts import HANG_ACTION, RESUME_KINDS
from monitor.analysis.goodput import CRASH_KINDS
from monitor.logs.attempt_marks import END, START
from monitor.records import Event, Flag, StepRecord
from monitor.store.runstore import RunStore

#: The event kinds the ledger reads (progress lines: only the last minute's, for a finish).
LEDGER_EVENTS: tuple[str, ...] = (START, END, HANG_ACTION, "validation", *RESUME_KINDS,
                                  *CRASH_KINDS)


def job_history(store: RunStore, since: float | None = None
                ) -> tuple[list[StepRecord], list[Event], list[Flag]]:
    """The store's steps (without their raw metrics: the ledger reads none), the ledger's
    events (time order) and flags; ``since``: only steps and events from then on (a reader
    that keeps what it read before)."""
    events: list[Event] = []
    for kind in LEDGER_EVENTS:
        events += store.events(start=since, kind=kind)
    steps = [replace(s, metrics={}) for s in store.steps(start=since)]
    newest = max((float(s.end_time) for s in steps if s.end_time is not None), default=None)
    if newest is not None:  # the last progress lines: a finish without a recorded exit
        events += store.events(start=newest - 60.0, kind="progress")
    events.sort(key=lambda e: (e.time is None, e.time or 0.0))
    return steps, events, store.flags()
