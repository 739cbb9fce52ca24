"""Server-side downsampling of sample frames to about ``max_points`` per series.

Every chart trace stays near 1,000 points however long the window is. Samples are grouped
into time buckets of a whole number of seconds, aligned to multiples of the bucket width (the
same alignment Prometheus uses for ``query_range`` steps, so both sources line up). Each
bucket keeps the mean of every value column, and an envelope so short events survive:
``<col>_min`` for activity columns (an idle dip is what matters there) and ``<col>_max`` for
memory and rates (a spike is what matters there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

#: Columns whose per-bucket minimum is kept (dips in activity must not vanish).
MIN_ENVELOPE: tuple[str, ...] = ("util", "sm_active", "cpu_avg_pct")
#: Columns whose per-bucket maximum is kept (spikes must not vanish).
MAX_ENVELOPE: tuple[str, ...] = (
    "mem_used_bytes",
    "cpu_max_core_pct",
    "iowait_pct",
    "power_w",
    "exec_s",
)


def bucket_seconds(start: float, end: float, max_points: int, floor_s: float = 1.0) -> int:
    """Bucket width so that ``[start, end]`` holds at most about ``max_points`` buckets.

    ``step = max(ceil(range / max_points), floor_s)``, the rule ANCHORS.md gives for
    Prometheus range queries (``floor_s`` is the scrape or sampling interval).
    """
    span = max(float(end) - float(start), 0.0)
    width = math.ceil(span / max(int(max_points), 1)) if span > 0 else 1
    return int(max(width, math.ceil(floor_s), 1))


def downsample(
    df: pd.DataFrame,
    keys: Sequence[str],
    values: Iterable[str],
    max_points: int = 1000,
    start: float | None = None,
    end: float | None = None,
) -> pd.DataFrame:
    """Reduce ``df`` to about ``max_points`` rows per series (one series per ``keys`` tuple).

    ``ts`` must be unix seconds. Returns the key columns, ``ts`` (bucket start), the mean of
    each column in ``values`` and the envelope columns described in the module docstring. A
    frame already small enough comes back with the same shape (envelope equal to the value).
    """
    values = [v for v in values if v in df.columns]
    keys = [k for k in keys if k in df.columns]
    if df.empty:
        out = df[[*keys, "ts", *values]].copy()
        for col in values:
            if col in _ENVELOPED:
                out[_env_name(col)] = pd.Series(dtype=float)
        return out
    lo = float(df["ts"].min()) if start is None else float(start)
    hi = float(df["ts"].max()) if end is None else float(end)
    width = bucket_seconds(lo, hi, max_points)
    per_series = len(df) / max(df.groupby(keys, sort=False).ngroups, 1) if keys else len(df)
    if per_series <= max_points and width <= 1:
        out = df[[*keys, "ts", *values]].copy()
        for col in values:
            if col in _ENVELOPED:
                out[_env_name(col)] = out[col]
        return out.reset_index(drop=True)
    work = df[[*keys, "ts", *values]].copy()
    work["ts"] = (np.floor(work["ts"].to_numpy(dtype=float) / width) * width).astype(float)
    group = work.groupby([*keys, "ts"], sort=True, observed=True, dropna=False)
    out = group[values].mean()
    for col in values:
        if col in MIN_ENVELOPE:
            out[_env_name(col)] = group[col].min()
        elif col in MAX_ENVELOPE:
            out[_env_name(col)] = group[col].max()
    return out.reset_index()


_ENVELOPED = set(MIN_ENVELOPE) | set(MAX_ENVELOPE)


def _env_name(col: str) -> str:
    return f"{col}_min" if col in MIN_ENVELOPE else f"{col}_max"

