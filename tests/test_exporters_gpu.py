"""The backend factory: names, the default, and options passed through."""

from __future__ import annotations

import pytest

from exporters.gpu import BACKENDS, default_backend_name, make_backend
from exporters.options import ExporterOptions


def test_default_is_nvml_never_silently_sim(monkeypatch):
    monkeypatch.delenv("VERLMON_GPU_BACKEND", raising=False)
    assert default_backend_name() == "nvml"
    monkeypatch.setenv("VERLMON_GPU_BACKEND", "bogus")
    assert default_backend_name() == "nvml"


def test_environment_can_choose_sim(monkeypatch):
    monkeypatch.setenv("VERLMON_GPU_BACKEND", "SIM")
    assert default_backend_name() == "sim"
    assert set(BACKENDS) == {"nvml", "sim"}


def test_sim_backend_from_exporter_options():
    opts = ExporterOptions(scenario="healthy", sim_gpus=5, seed=1, node="node0")
    backend = make_backend("sim", opts)
    assert backend.name == "sim"
    assert len(backend.devices()) == 5
    assert len(backend.sample()) == 5
    backend.close()


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="nvml, sim"):
        make_backend("rocm", None)
