"""Windows over the inputs that detectors share: steps as a table, GPU activity, time windows.

``activity`` is SM activity where a GPU reports it and NVML utilization where it does not,
per GPU, so every GPU detector works whether GPM is available or not.
"""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np
import pandas as pd

from monitor.records import ALL_PHASES, StepRecord

#: Phases that are not part of the training step proper (periodic by design, not a problem).
PERIODIC_PHASES: tuple[str, ...] = ("testing", "save_checkpoint")


def step_frame(steps: list[StepRecord]) -> pd.DataFrame:
    """Steps as one row each: step, start, end, total, throughput, memory peaks, phase columns.

    Rows without an end time are dropped; a step number seen twice (a resume) keeps the last.
    ``total`` falls back to the sum of the phases. ``start`` is ``end - total``.
    """
    rows = []
    for rec in steps:
        if rec.end_time is None:
            continue
        phases = {p: float(v) for p, v in rec.phases.items() if v is not None}
        total = rec.total if rec.total is not None else sum(phases.values()) or None
        row = {
            "step": int(rec.step),
            "end": float(rec.end_time),
            "total": float(total) if total is not None else np.nan,
            "throughput": np.nan if rec.throughput is None else float(rec.throughput),
            "mem_alloc": np.nan
            if rec.mem_allocated_peak_bytes is None
            else float(rec.mem_allocated_peak_bytes),
            "mem_reserved": np.nan
            if rec.mem_reserved_peak_bytes is None
            else float(rec.mem_reserved_peak_bytes),
            "data_wait": np.nan if rec.data_wait is None else float(rec.data_wait),
        }
        for name, val in phases.items():
            if name in ALL_PHASES:
                row[name] = val
        rows.append((row, None))
    if not rows:
        cols = ["step", "start", "end", "total", "throughput", "mem_alloc", "mem_reserved",
                "data_wait"]
        return pd.DataFrame(columns=cols, dtype=float)
    df = pd.DataFrame([r for r, _ in rows])
    df = df.sort_values("end", kind="stable").drop_duplicates("step", keep="last")
    df["start"] = df["end"] - df["total"].fillna(0.0)
    return df.reset_index(drop=True)


def step_metrics(steps: list[StepRecord], key: str) -> pd.Series:
    """One raw metric per step (NaN where absent or not a number), indexed by step number."""
    vals: dict[int, float] = {}
    for rec in steps:
        v = rec.metrics.get(key)
        if isinstance(v, (bool, np.bool_)):
            v = float(v)
        if isinstance(v, (int, float, np.integer, np.floating)):
            vals[int(rec.step)] = float(v)
    return pd.Series(vals, dtype=float).sort_index()


def phase(df: pd.DataFrame, name: str) -> pd.Series:
    """A phase column of a step frame (NaN where the phase is absent)."""
    if name in df.columns:
        return df[name].astype(float)
    return pd.Series(np.nan, index=df.index, dtype=float)


def core_total(df: pd.DataFrame) -> pd.Series:
    """Step time without the periodic testing and checkpoint phases."""
    total = df["total"].astype(float)
    for name in PERIODIC_PHASES:
        total = total - phase(df, name).fillna(0.0)
    return total


def activity(gpu: pd.DataFrame) -> pd.DataFrame:
    """GPU samples with ``act``: SM activity where the GPU reports it, else utilization.

    The choice is per GPU (node, gpu): a GPU whose sm_active is NaN throughout uses util.
    ``act_source`` says which ("sm" or "util").
    """
    if gpu is None or len(gpu) == 0:
        return pd.DataFrame(columns=["ts", "node", "gpu", "util", "sm_active", "act", "act_source"])
    df = gpu.copy()
    if "sm_active" not in df.columns:
        df["sm_active"] = np.nan
    df["node"] = df["node"].astype(str)
    has_sm = df.groupby(["node", "gpu"], sort=False)["sm_active"].transform(
        lambda s: s.notna().any()
    )
    df["act"] = np.where(has_sm, df["sm_active"], df["util"]).astype(float)
    # a GPU with SM activity that misses one sample falls back to util for that sample
    df["act"] = df["act"].where(df["act"].notna(), df["util"])
    df["act_source"] = np.where(has_sm, "sm", "util")
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def time_windows(t0: float, t1: float, length: float) -> pd.DataFrame:
    """Consecutive windows [start, end) of ``length`` seconds covering [t0, t1]."""
    if not np.isfinite(t0) or not np.isfinite(t1) or t1 <= t0 or length <= 0:
        return pd.DataFrame(columns=["start", "end"], dtype=float)
    starts = np.arange(t0, t1, length)
    return pd.DataFrame({"start": starts, "end": np.minimum(starts + length, t1)})


def assign_windows(ts: pd.Series, windows: pd.DataFrame) -> np.ndarray:
    """Index of the window holding each timestamp (-1 for none); windows sorted, not overlapping."""
    if len(windows) == 0 or len(ts) == 0:
        return np.full(len(ts), -1, dtype=int)
    starts = windows["start"].to_numpy(dtype=float)
    ends = windows["end"].to_numpy(dtype=float)
    t = ts.to_numpy(dtype=float)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = (idx >= 0) & (t < ends[np.clip(idx, 0, len(ends) - 1)])
    return np.where(ok, idx, -1)


def rolling_baseline(
    values: pd.Series, window: int, min_periods: int = 3
) -> tuple[pd.Series, pd.Series]:
    """Median and MAD of the previous ``window`` values (the current one excluded), NaN-aware."""
    arr = values.to_numpy(dtype=float)
    n = len(arr)
    if n == 0:
        empty = pd.Series(dtype=float, index=values.index)
        return empty, empty.copy()
    window = max(1, int(window))
    prev = np.concatenate([np.full(window, np.nan), arr[:-1]]) if n > 1 else np.full(window, np.nan)
    prev = prev[: window + n - 1] if n > 1 else prev
    views = np.lib.stride_tricks.sliding_window_view(prev, window)[:n]
    counts = np.sum(~np.isnan(views), axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(views, axis=1)
        mad = np.nanmedian(np.abs(views - med[:, None]), axis=1)
    ok = counts >= min_periods
    med = np.where(ok, med, np.nan)
    mad = np.where(ok, mad, np.nan)
    return pd.Series(med, index=values.index), pd.Series(mad, index=values.index)


def frozen_baseline(
    values: pd.Series,
    window: int,
    min_periods: int,
    is_outlier,
) -> tuple[pd.Series, pd.Series]:
    """Median and MAD of the last ``window`` accepted values; outliers never enter the history.

    ``is_outlier(value, median, mad) -> bool`` decides each value against the history before
    it. A lasting jump therefore stays an outlier against the healthy baseline instead of
    becoming the new normal after half a window.
    """
    hist: list[float] = []
    meds = np.full(len(values), np.nan)
    mads = np.full(len(values), np.nan)
    for i, v in enumerate(values.to_numpy(dtype=float).tolist()):
        recent = hist[-window:]
        if len(recent) >= min_periods:
            med = statistics.median(recent)
            meds[i] = med
            mads[i] = statistics.median([abs(x - med) for x in recent])
        if math.isnan(v):
            continue
        if math.isnan(meds[i]) or not is_outlier(v, float(meds[i]), float(mads[i])):
            hist.append(v)
    return pd.Series(meds, index=values.index), pd.Series(mads, index=values.index)


def latest_time(
    steps: list[StepRecord], gpu: pd.DataFrame, host: pd.DataFrame, events: list
) -> float | None:
    """The latest timestamp in any input (the default ``now``)."""
    cands: list[float] = []
    cands += [s.end_time for s in steps if s.end_time is not None]
    for df in (gpu, host):
        if df is not None and len(df) and "ts" in df.columns:
            v = pd.to_numeric(df["ts"], errors="coerce").max()
            if pd.notna(v):
                cands.append(float(v))
    cands += [e.time for e in events if getattr(e, "time", None) is not None]
    return max(cands) if cands else None
