"""Hangs on a real H200, judged again offline: the recordings of ``bench/hang_scenarios.py``.

Each ``tests/fixtures/real_gpu/hang_*`` folder is one run on one H200 (torch 2.11, NCCL 2.28):
the exporter's store exported (steps as the exporter saw them arrive, NVML + GPM samples at
0.5 s, events including the ``hang_dump`` round the exporter took), its live flags, and
``hang_truth.json`` (the fault, the rank's PID, how fast the live exporter flagged and named it).
Two ranks share the one GPU through gloo (NCCL refuses two ranks on one GPU), so their dump
round is py-spy's; the one-rank kernel hang is named from its real Flight Recorder dump.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.commands.analyze import read_events
from monitor.config import load_config
from monitor.detect import run_all
from monitor.frames import read_gpu_frame, read_host_frame
from monitor.hang.dump import read_dump
from monitor.hang.localize import localize_dumps
from monitor.logs.canonical_records import parse_file

FIXTURES = Path(__file__).parent / "fixtures" / "real_gpu"
RUNS = sorted(p.name for p in FIXTURES.glob("hang_*") if (p / "hang_truth.json").exists())


def _offline(run: str):
    d = FIXTURES / run
    steps = parse_file(str(d / "train.jsonl")).steps
    gpu = read_gpu_frame(d / "gpu.csv")
    events = read_events(str(d / "events.json"))
    flags = run_all(steps, gpu, read_host_frame(d / "host.csv"), events, config=load_config(),
                    now=float(gpu["ts"].max()))
    return steps, flags, json.loads((d / "hang_truth.json").read_text())


def test_the_hang_recordings_are_here():
    assert {"hang_kernel_1gpu", "hang_stop_2rank_1gpu", "hang_validation_2rank_1gpu",
            "hang_checkpoint_2rank_1gpu"} <= set(RUNS)


@pytest.mark.parametrize("run", RUNS)
def test_each_hang_is_critical_within_90_s_and_names_the_rank_healthy_runs_stay_quiet(run):
    steps, flags, truth = _offline(run)
    alarms = [f for f in flags if f.severity in ("warning", "critical")]
    live = json.loads((FIXTURES / run / "flags_live.json").read_text())
    if truth["expect_rank"] is None:
        assert alarms == [] and live == []
        return
    assert [f.kind for f in alarms] == ["hang"] and alarms[0].severity == "critical"
    last_end = max(s.end_time for s in steps)
    assert alarms[0].start - last_end <= 90.0
    assert truth["detect_s"] <= 90.0 and truth["named_s"] <= 90.0  # as the live exporter did
    pid = truth["rank_pids"][truth["expect_rank"]]
    assert f"PID {pid})" in alarms[0].evidence
    others = [p for p in truth["rank_pids"] if p != pid]
    assert all(f"PID {p})" not in alarms[0].evidence.split("Waiting:")[0] for p in others)
    assert [f["kind"] for f in live] == ["hang"] and f"PID {pid}" in live[0]["evidence"]


def test_the_real_dump_of_the_kernel_hang_names_rank_0_and_its_line():
    d = read_dump(FIXTURES / "hang_kernel_1gpu" / "fr" / "fr_0")
    loc = localize_dumps({0: d})
    assert [c.rank for c in loc.culprits] == [0]
    c = loc.culprits[0]
    assert "stuck in a kernel" in c.reason and c.collective == "nccl:all_reduce"
    assert c.frame.filename.endswith("bench/hang_job.py")
