"""``StoreWriter``: a bounded in-memory buffer in front of a ``RunStore``, for the exporter.

Collectors ``put_*`` rows from any thread; ``flush()`` (called by the exporter every second or
so) writes everything buffered in one transaction. A full disk or a file locked by another
process never raises: ``up`` turns False, ``write_errors`` counts the failures, ``last_error``
says what happened in plain words, and the rows stay buffered for the next ``flush()``. The
buffer is bounded (``max_samples`` sample rows, ``max_records`` steps/events/flags); past the
bound the oldest samples are dropped and counted in ``dropped_rows``. Every
``compact_interval_s`` a successful flush also runs the store's retention (``compact()``).

Usage::

    writer = StoreWriter(RunStore("run.db"))
    writer.put_gpu(rows); writer.put_steps(parsed.steps); writer.put_flags(flags)
    writer.flush()   # -> True when everything buffered is now stored
    writer.up, writer.write_errors, writer.last_error, writer.dropped_rows, writer.buffered
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from monitor.records import Event, Flag, StepRecord
from monitor.store.runstore import RunStore

_SAMPLE_KINDS = ("gpu", "host", "nccl")


def describe_error(exc: BaseException) -> str:
    """A plain-words description of a store write failure."""
    text = str(exc)
    low = text.lower()
    if "disk is full" in low or "database or disk is full" in low:
        return (
            "the disk holding the run store is full (or the store hit its page limit); "
            "rows are kept in memory until space is freed"
        )
    if "locked" in low or "busy" in low:
        return (
            "the run store file is locked by another process; rows are kept in memory and "
            "written once the lock is released"
        )
    if "readonly" in low or "read-only" in low:
        return "the run store file is read-only; rows are kept in memory"
    return f"writing the run store failed: {exc.__class__.__name__}: {text}"


def _has_ts(row: Mapping[str, Any]) -> bool:
    try:
        ts = float(row.get("ts"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return ts == ts


class StoreWriter:
    """Buffer rows for a RunStore and write them in batches; never raises on write errors."""

    def __init__(
        self,
        store: RunStore,
        *,
        max_samples: int = 200_000,
        max_records: int = 20_000,
        compact_interval_s: float | None = 300.0,
    ) -> None:
        self.store = store
        self.max_samples = int(max_samples)
        self.max_records = int(max_records)
        self.compact_interval_s = compact_interval_s
        self.up = True
        self.write_errors = 0
        self.last_error: str | None = None
        self.dropped_rows = 0
        self.rows_written = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._samples: dict[str, deque[dict[str, Any]]] = {k: deque() for k in _SAMPLE_KINDS}
        self._steps: deque[StepRecord] = deque()
        self._events: deque[Event] = deque()
        self._flags: dict[tuple[str, str, float], Flag] = {}
        self._meta: dict[str, Any] = {}
        self._last_compact = time.monotonic()

    # ------------------------------------------------------------------ putting

    def _put_samples(self, kind: str, rows: Iterable[Mapping[str, Any]]) -> None:
        kept = []
        for row in rows:
            if _has_ts(row):
                kept.append(dict(row))
            else:
                self.dropped_rows += 1
                self.last_error = f"a {kind} sample without a timestamp was dropped"
        with self._lock:
            self._samples[kind].extend(kept)
            self._enforce_bound()

    def _enforce_bound(self) -> None:
        total = sum(len(q) for q in self._samples.values())
        while total > self.max_samples:
            # drop from whichever queue holds the oldest sample
            oldest = min(
                (q for q in self._samples.values() if q),
                key=lambda q: q[0].get("ts") or 0.0,
            )
            oldest.popleft()
            self.dropped_rows += 1
            total -= 1
        for q in (self._steps, self._events):
            while len(q) > self.max_records:
                q.popleft()
                self.dropped_rows += 1

    def put_gpu(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer GPU sample dicts (monitor.frames.GPU_COLUMNS)."""
        self._put_samples("gpu", rows)

    def put_host(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer host sample dicts (monitor.frames.HOST_COLUMNS)."""
        self._put_samples("host", rows)

    def put_nccl(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer NCCL sample dicts (ts, node, coll, comm, ops, bytes, exec_s, busbw_bps)."""
        self._put_samples("nccl", rows)

    def put_steps(self, steps: Iterable[StepRecord]) -> None:
        """Buffer step records."""
        with self._lock:
            self._steps.extend(steps)
            self._enforce_bound()

    def put_events(self, events: Iterable[Event]) -> None:
        """Buffer events."""
        with self._lock:
            self._events.extend(events)
            self._enforce_bound()

    def put_flags(self, flags: Iterable[Flag]) -> None:
        """Buffer flags; a newer version of the same flag (kind, scope, start) replaces it."""
        with self._lock:
            for f in flags:
                self._flags[(f.kind, f.scope_label, float(f.start))] = f

    def set_meta(self, key: str, value: Any) -> None:
        """Buffer one run-level value."""
        with self._lock:
            self._meta[key] = value

    @property
    def buffered(self) -> int:
        """Rows waiting to be written."""
        with self._lock:
            return (
                sum(len(q) for q in self._samples.values())
                + len(self._steps)
                + len(self._events)
                + len(self._flags)
                + len(self._meta)
            )

    # ------------------------------------------------------------------ flushing

    def flush(self) -> bool:
        """Write everything buffered in one transaction; True on success. Never raises."""
        with self._flush_lock:
            with self._lock:
                batch = {
                    "gpu": list(self._samples["gpu"]),
                    "host": list(self._samples["host"]),
                    "nccl": list(self._samples["nccl"]),
                    "steps": list(self._steps),
                    "events": list(self._events),
                    "flags": list(self._flags.values()),
                    "meta": dict(self._meta),
                }
            count = sum(len(v) for v in batch.values())
            if count == 0:
                return self._maybe_compact()
            try:
                self.store.add_batch(**batch)
            except (sqlite3.Error, OSError, ValueError) as exc:
                self.up = False
                self.write_errors += 1
                self.last_error = describe_error(exc)
                return False
            with self._lock:
                self._remove_written(batch)
            self.rows_written += count
            self.up = True
            self.last_error = None
            return self._maybe_compact()

    def _remove_written(self, batch: dict[str, Any]) -> None:
        """Drop the rows just written; rows put during the write stay buffered."""
        for kind in _SAMPLE_KINDS:
            queue = self._samples[kind]
            written = {id(r) for r in batch[kind]}
            self._samples[kind] = deque(r for r in queue if id(r) not in written)
        written_steps = {id(s) for s in batch["steps"]}
        self._steps = deque(s for s in self._steps if id(s) not in written_steps)
        written_events = {id(e) for e in batch["events"]}
        self._events = deque(e for e in self._events if id(e) not in written_events)
        for f in batch["flags"]:
            key = (f.kind, f.scope_label, float(f.start))
            if self._flags.get(key) is f:
                del self._flags[key]
        for key, value in batch["meta"].items():
            if key in self._meta and self._meta[key] is value:
                del self._meta[key]

    def _maybe_compact(self) -> bool:
        if self.compact_interval_s is None:
            return True
        if time.monotonic() - self._last_compact < self.compact_interval_s:
            return True
        self._last_compact = time.monotonic()
        try:
            self.store.compact()
        except (sqlite3.Error, OSError) as exc:
            self.up = False
            self.write_errors += 1
            self.last_error = describe_error(exc)
            return False
        return True
