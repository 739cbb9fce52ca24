"""Read a local run store (the exporter's SQLite file) as a :class:`MetricSource`.

The store may not exist yet (the exporter has not started), may be empty (no sample yet), or
be written while we read (SQLite WAL: readers never block the writer). Each call opens the
store lazily and turns every failure into a :class:`SourceStatus` or a :class:`SourceError`.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np
import pandas as pd

from dashboards.sources.base import (
    NCCL_COLUMNS,
    SourceError,
    SourceStatus,
    fleet_from_gpu,
    node_summary_from_gpu,
    rollout_view,
)
from monitor.api import (
    GPU_COLUMNS,
    HOST_COLUMNS,
    MAX_ENVELOPE,
    MIN_ENVELOPE,
    Flag,
    StepRecord,
    bucket_seconds,
    downsample,
)

#: Buckets per cached chunk of a long window (see ``StoreSource._sql_buckets``).
CHUNK_BUCKETS = 100
#: A chunk that ended this long before the newest sample is complete (late samples included).
SEAL_MARGIN_S = 30.0
#: Chunks kept in memory per source (each is a few hundred rows).
MAX_CHUNKS = 2048

_GPU_VALUES = [c for c in GPU_COLUMNS if c not in ("ts", "node", "gpu")]
_HOST_VALUES = [c for c in HOST_COLUMNS if c not in ("ts", "node")]


class StoreSource:
    """A :class:`~dashboards.sources.base.MetricSource` over ``RunStore(path)``."""

    kind = "store"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.label = f"store {self.path}"
        self._store = None
        self._lock = threading.Lock()
        self._chunks: dict[tuple, pd.DataFrame] = {}

    def _open(self):
        from monitor.api import RunStore, StoreError

        with self._lock:
            if self._store is not None:
                return self._store
            if not self.path.is_file():
                raise SourceError(f"store missing: {self.path}")
            try:
                self._store = RunStore(self.path, create=False)
            except (StoreError, sqlite3.Error, OSError) as exc:
                raise SourceError(f"store unreadable: {exc}") from exc
            return self._store

    def _call(self, method: str, *args, **kwargs):
        store = self._open()
        try:
            return getattr(store, method)(*args, **kwargs)
        except sqlite3.Error as exc:
            raise SourceError(f"store {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the underlying store."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    # ----------------------------------------------------------------- MetricSource
    def status(self) -> SourceStatus:
        """"store missing: PATH", "no data yet", or ok with the sample span."""
        try:
            rng = self.time_range()
        except SourceError as exc:
            return SourceStatus(False, str(exc))
        if rng is None:
            return SourceStatus(False, "no data yet")
        return SourceStatus(True, f"{self.label}: {(rng[1] - rng[0]) / 60:.1f} min of data")

    def time_range(self) -> tuple[float, float] | None:
        """(oldest, newest) time over samples, steps and events, or None when empty."""
        lo, hi = self._call("time_range")
        if lo is None or hi is None:
            return None
        return float(lo), float(hi)

    def nodes(self) -> list[str]:
        """Node names seen in the GPU samples (or the store's meta)."""
        meta = self._call("meta")
        listed = meta.get("nodes") or ([meta["node"]] if meta.get("node") else [])
        if listed:
            return sorted(str(n) for n in listed)
        rng = self.time_range()
        if rng is None:
            return []
        tail = self._call("gpu_frame", rng[1] - 120, rng[1])
        return sorted(tail["node"].astype(str).unique().tolist())

    def gpu_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """GPU samples in the window, about ``max_points`` per GPU (bucketed inside SQLite
        when the window is long, so six hours of 1 s samples never cross into Python)."""
        width = bucket_seconds(start, end, max_points)
        if width > 1:
            out = self._sql_buckets("gpu_samples", ["node", "gpu"], _GPU_VALUES, start, end,
                                    width, node)
            if out is not None:
                out["gpu"] = out["gpu"].astype("Int64")
                return out
        raw = self._call("gpu_frame", start, end, node)
        return downsample(raw, ["node", "gpu"], _GPU_VALUES, max_points, start, end)

    def host_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """Host samples in the window, about ``max_points`` per node."""
        width = bucket_seconds(start, end, max_points)
        if width > 1:
            out = self._sql_buckets("host_samples", ["node"], _HOST_VALUES, start, end, width,
                                    node)
            if out is not None:
                return out
        raw = self._call("host_frame", start, end, node)
        return downsample(raw, ["node"], _HOST_VALUES, max_points, start, end)

    def _sql_buckets(self, table: str, keys: list[str], values: list[str], start: float,
                     end: float, width: int, node: str | None) -> pd.DataFrame | None:
        """Mean and envelope per time bucket computed by SQLite (the same columns and bucket
        alignment as :func:`monitor.downsample.downsample`); None if the schema differs.

        The window is cut into aligned chunks of :data:`CHUNK_BUCKETS` buckets; a chunk that
        ended well before the newest sample never changes again and is kept in memory, so a
        live refresh of a six-hour window only aggregates its last chunk.
        """
        self._open()  # raises "store missing" / "store unreadable" first
        chunk = width * CHUNK_BUCKETS
        try:
            conn = sqlite3.connect(self.path, timeout=5.0)
        except sqlite3.Error:
            return None
        try:
            newest = conn.execute(f"SELECT max(ts) FROM {table}").fetchone()[0]
            if newest is None:
                return None
            sealed_before = float(newest) - SEAL_MARGIN_S
            parts = []
            c0 = int(start // chunk) * chunk
            while c0 <= end:
                ck = (table, node, width, c0)
                part = self._chunks.get(ck)
                if part is None:
                    part = self._aggregate(conn, table, keys, values, c0, c0 + chunk, width,
                                           node)
                    if c0 + chunk < sealed_before:
                        self._remember(ck, part)
                parts.append(part)
                c0 += chunk
        except sqlite3.OperationalError:
            return None
        finally:
            conn.close()
        df = pd.concat([p for p in parts if not p.empty] or parts[:1], ignore_index=True)
        lo = int(start // width) * width
        df = df[(df["ts"] >= lo) & (df["ts"] <= end)]
        return df.sort_values([*keys, "ts"], kind="stable").reset_index(drop=True)

    @staticmethod
    def _aggregate(conn: sqlite3.Connection, table: str, keys: list[str], values: list[str],
                   lo: float, hi: float, width: int, node: str | None) -> pd.DataFrame:
        cols = [f"avg({v}) AS {v}" for v in values]
        cols += [f"min({v}) AS {v}_min" for v in values if v in MIN_ENVELOPE]
        cols += [f"max({v}) AS {v}_max" for v in values if v in MAX_ENVELOPE]
        key_sql = ", ".join(keys)
        sql = (f"SELECT {key_sql}, CAST(ts / ? AS INTEGER) * ? AS ts, {', '.join(cols)} "
               f"FROM {table} WHERE ts >= ? AND ts < ?")
        params: list = [width, width, float(lo), float(hi)]
        if node is not None:
            sql += " AND node = ?"
            params.append(str(node))
        sql += f" GROUP BY {key_sql}, CAST(ts / ? AS INTEGER)"
        params.append(width)
        cur = conn.execute(sql, params)
        df = pd.DataFrame.from_records(cur.fetchall(), columns=[d[0] for d in cur.description])
        df["ts"] = df["ts"].astype(float)
        df["node"] = df["node"].astype(str)
        return df

    def _remember(self, key: tuple, part: pd.DataFrame) -> None:
        with self._lock:
            self._chunks[key] = part
            while len(self._chunks) > MAX_CHUNKS:
                self._chunks.pop(next(iter(self._chunks)))

    def steps(self, start: float | None = None, end: float | None = None) -> list[StepRecord]:
        """Steps that ended in the window, in step order."""
        steps = self._call("steps", start, end)
        return sorted(steps, key=lambda s: (s.step, s.end_time or 0.0))

    def flags(
        self, active_only: bool = False, start: float | None = None, end: float | None = None
    ) -> list[Flag]:
        """Stored flags overlapping the window, newest first."""
        flags = self._call("flags", active_only)
        if start is not None:
            flags = [f for f in flags if f.end is None or f.end >= start]
        if end is not None:
            flags = [f for f in flags if f.start <= end]
        return sorted(flags, key=lambda f: f.start, reverse=True)

    def ledger_seconds(self, start: float | None, end: float | None,
                       n_steps: int | None) -> tuple[dict[str, float] | None, int]:
        """GPU-seconds by cause of the last ``n_steps`` steps ending in the window (every
        step with None), as the exporter counted them (the ledger it kept in the store: the
        seconds behind ``verlmon_gpu_seconds_total``), and how many steps; ``(None, 0)`` for a
        store without them (the pages then compute the ledger from the samples)."""
        from monitor.api import cause_seconds, last_steps

        led = self.ledger_frame(start, end)
        if led.empty:
            return None, 0
        rows = last_steps(led, n_steps) if n_steps else led[~led["tail"].astype(bool)]
        return cause_seconds(rows), int(rows[["step", "end"]].drop_duplicates().shape[0])

    def ledger_frame(self, start: float | None, end: float | None) -> pd.DataFrame:
        """The ledger rows the exporter counted whose step ended in the window (empty for a
        store without them: written before the exporter kept them, or by another tool)."""
        try:
            return self._call("ledger", start, end)
        except SourceError as exc:
            if "no such table" in str(exc):
                return pd.DataFrame()
            raise

    def run_end(self):
        """The run's end as the exporter saw it (``RunEnd``: its time, last step and what
        said so), or None while it goes on."""
        from monitor.api import RunEnd

        done = self._call("meta").get("run_finished")
        if not isinstance(done, dict) or done.get("time") is None:
            return None
        step = done.get("step")
        return RunEnd(float(done["time"]), None if step is None else int(step),
                      str(done.get("reason") or ""))

    def events(self, start: float | None = None, end: float | None = None) -> list:
        """Log events (OOM, traceback, resume...) in the window."""
        return self._call("events", start, end)

    def hang_culprits(self, start: float, end: float) -> pd.DataFrame:
        """The newest ``hang_dump`` round's culprits of each node in the window."""
        from dashboards.sources.base import culprits_from_events

        return culprits_from_events(self.events(start, end))

    def pending_flags(self, start: float | None = None, end: float | None = None) -> list:
        """Nothing: the run store holds the detectors' own verdicts, none of them waits to page."""
        return []

    def jobs(self) -> list[str]:
        """Nothing: a run store holds one run."""
        return []

    def phase_activity(self, start: float, end: float) -> pd.DataFrame:
        """Empty: the pages attribute the store's 1 s samples to the phases themselves."""
        return pd.DataFrame()

    def nccl_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """NCCL samples bucketed per (node, coll): share of wall time, bytes/s, bus bandwidth."""
        raw = self._call("nccl_frame", start, end)
        if raw.empty:
            return pd.DataFrame(columns=list(NCCL_COLUMNS))
        width = bucket_seconds(start, end, max_points, floor_s=_sample_period(raw))
        raw = raw.copy()
        raw["ts"] = np.floor(raw["ts"] / width) * width
        g = raw.groupby(["node", "coll", "ts"], observed=True)
        out = pd.DataFrame(
            {
                "exec_share": g["exec_s"].sum() / width,
                "bytes_per_s": g["bytes"].sum() / width,
                "busbw_bps": g["busbw_bps"].mean(),
            }
        ).reset_index()
        out["rank"] = np.nan
        return out[list(NCCL_COLUMNS)].sort_values(["node", "coll", "ts"]).reset_index(drop=True)

    def node_summary(self, start: float, end: float) -> pd.DataFrame:
        """One row per node, aggregated from the GPU and host samples of the window."""
        # the same buckets the GPU page uses, so their cached chunks serve both
        gpu = self.gpu_frame(start, end, max_points=1000)
        host = self.host_frame(start, end, max_points=1000)
        if "mem_used_bytes_max" in gpu.columns:
            gpu = gpu.assign(mem_used_bytes=gpu["mem_used_bytes_max"])
        return node_summary_from_gpu(gpu, host)

    def node_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """Mean GPU utilization per node over time."""
        gpu = self.gpu_frame(start, end, max_points)
        if gpu.empty:
            return pd.DataFrame(columns=["ts", "node", "util"])
        out = gpu.groupby(["node", "ts"], observed=True)["util"].mean().reset_index()
        return out[["ts", "node", "util"]]

    def fleet_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """Mean and lowest utilization across GPUs over time."""
        return fleet_from_gpu(self.gpu_frame(start, end, max_points, node))

    def rollout_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """Rollout-engine samples bucketed per server (``ROLLOUT_VIEW_COLUMNS``)."""
        raw = self._call("rollout_frame", start, end)
        width = bucket_seconds(start, end, max_points, floor_s=_sample_period(raw)) \
            if not raw.empty else 1.0
        return rollout_view(raw, width)


def _sample_period(df: pd.DataFrame) -> float:
    """Typical spacing of a sample table's timestamps (1 s when unknown)."""
    ts = np.unique(df["ts"].to_numpy(dtype=float))
    if len(ts) < 2:
        return 1.0
    return float(max(np.median(np.diff(ts)), 1.0))
