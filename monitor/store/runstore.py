"""``RunStore``: one run's telemetry, steps, events and flags in a single SQLite file (WAL mode).

One process writes (the exporter, through ``StoreWriter``); any number of readers, in the same
process (threads) or in others (the dashboards, ``verl-monitor export``), read while it writes.

Usage::

    store = RunStore("run.db")                  # creates the file when missing
    store.add_samples("gpu", [{"ts": t, "node": "n0", "gpu": 0, "util": 93.0, ...}])
    store.add_steps(parsed.steps)
    store.upsert_flags(flags)
    df = store.samples_frame("gpu", start=t0, node="n0")  # canonical columns (GPU_COLUMNS)
    store.compact()                             # retention: downsample old samples, cap size

    RunStore("run.db", create=False)            # StoreError when the file is missing

Thread safety: each thread gets its own connection; writes are serialised by a lock, so one
writer thread and any number of reader threads share one ``RunStore``.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from monitor.frames import empty_frame, kind_frame
from monitor.logs.fingerprint import step_fingerprint
from monitor.logs.follow import LogPosition
from monitor.numbers import float_or_none as _num  # a float for SQLite, or None (missing, NaN)
from monitor.printable import one_line
from monitor.records import Event, Flag, StepRecord
from monitor.store.schema import SchemaError, add_missing_columns, check, migrate
from monitor.telemetry_kinds import KIND, KindRows, TelemetryKind, kinds


class StoreError(RuntimeError):
    """A store file that cannot be opened; the message names the file and the problem."""


@dataclass
class OutboxItem:
    """One queued notification (the Slack notifier's outbox)."""

    id: int
    created: float
    payload: dict[str, Any]
    attempts: int
    last_error: str | None
    next_attempt: float
    dedupe_key: str | None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int(value: Any) -> int | None:
    """An integer SQLite can hold, or None (missing, NaN, infinite, or outside 64 bits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT64_MIN <= value <= _INT64_MAX else None
    num = _num(value)
    if num is None or not math.isfinite(num) or not _INT64_MIN <= num <= _INT64_MAX:
        return None
    return int(num)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, allow_nan=True)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


class RunStore(KindRows):
    """A run store file; see the module docstring.

    ``retention_s``: raw samples older than this (relative to the newest sample) are
    downsampled to ``downsample_s`` buckets by ``compact()``. ``max_bytes``: when the data
    passes this size, ``compact()`` drops the oldest downsampled samples first, then the oldest
    raw ones; steps, events, flags, meta and the outbox are always kept. ``busy_timeout_s``: how
    long a write waits for another process's lock before failing with "database is locked".
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention_s: float = 6 * 3600,
        downsample_s: float = 15.0,
        max_bytes: int = 2 * 2**30,
        busy_timeout_s: float = 5.0,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.retention_s = float(retention_s)
        self.downsample_s = float(downsample_s)
        self.max_bytes = int(max_bytes)
        self.busy_timeout_s = float(busy_timeout_s)
        self._local = threading.local()
        self._write_lock = threading.RLock()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._max_pages: int | None = None
        self._closed = False
        #: the first problem of a failed integrity check; writes are refused from then on
        self.integrity_problem: str | None = None
        #: step records that met another record of their step, end time and source: kept
        #: beside it (an end key a microsecond on) instead of replacing it
        self.step_clashes = 0
        if not create:
            _refuse_non_store(self.path)
        try:
            conn = self._conn()
            migrate(conn)
        except SchemaError as exc:
            self.close()
            raise StoreError(f"{self.path}: {exc}") from exc
        except sqlite3.OperationalError as exc:
            self.close()
            raise StoreError(f"{self.path}: cannot open ({exc})") from exc
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StoreError(f"{self.path}: not a verl-monitor run store ({exc})") from exc

    # ------------------------------------------------------------------ connections

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise StoreError(f"{self.path}: store is closed")
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        try:
            check(conn)  # before WAL: never change another program's file
        except BaseException:
            conn.close()
            raise
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreError(f"{self.path}: cannot switch to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous = NORMAL")
        if self._max_pages is not None:
            conn.execute(f"PRAGMA max_page_count = {int(self._max_pages)}")
        self._local.conn = conn
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection this object opened (all threads)."""
        self._closed = True
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._conns.clear()
        self._local = threading.local()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_page_limit(self, pages: int | None) -> None:
        """Cap the file at ``pages`` pages (``PRAGMA max_page_count``); None lifts the cap.

        Writes past the cap fail like a full disk ("database or disk is full").
        """
        self._max_pages = pages
        limit = pages if pages is not None else 4294967294
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            conn.execute(f"PRAGMA max_page_count = {int(limit)}")

    # ------------------------------------------------------------------ writing

    def _write(self, fn) -> Any:
        """Run ``fn(conn)`` inside one IMMEDIATE transaction; rolls back on any error. Refused
        (:class:`StoreIntegrityError`) once the file failed its integrity check."""
        if self.integrity_problem is not None:
            raise StoreIntegrityError(
                f"not written: the run store failed its integrity check "
                f"({self.integrity_problem})")
        with self._write_lock:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(conn)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return out

    def add_batch(
        self,
        *,
        gpu: Sequence[Mapping[str, Any]] = (),
        host: Sequence[Mapping[str, Any]] = (),
        nccl: Sequence[Mapping[str, Any]] = (),
        rollout: Sequence[Mapping[str, Any]] = (),
        steps: Sequence[StepRecord] = (),
        events: Sequence[Event] = (),
        flags: Sequence[Flag] = (),
        meta: Mapping[str, Any] | None = None,
        positions: Sequence[LogPosition] = (),
        samples: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        ledger: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Write several kinds of rows in ONE transaction: all are stored, or none.

        ``samples`` maps a telemetry kind (monitor/telemetry_kinds.py) to its rows; ``gpu``,
        ``host``, ``nccl`` and ``rollout`` are the same, one keyword each.

        ``positions``: where each followed log was read up to, saved with the steps and events
        read before it (a restart resumes there; never ahead of what was stored).

        ``ledger``: goodput ledger rows as the exporter counted them (``step``, ``node``,
        ``gpu``, ``start``, ``end``, ``tail``, ``wall`` and a number per cause; see
        :meth:`ledger`)."""

        by_kind = {"gpu": gpu, "host": host, "nccl": nccl, "rollout": rollout, **(samples or {})}
        unknown = sorted(k for k, rows in by_kind.items() if rows and k not in KIND)
        if unknown:  # rows no table takes: refused, never dropped quietly
            raise ValueError(f"no telemetry kind {', '.join(map(repr, unknown))} "
                             f"(monitor/telemetry_kinds.py has {', '.join(KIND)})")

        def work(conn: sqlite3.Connection) -> None:
            for kind in kinds():
                if by_kind.get(kind.name):
                    _insert_kind(conn, kind, by_kind[kind.name])
            if steps:
                self.step_clashes += _insert_steps(conn, steps)
            if events:
                _insert_events(conn, events)
            if flags:
                _upsert_flags(conn, flags)
            if meta:
                conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    [(str(k), _dumps(v)) for k, v in meta.items()],
                )
            if positions:
                _save_positions(conn, positions)
            if ledger:
                _insert_ledger(conn, ledger)

        self._write(work)

    def save_log_positions(self, positions: Sequence[LogPosition]) -> None:
        """Save where followed logs were read up to (see ``add_batch``)."""
        self.add_batch(positions=positions)

    def log_positions(self) -> dict[str, LogPosition]:
        """The saved position of each followed log, by its path."""
        conn = self._conn()
        have = {r[1] for r in conn.execute("PRAGMA table_info(log_positions)")}
        tail = ", ".join(c if c in have else "0" for c in _POSITION_TAIL)
        sql = f'SELECT path, dev, ino, "offset", head_len, head_hash, updated, {tail} ' \
              "FROM log_positions"
        return {r[0]: LogPosition(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]), str(r[5]),
                                  _num(r[6]), tail_len=int(r[7] or 0), tail_fp=int(r[8] or 0))
                for r in conn.execute(sql)}

    def add_samples(self, kind: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append samples of ``kind`` (monitor/telemetry_kinds.py: dicts keyed by its columns;
        extras ignored; a row without ``ts`` fails the write)."""
        self.add_batch(samples={kind: rows})

    #: ``add_rows`` (KindRows: ``add_gpu(rows)``, ...) and the older per-kind names
    #: (``add_gpu_samples(rows)``: ``add_samples("gpu", rows)``) all append through
    #: ``add_samples``
    add_rows = add_samples
    add_gpu_samples, add_host_samples, add_nccl_samples, add_rollout_samples = (
        KindRows.add_gpu, KindRows.add_host, KindRows.add_nccl, KindRows.add_rollout)

    def add_steps(self, steps: Sequence[StepRecord]) -> None:
        """Store step records. A step whose content (source, number, values) is stored already
        is not stored again, whatever its end time; the same step, end time and source with
        other values (a JSONL object merged later) replaces the earlier row."""
        self.add_batch(steps=steps)

    def add_events(self, events: Sequence[Event]) -> None:
        """Append events; an event identical to a stored one (same time) is not stored twice."""
        self.add_batch(events=events)

    def upsert_flags(self, flags: Sequence[Flag]) -> None:
        """Insert flags or update them in place, keyed by kind + scope label + start."""
        self.add_batch(flags=flags)

    def set_meta(self, key: str, value: Any) -> None:
        """Set one run-level value (run name, node names, backend, started_at...); JSON-able."""
        self.add_batch(meta={key: value})

    # ------------------------------------------------------------------ reading

    def _read_frame(
        self,
        table: str,
        columns: tuple[str, ...],
        start: float | None,
        end: float | None,
        node: str | None,
        resample_s: float | None = None,
    ) -> pd.DataFrame:
        where, params = _time_filter("ts", start, end)
        if node is not None:
            where.append("node = ?")
            params.append(str(node))
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        if resample_s:
            from monitor.store.retention import bucket_query

            if not resample_s > 0:
                raise ValueError("resample_s must be positive")
            select, group = bucket_query(table, float(resample_s))
            sql = (
                f"SELECT {select} FROM {table}{clause} GROUP BY {', '.join(group)} "
                f"ORDER BY bucket, {', '.join(group[1:])}"
            )
        elif start is None and end is None:
            # a full scan in rowid order, sorted afterwards, beats walking the ts index
            sql = f"SELECT {', '.join(columns)} FROM {table}{clause}"
            rows = self._conn().execute(sql, params).fetchall()
            df = pd.DataFrame.from_records(rows, columns=list(columns))
            return df.sort_values("ts", kind="stable", ignore_index=True)
        else:
            sql = f"SELECT {', '.join(columns)} FROM {table}{clause} ORDER BY ts"
        rows = self._conn().execute(sql, params).fetchall()
        return pd.DataFrame.from_records(rows, columns=list(columns))

    def samples_frame(
        self,
        kind: str,
        start: float | None = None,
        end: float | None = None,
        node: str | None = None,
        resample_s: float | None = None,
    ) -> pd.DataFrame:
        """Samples of ``kind`` with ``start <= ts <= end`` (either bound optional), sorted by ts,
        as its canonical frame (monitor/frames.py); empty for a store without the kind's table
        (one made by its first row, that never saw one).

        ``resample_s``: one row per ``resample_s`` bucket and series instead (bucket start as
        ts; values folded as retention folds them: mean, max memory, summed NCCL counts),
        computed in SQLite: use it for charts over long ranges.
        """
        k = KIND[kind]
        if k.create_on_use and not _has_table(self._conn(), k.table):
            return empty_frame(kind)
        return kind_frame(kind, self._read_frame(k.table, k.columns, start, end, node,
                                                 resample_s))

    def gpu_frame(self, start: float | None = None, end: float | None = None,
                  node: str | None = None, resample_s: float | None = None) -> pd.DataFrame:
        """``samples_frame("gpu", ...)``: GPU samples."""
        return self.samples_frame("gpu", start, end, node, resample_s)

    def host_frame(self, start: float | None = None, end: float | None = None,
                   node: str | None = None, resample_s: float | None = None) -> pd.DataFrame:
        """``samples_frame("host", ...)``: host samples."""
        return self.samples_frame("host", start, end, node, resample_s)

    def nccl_frame(self, start: float | None = None, end: float | None = None,
                   node: str | None = None, resample_s: float | None = None) -> pd.DataFrame:
        """``samples_frame("nccl", ...)``: NCCL samples."""
        return self.samples_frame("nccl", start, end, node, resample_s)

    def rollout_frame(self, start: float | None = None, end: float | None = None,
                      node: str | None = None, resample_s: float | None = None
                      ) -> pd.DataFrame:
        """``samples_frame("rollout", ...)``: rollout-engine samples."""
        return self.samples_frame("rollout", start, end, node, resample_s)

    def steps(self, start: float | None = None, end: float | None = None) -> list[StepRecord]:
        """Step records whose end_time is within the bounds, in end_time order.

        With no bounds, steps without an end_time are included (ordered by step).
        """
        where, params = _time_filter("end_time", start, end)
        sql = (
            "SELECT step, end_time, total, phases, throughput, mem_allocated_peak_bytes, "
            "mem_reserved_peak_bytes, metrics, time_source, source FROM steps"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY end_time IS NULL, end_time, step"
        out = []
        for row in self._conn().execute(sql, params):
            out.append(
                StepRecord(
                    step=row[0],
                    end_time=row[1],
                    total=row[2],
                    phases=json.loads(row[3]),
                    throughput=row[4],
                    mem_allocated_peak_bytes=row[5],
                    mem_reserved_peak_bytes=row[6],
                    metrics=json.loads(row[7]),
                    time_source=row[8] or "arrival",
                    source=row[9] or "console",
                )
            )
        return out

    def events(
        self, start: float | None = None, end: float | None = None, kind: str | None = None
    ) -> list[Event]:
        """Events within the time bounds (optionally one kind), in time order."""
        where, params = _time_filter("time", start, end)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        sql = "SELECT kind, time, step, message, data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY time IS NULL, time, id"
        return [
            Event(kind=r[0], time=r[1], step=r[2], message=r[3] or "", data=json.loads(r[4]))
            for r in self._conn().execute(sql, params)
        ]

    def flags(self, active_only: bool = False) -> list[Flag]:
        """Stored flags in start order; ``active_only`` keeps the open ones (end is None)."""
        sql = 'SELECT kind, severity, start, "end", scope, evidence, advice FROM flags'
        if active_only:
            sql += ' WHERE "end" IS NULL'
        sql += " ORDER BY start, kind"
        return [
            Flag(
                kind=r[0],
                severity=r[1],
                start=r[2],
                end=r[3],
                scope=json.loads(r[4]),
                evidence=r[5] or "",
                advice=json.loads(r[6]),
            )
            for r in self._conn().execute(sql)
        ]

    def ledger(self, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        """The goodput ledger as the exporter counted it, rows whose end is within the
        bounds: the columns of ``monitor.analysis.goodput.ledger`` (step, node, gpu, start,
        end, tail, wall, every cause). Empty (with those columns) when the store has none."""
        from monitor.analysis.goodput import CAUSES, LEDGER_COLUMNS

        where, params = _time_filter('"end"', start, end)
        sql = 'SELECT step, node, gpu, start, "end", tail, wall, causes FROM ledger'
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += ' ORDER BY "end", node, gpu'
        rows = []
        for r in self._conn().execute(sql, params):
            causes = json.loads(r[7])
            rows.append([int(r[0]), str(r[1]), int(r[2]), float(r[3]), float(r[4]), bool(r[5]),
                         float(r[6]), *(float(causes.get(c, 0.0)) for c in CAUSES)])
        return pd.DataFrame(rows, columns=LEDGER_COLUMNS)

    def meta(self) -> dict[str, Any]:
        """All run-level values set with ``set_meta``."""
        return {k: json.loads(v) for k, v in self._conn().execute("SELECT key, value FROM meta")}

    def time_range(self) -> tuple[float | None, float | None]:
        """(oldest, newest) timestamp over samples of every kind, steps and events; (None,
        None) when empty."""
        conn = self._conn()
        parts = [f"SELECT min(ts) lo, max(ts) hi FROM {t}" for t in self._sample_tables(conn)]
        parts += ["SELECT min(end_time), max(end_time) FROM steps",
                  "SELECT min(time), max(time) FROM events"]
        lo, hi = conn.execute(f"SELECT min(lo), max(hi) FROM ({' UNION ALL '.join(parts)})"
                              ).fetchone()
        return lo, hi

    @staticmethod
    def _sample_tables(conn: sqlite3.Connection) -> list[str]:
        """The sample tables this store has (a ``create_on_use`` kind's once it saw a row)."""
        return [k.table for k in kinds() if not k.create_on_use or _has_table(conn, k.table)]

    def counts(self) -> dict[str, int]:
        """Row count per table (for status lines and tests)."""
        conn = self._conn()
        tables = (*self._sample_tables(conn), "steps", "events", "flags")
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}

    # ------------------------------------------------------------------ size and retention

    def data_bytes(self) -> int:
        """Bytes of data in use (pages minus free pages); what ``max_bytes`` caps."""
        from monitor.store.retention import used_bytes

        return used_bytes(self._conn())

    def file_bytes(self) -> int:
        """Bytes on disk: the database file plus its WAL."""
        total = self.path.stat().st_size if self.path.exists() else 0
        wal = Path(f"{self.path}-wal")
        return total + (wal.stat().st_size if wal.exists() else 0)

    def quick_check(self) -> str | None:
        """SQLite's ``PRAGMA quick_check``: None when the file is sound, else its first problem
        on one short printable line (SQLite lists every damaged cell, with the bytes it read).
        A failed check makes every later write raise :class:`StoreIntegrityError`: nothing more
        goes into a damaged file."""
        rows = self._conn().execute("PRAGMA quick_check(20)").fetchall()
        lines = [ln for r in rows for ln in str(r[0]).splitlines()
                 if ln.strip() and not ln.startswith("*** in database")]
        if rows and str(rows[0][0]) == "ok":
            return None
        first = one_line(lines[0] if lines else "no answer", 160)
        more = f" and {len(lines) - 1}+ more" if len(lines) > 1 else ""
        self.integrity_problem = first + more
        return self.integrity_problem

    def compact(self, now: float | None = None) -> dict[str, int]:
        """Apply retention now (``monitor.store.retention``); ``now`` defaults to the newest
        sample's timestamp.

        Returns counts: ``downsampled`` (raw rows folded into buckets), ``buckets`` (rows
        written), ``dropped`` (rows deleted for size), ``bytes_before`` and ``bytes_after``
        (file on disk).
        """
        from monitor.store.retention import apply_retention, release_space

        bytes_before = self.file_bytes()
        removed, added, dropped = self._write(lambda conn: apply_retention(
            conn, now, self.retention_s, self.downsample_s, self.max_bytes))
        with self._write_lock:
            release_space(self._conn())
        return {
            "downsampled": removed,
            "buckets": added,
            "dropped": dropped,
            "bytes_before": bytes_before,
            "bytes_after": self.file_bytes(),
        }

    # ------------------------------------------------------------------ outbox (notifications)

    def outbox_add(
        self, payload: Mapping[str, Any], *, dedupe_key: str | None = None, created: float | None = None
    ) -> int:
        """Queue a notification payload; returns its id."""

        def work(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT INTO outbox (created, payload, dedupe_key) VALUES (?, ?, ?)",
                (time.time() if created is None else created, _dumps(dict(payload)), dedupe_key),
            )
            return int(cur.lastrowid)

        return self._write(work)

    def outbox_pending(self, now: float | None = None, limit: int = 100) -> list[OutboxItem]:
        """Unsent items whose next attempt is due at ``now`` (all unsent when now is None)."""
        sql = (
            "SELECT id, created, payload, attempts, last_error, next_attempt, dedupe_key "
            "FROM outbox WHERE sent_at IS NULL"
        )
        params: list[Any] = []
        if now is not None:
            sql += " AND next_attempt <= ?"
            params.append(now)
        sql += " ORDER BY id LIMIT ?"
        params.append(int(limit))
        return [
            OutboxItem(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5], r[6])
            for r in self._conn().execute(sql, params)
        ]

    def outbox_count_pending(self) -> int:
        """Number of unsent items."""
        sql = "SELECT count(*) FROM outbox WHERE sent_at IS NULL"
        return int(self._conn().execute(sql).fetchone()[0])

    def outbox_mark_sent(
        self, item_id: int, sent_at: float | None = None, note: str | None = None
    ) -> None:
        """Record that an item is done: delivered, or given up for good (``note`` says why:
        "outcome unknown" after a timeout, "not sent" for a message that must not go)."""
        ts = time.time() if sent_at is None else sent_at
        self._write(
            lambda c: c.execute(
                "UPDATE outbox SET sent_at = ?, attempts = attempts + 1, "
                "last_error = COALESCE(?, last_error) WHERE id = ?",
                (ts, note, item_id),
            )
        )

    def outbox_status(self, dedupe_key: str) -> str | None:
        """"done" when an item with this key was delivered (or given up), "pending" while one
        waits, None when none was ever queued."""
        row = self._conn().execute(
            "SELECT MAX(sent_at IS NOT NULL) FROM outbox WHERE dedupe_key = ?", (dedupe_key,)
        ).fetchone()
        if row is None or row[0] is None:
            return None
        return "done" if row[0] else "pending"

    def outbox_mark_failed(self, item_id: int, error: str, next_attempt: float) -> None:
        """Record a failed attempt; the item stays pending until ``next_attempt``."""
        self._write(
            lambda c: c.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt = ? "
                "WHERE id = ?",
                (error, next_attempt, item_id),
            )
        )

    def outbox_seen(self, dedupe_key: str, since: float) -> bool:
        """True when an item with this dedupe key was queued at or after ``since``."""
        row = self._conn().execute(
            "SELECT 1 FROM outbox WHERE dedupe_key = ? AND created >= ? LIMIT 1",
            (dedupe_key, since),
        ).fetchone()
        return row is not None


# ---------------------------------------------------------------------- helpers


class StoreIntegrityError(sqlite3.OperationalError):
    """A write refused because the file failed its integrity check (the rows are kept)."""


def _refuse_non_store(path: Path) -> None:
    """Raise StoreError unless ``path`` is a file holding a verl-monitor run store: opening an
    empty file (0 bytes, or a database without tables) would write a new schema into it."""
    if not path.is_file():
        raise StoreError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise StoreError(f"{path}: an empty file, not a verl-monitor run store")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open ({exc})") from exc
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a verl-monitor run store ({exc})") from exc
    finally:
        conn.close()
    if not names:
        raise StoreError(f"{path}: a database without tables, not a verl-monitor run store")


def _insert_ledger(conn: sqlite3.Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Ledger rows (one per step and GPU); a row counted again replaces the first."""
    from monitor.analysis.goodput import CAUSES

    conn.executemany(
        'INSERT OR REPLACE INTO ledger (node, gpu, step, start, "end", tail, wall, causes) '
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(str(r["node"]), int(r["gpu"]), int(r["step"]), float(r["start"]), float(r["end"]),
          int(bool(r.get("tail", False))), float(r["wall"]),
          json.dumps({c: round(float(r[c]), 6) for c in CAUSES if float(r.get(c) or 0.0) > 0}))
         for r in rows])


def _time_filter(column: str, start: float | None, end: float | None) -> tuple[list[str], list]:
    where: list[str] = []
    params: list[Any] = []
    if start is not None:
        where.append(f"{column} >= ?")
        params.append(float(start))
    if end is not None:
        where.append(f"{column} <= ?")
        params.append(float(end))
    return where, params


def _insert_samples(conn: sqlite3.Connection, kind: TelemetryKind, rows: Iterable[Mapping]
                    ) -> None:
    table, columns = kind.table, kind.columns
    values = []
    for row in rows:
        ts = _num(row.get("ts"))
        if ts is None:
            raise ValueError(f"{table}: a sample without a timestamp: {dict(row)!r}")
        out: list[Any] = []
        for col in columns:
            val = row.get(col)
            if col in kind.text:
                out.append("" if val is None else str(val))
            elif col == "gpu":
                out.append(_int(val))
            else:
                out.append(_num(val))
        values.append(out)
    marks = ", ".join("?" for _ in columns)
    conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", values)


#: The rollout-engine samples table; created by its first write (stores of every version
#: before it simply lack it, and read as holding no engine samples).
ROLLOUT_TABLE = KIND["rollout"].table


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                       (name,)).fetchone()
    return row is not None


def _insert_kind(conn: sqlite3.Connection, kind: TelemetryKind, rows: Iterable[Mapping]) -> None:
    """Insert rows of one telemetry kind into its table; a table added after the first stores
    (``create_on_use``: rollout-engine rows) is created, with its ts index, at its first row."""
    if kind.create_on_use:
        defs = ", ".join("ts REAL NOT NULL" if c == "ts" else f"{c} TEXT NOT NULL"
                         if c in kind.text else f"{c} REAL" for c in kind.columns)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {kind.table} ({defs}, "
                     "res REAL NOT NULL DEFAULT 0)")
        conn.execute(f"CREATE INDEX IF NOT EXISTS {kind.table}_ts ON {kind.table} (ts)")
    _insert_samples(conn, kind, rows)


#: Most end keys tried, a microsecond apart, for a step record meeting others of its key.
_CLASH_TRIES = 1000


def _insert_steps(conn: sqlite3.Connection, steps: Iterable[StepRecord]) -> int:
    """Insert step records; one already stored (the same fingerprint) is skipped. A record
    whose (step, end_key, source) another record holds is never replaced: it is stored with
    the next free end key a microsecond on. Returns how many were kept apart so."""
    clashes = 0
    for s in steps:
        end = _num(s.end_time)
        step = _int(s.step)
        if step is None:
            raise ValueError(f"step number {str(s.step)[:40]} does not fit in 64 bits")
        fp = step_fingerprint(s)
        if conn.execute("SELECT 1 FROM steps WHERE fp = ?", (fp,)).fetchone() is not None:
            continue
        key = -1.0 if end is None else end
        source = s.source or ""
        for tries in range(_CLASH_TRIES):
            taken = conn.execute("SELECT 1 FROM steps WHERE step = ? AND end_key = ? AND "
                                 "source = ?", (step, key, source)).fetchone()
            if taken is None:
                break
            if tries == 0:
                clashes += 1
            key += 1e-6
        conn.execute(
            "INSERT INTO steps (step, end_key, end_time, total, phases, throughput, "
            "mem_allocated_peak_bytes, mem_reserved_peak_bytes, metrics, time_source, source, "
            "fp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (step, key, end, _num(s.total), _dumps(dict(s.phases)), _num(s.throughput),
             _num(s.mem_allocated_peak_bytes), _num(s.mem_reserved_peak_bytes),
             _dumps(s.metrics), s.time_source, source, fp),
        )
    return clashes


#: Columns of ``log_positions`` added after schema version 2 (nullable; a position saved
#: before them reads as 0: not known): the fingerprint of the bytes before the offset.
_POSITION_TAIL = ("tail_len", "tail_fp")


def _save_positions(conn: sqlite3.Connection, positions: Iterable[LogPosition]) -> None:
    add_missing_columns(conn, "log_positions", _POSITION_TAIL)
    now = time.time()
    conn.executemany(
        'INSERT INTO log_positions (path, dev, ino, "offset", head_len, head_hash, updated, '
        "tail_len, tail_fp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (path) DO UPDATE "
        'SET dev = excluded.dev, ino = excluded.ino, "offset" = excluded."offset", '
        "head_len = excluded.head_len, head_hash = excluded.head_hash, "
        "updated = excluded.updated, tail_len = excluded.tail_len, tail_fp = excluded.tail_fp",
        [(p.path, int(p.dev), int(p.ino), int(p.offset), int(p.head_len), p.head_hash, now,
          int(p.tail_len), int(p.tail_fp)) for p in positions],
    )


def _insert_events(conn: sqlite3.Connection, events: Iterable[Event]) -> None:
    values = []
    for e in events:
        t = _num(e.time)
        data = _dumps(e.data)
        dedupe = None if t is None else _dumps([e.kind, t, e.step, e.message, data])
        values.append((t, e.kind, _int(e.step), e.message, data, dedupe))
    conn.executemany(
        "INSERT OR IGNORE INTO events (time, kind, step, message, data, dedupe) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        values,
    )


def _upsert_flags(conn: sqlite3.Connection, flags: Iterable[Flag]) -> None:
    now = time.time()
    values = [
        (
            f.kind,
            f.scope_label,
            float(f.start),
            f.severity,
            _num(f.end),
            _dumps(f.scope),
            f.evidence,
            _dumps(list(f.advice)),
            now,
        )
        for f in flags
    ]
    conn.executemany(
        'INSERT INTO flags (kind, scope_label, start, severity, "end", scope, evidence, advice, '
        "updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (kind, scope_label, start) DO UPDATE SET severity = excluded.severity, "
        '"end" = excluded."end", scope = excluded.scope, evidence = excluded.evidence, '
        "advice = excluded.advice, updated = excluded.updated",
        values,
    )
