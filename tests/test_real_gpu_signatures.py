"""Issue 23's faults on a real H200, judged by their own kind and first line of advice.

Recorded with ``bench/gpu_scenarios.py --scenarios healthy,cpu_reward,offload,memory_creep`` on
one H200 (``bench/results/gpu_scenarios_2026-12-01_H200_1gpu_issue23.txt``); each folder under
``tests/fixtures/real_gpu`` holds the exporter's store exported (GPU samples with GPM PCIe
columns, host samples with the busiest core) and the job's truth.
"""

from __future__ import annotations

import pytest
from test_real_gpu import _first_step, _flags

CASES = {
    # run: (kind, phase, words of the first advice line, words of the evidence)
    "1gpu_cpu_reward": ("phase_imbalance", "reward", "reward.num_workers", "CPU-bound"),
    "1gpu_offload": ("phase_imbalance", "old_log_prob", "fsdp_config.param_offload=False",
                     "PCIe-bound"),
    "1gpu_memory_creep": ("memory_creep", None, "Memory that grows every step",
                          "out of memory in about"),
}


@pytest.mark.parametrize("run", sorted(CASES))
def test_each_fault_is_told_by_its_cause_first(run):
    kind, phase, advice, evidence = CASES[run]
    steps, flags = _flags(run)
    alarms = [f for f in flags if f.severity in ("warning", "critical") and f.kind == kind]
    assert alarms, [(f.kind, f.severity) for f in flags]
    f = alarms[0]
    if phase is not None:
        assert f.scope.get("phase") == phase
    assert advice in f.advice[0] and evidence in f.evidence
    assert _first_step(f.start, steps) <= 7  # the fault acts from step 4 (memory: step 3)


def test_advice_the_evidence_contradicts_is_not_shown():
    for run in ("1gpu_cpu_reward", "1gpu_offload"):
        _, flags = _flags(run)
        text = " ".join(a for f in flags for a in f.advice)
        assert "micro_batch_size" not in text and "use_dynamic_bsz" not in text, run
        assert "critic" not in text.lower(), run


def test_the_healthy_run_of_the_same_session_stays_quiet():
    _, flags = _flags("1gpu_healthy")
    assert [f for f in flags if f.severity in ("warning", "critical")] == []
