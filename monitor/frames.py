"""The telemetry interchange format (ARCHITECTURE.md): GPU and host samples as data frames.

The exporter's store writes it, ``verl-monitor export`` dumps it as CSV, ``analyze`` and the
detectors read it. Columns are fixed here, once.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

#: GPU samples. ``sm_active``, ``tensor_active``, ``dram_active``, ``power_w`` and the PCIe /
#: NVLink rates may be empty (NaN).
GPU_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "gpu",
    "util",
    "sm_active",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "tensor_active",
    "dram_active",
    # GPM link traffic, bytes per second (issue 23: the signature of offload copies and
    # collectives); optional: stores and CSVs written before them load with NaN here
    "pcie_tx_bps",
    "pcie_rx_bps",
    "nvlink_tx_bps",
    "nvlink_rx_bps",
)
GPU_REQUIRED: tuple[str, ...] = ("ts", "node", "gpu", "util", "mem_used_bytes", "mem_total_bytes")

#: Host samples. ``iowait_pct`` and ``disk_read_bps`` may be empty.
HOST_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "cpu_max_core_pct",
    "cpu_avg_pct",
    "iowait_pct",
    "disk_read_bps",
    # resident memory of the verl training process tree (the job's workers), bytes (issue 23:
    # host memory creep); optional: stores and CSVs written before it load with NaN here
    "train_rss_bytes",
)
HOST_REQUIRED: tuple[str, ...] = ("ts", "node", "cpu_max_core_pct", "cpu_avg_pct")

#: NCCL Inspector records as the store keeps them: per node, collective and communicator, the
#: operations, bytes and execution seconds (summed over the node's ranks) of one dump interval.
NCCL_COLUMNS: tuple[str, ...] = ("ts", "node", "coll", "comm", "ops", "bytes", "exec_s",
                                 "busbw_bps")
NCCL_REQUIRED: tuple[str, ...] = ("ts", "node", "coll", "exec_s")

#: Rollout-engine samples (vLLM / SGLang servers behind verl's agent loop), one row per server
#: and scrape: KV-cache use 0..1, requests running / waiting / paused, cumulative preemptions
#: (SGLang: retractions) and generated tokens, mean queue time and end-to-end latency since the
#: previous scrape, and ``sleeping`` (1 while the engine is asleep, NaN where it does not say).
ROLLOUT_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "server",
    "engine",
    "model",
    "kv_cache_usage",
    "running",
    "waiting",
    "paused",
    "preemptions_total",
    "generation_tokens_total",
    "queue_time_mean_s",
    "e2e_latency_mean_s",
    "sleeping",
)

#: Columns kept as text; every other column is a number.
_TEXT_COLUMNS = ("node", "coll", "comm", "server", "engine", "model")


class FrameError(ValueError):
    """A telemetry file that cannot be read; the message names the file and the problem."""


def empty_gpu_frame() -> pd.DataFrame:
    """An empty GPU frame with the canonical columns."""
    return _normalise(pd.DataFrame(columns=list(GPU_COLUMNS)), GPU_COLUMNS)


def empty_host_frame() -> pd.DataFrame:
    """An empty host frame with the canonical columns."""
    return _normalise(pd.DataFrame(columns=list(HOST_COLUMNS)), HOST_COLUMNS)


def empty_nccl_frame() -> pd.DataFrame:
    """An empty NCCL frame with the canonical columns."""
    return _normalise(pd.DataFrame(columns=list(NCCL_COLUMNS)), NCCL_COLUMNS)


def nccl_frame(rows: list[dict]) -> pd.DataFrame:
    """NCCL rows (dicts with NCCL_COLUMNS keys, as the exporter's collector makes them) as the
    canonical frame."""
    if not rows:
        return empty_nccl_frame()
    return _normalise(pd.DataFrame(rows), NCCL_COLUMNS)


def empty_rollout_frame() -> pd.DataFrame:
    """An empty rollout-engine frame with the canonical columns (ROLLOUT_COLUMNS)."""
    return _normalise(pd.DataFrame(columns=list(ROLLOUT_COLUMNS)), ROLLOUT_COLUMNS)


def rollout_frame(rows: list[dict]) -> pd.DataFrame:
    """Rollout-engine rows (dicts with ROLLOUT_COLUMNS keys, as the exporter's collector makes
    them) as the canonical frame, sorted by ``ts``."""
    if not rows:
        return empty_rollout_frame()
    return _normalise(pd.DataFrame(rows), ROLLOUT_COLUMNS)


def cast_columns(df: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """The canonical dtypes, in place: ``node`` (and ``coll``, ``comm``) str, ``gpu`` nullable
    Int64, every other column of ``columns`` float64 (the values must already be numbers or NaN)."""
    for col in _TEXT_COLUMNS:
        if col in columns:
            df[col] = df[col].astype(str)
    for col in columns:
        if col not in ("gpu", *_TEXT_COLUMNS):
            df[col] = df[col].astype("float64")
    if "gpu" in columns:
        df["gpu"] = df["gpu"].astype("Int64")
    return df


def _normalise(df: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    for col in columns:
        if col not in df.columns:
            df[col] = float("nan")
    df = df[list(columns)].copy()
    for col in columns:
        if col not in _TEXT_COLUMNS:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    cast_columns(df, columns)
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def _read(path: str | Path, columns: tuple[str, ...], required: tuple[str, ...]) -> pd.DataFrame:
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        else:
            df = pd.read_csv(path, dtype={c: str for c in _TEXT_COLUMNS})
    except FileNotFoundError as exc:
        raise FrameError(f"{path}: no such file") from exc
    except Exception as exc:  # noqa: BLE001 - any reader failure becomes one clear line
        raise FrameError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from exc
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise FrameError(f"{path}: missing column(s) {', '.join(missing)}")
    return _normalise(df, columns)


def read_gpu_frame(path: str | Path) -> pd.DataFrame:
    """Read GPU samples (CSV or Parquet) into the canonical frame; raises FrameError."""
    return _read(path, GPU_COLUMNS, GPU_REQUIRED)


def read_host_frame(path: str | Path) -> pd.DataFrame:
    """Read host samples (CSV or Parquet) into the canonical frame; raises FrameError."""
    return _read(path, HOST_COLUMNS, HOST_REQUIRED)


def read_nccl_frame(path: str | Path) -> pd.DataFrame:
    """Read NCCL Inspector records (``nccl.csv`` of ``verl-monitor export``); raises FrameError."""
    return _read(path, NCCL_COLUMNS, NCCL_REQUIRED)


def read_rollout_frame(path: str | Path) -> pd.DataFrame:
    """Read rollout-engine samples (``rollout.csv`` of ``verl-monitor export`` or
    ``simulate``); raises FrameError."""
    return _read(path, ROLLOUT_COLUMNS, ("ts", "server"))


def write_frame(df: pd.DataFrame, path: str | Path) -> None:
    """Write a GPU or host frame as CSV (or Parquet when the path ends in .parquet)."""
    path = Path(path)
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)
