"""Detector building blocks: severity bands, flag construction, step ranges in evidence."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from monitor.detect.detector_base import make_flag, severity_for, step_range, steps_text
from monitor.detect.persistence import Episode


def test_severity_bands_in_both_directions():
    assert [severity_for(v, 0.3, 0.5) for v in (0.1, 0.3, 0.49, 0.5, 0.9)] == [
        "info", "warning", "warning", "critical", "critical"]
    # lower is worse, e.g. utilization
    assert [severity_for(v, 40, 20, higher_is_worse=False) for v in (80, 40, 25, 20, 5)] == [
        "info", "warning", "warning", "critical", "critical"]
    assert severity_for(math.nan, 0.3, 0.5) == "info"


def test_make_flag_attaches_advice_and_drops_empty_scope_entries():
    flag = make_flag("io_starvation", "warning", 10, None,
                     {"node": "n0", "gpus": [], "phase": None, "steps": [3, 9]}, "iowait 40%")
    assert flag.scope == {"node": "n0", "steps": [3, 9]}
    assert flag.start == 10.0 and flag.end is None
    assert any("data.dataloader_num_workers" in a for a in flag.advice)


def test_step_range_and_its_text():
    steps = pd.Series([40, 41, 42, 43, np.nan])
    assert step_range(steps, Episode(onset=1, opened=2, last=3, closed=None)) == [41, 43]
    assert step_range(steps, Episode(onset=1, opened=2, last=4, closed=None)) is None
    assert steps_text([41, 60]) == "steps 41-60"
    assert steps_text([41, 41]) == "step 41"
    assert steps_text(None) == ""


def test_context_signatures_per_step_phase_and_gpu_for_the_ledger_and_the_evidence():
    """``Context.signatures``: one row per (step, phase, node, gpu) with the means and the
    signature; the host's busiest core joins by node and time."""
    from detect_builders import make_gpu, make_host, make_steps

    from monitor.config import load_config
    from monitor.detect import make_context

    steps = make_steps(6, shares={"gen": 0.5, "reward": 0.2, "update_actor": 0.3})
    gpu = make_gpu(steps, n_gpus=2)
    ctx = make_context(steps, gpu, make_host(gpu, cpu_max=100.0), [], load_config())
    sig = ctx.signatures
    assert {"step", "phase", "node", "gpu", "signature", "cpu_max"} <= set(sig.columns)
    assert len(sig) == 6 * 3 * 2
    assert set(sig[sig["phase"] == "reward"]["signature"]) == {"cpu_bound"}
    assert set(sig[sig["phase"] == "update_actor"]["signature"]) == {"busy"}
    assert not ctx.pcie_measured  # the frame has no PCIe rates: quiet PCIe is no evidence
    assert ctx.verl_version == "unknown"
