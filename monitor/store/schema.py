"""The run store's SQLite schema, versioned with ``PRAGMA user_version``.

Sample tables carry a ``res`` column: 0 for raw samples, the bucket width in seconds for rows
that retention has downsampled. Steps, events and flags are never downsampled or dropped.
"""

from __future__ import annotations

import sqlite3

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS

#: Bump when the schema changes; ``migrate`` brings older files up to date.
#: 2: steps keyed by (step, end_key, source) with a content fingerprint ``fp`` (a step read
#: twice is stored once); ``log_positions``, where each followed log was read up to.
#: 3: ``ledger``, the exporter's goodput ledger of each step and GPU as it counted it (the
#: seconds behind ``verlmon_gpu_seconds_total``), so the dashboard on a store reads the very
#: numbers Prometheus has.
SCHEMA_VERSION = 3

#: NCCL sample columns, in the order ``nccl_frame`` returns them.
NCCL_COLUMNS: tuple[str, ...] = ("ts", "node", "coll", "comm", "ops", "bytes", "exec_s", "busbw_bps")

_TEXT_COLUMNS = {"node", "coll", "comm"}
_INT_COLUMNS = {"gpu"}


def _column_defs(columns: tuple[str, ...]) -> str:
    defs = []
    for col in columns:
        if col in _TEXT_COLUMNS:
            defs.append(f"{col} TEXT NOT NULL")
        elif col in _INT_COLUMNS:
            defs.append(f"{col} INTEGER")
        elif col == "ts":
            defs.append("ts REAL NOT NULL")
        else:
            defs.append(f"{col} REAL")
    defs.append("res REAL NOT NULL DEFAULT 0")
    return ", ".join(defs)


#: The steps table's columns before ``source`` (the same in every version).
_STEP_COLUMNS = """step INTEGER NOT NULL, end_key REAL NOT NULL, end_time REAL, total REAL,
    phases TEXT NOT NULL, throughput REAL, mem_allocated_peak_bytes REAL,
    mem_reserved_peak_bytes REAL, metrics TEXT NOT NULL, time_source TEXT"""

_SCHEMA_V1 = f"""
CREATE TABLE IF NOT EXISTS gpu_samples ({_column_defs(GPU_COLUMNS)});
CREATE INDEX IF NOT EXISTS gpu_samples_ts ON gpu_samples (ts);
CREATE TABLE IF NOT EXISTS host_samples ({_column_defs(HOST_COLUMNS)});
CREATE INDEX IF NOT EXISTS host_samples_ts ON host_samples (ts);
CREATE TABLE IF NOT EXISTS nccl_samples ({_column_defs(NCCL_COLUMNS)});
CREATE INDEX IF NOT EXISTS nccl_samples_ts ON nccl_samples (ts);
CREATE TABLE IF NOT EXISTS steps ({_STEP_COLUMNS}, source TEXT, PRIMARY KEY (step, end_key));
CREATE INDEX IF NOT EXISTS steps_end ON steps (end_time);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    time REAL,
    kind TEXT NOT NULL,
    step INTEGER,
    message TEXT,
    data TEXT NOT NULL,
    dedupe TEXT UNIQUE
);
CREATE INDEX IF NOT EXISTS events_time ON events (time);
CREATE TABLE IF NOT EXISTS flags (
    kind TEXT NOT NULL,
    scope_label TEXT NOT NULL,
    start REAL NOT NULL,
    severity TEXT NOT NULL,
    "end" REAL,
    scope TEXT NOT NULL,
    evidence TEXT,
    advice TEXT NOT NULL,
    updated REAL,
    PRIMARY KEY (kind, scope_label, start)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    sent_at REAL,
    next_attempt REAL NOT NULL DEFAULT 0,
    dedupe_key TEXT
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (sent_at, id);
CREATE INDEX IF NOT EXISTS outbox_dedupe ON outbox (dedupe_key, created);
"""


#: Version 1 -> 2: the steps table gains ``fp`` (unique) and ``source`` joins its key, so a
#: console and a JSONL record of one step never replace each other; followed logs' positions.
_UPGRADE_V2 = f"""
CREATE TABLE steps_v2 ({_STEP_COLUMNS}, source TEXT NOT NULL DEFAULT '', fp TEXT,
    PRIMARY KEY (step, end_key, source));
INSERT OR IGNORE INTO steps_v2 (step, end_key, end_time, total, phases, throughput,
    mem_allocated_peak_bytes, mem_reserved_peak_bytes, metrics, time_source, source)
    SELECT step, end_key, end_time, total, phases, throughput, mem_allocated_peak_bytes,
    mem_reserved_peak_bytes, metrics, time_source, COALESCE(source, '') FROM steps;
DROP TABLE steps;
ALTER TABLE steps_v2 RENAME TO steps;
CREATE INDEX IF NOT EXISTS steps_end ON steps (end_time);
CREATE UNIQUE INDEX IF NOT EXISTS steps_fp ON steps (fp);
CREATE TABLE IF NOT EXISTS log_positions (
    path TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    head_len INTEGER NOT NULL,
    head_hash TEXT NOT NULL,
    updated REAL
);
"""


#: Version 2 -> 3: the goodput ledger as the exporter counted it, one row per step and GPU:
#: the wall interval, and the GPU-seconds of each cause that got any (JSON).
_UPGRADE_V3 = """
CREATE TABLE IF NOT EXISTS ledger (
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    step INTEGER NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    tail INTEGER NOT NULL DEFAULT 0,
    wall REAL NOT NULL,
    causes TEXT NOT NULL,
    PRIMARY KEY (node, gpu, step, "end")
);
CREATE INDEX IF NOT EXISTS ledger_end ON ledger ("end");
"""


def add_missing_gpu_columns(conn: sqlite3.Connection) -> list[str]:
    """Add the GPU sample columns a store written before them lacks (issue 23: PCIe and NVLink
    rates), as nullable REAL columns; returns the names added. Old rows read as NaN there.

    Additive and idempotent, so it runs on every open, whatever ``user_version`` says.
    """
    return add_missing_columns(conn, "gpu_samples", GPU_COLUMNS)


def add_missing_host_columns(conn: sqlite3.Connection) -> list[str]:
    """The same for host samples (issue 23: the training process tree's resident memory)."""
    return add_missing_columns(conn, "host_samples", HOST_COLUMNS)


def add_missing_columns(conn: sqlite3.Connection, table: str,
                        columns: tuple[str, ...]) -> list[str]:
    """Add the ``columns`` that ``table`` lacks as nullable REAL columns; the names added."""
    have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    if not have:
        return []
    added = []
    for col in columns:
        if col not in have:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {col} REAL")
            except sqlite3.OperationalError as exc:  # another process added it meanwhile
                if "duplicate column" not in str(exc):
                    raise
                continue
            added.append(col)
    return added


class SchemaError(RuntimeError):
    """The file is not a run store this version can read."""


def check(conn: sqlite3.Connection) -> None:
    """Raise SchemaError for a file this version must not touch: another program's SQLite
    database, or a run store written by a newer verl-monitor."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"store schema version {version} is newer than this verl-monitor "
            f"understands ({SCHEMA_VERSION})"
        )
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if names and "gpu_samples" not in names:
        raise SchemaError("not a verl-monitor run store (it holds other tables)")


def migrate(conn: sqlite3.Connection) -> None:
    """Create the schema on an empty file or check the version of an existing one.

    A file written by a newer verl-monitor (higher ``user_version``) raises SchemaError rather
    than being changed.
    """
    check(conn)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        add_missing_gpu_columns(conn)
        add_missing_host_columns(conn)
        return
    # auto_vacuum must be set before the first table exists; it lets retention give space back.
    if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("BEGIN IMMEDIATE")
    try:  # read again under the lock: another process may have upgraded the file meanwhile
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        script = ((_SCHEMA_V1 if version < 1 else "") + (_UPGRADE_V2 if version < 2 else "")
                  + (_UPGRADE_V3 if version < 3 else ""))
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        add_missing_gpu_columns(conn)
        add_missing_host_columns(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
