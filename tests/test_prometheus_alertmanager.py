"""Alertmanager config: valid for the real amtool, routes each severity to the right Slack
receiver, keeps the webhook secret out of the repository, and inhibits as documented.

Delivery and inhibition by a running Alertmanager are tested in tests/e2e/test_alert_pipeline.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
AM_DIR = REPO / "prometheus" / "alertmanager"
CONFIG = AM_DIR / "alertmanager.yml"

AMTOOL = shutil.which("amtool")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool not installed")


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run amtool with a bound on its run time."""
    assert AMTOOL is not None
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60)


def load() -> dict:
    return yaml.safe_load(CONFIG.read_text())


@pytest.mark.slow
@needs_amtool
def test_config_passes_amtool_check() -> None:
    res = amtool("check-config", str(CONFIG))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
    assert "3 receivers" in res.stdout


@pytest.mark.slow
@needs_amtool
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "kind=stalled", "job=grpo", "alertname=TrainingStalled"],
         "slack-critical"),
        (["severity=critical", "kind=exporter", "job=grpo", "alertname=ExporterDown"],
         "slack-critical"),
        (["severity=warning", "kind=gpu_imbalance", "job=grpo", "alertname=NodeImbalance"],
         "slack-warning"),
        (["severity=info", "kind=util_overstates_sm", "job=grpo"], "quiet"),
        # an alert from some other rule file without a severity still reaches people
        (["alertname=SomethingElse", "job=grpo"], "slack-warning"),
    ],
)
def test_routes_send_each_severity_to_its_receiver(labels: list[str], receiver: str) -> None:
    res = amtool("config", "routes", "test", f"--config.file={CONFIG}",
                 f"--verify.receivers={receiver}", *labels)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == receiver


@pytest.mark.slow
@needs_amtool
def test_routes_test_rejects_a_wrong_receiver() -> None:
    res = amtool("config", "routes", "test", f"--config.file={CONFIG}",
                 "--verify.receivers=slack-warning", "severity=critical", "job=grpo")
    assert res.returncode != 0
    assert res.stdout.splitlines()[0] == "slack-critical"
    assert "did not match" in res.stdout


@pytest.mark.slow
@needs_amtool
def test_a_broken_config_is_rejected(tmp_path: Path) -> None:
    cfg = load()
    cfg["route"]["receiver"] = "nobody"
    bad = tmp_path / "alertmanager.yml"
    bad.write_text(yaml.safe_dump(cfg))
    res = amtool("check-config", str(bad))
    assert res.returncode != 0
    assert "nobody" in res.stdout + res.stderr


def test_webhook_url_is_read_from_a_file_never_committed() -> None:
    text = CONFIG.read_text()
    cfg = load()
    assert cfg["global"]["slack_api_url_file"].startswith("/etc/")
    assert "hooks.slack.com/services/" not in text.replace("https://hooks.slack.com/services/...", "")
    for receiver in cfg["receivers"]:
        for slack in receiver.get("slack_configs", []):
            assert "api_url" not in slack, receiver["name"]


def test_slack_receivers_send_resolved_with_our_templates() -> None:
    cfg = load()
    slack = [s for r in cfg["receivers"] for s in r.get("slack_configs", [])]
    assert len(slack) == 2
    for s in slack:
        assert s["send_resolved"] is True
        assert "verlmon.slack.text" in s["text"] and "verlmon.slack.title" in s["title"]
    tmpl = (AM_DIR / "templates" / "slack.tmpl").read_text()
    for name in ("verlmon.slack.title", "verlmon.slack.text", "verlmon.slack.color"):
        assert f'define "{name}"' in tmpl
    # the message carries the evidence and advice the rules put in the annotations
    assert ".Annotations.description" in tmpl and ".Annotations.runbook_url" in tmpl


def test_grouping_and_inhibition_as_documented() -> None:
    cfg = load()
    assert set(cfg["route"]["group_by"]) == {"job", "alertname"}
    rules = cfg["inhibit_rules"]
    same_kind = rules[0]
    assert same_kind["source_matchers"] == ['severity="critical"']
    assert same_kind["target_matchers"] == ['severity="warning"']
    assert {"job", "kind"} <= set(same_kind["equal"])
