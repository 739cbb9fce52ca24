"""``verl-monitor prometheus-config``: a job's file_sd targets and a config that reads them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitor.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_writes_the_jobs_targets_and_removes_them(tmp_path: Path, capsys) -> None:
    d = tmp_path / "targets"
    assert main(["prometheus-config", "--job", "grpo-7b", "--targets",
                 "gpu-01, gpu-02:9100", "--targets-dir", str(d)]) == 0
    groups = json.loads((d / "grpo-7b.json").read_text())
    assert groups == [
        {"targets": ["gpu-01:9048"], "labels": {"node": "gpu-01", "job": "grpo-7b"}},
        {"targets": ["gpu-02:9100"], "labels": {"node": "gpu-02", "job": "grpo-7b"}},
    ]
    assert main(["prometheus-config", "--job", "grpo-7b", "--remove",
                 "--targets-dir", str(d)]) == 0
    assert list(d.iterdir()) == []
    assert "removed" in capsys.readouterr().out


def test_rendered_config_matches_the_shipped_one(tmp_path: Path) -> None:
    """Same cadence, the same relabelling, file_sd only, the runbook base as a label."""
    cfg_path = tmp_path / "prometheus.yml"
    assert main(["prometheus-config", "--job", "j", "--targets", "h:1",
                 "--targets-dir", str(tmp_path / "t"), "--config", str(cfg_path),
                 "--runbook-base", "https://git.example.org/ml/verl-monitor/blob/main/"]) == 0
    ours = yaml.safe_load(cfg_path.read_text())
    shipped = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    for key in ("scrape_interval", "evaluation_interval", "scrape_timeout"):
        assert ours["global"][key] == shipped["global"][key]
    assert ours["global"]["external_labels"]["runbook_base"] == (
        "https://git.example.org/ml/verl-monitor/blob/main/")
    assert set(ours["global"]["external_labels"]) == set(shipped["global"]["external_labels"])
    (job,) = ours["scrape_configs"]
    (shipped_job,) = shipped["scrape_configs"]
    assert job["relabel_configs"] == shipped_job["relabel_configs"]
    assert job["file_sd_configs"][0]["files"] == [str((tmp_path / "t").resolve() / "*.json")]
    assert [Path(p).name for p in ours["rule_files"]] == ["recording.yml", "alerts.yml"]
    assert all(Path(p).is_file() for p in ours["rule_files"])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_rendered_config_passes_promtool(tmp_path: Path) -> None:
    cfg_path = tmp_path / "prometheus.yml"
    assert main(["prometheus-config", "--job", "j", "--targets", "h:1",
                 "--targets-dir", str(tmp_path / "t"), "--config", str(cfg_path)]) == 0
    res = subprocess.run(["promtool", "check", "config", str(cfg_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("argv", "said"), [
    (["--job", "my job", "--targets", "h"], "--job 'my job': use letters"),
    (["--job", "j"], "--targets: give the job's exporters"),
    (["--job", "j", "--targets", "h:port"], "the port after ':' must be a number"),
    (["--job", "j", "--targets", "h", "--config", "c.yml", "--runbook-base", "docs/"],
     "--runbook-base 'docs/': expected an http(s) URL ending in /"),
    (["--job", "j", "--targets", "h", "--config", "c.yml", "--alertmanager", "am"],
     "--alertmanager 'am': expected HOST:PORT"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys, argv: list[str],
                                      said: str) -> None:
    code = main(["prometheus-config", "--targets-dir", str(tmp_path / "t"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t").exists()  # nothing written
