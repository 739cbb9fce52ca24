"""The ledger across the job's attempts, live: the store, /metrics and wandb.

Every poll the view reads ``<log>.attempts`` beside each followed log (``verl-monitor run``
appends a line when it starts the job and when the job exits: ``monitor.logs.attempt_marks``)
and publishes the new marks as ``attempt_start`` / ``attempt_end`` events, so the run store
keeps each attempt of the job across exporter restarts. Every ``REFRESH_S`` (and when a mark
arrives) it books the job's attempts (``monitor.analysis.attempts.job_ledger``) from the whole
run store when there is one (the window otherwise: its last ``--window`` seconds) and exports:

- ``verlmon_job_seconds_total{bucket}``: the job's wall seconds by bucket (productive, redone,
  overhead, checkpoint, validation, between_steps, hang, crash_loss, shutdown,
  after_last_step, between_attempts), every bucket from 0; a running attempt is booked up to
  its last step;
- ``verlmon_job_attempts_total``, ``verlmon_job_failures_total{ended_by}``,
  ``verlmon_job_steps_redone_total``, ``verlmon_job_checkpoint_saves_total``;
- ``verlmon_job_ettr_ratio``: productive / wall over all attempts (absent while unknown).

The same numbers go to wandb (``WandbSink.log_attempts``) when the ledger changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from monitor import metric_names as m
from monitor.analysis.attempts import BUCKETS, FAILURES, job_ledger
from monitor.live.live_view import PollingView, ViewContext
from monitor.logs.attempt_marks import marks_path, read_marks
from monitor.records import Event, Flag, StepRecord
from monitor.store.job_history import LEDGER_EVENTS, job_history

#: Seconds between two bookings when no mark arrived (and only when the window changed).
REFRESH_S = 10.0
#: Seconds of overlap when the store is read again from the newest time read.
OVERLAP_S = 60.0


def _event_key(e: Event) -> tuple:
    return (e.kind, None if e.time is None else round(float(e.time), 3), e.message)


def _step_key(s: StepRecord) -> tuple:
    return (int(s.step), None if s.end_time is None else round(float(s.end_time), 3))


def merge_inputs(stored: tuple[list, list, list], window: tuple[list, list, list]
                 ) -> tuple[list[StepRecord], list[Event], list[Flag]]:
    """The store's steps, events and flags with the window's newer ones (the store writer
    flushes every few seconds), each once."""
    steps = {_step_key(s): s for s in [*stored[0], *window[0]]}
    events = {_event_key(e): e for e in [*stored[1], *window[1]]}
    flags = {(f.kind, f.scope_label, round(float(f.start), 3)): f for f in [*stored[2],
                                                                          *window[2]]}
    return list(steps.values()), sorted(events.values(), key=lambda e: e.time or 0.0), \
        list(flags.values())


class AttemptsView(PollingView):
    """Publishes the attempt marks and exports the job's ledger."""

    thread_name = "attempts"

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)
        self.doc: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._published: set[tuple] = set()
        self._sizes: dict[str, int] = {}
        self._at = 0.0
        self._logged: tuple | None = None
        self._store = None
        self._seen: float | None = None  # the newest step or event read from the store
        self._kept_steps: dict[tuple, StepRecord] = {}
        self._kept_events: dict[tuple, Event] = {}
        self._version = -1

    def poll_once(self) -> None:
        """Publish new marks; book the job when due."""
        self.poll(time.time())

    def poll(self, now: float) -> dict[str, Any] | None:
        """One round; the ledger when it was booked this round, else None."""
        fresh = self.publish_marks()
        window = self.ctx.window
        version = window.version if window is not None else 0
        if not fresh and (now - self._at < REFRESH_S or
                          (version == self._version and self.doc is not None)):
            return None
        self._at, self._version = now, version
        steps, events, flags = self._inputs()
        doc = job_ledger(steps, events, flags, running=True)
        with self._lock:
            self.doc = doc
        self._to_wandb(doc, now)
        return doc

    def publish_marks(self) -> int:
        """The marks of ``<log>.attempts`` not published yet, as events through the sink."""
        new: list[Event] = []
        for log in self.ctx.options.log or ():
            path = marks_path(log)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if self._sizes.get(str(path)) == size:
                continue
            self._sizes[str(path)] = size
            for e in read_marks(log):
                e.data["log"] = str(log)
                if _event_key(e) not in self._published:
                    self._published.add(_event_key(e))
                    new.append(e)
        if new:
            self.ctx.sink.add_events(new)
        return len(new)

    def _inputs(self) -> tuple[list[StepRecord], list[Event], list[Flag]]:
        window = self.ctx.window
        w_steps, _, _, w_events = window.frames() if window is not None else ([], None, None, [])
        tracker = self.ctx.tracker
        live = ([s for s in w_steps], [e for e in w_events if e.kind in LEDGER_EVENTS],
                list(tracker.active()) if tracker is not None else [])
        return merge_inputs(self._stored(), live)

    def _stored(self) -> tuple[list, list, list]:
        """Everything the run store holds for the ledger (nothing without ``--store``): read
        whole once, then only what came since the newest step or event read (a minute of
        overlap: the writer flushes in batches)."""
        path = getattr(self.ctx.options, "store", None)
        if not path:
            return [], [], []
        if self._store is None:
            from monitor.store import RunStore

            self._store = RunStore(path, create=False)
        since = None if self._seen is None else self._seen - OVERLAP_S
        steps, events, flags = job_history(self._store, since)
        self._kept_steps.update((_step_key(x), x) for x in steps)
        self._kept_events.update((_event_key(e), e) for e in events if e.kind != "progress")
        times = [float(x.end_time) for x in steps if x.end_time is not None] + \
            [float(e.time) for e in events if e.time is not None]
        if times:
            self._seen = max([*times, self._seen or 0.0])
        progress = [e for e in events if e.kind == "progress"]
        return list(self._kept_steps.values()), [*self._kept_events.values(), *progress], flags

    def _to_wandb(self, doc: dict[str, Any], now: float) -> None:
        """Log to wandb when an attempt starts or ends, and at most every minute otherwise."""
        get = getattr(self.ctx, "wandb", None)
        sink = get() if callable(get) else None
        if sink is None:
            return
        key = tuple((a["attempt"], a["ended_by"]) for a in doc["attempts"])
        if self._logged is not None and self._logged[0] == key and now - self._logged[1] < 60:
            return
        self._logged = (key, now)
        sink.log_attempts(doc)

    def collect(self) -> Iterable[Metric]:
        """The job's counters and ETTR (nothing before the first booking)."""
        with self._lock:
            doc = self.doc
        if doc is None:
            return
        secs = CounterMetricFamily(m.JOB_SECONDS.removesuffix("_total"),
                                   "Wall seconds of the job over all its attempts, by bucket "
                                   "(docs/attempts.md); the buckets add up to its wall time.",
                                   labels=["bucket"])
        for bucket in (*BUCKETS, "between_attempts"):
            secs.add_metric([bucket], float(doc["seconds"].get(bucket, 0.0)))
        yield secs
        yield CounterMetricFamily(m.JOB_ATTEMPTS.removesuffix("_total"),
                                  "Attempts of the job (starts).", value=len(doc["attempts"]))
        fails = CounterMetricFamily(m.JOB_FAILURES.removesuffix("_total"),
                                    "Attempts that ended in a failure, by how they ended.",
                                    labels=["ended_by"])
        for how in sorted(FAILURES):
            fails.add_metric([how], sum(1 for a in doc["attempts"] if a["ended_by"] == how))
        yield fails
        yield CounterMetricFamily(m.JOB_STEPS_REDONE.removesuffix("_total"),
                                  "Steps done again after a resume.", value=doc["steps_redone"])
        yield CounterMetricFamily(m.JOB_SAVES.removesuffix("_total"),
                                  "Checkpoint saves over all attempts.", value=doc["saves"])
        if doc.get("ettr") is not None:
            yield GaugeMetricFamily(m.JOB_ETTR, "ETTR: productive step time over the job's "
                                    "wall time, all attempts.", value=float(doc["ettr"]))
