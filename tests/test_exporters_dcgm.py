"""dcgm-exporter compatible series: DCGM names, units and labels from our readings."""

from __future__ import annotations

import pytest

from exporters.dcgm import LABELS, dcgm_families, latest_xid
from exporters.gpu.backend import GpuIdentity, GpuReading

MIB = 1024 * 1024


def _values(families) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for fam in families:
        for s in fam.samples:
            out.setdefault(s.name, {})[s.labels["gpu"]] = s.value
    return out


def _reading(**kw) -> GpuReading:
    base = dict(index=0, ts=1.0, util=0.5, sm_active=0.4, sm_occupancy=0.1, tensor_active=0.3,
                dram_active=0.2, mem_used_bytes=2048 * MIB, mem_total_bytes=8192 * MIB,
                power_w=300.0, energy_j=12.5, temperature_c=60.0, sm_clock_hz=1.98e9)
    base.update(kw)
    return GpuReading(**base)


IDS = {0: GpuIdentity(0, "GPU-aaa", "NVIDIA H200"), 1: GpuIdentity(1, "GPU-bbb", "NVIDIA H200")}


def test_units_are_dcgm_units():
    v = _values(dcgm_families([_reading()], IDS, "host-a"))
    assert v["DCGM_FI_DEV_GPU_UTIL"]["0"] == pytest.approx(50.0)
    assert v["DCGM_FI_DEV_FB_USED"]["0"] == pytest.approx(2048.0)
    assert v["DCGM_FI_DEV_FB_FREE"]["0"] == pytest.approx(6144.0)
    assert v["DCGM_FI_DEV_SM_CLOCK"]["0"] == pytest.approx(1980.0)
    assert v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["0"] == pytest.approx(12500.0)
    assert v["DCGM_FI_PROF_SM_ACTIVE"]["0"] == pytest.approx(0.4)
    assert v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]["0"] == pytest.approx(0.3)
    assert v["DCGM_FI_DEV_XID_ERRORS"]["0"] == 0.0


def test_labels_match_dcgm_exporter():
    fams = dcgm_families([_reading(index=1)], IDS, "host-a")
    sample = fams[0].samples[0]
    assert tuple(sample.labels) == LABELS
    assert sample.labels == {"gpu": "1", "UUID": "GPU-bbb", "device": "nvidia1",
                             "modelName": "NVIDIA H200", "Hostname": "host-a"}


def test_missing_fields_and_down_gpus_are_left_out():
    readings = [_reading(sm_active=None, tensor_active=None),
                GpuReading(index=1, ts=1.0, up=False, error="NVML: GPU is lost")]
    v = _values(dcgm_families(readings, IDS, "h"))
    assert "DCGM_FI_PROF_SM_ACTIVE" not in v
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in v
    assert set(v["DCGM_FI_DEV_GPU_UTIL"]) == {"0"}


def test_last_xid_is_reported():
    v = _values(dcgm_families([_reading()], IDS, "h", last_xid={0: 79}))
    assert v["DCGM_FI_DEV_XID_ERRORS"]["0"] == 79.0


def test_latest_xid_finds_the_code_that_grew():
    assert latest_xid({}, {}) is None
    assert latest_xid({79: 1}, {79: 1}) is None
    assert latest_xid({79: 1}, {79: 2, 48: 0}) == 79
    assert latest_xid({}, {13: 1, 48: 1}) == 48
