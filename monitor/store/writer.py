"""``StoreWriter``: a bounded in-memory buffer in front of a ``RunStore``, for the exporter.

Collectors ``put_*`` rows from any thread; ``flush()`` (called by the exporter every second or
so) writes everything buffered in one transaction. A full disk or a file locked by another
process never raises: ``up`` turns False, ``write_errors`` counts the failures, ``last_error``
says what happened in plain words, and the rows stay buffered for the next ``flush()``. No
value stops the writer: a row SQLite cannot hold (a step number of 2**63 or more, say) is
refused when it is put, and any other row that makes a write fail for what it holds (not for
the disk) is found by splitting the batch, dropped alone, and counted; the rest is written.

Bounds (each drop is counted in ``dropped`` by reason and in ``dropped_rows``):

- ``max_samples`` sample rows (GPU + host + NCCL, default 200,000: about 5 minutes at 64 GPUs
  every 0.1 s while the disk refuses writes); past it the oldest samples go (``buffer_full``);
- ``max_records`` steps and, separately, events (default 20,000 each); past it the oldest go
  (``buffer_full``);
- a put that passes a bound while writes work flushes at once, in the putting thread, so a
  burst (a long log read from its start) is written, not dropped: rows are dropped only
  while the store refuses writes;
- rows that cannot be stored at all (``invalid``: no timestamp, a step outside SQLite's
  64-bit integers, a value a write rejects).

``integrity_error`` (set by :meth:`check_integrity`) keeps ``up`` False: a store with garbage
inside is reported, not trusted. Every ``compact_interval_s`` a successful flush also runs
the store's retention (``compact()``).

Usage::

    writer = StoreWriter(RunStore("run.db"))
    writer.put_gpu(rows); writer.put_steps(parsed.steps); writer.put_flags(flags)
    writer.flush()   # -> True when everything buffered is now stored
    writer.up, writer.write_errors, writer.last_error, writer.dropped, writer.buffered
"""

from __future__ import annotations

import errno
import os
import sqlite3
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from monitor.logs.follow import LogPosition
from monitor.records import Event, Flag, StepRecord
from monitor.store.runstore import RunStore
from monitor.telemetry_kinds import KindRows, kinds

_INT64 = (-(2**63), 2**63 - 1)
#: Failures that come from the place (disk, lock, file), not from the rows: keep the rows.
_ENVIRONMENT_ERRORS = (sqlite3.OperationalError, OSError)


def valid_step_number(value: Any) -> bool:
    """True when ``value`` is an integer SQLite can store (a 64-bit signed integer)."""
    if isinstance(value, bool):
        return False
    try:
        num = int(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return _INT64[0] <= num <= _INT64[1]


def failure_cause(exc: BaseException, path: str | os.PathLike[str] | None = None) -> str:
    """What stopped a store write, in a few plain words. With the store's ``path``, a volume
    mounted (or gone) read-only is named as such: SQLite reports it as "disk I/O error"."""
    low = str(exc).lower()
    if "disk is full" in low or "database or disk is full" in low:
        return "the disk holding the run store is full (or the store hit its page limit)"
    if "locked" in low or "busy" in low:
        return "the run store file is locked by another process"
    if path is not None and read_only_volume(path):
        return "the volume holding the run store is read-only"
    if "readonly" in low or "read-only" in low:
        return "the run store file is read-only"
    text = (str(exc).splitlines() or [""])[0][:200]
    return f"writing the run store failed: {exc.__class__.__name__}: {text}"


_WHAT_NEXT = {
    "full": "rows are kept in memory until space is freed",
    "locked": "rows are kept in memory and written once the lock is released",
}


def describe_error(exc: BaseException, path: str | os.PathLike[str] | None = None) -> str:
    """A plain-words description of a store write failure, saying what happens to the rows."""
    cause = failure_cause(exc, path)
    if cause.startswith("writing the run store failed"):
        return cause
    tail = next((v for k, v in _WHAT_NEXT.items() if k in cause), "rows are kept in memory")
    return f"{cause}; {tail}"


def read_only_volume(path: str | os.PathLike[str]) -> bool:
    """True when the file system holding ``path`` refuses writes as read-only now: mounted
    read-only, or turned read-only after an error (ext4's ``errors=remount-ro``, which the
    mount flags do not always show), found by creating and removing a scratch file there."""
    folder = os.path.dirname(os.path.realpath(path)) or "."
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return True
        with tempfile.TemporaryFile(dir=folder):
            return False
    except OSError as exc:
        return exc.errno == errno.EROFS


def _has_ts(row: Mapping[str, Any]) -> bool:
    try:
        ts = float(row.get("ts"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return ts == ts


class StoreWriter(KindRows):
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
        self._write_ok = True
        self.write_errors = 0
        self.last_error: str | None = None
        #: the exception of the last failed write (what ``drop_unwritten`` names)
        self.last_exception: BaseException | None = None
        #: rows dropped, by reason: "buffer_full" (past a bound), "invalid" (unstorable), or
        #: "unwritten_at_stop" (still buffered when the final flush failed; ``drop_unwritten``)
        self.dropped: dict[str, int] = {"buffer_full": 0, "invalid": 0}
        #: set when the store file failed its integrity check: ``up`` stays False
        self.integrity_error: str | None = None
        self.rows_written = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        #: the telemetry kinds (monitor/telemetry_kinds.py) buffered, in the order written
        self._kinds = tuple(k.name for k in kinds())
        self._samples: dict[str, deque[dict[str, Any]]] = {k: deque() for k in self._kinds}
        self._steps: deque[StepRecord] = deque()
        self._events: deque[Event] = deque()
        self._flags: dict[tuple[str, str, float], Flag] = {}
        self._meta: dict[str, Any] = {}
        self._positions: dict[str, LogPosition] = {}
        self._ledger: deque[dict[str, Any]] = deque()
        self._last_compact = time.monotonic()

    # ------------------------------------------------------------------ state

    @property
    def up(self) -> bool:
        """True while the last write worked and the file passed its integrity check."""
        return self._write_ok and self.integrity_error is None

    @up.setter
    def up(self, value: bool) -> None:
        self._write_ok = bool(value)

    @property
    def dropped_rows(self) -> int:
        """Rows dropped for any reason (see ``dropped``)."""
        return sum(self.dropped.values())

    def collect(self) -> list:
        """The writer's own families (a collector): ``verlmon_store_up``,
        ``verlmon_store_write_errors_total`` and ``verlmon_store_dropped_rows_total{reason}``."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from monitor import metric_names as m

        dropped = CounterMetricFamily(
            m.STORE_DROPPED.removesuffix("_total"),
            "Rows the run-store writer dropped: buffer_full (past its bound while writes "
            "fail), invalid (a value SQLite cannot hold) or unwritten_at_stop (still "
            "buffered when the final write at stop failed).", labels=["reason"])
        for reason, count in sorted(self.dropped.items()):
            dropped.add_metric([reason], count)
        return [GaugeMetricFamily(m.STORE_UP, "1 while the run store accepts writes.",
                                  value=1.0 if self.up else 0.0),
                CounterMetricFamily(m.STORE_WRITE_ERRORS.removesuffix("_total"),
                                    "Failed run-store writes (disk full, database locked).",
                                    value=float(self.write_errors)),
                dropped]

    def _drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def check_integrity(self) -> bool:
        """Run SQLite's quick check on the store; False (and ``up`` False) when it fails."""
        try:
            problem = self.store.quick_check()
        except sqlite3.Error as exc:
            problem = f"{exc.__class__.__name__}: {exc}"
        self.integrity_error = (
            None if problem is None
            else f"the run store failed its integrity check ({problem}); copy what it holds "
            "with `verl-monitor export` and start a new store"
        )
        return problem is None

    # ------------------------------------------------------------------ putting

    def _over_bound(self) -> bool:
        return (sum(len(q) for q in self._samples.values()) > self.max_samples
                or len(self._steps) > self.max_records or len(self._events) > self.max_records
                or len(self._ledger) > self.max_records)

    def _bound_or_flush(self) -> None:
        """Past a bound: write now when writes work, else drop the oldest (counted)."""
        with self._lock:
            over = self._over_bound()
        if over and self._write_ok:
            self.flush()
        with self._lock:
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
            self._drop("buffer_full")
            total -= 1
        for q in (self._steps, self._events, self._ledger):
            while len(q) > self.max_records:
                q.popleft()
                self._drop("buffer_full")

    def put_rows(self, kind: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer sample dicts of ``kind`` (its columns: monitor/telemetry_kinds.py); a row
        without a timestamp is dropped and counted (``invalid``)."""
        kept = []
        for row in rows:
            if _has_ts(row):
                kept.append(dict(row))
            else:
                self._drop("invalid")
                self.last_error = f"a {kind} sample without a timestamp was dropped"
        with self._lock:
            self._samples[kind].extend(kept)
        self._bound_or_flush()

    #: ``add_rows`` (KindRows: ``add_gpu(rows)``, ...) and the older per-kind names
    #: (``put_gpu(rows)``: ``put_rows("gpu", rows)``) all buffer through ``put_rows``
    add_rows = put_rows
    put_gpu, put_host, put_nccl, put_rollout = (KindRows.add_gpu, KindRows.add_host,
                                                KindRows.add_nccl, KindRows.add_rollout)

    def put_steps(self, steps: Iterable[StepRecord]) -> None:
        """Buffer step records; a step number SQLite cannot hold is dropped and counted."""
        kept = []
        for s in steps:
            if valid_step_number(s.step):
                kept.append(s)
            else:
                self._drop("invalid")
                self.last_error = (f"step {str(s.step)[:40]} was not stored: step numbers must "
                                   "fit in 64 bits")
        with self._lock:
            self._steps.extend(kept)
        self._bound_or_flush()

    def put_events(self, events: Iterable[Event]) -> None:
        """Buffer events."""
        with self._lock:
            self._events.extend(events)
        self._bound_or_flush()

    def put_flags(self, flags: Iterable[Flag]) -> None:
        """Buffer flags; a newer version of the same flag (kind, scope, start) replaces it."""
        with self._lock:
            for f in flags:
                try:
                    key = (f.kind, f.scope_label, float(f.start))
                except (TypeError, ValueError):
                    self._drop("invalid")
                    self.last_error = f"a {f.kind} flag without a usable start was dropped"
                    continue
                self._flags[key] = f

    def put_ledger(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer goodput ledger rows as the exporter counted them (``RunStore.ledger``)."""
        with self._lock:
            self._ledger.extend(dict(r) for r in rows)
        self._bound_or_flush()

    def put_position(self, position: LogPosition) -> None:
        """Buffer where a followed log was read up to; it is written in the same transaction
        as the steps and events put before it (never ahead of them)."""
        with self._lock:
            self._positions[position.path] = position

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
                + len(self._positions)
                + len(self._ledger)
            )

    # ------------------------------------------------------------------ flushing

    def flush(self) -> bool:
        """Write everything buffered in one transaction; True on success. Never raises.

        A failure of the place (disk full, file locked, read-only) keeps every row for the next
        flush. A failure caused by what a row holds is narrowed down by halving the batch: the
        rows that cannot be written are dropped (counted as ``invalid``), the rest is stored.
        """
        with self._flush_lock:
            with self._lock:
                batch = {
                    **{kind: list(self._samples[kind]) for kind in self._kinds},
                    "steps": list(self._steps),
                    "events": list(self._events),
                    "flags": list(self._flags.values()),
                    "meta": dict(self._meta),
                    "positions": list(self._positions.values()),
                    "ledger": list(self._ledger),
                }
            count = sum(len(v) for v in batch.values())
            if count == 0:
                return self._maybe_compact()
            try:
                self.store.add_batch(
                    samples={kind: batch[kind] for kind in self._kinds},
                    **{k: v for k, v in batch.items() if k not in self._kinds})
            except _ENVIRONMENT_ERRORS as exc:
                return self._failed(exc)
            except Exception:  # noqa: BLE001 - a row's content: find it, drop it, store the rest
                try:
                    count = self._write_isolating(batch)
                except _ENVIRONMENT_ERRORS as exc:
                    return self._failed(exc)
            with self._lock:
                self._remove_written(batch)
            self.rows_written += count
            self._write_ok = True
            self.last_error = None
            return self._maybe_compact()

    def _failed(self, exc: BaseException) -> bool:
        self._write_ok = False
        self.write_errors += 1
        self.last_exception = exc
        self.last_error = describe_error(exc, self.store.path)
        return False

    def drop_unwritten(self) -> str | None:
        """At stop, after the final ``flush()`` failed: count every row still buffered as
        dropped (reason ``unwritten_at_stop``), empty the buffer, and return one plain line
        saying why and how many rows are lost; None when nothing was left unwritten."""
        with self._lock:
            parts = {kind: len(q) for kind, q in self._samples.items()}
            parts.update(steps=len(self._steps), events=len(self._events),
                         flags=len(self._flags), meta=len(self._meta), ledger=len(self._ledger))
            lost = sum(parts.values())
            for queue in (*self._samples.values(), self._steps, self._events, self._ledger):
                queue.clear()
            self._flags.clear()
            self._meta.clear()
        if not lost:
            return None
        self._drop("unwritten_at_stop", lost)
        exc = self.last_exception
        cause = failure_cause(exc, self.store.path) if exc is not None else "the store refused it"
        detail = ", ".join(f"{n} {kind}" for kind, n in parts.items() if n)
        return (f"the final write failed ({cause}): {lost} buffered rows could not be written "
                f"and are lost ({detail})")

    def _write_isolating(self, batch: dict[str, Any]) -> int:
        """Write ``batch`` kind by kind, halving any part a row makes fail; returns rows stored.

        Rows that fail alone are dropped from ``batch`` (so they leave the buffer too) and
        counted. Environment errors propagate (the caller keeps everything)."""
        stored = 0
        for kind in (*self._kinds, "steps", "events", "flags", "meta", "positions", "ledger"):
            rows = batch[kind]
            if not rows:
                continue
            if kind == "meta":
                items = [{k: v} for k, v in rows.items()]
                good = self._write_part("meta", items)
                stored += len(good)
                continue
            stored += len(self._write_part(kind, rows))
        return stored

    def _write_part(self, kind: str, rows: list) -> list:
        """Write ``rows`` of one kind; returns the rows stored (bad ones dropped, counted)."""
        try:
            if kind == "meta":
                merged: dict[str, Any] = {}
                for item in rows:
                    merged.update(item)
                self.store.add_batch(meta=merged)
            else:
                self.store.add_batch(samples={kind: rows}) if kind in self._kinds \
                    else self.store.add_batch(**{kind: rows})
            return rows
        except _ENVIRONMENT_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - narrowed below
            if len(rows) == 1:
                self._drop("invalid")
                self.last_error = (f"a {kind} row could not be stored and was dropped "
                                   f"({exc.__class__.__name__}: {str(exc)[:120]})")
                return []
            half = len(rows) // 2
            return self._write_part(kind, rows[:half]) + self._write_part(kind, rows[half:])

    def _remove_written(self, batch: dict[str, Any]) -> None:
        """Drop the rows just written; rows put during the write stay buffered."""
        for kind in self._kinds:
            queue = self._samples[kind]
            written = {id(r) for r in batch[kind]}
            self._samples[kind] = deque(r for r in queue if id(r) not in written)
        written_steps = {id(s) for s in batch["steps"]}
        self._steps = deque(s for s in self._steps if id(s) not in written_steps)
        written_events = {id(e) for e in batch["events"]}
        self._events = deque(e for e in self._events if id(e) not in written_events)
        written_ledger = {id(r) for r in batch["ledger"]}
        self._ledger = deque(r for r in self._ledger if id(r) not in written_ledger)
        for f in batch["flags"]:
            key = (f.kind, f.scope_label, float(f.start))
            if self._flags.get(key) is f:
                del self._flags[key]
        for key, value in batch["meta"].items():
            if key in self._meta and self._meta[key] is value:
                del self._meta[key]
        for pos in batch["positions"]:
            if self._positions.get(pos.path) is pos:
                del self._positions[pos.path]

    def _maybe_compact(self) -> bool:
        if self.compact_interval_s is None:
            return True
        if time.monotonic() - self._last_compact < self.compact_interval_s:
            return True
        self._last_compact = time.monotonic()
        try:
            self.store.compact()
        except Exception as exc:  # noqa: BLE001 - retention never stops the writer
            return self._failed(exc)
        return True
