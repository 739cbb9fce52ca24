"""End to end through the CLI: a fully-async trainer node that waits on its rollout pool.

``verl-monitor analyze`` (a real process) reads a log written by verl's own metric code
(tests/fixtures/verl_modes/) and GPU samples of the trainer's node that idle in every wait. It
must book the wait as a loss of its own (waiting_for_samples, never generation or low
activity), show each pool's share of GPU time, and warn that the trainer waits on the rollout
pool with the pool-split keys, without micro-batch advice for the wait.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "verl_modes" / "fully_async_trainer.jsonl"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _gpu_csv(tmp_path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from detect_builders import make_gpu

    from monitor.logs.canonical_records import parse_file

    steps = parse_file(FIXTURE).steps

    def idle_while_waiting(df):
        df.loc[df["phase"] == "gen", ["util", "sm_active"]] = 0.5

    path = tmp_path / "gpu.csv"
    make_gpu(steps, n_gpus=8, edit=idle_while_waiting).to_csv(path, index=False)
    return path


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monitor", "analyze", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_analyze_shows_the_wait_as_a_loss_and_warns_about_the_rollout_pool(tmp_path):
    gpu = _gpu_csv(tmp_path)
    res = _analyze(str(FIXTURE), "--gpu", str(gpu), "--rollout-gpus", "8")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "trainer: fully-async policy, trainer (separate rollout pool)" in out
    # the ledger: the wait is its own cause, in the GPU ledger and in the trainer pool's
    ledger = out.split("Where the GPU time went")[1].split("GPU time per pool")[0]
    assert "waiting_for_samples" in ledger
    pools = out.split("GPU time per pool")[1].split("Flags (")[0]
    assert "trainer pool (8 GPU(s), from GPU samples)" in pools
    assert "rollout pool (8 GPU(s), from log timers)" in pools
    assert "overall (16 GPUs" in pools
    # the warning, with the keys that split the pools
    flags = out.split("Flags (")[1]
    assert "pool_imbalance" in flags and "trainer waited for samples from the rollout pool" in flags
    for key in ("rollout.nnodes", "rollout.n_gpus_per_node", "trainer.n_gpus_per_node",
                "async_training.staleness_threshold"):
        assert key in flags
    assert "low_utilization" not in flags and "phase_imbalance" not in flags
    assert "ppo_micro_batch_size_per_gpu" not in flags


def test_analyze_json_carries_mode_pools_and_the_wait(tmp_path):
    res = _analyze(str(FIXTURE), "--gpu", str(_gpu_csv(tmp_path)), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["trainer_mode"] == "fully_async_trainer"
    lost = doc["goodput"]["lost"]
    assert lost["waiting_for_samples"] > 0.35 * doc["goodput"]["gpu_seconds_total"]
    assert lost["rollout_long_tail"] == 0.0
    trainer, rollout = doc["pools"]["pools"]
    assert trainer["pool"] == "trainer" and rollout["pool"] == "rollout"
    assert doc["pools"]["overall"] is None  # the rollout pool's GPU count was not given
    assert [f["kind"] for f in doc["flags"]] == ["pool_imbalance"]


def test_the_log_alone_is_enough_for_the_warning_and_the_pools(tmp_path):
    res = _analyze(str(ROOT / "tests" / "fixtures" / "verl_modes" / "fully_async_trainer.log"))
    assert res.returncode == 0, res.stderr
    assert "waiting_for_samples" in res.stdout.split("GPU time per pool")[1]
    assert "[CRITICAL] pool_imbalance" in res.stdout
