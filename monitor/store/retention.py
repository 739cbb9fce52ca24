"""Retention for the run store: downsample old samples, then keep the file under its size cap.

1. Raw samples older than ``retention_s`` before the newest sample are replaced by one row per
   ``downsample_s`` bucket and series (the kind's ``series`` in monitor/telemetry_kinds.py;
   GPU: node+gpu; host: node; NCCL: node+coll+comm): the mean of each value, except where the
   kind's ``aggregates`` say otherwise: memory takes the maximum (so peaks survive), NCCL
   counts (ops, bytes, exec_s) the sum. Only whole buckets older than the cut are touched.
2. While the data is larger than ``max_bytes``, the oldest downsampled samples are deleted,
   a tenth of their time span at a time; when none are left, the oldest raw samples go.
3. Free pages are handed back to the file system (the schema uses incremental auto-vacuum)
   and the WAL is checkpointed.

Steps, events, flags, meta and the outbox are never touched. These are functions of a
connection; ``RunStore.compact`` runs them under its write lock (this module never imports
the store).
"""

from __future__ import annotations

import math
import sqlite3

from monitor.telemetry_kinds import TelemetryKind, kinds


def _present(conn: sqlite3.Connection) -> list[TelemetryKind]:
    """The kinds whose sample table this file has (``create_on_use`` ones appear with their
    first row), in the order of the table of kinds."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    names = {r[0] for r in rows}
    return [k for k in kinds() if k.table in names]


def bucket_query(table: str, width: float) -> tuple[str, tuple[str, ...]]:
    """``(select list, group keys)`` that fold ``table`` rows into ``width``-second buckets.

    The bucket's timestamp is its start; one bucket per series (the kind's ``series``
    columns); values aggregate as the kind says (``aggregates``: max for memory, sum for NCCL
    counts; else the mean). Shared by ``compact`` and the stores' ``resample_s`` reads.
    """
    kind = next((k for k in kinds() if k.table == table), None)
    if kind is None:
        raise ValueError(f"no bucket plan for table {table!r}")
    select = []
    for col in kind.columns:
        if col == "ts":
            select.append(f"CAST(ts / {width!r} AS INTEGER) * {width!r} AS bucket")
        elif col in kind.series:
            select.append(col)
        else:
            select.append(f"{kind.aggregates.get(col, 'avg')}({col})")
    return ", ".join(select), ("bucket",) + kind.series


def _downsample(conn: sqlite3.Connection, cutoff: float, width: float) -> tuple[int, int]:
    """Replace raw rows with ts < cutoff by bucket rows; returns (raw rows removed, rows added)."""
    removed = added = 0
    for kind in _present(conn):
        table = kind.table
        select, group = bucket_query(table, width)
        cur = conn.execute(
            f"INSERT INTO {table} ({', '.join(kind.columns)}, res) "
            f"SELECT {select}, {width!r} FROM {table} "
            f"WHERE res = 0 AND ts < ? GROUP BY {', '.join(group)}",
            (cutoff,),
        )
        added += max(cur.rowcount, 0)
        cur = conn.execute(f"DELETE FROM {table} WHERE res = 0 AND ts < ?", (cutoff,))
        removed += max(cur.rowcount, 0)
    return removed, added


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of the database in use: (pages - free pages) x page size."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return (pages - free) * page_size


def _span(conn: sqlite3.Connection, raw: bool) -> tuple[float | None, float | None]:
    cond = "res = 0" if raw else "res > 0"
    parts = " UNION ALL ".join(
        f"SELECT min(ts) lo, max(ts) hi FROM {k.table} WHERE {cond}" for k in _present(conn))
    return conn.execute(f"SELECT min(lo), max(hi) FROM ({parts})").fetchone()


def _trim_to_size(conn: sqlite3.Connection, max_bytes: int, width: float) -> int:
    """Delete oldest samples (downsampled first) until the data fits; returns rows deleted."""
    dropped = 0
    for raw in (False, True):
        cond = "res = 0" if raw else "res > 0"
        while used_bytes(conn) > max_bytes:
            lo, hi = _span(conn, raw)
            if lo is None:
                break
            chunk = max((hi - lo) / 10.0, width, 1.0)
            for kind in _present(conn):
                cur = conn.execute(f"DELETE FROM {kind.table} WHERE {cond} AND ts < ?",
                                   (lo + chunk,))
                dropped += max(cur.rowcount, 0)
    return dropped


def apply_retention(conn: sqlite3.Connection, now: float | None, retention_s: float,
                    width: float, max_bytes: int) -> tuple[int, int, int]:
    """Steps 1 and 2 on ``conn``, inside the caller's write transaction: fold raw samples
    older than ``retention_s`` before ``now`` (default: the newest sample's timestamp) into
    ``width``-second buckets, then delete the oldest samples until the data fits
    ``max_bytes``. Returns (raw rows folded, buckets written, rows deleted for size).

    Using the newest sample rather than the wall clock keeps a replayed or copied run intact.
    """
    ref = now
    if ref is None:
        ref = _span(conn, raw=True)[1]
    removed = added = 0
    if ref is not None and width > 0:
        cutoff = math.floor((ref - retention_s) / width) * width
        removed, added = _downsample(conn, cutoff, width)
    dropped = _trim_to_size(conn, max_bytes, width)
    return removed, added, dropped


def release_space(conn: sqlite3.Connection) -> None:
    """Step 3, outside any transaction: hand the free pages back and checkpoint the WAL."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # sqlite3.execute steps a statement once, which frees one page: executescript runs it out
    conn.executescript("PRAGMA incremental_vacuum;")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
