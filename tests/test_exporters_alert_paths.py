"""Every alert path counted on the exporter's own /metrics (issue 20): a real exporter in this
process, a real webhook on 127.0.0.1 that refuses the hook (404, echoing its path) or takes it,
real SQLite for the outbox, and wandb switched off for real."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from test_exporters_app import scrape, value
from test_notify_slack import SLACK_PATH, Hook, leaked

from cli.commands.exporter import parse_options
from exporters.exposition import format_families
from exporters.node_exporter import Exporter
from monitor.live.alert_paths import slack_families, wandb_families
from monitor.notify.slack import FAILURE_REASONS
from monitor.records import Event

pytestmark = pytest.mark.slow  # servers and an exporter, on threads of this process


def _exporter(tmp_path: Path, hook: Hook, *extra: str) -> Exporter:
    (tmp_path / "hook").write_text(hook.url + "\n")
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--store", str(tmp_path / "run.db"), "--slack-webhook-file", str(tmp_path / "hook"),
        "--detect-interval", "600", *extra]))
    exporter.start()
    return exporter


def test_a_revoked_webhook_shows_on_metrics_and_in_one_log_line(tmp_path, caplog, monkeypatch):
    """Before: the 404s were in no log line and /metrics had no failed or pending count."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    hook = Hook(SLACK_PATH)
    hook.statuses = [(404, {})] * 10
    hook.answer = lambda path: f"no_service: {path}".encode()
    exporter = _exporter(tmp_path, hook, "--wandb", "verl-monitor")
    try:
        before = scrape(exporter)
        for reason in FAILURE_REASONS:
            assert value(before, f'verlmon_slack_failed_attempts_total{{reason="{reason}"}}') == 0
        assert value(before, "verlmon_slack_pending_messages") == 0
        exporter.monitor.window.add_events([Event("oom", time.time(), 7, "CUDA out of memory")])
        with caplog.at_level(logging.WARNING):
            exporter.detect_once()
            assert exporter.monitor.notifier.deliver() == 0
        deadline = time.monotonic() + 10  # wandb starts on its own thread (disabled: at once)
        while exporter.monitor.wandb_sink is None and time.monotonic() < deadline:
            time.sleep(0.05)
        exporter.detect_once()  # the sink has the next changes; the OOM alert already went by
        text = scrape(exporter)
    finally:
        exporter.stop()
        hook.close()
    assert len(hook.requests) >= 1
    assert value(text, 'verlmon_slack_failed_attempts_total{reason="rejected"}') >= 1
    assert value(text, 'verlmon_slack_failed_attempts_total{reason="server_error"}') == 0
    assert value(text, "verlmon_slack_pending_messages") == 1
    assert value(text, 'verlmon_slack_messages_total{outcome="sent"}') == 0
    assert value(text, "verlmon_slack_dropped_total") == 0
    assert value(text, 'verlmon_wandb_alerts_total{outcome="sent"}') == 0
    slack_lines = [r.getMessage() for r in caplog.records if "Slack" in r.getMessage()]
    assert len(slack_lines) == 1 and "HTTP 404" in slack_lines[0], slack_lines
    for shown in (text, caplog.text):
        assert leaked(SLACK_PATH, shown) == []


def test_the_families_name_every_outcome(tmp_path):
    """The notifier's and the wandb sink's counters as the exposition writes them: every reason
    and outcome present from the start, the counts as the objects hold them."""
    from monitor.integrations.wandb_sink import WandbSink
    from monitor.notify.slack import SlackNotifier
    from monitor.records import Flag

    hook = Hook()
    try:
        (tmp_path / "hook").write_text(hook.url)
        hook.statuses = [(429, {"Retry-After": "60"})]
        notifier = SlackNotifier(str(tmp_path / "hook"), None)
        flag = Flag("oom", "critical", 1000.0, None, scope={}, evidence="CUDA out of memory")
        notifier.notify_opened(flag)
        notifier.deliver()
    finally:
        hook.close()
    sink = WandbSink("verl-monitor", None, mode="disabled")
    sink.log_flags([flag], [])  # no run to alert on: the alert is dropped, and counted
    text = format_families([*slack_families(notifier), *wandb_families(sink)]).decode()
    assert 'verlmon_slack_failed_attempts_total{reason="rate_limited"} 1.0' in text
    assert 'verlmon_slack_failed_attempts_total{reason="unreachable"} 0.0' in text
    assert "verlmon_slack_pending_messages 1.0" in text
    assert 'verlmon_wandb_alerts_total{outcome="dropped"} 1.0' in text
    assert 'verlmon_wandb_alerts_total{outcome="failed"} 0.0' in text
    assert json.dumps(sink.alerts) == '{"sent": 0, "failed": 0, "dropped": 1}'
    assert 'verlmon_wandb_alerts_total{outcome="sent"} 0.0' in format_families(
        wandb_families(None)).decode()
