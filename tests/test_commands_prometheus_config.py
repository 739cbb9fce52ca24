"""``verl-monitor prometheus-config``: a job's file_sd targets and a config that reads them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cli.main import main

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


def test_a_named_target_keeps_its_node_and_two_on_one_host_stay_two(tmp_path: Path) -> None:
    d = tmp_path / "targets"
    assert main(["prometheus-config", "--job", "j", "--no-ask", "--targets-dir", str(d),
                 "--targets", "node-a=127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"]) == 0
    groups = json.loads((d / "j.json").read_text())
    # before: every target on 127.0.0.1 was node "127.0.0.1" (one node for three exporters)
    assert [g["labels"]["node"] for g in groups] == ["node-a", "127.0.0.1:9102",
                                                     "127.0.0.1:9103"]


@pytest.mark.parametrize("targets", ["=127.0.0.1:1", "a=", "a=b=c:1"])
def test_a_bad_named_target_is_one_line_and_exit_2(tmp_path: Path, capsys, targets) -> None:
    assert main(["prometheus-config", "--job", "j", "--no-ask", "--targets", targets,
                 "--targets-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "NODE=HOST[:PORT]" in err and "\n" not in err


def test_one_node_named_for_two_exporters_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["prometheus-config", "--job", "j", "--no-ask", "--targets-dir", str(tmp_path),
                 "--targets", "n=h1:1,n=h2:1"]) == 2
    assert "named for two exporters" in capsys.readouterr().err


@pytest.mark.slow
def test_the_exporters_are_asked_their_node_names(tmp_path: Path) -> None:
    """Two real exporters on 127.0.0.1 (``--node node-a``, ``--node node-b``): the targets
    file names them as they name themselves."""
    import socket
    import sys
    import time

    from cli.commands.prometheus_config import _ask_node

    cli = str(Path(sys.executable).parent / "verl-monitor")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    procs = [subprocess.Popen(
        [cli, "exporter", "--listen-address", f"127.0.0.1:{port}", "--node", node,
         "--gpu-backend", "sim", "--sim-gpus", "1", "--no-collector.verl_log",
         "--store", str(tmp_path / f"{node}.db")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node, port in zip(("node-a", "node-b"), ports, strict=True)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(_ask_node(f"127.0.0.1:{p}")
                                                      for p in ports):
            time.sleep(0.5)
        d = tmp_path / "targets"
        assert main(["prometheus-config", "--job", "j", "--targets-dir", str(d), "--targets",
                     ",".join(f"127.0.0.1:{p}" for p in ports)]) == 0
        groups = json.loads((d / "j.json").read_text())
        assert [(g["labels"]["node"], g["targets"]) for g in groups] == [
            ("node-a", [f"127.0.0.1:{ports[0]}"]), ("node-b", [f"127.0.0.1:{ports[1]}"])]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
