"""The core install (a training node's) against real pip and PyPI.

- Resolving the core install together with a recent verl release, its vLLM and torch
  (``verl[vllm]==VERL_VERSION``) changes none of the versions verl's own resolution picks:
  installing the monitor on a training node never moves torch, vLLM or their pins.
- A fresh venv with only the core install runs ``verl-monitor exporter --help`` and
  ``verl-monitor analyze`` on a fixture log, and names the extra when asked for the dashboard.

Both download from PyPI (slow): marked e2e. Without PyPI the resolution test is skipped with
the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_LOG = ROOT / "tests" / "fixtures" / "logs" / "verl_0.8_actor_perf.log"
#: A recent verl release; its ``vllm`` extra pins torch, vLLM and transformers (==).
VERL_VERSION = os.environ.get("VERLMON_TEST_VERL_VERSION", "0.9.1")
_NETWORK_ERRORS = ("NewConnectionError", "Temporary failure in name resolution",
                   "Network is unreachable", "ConnectTimeoutError", "Max retries exceeded")


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def _source_copy(dest: Path) -> Path:
    """The checkout's tracked and untracked (not ignored) files, copied to ``dest``: pip builds
    there, not in the working tree."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def _resolve(tmp: Path, label: str, *requirements: str) -> dict[str, str]:
    """``pip install --dry-run --report`` from scratch: name -> version it would install."""
    report = tmp / f"{label}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--disable-pip-version-check", "--report", str(report), *requirements],
        capture_output=True, text=True, timeout=540,
    )
    if proc.returncode != 0:
        if any(err in proc.stderr for err in _NETWORK_ERRORS):
            pytest.skip(f"PyPI unreachable, cannot resolve verl's pins: "
                        f"{proc.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"pip could not resolve {requirements}:\n{proc.stderr[-3000:]}")
    doc = json.loads(report.read_text())
    return {_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in doc["install"]}


@pytest.mark.timeout(1200)
def test_core_install_changes_none_of_verl_vllm_torch_pins(tmp_path):
    spec = f"verl[vllm]=={VERL_VERSION}"
    alone = _resolve(tmp_path, "verl", spec)
    assert alone.get("verl") == VERL_VERSION and "vllm" in alone and "torch" in alone
    together = _resolve(tmp_path, "together", spec, str(_source_copy(tmp_path / "src")))
    assert "verl-monitor" in together
    moved = {name: (version, together.get(name)) for name, version in alone.items()
             if together.get(name) != version}
    assert moved == {}, f"the core install moves verl's resolution: {moved}"
    added = sorted(set(together) - set(alone) - {"verl-monitor"})
    # what the monitor adds beside verl is small: its own exporter dependencies only
    assert set(added) <= {"prometheus-client", "nvidia-ml-py", "psutil", "pyyaml", "bcrypt",
                          "pandas", "numpy", "python-dateutil", "tzdata", "six", "py-spy"}, added


@pytest.mark.timeout(900)
def test_core_only_venv_runs_exporter_and_analyze_and_names_missing_extras(tmp_path):
    venv = tmp_path / "core"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", str(_source_copy(tmp_path / "src"))],
        capture_output=True, text=True, timeout=840,
    )
    if pip.returncode != 0 and any(err in pip.stderr for err in _NETWORK_ERRORS):
        pytest.skip(f"PyPI unreachable: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    cli = str(venv / "bin" / "verl-monitor")
    assert (venv / "bin" / "py-spy").exists(), "py-spy is not in the core install"
    for absent in ("streamlit", "plotly", "wandb", "slack_sdk", "httpx"):
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {absent}"],
                               capture_output=True, timeout=60)
        assert probe.returncode != 0, f"{absent} is in the core install"

    helped = subprocess.run([cli, "exporter", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "--listen-address" in helped.stdout

    analyzed = subprocess.run([cli, "analyze", str(FIXTURE_LOG), "--json"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert analyzed.returncode == 0, analyzed.stderr
    doc = json.loads(analyzed.stdout)
    assert doc["steps"], "analyze found no steps in the fixture log"

    dash = subprocess.run([cli, "dashboard", "--store", str(tmp_path / "run.db")],
                          capture_output=True, text=True, timeout=120)
    assert dash.returncode == 2
    assert dash.stderr.strip() == (
        "verl-monitor dashboard: the dashboard needs the 'dashboard' extra: "
        "pip install 'verl-monitor[dashboard]'")
