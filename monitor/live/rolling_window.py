"""The exporter's rolling window: the recent GPU and host samples, steps and events.

Collectors push into it from their sampling threads; the detector loop reads it with
:meth:`RollingWindow.frames`. Everything is bounded twice: by age (``max_age_s``) and by count
(``max_steps``, ``max_events``, ``max_rows``), so a long run or a fast interval never grows it.
GPU and host rows are dicts in the interchange format (``monitor.frames.GPU_COLUMNS`` /
``HOST_COLUMNS``); missing optional columns become NaN and extra keys (the GPU collector's
``up``, ``xid_total``, ``throttle``) become extra columns after the canonical ones.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from monitor.frames import rows_frame
from monitor.logs.failure_lines import FAILURE_KINDS
from monitor.records import Event, StepRecord
from monitor.telemetry_kinds import KindRows, kinds

#: Event kinds the window keeps past its count cap until a detector pass has seen them (and
#: then evicts last): a flood of other lines must not hide an OOM or a fatal failure.
CRITICAL_EVENT_KINDS: frozenset[str] = frozenset(("oom", *FAILURE_KINDS))


def critical_event(event: Event) -> bool:
    """An OOM, a failure of FAILURE_KINDS, or any event whose data says ``fatal``."""
    return event.kind in CRITICAL_EVENT_KINDS or bool((event.data or {}).get("fatal"))


class RollingWindow(KindRows):
    """Thread-safe, bounded recent history for the live detectors.

    ``max_age_s``: samples older than this (by their ``ts``) and steps and events added longer
    ago than this are dropped (records age by arrival, so a log replayed from its start still
    fills the window). Past ``max_events`` the oldest non-critical event goes first; an OOM or
    fatal event (``critical_event``) is evicted only once a ``frames()`` call has returned it
    and no other event is left to evict; every eviction is counted in ``dropped["events"]``. ``max_rows`` bounds GPU and host
    rows each; ``max_steps`` and ``max_events`` bound the records. The run's first
    ``first_steps`` step records are also kept for good (``first_steps()``): the baseline a
    throughput drop is measured against, after they have aged out.
    """

    def __init__(
        self,
        max_age_s: float = 1800.0,
        max_steps: int = 200,
        max_events: int = 1000,
        max_rows: int = 200_000,
        clock=time.time,
        first_steps: int = 32,
    ) -> None:
        self.max_age_s = float(max_age_s)
        self._clock = clock
        self._lock = threading.Lock()
        #: sample rows by kind (monitor/telemetry_kinds.py), each bounded by ``max_rows``
        self._rows: dict[str, deque[dict]] = {k.name: deque(maxlen=max_rows) for k in kinds()}
        self._steps: deque[tuple[float, StepRecord]] = deque(maxlen=max_steps)
        self._first_steps: list[StepRecord] = []
        self._first_steps_max = int(first_steps)
        self._events: deque[tuple[float, Event, int]] = deque()  # (arrival, event, seq)
        self._max_events = int(max_events)
        self._event_seq = 0  # sequence number of the next event
        self._events_seen = 0  # events numbered below this were returned by frames()
        self._version = 0
        #: GPU/host rows dropped at the ``max_rows`` cap before they aged out
        self.dropped = {**{k.name: 0 for k in kinds()}, "events": 0}
        #: step records added so far (the detector loop runs soon after a new step)
        self.steps_added = 0

    @property
    def max_rows(self) -> int:
        """GPU (and host) rows kept at most; older ones are dropped before they age out."""
        return self._rows["gpu"].maxlen or 0

    # --- writers (collector threads)

    def add_rows(self, kind: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append sample rows of ``kind`` (dicts with its columns; extra keys are kept); the
        per-kind spellings (``add_gpu(rows)``, ...: ``KindRows``) come here.

        The row objects are kept as they are (no copy): do not change them afterwards."""
        with self._lock:
            self._extend_rows(kind, self._rows[kind], rows)

    def add_steps(self, steps: Iterable[StepRecord]) -> None:
        """Append step records (kept: the newest ``max_steps`` within ``max_age_s``)."""
        now = self._clock()
        with self._lock:
            for s in steps:
                self._steps.append((now, s))
                self.steps_added += 1
                if len(self._first_steps) < self._first_steps_max:
                    self._first_steps.append(s)
            self._prune_records(self._steps)
            self._version += 1

    def add_events(self, events: Iterable[Event]) -> None:
        """Append parser events (OOM, traceback, resume...)."""
        now = self._clock()
        with self._lock:
            for e in events:
                self._events.append((now, e, self._event_seq))
                self._event_seq += 1
            self._prune_records(self._events)
            self._evict_events()
            self._version += 1

    # --- readers (detector loop, tests)

    def gpu_since(self, t: float) -> list[dict]:
        """GPU rows newer than ``t`` (newest last), copying only those: cheap for pollers."""
        out: list[dict] = []
        with self._lock:
            for row in reversed(self._rows["gpu"]):
                if float(row.get("ts") or 0.0) <= t:
                    break
                out.append(dict(row))
        out.reverse()
        return out

    def recent_steps(self, n: int = 6) -> list[StepRecord]:
        """The newest ``n`` step records, without copying the samples (cheap: for pollers)."""
        with self._lock:
            return [s for _, s in list(self._steps)[-n:]]

    @property
    def version(self) -> int:
        """Increases on every change: a reader can skip work when nothing new arrived."""
        return self._version

    def frames(self) -> tuple[list[StepRecord], pd.DataFrame, pd.DataFrame, list[Event]]:
        """(steps, gpu_df, host_df, events): copies, safe to use while collectors keep adding."""
        with self._lock:
            self._prune_rows(self._rows["gpu"])
            self._prune_rows(self._rows["host"])
            self._prune_records(self._steps)
            self._prune_records(self._events)
            gpu = list(self._rows["gpu"])
            host = list(self._rows["host"])
            steps = [s for _, s in self._steps]
            events = [e for _, e, _ in self._events]
            self._events_seen = self._event_seq
        return steps, rows_frame("gpu", gpu), rows_frame("host", host), events

    def frame(self, kind: str) -> pd.DataFrame:
        """The recent rows of ``kind`` as its canonical frame (empty when none came)."""
        with self._lock:
            self._prune_rows(self._rows[kind])
            rows = list(self._rows[kind])
        return rows_frame(kind, rows)

    def nccl(self) -> pd.DataFrame:
        """The recent NCCL Inspector rows as a frame (empty without the plugin)."""
        return self.frame("nccl")

    def rollout(self) -> pd.DataFrame:
        """The recent rollout-engine rows as a frame (empty without an engine to scrape)."""
        return self.frame("rollout")

    @property
    def first_steps_max(self) -> int:
        """How many of the run's first steps are kept for good."""
        return self._first_steps_max

    def seed_first_steps(self, steps: Iterable[StepRecord]) -> None:
        """Set the run's first steps (read back from the store after a restart)."""
        with self._lock:
            self._first_steps = list(steps)[: self._first_steps_max]

    def first_steps(self) -> list[StepRecord]:
        """The run's first step records (up to ``first_steps``), kept after they age out."""
        with self._lock:
            return list(self._first_steps)

    def sizes(self) -> dict[str, int]:
        """How much the window holds now, per kind."""
        with self._lock:
            return {**{kind: len(rows) for kind, rows in self._rows.items()},
                    "steps": len(self._steps), "events": len(self._events)}

    # --- internals (lock held)

    def collect(self) -> list:
        """``verlmon_window_dropped_rows_total{kind}``: rows dropped at the cap (a collector)."""
        from prometheus_client.core import CounterMetricFamily

        from monitor import metric_names as m

        window = CounterMetricFamily(
            m.WINDOW_DROPPED.removesuffix("_total"),
            "Rows the detectors' window dropped at its cap before they aged out (samples "
            "by kind; events: oldest non-critical first).",
            labels=["kind"])
        for kind, count in sorted(self.dropped.items()):
            window.add_metric([kind], count)
        return [window]

    def _extend_rows(self, kind: str, queue: deque[dict], rows: Iterable[Mapping[str, Any]]
                     ) -> None:
        rows = list(rows)
        self._prune_rows(queue)  # rows past their age go first: dropping those loses nothing
        over = len(queue) + len(rows) - (queue.maxlen or len(queue) + len(rows))
        if over > 0:
            self.dropped[kind] += over
        queue.extend(rows)
        self._version += 1

    def _evict_events(self) -> None:
        """Bring the events down to ``max_events``: the oldest non-critical first, then the
        oldest critical one a detector pass has seen; an unseen critical event stays."""
        events = self._events
        while len(events) > self._max_events:
            victim = next((i for i, (_, e, _) in enumerate(events) if not critical_event(e)),
                          None)
            if victim is None:
                victim = next((i for i, (_, _, seq) in enumerate(events)
                               if seq < self._events_seen), None)
            if victim is None:
                return  # only unseen critical events: kept until the next detector pass
            del events[victim]
            self.dropped["events"] += 1

    def _cutoff(self) -> float:
        return self._clock() - self.max_age_s

    def _prune_rows(self, rows: deque[dict]) -> None:
        cutoff = self._cutoff()
        while rows:
            ts = rows[0].get("ts")
            if not isinstance(ts, (int, float)) or not ts < cutoff:
                break
            rows.popleft()

    def _prune_records(self, records: deque) -> None:
        cutoff = self._cutoff()
        while records and records[0][0] < cutoff:
            records.popleft()
