"""``verl-monitor exporter`` as a real process: a simulated job, scraped, linted, stopped."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from monitor.store import RunStore

pytestmark = pytest.mark.e2e

CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
#: Packages a GPU node's Python may lack: the exporter must start without them.
NOT_ON_GPU_NODES = ("bcrypt", "slack_sdk", "streamlit", "wandb", "plotly")


def start(argv: list[str], tmp_path: Path, python_prelude: str | None = None):
    """Start the exporter; return (process, /metrics URL) once its startup line is out."""
    out = (tmp_path / "stdout.txt").open("w")
    err = (tmp_path / "stderr.txt").open("w")
    if python_prelude is None:
        cmd = [CLI, "exporter", *argv]
    else:
        cmd = [sys.executable, "-c",
               python_prelude + "\nfrom monitor.cli import main\nsys.exit(main(sys.argv[1:]))",
               "exporter", *argv]
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = (tmp_path / "stdout.txt").read_text()
        found = re.search(r"serving (http\S+/metrics)", text)
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise AssertionError(f"exporter exited {proc.returncode}: "
                                 f"{(tmp_path / 'stderr.txt').read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("no startup line within 60 s")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def step_of(text: str) -> float | None:
    m = re.search(r"^verlmon_training_step (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_simulated_job_scraped_linted_and_stopped(tmp_path):
    log, store = tmp_path / "train.log", tmp_path / "run.db"
    proc, url = start(["--listen-address", "127.0.0.1:0", "--interval", "0.5",
                       "--gpu-backend", "sim", "--scenario", "healthy", "--sim-gpus", "4",
                       "--sim-log", str(log), "--log", str(log), "--sim-speed", "30",
                       "--store", str(store), "--node", "e2e-node"], tmp_path)
    try:
        steps, scrapes = [], []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len({s for s in steps if s is not None}) < 3:
            text = httpx.get(url, timeout=10).text
            scrapes.append(text)
            steps.append(step_of(text))
            time.sleep(0.5)
        seen = [s for s in steps if s is not None]
        assert len(set(seen)) >= 3, f"step counter did not advance: {steps}"
        assert seen == sorted(seen)
        last = scrapes[-1]
        assert 'verlmon_node_info{backend="sim",node="e2e-node"} 1.0' in last
        assert 'verlmon_gpu_utilization_ratio{gpu="3"}' in last
        assert f'verlmon_log_lines_total{{log="{log}"}}' in last
        for name in ("gpu", "host", "verl_log", "nccl", "flags"):
            assert f'verlmon_collector_success{{collector="{name}"}} 1.0' in last
        lint = subprocess.run(["promtool", "check", "metrics"], input=last.encode(),
                              capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr
        # the store fills while the exporter runs (read by another connection, WAL mode)
        reader = RunStore(store, create=False)
        try:
            counts = {}
            wait_until = time.monotonic() + 30
            while time.monotonic() < wait_until:
                counts = reader.counts()
                if counts["gpu_samples"] and counts["steps"] and counts["host_samples"]:
                    break
                time.sleep(0.5)
            assert counts["gpu_samples"] > 0 and counts["steps"] > 0 and counts["host_samples"]
        finally:
            reader.close()
    finally:
        rc = stop(proc)
    assert rc == 0
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr
    final = RunStore(store, create=False)
    try:
        assert len(final.steps()) >= max(seen)
    finally:
        final.close()


def test_starts_without_the_packages_gpu_nodes_lack(tmp_path):
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in NOT_ON_GPU_NODES)
    proc, url = start(["--listen-address", "127.0.0.1:0", "--gpu-backend", "sim",
                       "--sim-gpus", "2", "--interval", "0.5"], tmp_path, python_prelude=prelude)
    try:
        text = httpx.get(url, timeout=10).text
        assert 'verlmon_gpu_up{gpu="1"} 1.0' in text
    finally:
        rc = stop(proc)
    assert rc == 0


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--interval", "0.01"], "--interval must be at least 0.1 seconds"),
        (["--web.config.file", "missing.yml"], "missing.yml: no such file"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, argv, words):
    result = subprocess.run([CLI, "exporter", "--listen-address", "127.0.0.1:0",
                             "--gpu-backend", "sim", *argv], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a GPU")
def test_no_gpu_says_how_to_simulate(tmp_path):
    result = subprocess.run([CLI, "exporter", "--listen-address", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={k: v for k, v in os.environ.items()
                                 if k != "VERLMON_GPU_BACKEND"})
    assert result.returncode == 2
    assert "--gpu-backend sim" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed")
def test_prometheus_scrapes_the_exporter_in_openmetrics_with_the_rules_loaded(tmp_path):
    """A real Prometheus (it asks for OpenMetrics first) with the repository's rules scrapes
    the exporter: the answer is OpenMetrics, the target is up without a scrape error, the GPU
    series are stored and the recording rules evaluate without error."""
    from procs import start_prometheus, wait_until

    proc, url = start(["--listen-address", "127.0.0.1:0", "--gpu-backend", "sim",
                       "--scenario", "healthy", "--sim-gpus", "2", "--node", "om-node",
                       "--interval", "0.5", "--no-collector.host"], tmp_path)
    try:
        asked = httpx.get(url, headers={"Accept": "application/openmetrics-text"}, timeout=10)
        assert asked.headers["content-type"].startswith("application/openmetrics-text")
        assert asked.text.endswith("# EOF\n")
        target = url.split("/")[2]
        with start_prometheus(tmp_path / "prom", scrape_targets=[target]) as prom:
            def up() -> dict | None:
                active = httpx.get(f"{prom.url}/api/v1/targets", timeout=5).json()
                found = active["data"]["activeTargets"]
                return found[0] if found and found[0]["health"] == "up" else None

            wait_until(up, timeout=60)
            gpus = wait_until(lambda: prom.query("verlmon_gpu_up"), timeout=30)
            assert sorted(r["metric"]["gpu"] for r in gpus) == ["0", "1"]
            def rules_evaluated() -> list | None:
                answer = httpx.get(f"{prom.url}/api/v1/rules", timeout=5).json()
                groups = answer["data"]["groups"]
                done = all(r["lastEvaluation"].startswith("20")
                           for g in groups for r in g["rules"])
                return groups if groups and done else None

            groups = wait_until(rules_evaluated, timeout=30)
            errors = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
                      if r.get("lastError")]
            assert groups and not errors
    finally:
        assert stop(proc) == 0
