"""The telemetry interchange format (ARCHITECTURE.md): sample rows of each kind as data frames.

The exporter's store writes it, ``verl-monitor export`` dumps it as CSV, ``analyze`` and the
detectors read it. The kinds and their columns are fixed once, in monitor/telemetry_kinds.py
(re-exported here: ``GPU_COLUMNS``, ...); the functions here take a kind's name
(``empty_frame``, ``rows_frame``, ``read_frame``), with the older per-kind names as one-line
spellings of them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from monitor.telemetry_kinds import (
    GPU_COLUMNS,
    GPU_REQUIRED,
    HOST_COLUMNS,
    HOST_REQUIRED,
    KIND,
    NCCL_COLUMNS,
    NCCL_REQUIRED,
    ROLLOUT_COLUMNS,
    ROLLOUT_REQUIRED,
    TelemetryKind,
)

__all__ = [  # the columns live in monitor/telemetry_kinds.py; importers read them from here
    "GPU_COLUMNS", "GPU_REQUIRED", "HOST_COLUMNS", "HOST_REQUIRED", "NCCL_COLUMNS",
    "NCCL_REQUIRED", "ROLLOUT_COLUMNS", "ROLLOUT_REQUIRED", "FrameError", "cast_columns",
    "empty_frame", "kind_frame", "read_frame", "rows_frame", "write_frame",
    "empty_gpu_frame", "empty_host_frame", "empty_nccl_frame", "empty_rollout_frame",
    "nccl_frame", "rollout_frame",
    "read_gpu_frame", "read_host_frame", "read_nccl_frame", "read_rollout_frame",
]

#: Columns kept as text in any kind; every other column is a number.
_TEXT_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(c for k in KIND.values() for c in k.text))


class FrameError(ValueError):
    """A telemetry file that cannot be read; the message names the file and the problem."""


def cast_columns(df: pd.DataFrame, columns: tuple[str, ...],
                 text: tuple[str, ...] = _TEXT_COLUMNS) -> pd.DataFrame:
    """The canonical dtypes, in place: the ``text`` columns (``node``, ``coll``, ``comm``, ...)
    str, ``gpu`` nullable Int64, every other column of ``columns`` float64 (the values must
    already be numbers or NaN)."""
    for col in text:
        if col in columns:
            df[col] = df[col].astype(str)
    for col in columns:
        if col not in ("gpu", *text):
            df[col] = df[col].astype("float64")
    if "gpu" in columns:
        df["gpu"] = df["gpu"].astype("Int64")
    return df


def kind_frame(kind: str, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (values already numbers or NaN, e.g. read from the run store) with the canonical
    dtypes of ``kind`` (a key of ``monitor.telemetry_kinds.KIND``); empty: ``empty_frame``."""
    k = KIND[kind]
    return empty_frame(kind) if df.empty else cast_columns(df, k.columns, k.text)


def empty_frame(kind: str) -> pd.DataFrame:
    """An empty frame of ``kind`` with its canonical columns and dtypes."""
    k = KIND[kind]
    return _normalise(pd.DataFrame(columns=list(k.columns)), k)


def rows_frame(kind: str, rows: list[dict]) -> pd.DataFrame:
    """Sample rows of ``kind`` (dicts keyed by its columns, as the collectors make them) as its
    canonical frame, sorted by ``ts``: missing columns NaN. A kind that ``keeps_extras``
    (GPU, host) keeps the extra keys as columns after the canonical ones, values as given."""
    k = KIND[kind]
    if not k.keeps_extras:
        return _normalise(pd.DataFrame(rows), k) if rows else empty_frame(kind)
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(k.columns))
    for col in k.columns:
        if col not in df.columns:
            df[col] = float("nan")
    df = df[list(k.columns) + [c for c in df.columns if c not in k.columns]]
    for col in k.columns:
        if col in k.text:
            df[col] = df[col].astype(str)
        else:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "gpu" in k.columns:
        df["gpu"] = df["gpu"].astype("Int64")
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def read_frame(kind: str, path: str | Path) -> pd.DataFrame:
    """Read samples of ``kind`` (CSV or Parquet: ``verl-monitor export``, ``simulate``) into
    its canonical frame; raises FrameError (no file, unreadable, a required column missing)."""
    k = KIND[kind]
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        else:
            df = pd.read_csv(path, dtype={c: str for c in k.text})
    except FileNotFoundError as exc:
        raise FrameError(f"{path}: no such file") from exc
    except Exception as exc:  # noqa: BLE001 - any reader failure becomes one clear line
        raise FrameError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from exc
    missing = [c for c in k.required if c not in df.columns]
    if missing:
        raise FrameError(f"{path}: missing column(s) {', '.join(missing)}")
    return _normalise(df, k)


def _normalise(df: pd.DataFrame, kind: TelemetryKind) -> pd.DataFrame:
    columns = kind.columns
    for col in columns:
        if col not in df.columns:
            df[col] = float("nan")
    df = df[list(columns)].copy()
    for col in columns:
        if col not in kind.text:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    cast_columns(df, columns, kind.text)
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


# The per-kind spellings (many callers): one line each over the generic functions above.

def empty_gpu_frame() -> pd.DataFrame:
    """``empty_frame("gpu")``."""
    return empty_frame("gpu")


def empty_host_frame() -> pd.DataFrame:
    """``empty_frame("host")``."""
    return empty_frame("host")


def empty_nccl_frame() -> pd.DataFrame:
    """``empty_frame("nccl")``."""
    return empty_frame("nccl")


def empty_rollout_frame() -> pd.DataFrame:
    """``empty_frame("rollout")``."""
    return empty_frame("rollout")


def nccl_frame(rows: list[dict]) -> pd.DataFrame:
    """``rows_frame("nccl", rows)``: NCCL rows as the canonical frame."""
    return rows_frame("nccl", rows)


def rollout_frame(rows: list[dict]) -> pd.DataFrame:
    """``rows_frame("rollout", rows)``: rollout-engine rows as the canonical frame."""
    return rows_frame("rollout", rows)


def read_gpu_frame(path: str | Path) -> pd.DataFrame:
    """``read_frame("gpu", path)``: GPU samples; raises FrameError."""
    return read_frame("gpu", path)


def read_host_frame(path: str | Path) -> pd.DataFrame:
    """``read_frame("host", path)``: host samples; raises FrameError."""
    return read_frame("host", path)


def read_nccl_frame(path: str | Path) -> pd.DataFrame:
    """``read_frame("nccl", path)``: NCCL Inspector records (``nccl.csv``); raises FrameError."""
    return read_frame("nccl", path)


def read_rollout_frame(path: str | Path) -> pd.DataFrame:
    """``read_frame("rollout", path)``: rollout-engine samples (``rollout.csv``); raises
    FrameError."""
    return read_frame("rollout", path)


def write_frame(df: pd.DataFrame, path: str | Path) -> None:
    """Write a GPU or host frame as CSV (or Parquet when the path ends in .parquet)."""
    path = Path(path)
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)
