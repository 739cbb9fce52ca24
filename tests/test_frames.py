"""The telemetry interchange format: CSV round trips, canonical dtypes, clear errors."""

from __future__ import annotations

import pandas as pd
import pytest

from monitor.frames import (
    GPU_COLUMNS,
    HOST_COLUMNS,
    FrameError,
    cast_columns,
    empty_gpu_frame,
    empty_host_frame,
    read_gpu_frame,
    read_host_frame,
    write_frame,
)


def _gpu_rows() -> pd.DataFrame:
    return pd.DataFrame({
        "ts": [2.0, 1.0, 3.0], "node": ["7", "7", "7"], "gpu": [1, 0, 1],
        "util": [0.9, 0.5, 0.8], "mem_used_bytes": [1e9, 2e9, 3e9],
        "mem_total_bytes": [8e10] * 3,
    })


def test_gpu_csv_round_trip_fills_optional_columns_and_sorts_by_time(tmp_path):
    path = tmp_path / "gpu.csv"
    write_frame(_gpu_rows(), path)
    df = read_gpu_frame(path)
    assert list(df.columns) == list(GPU_COLUMNS)
    assert df["ts"].tolist() == [1.0, 2.0, 3.0]
    # a numeric-looking node name stays a string; gpu is a nullable integer
    assert df["node"].tolist() == ["7", "7", "7"]
    assert str(df["gpu"].dtype) == "Int64"
    assert df["sm_active"].isna().all() and df["power_w"].dtype == "float64"


def test_garbage_values_become_nan_instead_of_failing(tmp_path):
    path = tmp_path / "host.csv"
    path.write_text("ts,node,cpu_max_core_pct,cpu_avg_pct,iowait_pct\n"
                    "1,n0,50,20,oops\n2,n0,60,25,3.5\n")
    df = read_host_frame(path)
    assert list(df.columns) == list(HOST_COLUMNS)
    assert pd.isna(df.loc[0, "iowait_pct"]) and df.loc[1, "iowait_pct"] == 3.5
    assert df["disk_read_bps"].isna().all()


def test_missing_required_column_names_the_file_and_the_column(tmp_path):
    path = tmp_path / "gpu.csv"
    write_frame(_gpu_rows().drop(columns=["util"]), path)
    with pytest.raises(FrameError, match=r"gpu\.csv: missing column\(s\) util"):
        read_gpu_frame(path)


def test_missing_and_unreadable_files_give_one_clear_error(tmp_path):
    with pytest.raises(FrameError, match="no such file"):
        read_gpu_frame(tmp_path / "absent.csv")
    bad = tmp_path / "binary.csv"
    bad.write_bytes(b"\x00\xff\xfe" * 10)
    with pytest.raises(FrameError, match="binary.csv"):
        read_host_frame(bad)


def test_cast_columns_gives_float64_everywhere_but_node_and_gpu():
    df = _gpu_rows()
    for col in GPU_COLUMNS:
        if col not in df.columns:
            df[col] = 0  # integers, as SQLite hands them back
    cast_columns(df, GPU_COLUMNS)
    assert pd.api.types.is_string_dtype(df["node"]) and str(df["gpu"].dtype) == "Int64"
    assert all(df[c].dtype == "float64" for c in GPU_COLUMNS if c not in ("node", "gpu"))


def test_empty_frames_have_the_canonical_columns():
    assert list(empty_gpu_frame().columns) == list(GPU_COLUMNS)
    assert list(empty_host_frame().columns) == list(HOST_COLUMNS)
    assert empty_gpu_frame().empty and empty_host_frame().empty


def test_nccl_csv_keeps_collective_and_communicator_as_text(tmp_path):
    from monitor.frames import read_nccl_frame

    path = tmp_path / "nccl.csv"
    path.write_text("ts,node,coll,comm,ops,bytes,exec_s,busbw_bps\n"
                    "2.0,n0,AllReduce,0x7f,8,1e9,0.5,3e11\n1.0,n0,Broadcast,unknown,2,x,0.1,\n")
    df = read_nccl_frame(path)
    assert df["coll"].tolist() == ["Broadcast", "AllReduce"]
    assert df["comm"].tolist() == ["unknown", "0x7f"]
    assert df["exec_s"].tolist() == [0.1, 0.5] and pd.isna(df["bytes"].iloc[0])


def test_a_gpu_csv_from_before_the_link_rates_still_loads(tmp_path):
    """gpu.csv files written before the PCIe/NVLink columns (every real recording up to
    issue 23) load with those columns empty."""
    path = tmp_path / "gpu.csv"
    path.write_text("ts,node,gpu,util,sm_active,mem_used_bytes,mem_total_bytes,power_w,"
                    "tensor_active,dram_active\n1.0,n,0,50,40,1,2,300,10,20\n")
    df = read_gpu_frame(path)
    assert list(df.columns) == list(GPU_COLUMNS)
    assert df[["pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps"]].isna().all().all()
