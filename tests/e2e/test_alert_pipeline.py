"""End to end: verl-monitor exporter -> Prometheus -> Alertmanager -> Slack, all real processes.

A local HTTP server stands in for Slack's incoming webhook; Alertmanager reads its URL from a
file, as in production. Prometheus scrapes and evaluates every second with the repository's
rule files; Alertmanager runs the repository's config with short grouping times.
"""

from __future__ import annotations

import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from procs import (
    REPO,
    AlertmanagerProc,
    WebhookRecorder,
    free_port,
    repo_alertmanager_config,
    start_alertmanager,
    start_process,
    start_prometheus,
    wait_until,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")),
        reason="needs prometheus and prometheus-alertmanager",
    ),
]

VERL_MONITOR = Path(sys.executable).with_name("verl-monitor")


def slack_text(body: dict[str, Any]) -> str:
    """Everything a person reads in a Slack webhook payload (title and text of attachments)."""
    parts = [str(body.get("text", ""))]
    for att in body.get("attachments", []):
        parts += [str(att.get("title", "")), str(att.get("text", ""))]
    return "\n".join(parts)


def title(body: dict[str, Any]) -> str:
    return str(body["attachments"][0]["title"])


def am_alert(name: str, severity: str, kind: str, summary: str, description: str,
             ends: datetime | None = None, began_s_ago: float = 5.0,
             **labels: str) -> dict[str, Any]:
    """An alert as Prometheus posts it to Alertmanager, firing since ``began_s_ago``."""
    now = datetime.now(timezone.utc)
    alert: dict[str, Any] = {
        "labels": {"alertname": name, "severity": severity, "kind": kind, "job": "grpo",
                   **labels},
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": f"docs/runbooks.md#{name.lower()}"},
        "startsAt": (now - timedelta(seconds=began_s_ago)).isoformat(),
    }
    if ends is not None:
        alert["endsAt"] = ends.isoformat()
    return alert


@pytest.fixture
def slack() -> WebhookRecorder:
    with WebhookRecorder() as recorder:
        yield recorder


@pytest.fixture
def alertmanager(tmp_path: Path, slack: WebhookRecorder) -> AlertmanagerProc:
    # Alertmanager's inhibitor learns of a critical alert on its own subscription, apart from
    # the dispatcher, so a warning's group must wait before it flushes: 4 s (the shipped
    # 10 s/30 s shortened). The inhibition test's alerts start now (see there).
    cfg = repo_alertmanager_config(tmp_path / "am", slack.url + "/services/T000/B000/test",
                                   group_wait="4s")
    with start_alertmanager(tmp_path / "am", cfg) as am:
        yield am


def test_alertmanager_posts_evidence_to_slack_and_inhibits_the_lesser_alert(
    alertmanager: AlertmanagerProc, slack: WebhookRecorder
) -> None:
    """A critical alert silences the warning of the same kind and node; the Slack message
    carries summary, evidence/advice and runbook; a resolved message follows."""
    # They fire now, as Prometheus sends an alert that just began: Alertmanager flushes a new
    # group at once when an alert's start plus the group wait has passed (`aggrGroup.insert`),
    # which races the inhibitor's reading of the critical alert posted with it (5 s ago with a
    # 1 s wait let the warning reach Slack twice on a loaded machine).
    mem_warning = am_alert(
        "VerlMemoryPressure", "warning", "memory_pressure", "GPU memory near capacity on n0",
        "Fullest GPU 96% used. Advice: lower actor_rollout_ref.rollout.gpu_memory_utilization.",
        began_s_ago=0.0, node="n0")
    mem_critical = am_alert(
        "MemoryPressure", "critical", "memory_pressure", "GPU 0 on n0 is 99% full (grpo)",
        "GPU 0 has used more than 95% of its memory for 5 minutes (now 99%).", began_s_ago=0.0,
        node="n0", gpu="0")
    low_util = am_alert(
        "VerlLowUtilization", "warning", "low_utilization", "Low GPU utilization on n0 in grpo",
        "Node utilization 41%. Advice: raise "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu.", began_s_ago=0.0, node="n0")
    alertmanager.post_alerts([mem_warning, mem_critical, low_util])

    post = slack.wait_for(lambda b: "VerlLowUtilization" in title(b), timeout=30,
                          what="the low-utilization message")
    body = post["body"]
    assert post["path"] == "/services/T000/B000/test"  # the URL came from the file
    assert body["channel"] == "#verl-training"
    assert title(body) == "[FIRING:1] VerlLowUtilization in grpo (warning)"
    text = slack_text(body)
    assert "Low GPU utilization on n0 in grpo" in text
    assert "Node utilization 41%" in text and "ppo_micro_batch_size_per_gpu" in text
    assert "docs/runbooks.md#verllowutilization" in text
    assert "node `n0`" in text

    crit = slack.wait_for(lambda b: title(b).startswith("[FIRING:1] MemoryPressure "),
                          timeout=30, what="the critical memory message")["body"]
    assert crit["channel"] == "#verl-oncall"
    assert title(crit) == "[FIRING:1] MemoryPressure in grpo (critical)"
    assert crit["attachments"][0]["color"] == "danger"

    inhibited = alertmanager.alerts(inhibited=True, active=False, silenced=False)
    assert [a["labels"]["alertname"] for a in inhibited] == ["VerlMemoryPressure"]

    # the problem clears: Prometheus sends the alert with an end time in the past
    low_util["endsAt"] = datetime.now(timezone.utc).isoformat()
    alertmanager.post_alerts([low_util])
    resolved = slack.wait_for(lambda b: title(b).startswith("[RESOLVED] VerlLowUtilization"),
                              timeout=30, what="the resolved message")["body"]
    assert resolved["attachments"][0]["color"] == "good"
    assert "Resolved: Low GPU utilization on n0 in grpo" in slack_text(resolved)
    # the inhibited warning never reached Slack
    assert not [p for p in slack.snapshot() if "VerlMemoryPressure" in slack_text(p["body"])]


def test_log_text_in_an_alert_reaches_slack_inert(alertmanager: AlertmanagerProc,
                                                  slack: WebhookRecorder) -> None:
    """Issue 20: labels and annotations carrying log text (a node name, evidence quoted by a
    rule) cannot ping a channel or hide a link; the template's own runbook link still works."""
    hostile = "<!channel> see <https://evil.example/login|Click here> & <@U0123ABCD> <!here>"
    alert = am_alert("VerlFatalError", "critical", "fatal_error", f"Fatal error: {hostile}",
                     f"Last log line: {hostile}", node="n0<!everyone>")
    alert["annotations"]["runbook_url"] = "https://runbooks.example/verl?a=1&b=2#fatal"
    alertmanager.post_alerts([alert])
    body = slack.wait_for(lambda b: "VerlFatalError" in title(b), timeout=30,
                          what="the fatal-error message")["body"]
    text = slack_text(body)
    for markup in ("<!channel>", "<!here>", "<!everyone>", "<@U0123ABCD>", "<https://evil"):
        assert markup not in text, markup
    escaped = hostile.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"*Fatal error: {escaped}*" in text and f"Last log line: {escaped}" in text
    assert "node `n0&lt;!everyone&gt;`" in text
    assert "<https://runbooks.example/verl?a=1&amp;b=2#fatal|Runbook>" in text


def test_example_config_gives_targets_without_a_node_label_their_host(tmp_path: Path) -> None:
    """The relabel rule of prometheus/prometheus.yml, applied by a real Prometheus."""
    example = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    relabel = example["scrape_configs"][0]["relabel_configs"]
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{
            "job_name": "grpo",
            "static_configs": [
                {"targets": ["127.0.0.1:1", "localhost:2"]},
                {"targets": ["127.0.0.1:3"], "labels": {"node": "gpu-node-07"}},
            ],
            "relabel_configs": relabel,
        }],
    }
    with start_prometheus(tmp_path, yaml.safe_dump(config)) as prom:
        targets = wait_until(
            lambda: httpx.get(f"{prom.url}/api/v1/targets", timeout=5).json()["data"][
                "activeTargets"], timeout=20, what="the targets")
    nodes = {t["labels"]["instance"]: t["labels"]["node"] for t in targets}
    assert nodes == {"127.0.0.1:1": "127.0.0.1", "localhost:2": "localhost",
                     "127.0.0.1:3": "gpu-node-07"}


#: The injected problem: five healthy steps, ten starved by data loading, then healthy again,
#: so the detector's io_starvation flag opens and later closes. The stall sits between step
#: lines (before verl's step timer), so the exporter measures it from the lines' arrival
#: times: 30 s steps at 15x speed (one step every 2 wall seconds) and a 0.25 s poll keep the
#: arrival jitter (about 4 simulated seconds) below the stall (5-14 simulated seconds).
SCRIPT = "healthy:5,io_starvation:10,healthy:15"
JOB = "grpo-e2e"


def test_injected_problem_reaches_slack_and_resolves_when_it_clears(
    tmp_path: Path, alertmanager: AlertmanagerProc, slack: WebhookRecorder
) -> None:
    """exporter (sim, io_starvation for 10 steps) -> Prometheus (1 s) -> Alertmanager -> Slack:
    the firing message carries the evidence and advice; the resolved message follows once the
    simulated run is healthy again and the flag closes."""
    port = free_port()
    prom = start_prometheus(
        tmp_path / "prom", job=JOB, node="node0", alertmanager=f"127.0.0.1:{alertmanager.port}",
        scrape_targets=[f"127.0.0.1:{port}"],
    )
    argv = [
        str(VERL_MONITOR), "exporter", "--listen-address", f"127.0.0.1:{port}",
        "--interval", "0.25", "--gpu-backend", "sim", "--scenario", SCRIPT,
        "--sim-log", str(tmp_path / "train.log"), "--sim-speed", "15", "--sim-gpus", "2",
        "--node", "node0", "--store", str(tmp_path / "run.db"),
    ]
    with prom, start_process(argv, tmp_path / "exporter", "exporter", port,
                             f"http://127.0.0.1:{port}/metrics", timeout=60) as exporter:
        firing = slack.wait_for(
            lambda b: title(b).startswith("[FIRING:1] VerlIoStarvation"), timeout=90,
            what=f"the io_starvation alert in Slack\n{exporter.log_tail()}",
        )
        body = firing["body"]
        severity = "critical" if title(body).endswith("(critical)") else "warning"
        assert title(body) == f"[FIRING:1] VerlIoStarvation in {JOB} ({severity})"
        assert body["channel"] == "#verl-training"
        text = slack_text(body)
        assert f"GPUs starved by data loading on node0 in {JOB}" in text
        assert "data.dataloader_num_workers" in text  # the advice
        assert "kind `io_starvation`" in text and "node `node0`" in text
        assert "docs/runbooks.md#verliostarvation" in text
        # Prometheus holds the same alert, labelled with the flag's severity and scope
        active = [a for a in prom.alerts() if a["labels"]["alertname"] == "VerlIoStarvation"]
        assert active and active[0]["labels"]["severity"] == severity
        assert active[0]["labels"]["job"] == JOB

        resolved = slack.wait_for(
            lambda b: title(b).startswith("[RESOLVED] VerlIoStarvation"), timeout=90,
            what=f"the resolved io_starvation message\n{exporter.log_tail()}",
        )
        assert f"Resolved: GPUs starved by data loading on node0 in {JOB}" in slack_text(
            resolved["body"])
        assert resolved["body"]["attachments"][0]["color"] == "good"
        posts = slack.snapshot()
        assert posts.index(firing) < posts.index(resolved)
