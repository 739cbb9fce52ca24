"""Retention for the run store: downsample old samples, then keep the file under its size cap.

1. Raw samples older than ``retention_s`` before the newest sample are replaced by one row per
   ``downsample_s`` bucket and series (GPU: node+gpu; host: node; NCCL: node+coll+comm):
   the mean of each value, except memory (the maximum, so peaks survive) and NCCL counts
   (ops, bytes, exec_s: the sum). Only whole buckets older than the cut are touched.
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

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS, ROLLOUT_COLUMNS
from monitor.store.schema import NCCL_COLUMNS

_SAMPLE_TABLES = ("gpu_samples", "host_samples", "nccl_samples", "rollout_samples")

#: (table, columns, group keys, aggregate per value column)
_PLANS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], dict[str, str]], ...] = (
    (
        "gpu_samples",
        GPU_COLUMNS,
        ("node", "gpu"),
        {"mem_used_bytes": "max", "mem_total_bytes": "max"},
    ),
    ("host_samples", HOST_COLUMNS, ("node",), {}),
    ("nccl_samples", NCCL_COLUMNS, ("node", "coll", "comm"), {"ops": "sum", "bytes": "sum",
                                                              "exec_s": "sum"}),
    # rollout engines: the fullest cache and the counters' last value per bucket
    ("rollout_samples", ROLLOUT_COLUMNS, ("node", "server", "engine", "model"),
     {"kv_cache_usage": "max", "preemptions_total": "max", "generation_tokens_total": "max",
      "sleeping": "max"}),
)


def _present(conn: sqlite3.Connection) -> set[str]:
    """The sample tables this file has (``rollout_samples`` appears with its first row)."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows} & set(_SAMPLE_TABLES)


def bucket_query(table: str, width: float) -> tuple[str, tuple[str, ...]]:
    """``(select list, group keys)`` that fold ``table`` rows into ``width``-second buckets.

    The bucket's timestamp is its start; values aggregate as retention does (mean; max for
    memory; sum for NCCL counts). Shared by ``compact`` and the stores' ``resample_s`` reads.
    """
    for name, columns, keys, aggs in _PLANS:
        if name != table:
            continue
        select = []
        for col in columns:
            if col == "ts":
                select.append(f"CAST(ts / {width!r} AS INTEGER) * {width!r} AS bucket")
            elif col in keys:
                select.append(col)
            else:
                select.append(f"{aggs.get(col, 'avg')}({col})")
        return ", ".join(select), ("bucket",) + keys
    raise ValueError(f"no bucket plan for table {table!r}")


def _downsample(conn: sqlite3.Connection, cutoff: float, width: float) -> tuple[int, int]:
    """Replace raw rows with ts < cutoff by bucket rows; returns (raw rows removed, rows added)."""
    removed = added = 0
    present = _present(conn)
    for table, columns, _keys, _aggs in _PLANS:
        if table not in present:
            continue
        select, group = bucket_query(table, width)
        cur = conn.execute(
            f"INSERT INTO {table} ({', '.join(columns)}, res) "
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
    present = _present(conn)
    parts = " UNION ALL ".join(
        f"SELECT min(ts) lo, max(ts) hi FROM {t} WHERE {cond}" for t in _SAMPLE_TABLES
        if t in present
    )
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
            for table in _present(conn):
                cur = conn.execute(f"DELETE FROM {table} WHERE {cond} AND ts < ?", (lo + chunk,))
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
