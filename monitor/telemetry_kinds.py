"""One table of the sampled telemetry kinds: name, columns, store table, frame builder.

Every part that carries sample rows reads this table instead of a method per kind: the live
monitor's Recorder (monitor/live/live_monitor.py) hands rows of a kind to the rolling window
(monitor/live/rolling_window.py) and the store writer (monitor/store/writer.py), which buffers
them per kind and writes them to the kind's table (monitor/store/runstore.py). Adding a kind
is one entry here (and its columns in monitor/frames.py); the ``add_gpu`` / ``put_gpu`` names
stay as one-line spellings of ``add_rows("gpu", ...)`` / ``put_rows("gpu", ...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from monitor.frames import (
    GPU_COLUMNS,
    HOST_COLUMNS,
    NCCL_COLUMNS,
    ROLLOUT_COLUMNS,
    nccl_frame,
    rollout_frame,
)

_NAN = float("nan")


def sample_frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    """Canonical columns first (NaN where missing), then any extra keys the rows carried."""
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(columns))
    for col in columns:
        if col not in df.columns:
            df[col] = _NAN
    extras = [c for c in df.columns if c not in columns]
    df = df[list(columns) + extras]
    df["node"] = df["node"].astype(str)
    for col in columns:
        if col != "node":
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "gpu" in columns:
        df["gpu"] = df["gpu"].astype("Int64")
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class TelemetryKind:
    """One kind of sample rows.

    ``what`` names its rows in an error ("GPU rows"); ``table`` is its run-store table;
    ``create_on_use`` marks a table added after the first stores (created at its first row,
    so an older store keeps its schema); ``frame`` turns the window's rows into the canonical
    frame the detectors read."""

    name: str
    what: str
    columns: tuple[str, ...]
    table: str
    frame: Callable[[list[dict]], pd.DataFrame]
    create_on_use: bool = False


#: Every sampled kind, in the order they are written.
KINDS: tuple[TelemetryKind, ...] = (
    TelemetryKind("gpu", "GPU rows", GPU_COLUMNS, "gpu_samples",
                  lambda rows: sample_frame(rows, GPU_COLUMNS)),
    TelemetryKind("host", "host rows", HOST_COLUMNS, "host_samples",
                  lambda rows: sample_frame(rows, HOST_COLUMNS)),
    TelemetryKind("nccl", "NCCL rows", NCCL_COLUMNS, "nccl_samples", nccl_frame),
    TelemetryKind("rollout", "rollout-engine rows", ROLLOUT_COLUMNS, "rollout_samples",
                  rollout_frame, create_on_use=True),
)
#: The kinds by name.
KIND: dict[str, TelemetryKind] = {k.name: k for k in KINDS}
