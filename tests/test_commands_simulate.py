"""``verl-monitor simulate`` end to end: files, exit codes, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main


def test_simulate_writes_the_four_files_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "--scenario", "gpu_imbalance", "--steps", "9", "--gpus-per-node", "2",
               "--verl-version", "0.9", "--jsonl", "--timestamps", "--seed", "3",
               "--out", str(out)])
    assert rc == 0
    for name in ("train.log", "train.jsonl", "gpu.csv", "host.csv", "truth.json"):
        assert (out / name).stat().st_size > 0
    truth = json.loads((out / "truth.json").read_text())
    assert truth["verl_version"] == "0.9" and truth["seed"] == 3
    assert [e["kind"] for e in truth["truth"]] == ["gpu_imbalance"]
    assert "TaskRunnerV1" in (out / "train.log").read_text()
    assert "9 steps" in capsys.readouterr().out


def test_unknown_scenario_exits_2_with_one_line_listing_valid_ones(tmp_path, capsys):
    rc = main(["simulate", "--scenario", "meltdown", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "unknown scenario 'meltdown'" in err[0] and "io_starvation" in err[0]
    assert not (tmp_path / "x").exists()


def test_unknown_version_exits_2(tmp_path, capsys):
    rc = main(["simulate", "--verl-version", "1.0", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown verl version '1.0'" in err and "0.4.1" in err


def test_unwritable_output_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["simulate", "--steps", "2", "--gpus-per-node", "1", "--out", str(blocker / "o")])
    assert rc == 2 and "cannot write" in capsys.readouterr().err


def test_list_prints_every_scenario(capsys):
    assert main(["simulate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "rollout_long_tail" in out


@pytest.mark.slow
def test_console_script_runs(tmp_path):
    exe = Path(sys.executable).with_name("verl-monitor")
    proc = subprocess.run(
        [str(exe), "simulate", "--scenario", "oom", "--steps", "6", "--gpus-per-node", "1",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "CUDA out of memory" in (tmp_path / "o" / "train.log").read_text()
    bad = subprocess.run([str(exe), "simulate", "--scenario", "nope", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_a_trainer_mode_writes_the_engines_series_too(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "--scenario", "io_starvation", "--steps", "6", "--trainer-mode",
               "fully_async", "--out", str(out)])
    assert rc == 0 and "fully_async trainer" in capsys.readouterr().out
    truth = json.loads((out / "truth.json").read_text())
    assert truth["mode"] == "fully_async"
    header = (out / "rollout.csv").read_text().splitlines()[0]
    assert header.startswith("ts,node,server,engine,model,kv_cache_usage,running,waiting")
    assert "fully_async/trainer/idle_ratio" in (out / "train.log").read_text()
    rc = main(["simulate", "--scenario", "healthy", "--steps", "3", "--out", str(tmp_path / "s")])
    assert rc == 0 and not (tmp_path / "s" / "rollout.csv").exists()
    rc = main(["simulate", "--trainer-mode", "agent_loop", "--verl-version", "0.5",
               "--out", str(tmp_path / "x")])
    assert rc == 2 and "verl 0.6 or later" in capsys.readouterr().err
