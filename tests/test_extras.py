"""Missing extras: one line naming the extra to install, exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from monitor import extras


def _cli_without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``verl-monitor ARGV`` in a fresh interpreter where ``modules`` cannot be imported
    (as in an install without their extra)."""
    code = (
        "import sys\n"
        f"for name in {modules!r}:\n"
        "    sys.modules[name] = None\n"
        "from monitor.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_every_extra_names_modules_and_the_message_names_the_pip_command():
    assert set(extras.EXTRAS) == {"dashboard", "wandb", "slack"}
    assert extras.missing_extra_message("the dashboard", "dashboard") == (
        "the dashboard needs the 'dashboard' extra: pip install 'verl-monitor[dashboard]'")
    assert extras.extra_for_module("slack_sdk.webhook") == "slack"
    assert extras.extra_for_module("pandas") is None


def test_installed_extra_passes_and_a_blocked_module_is_reported(monkeypatch):
    assert extras.explain_missing("dashboard", "the dashboard") is None  # [test] pulls [all]
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(extras.MissingExtra) as info:
        extras.require_extra("dashboard", "the dashboard")
    assert info.value.missing == ["plotly"] and info.value.extra == "dashboard"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("blocked", "argv", "line"),
    [
        (["streamlit"], ["dashboard", "--store", "run.db"],
         "verl-monitor dashboard: the dashboard needs the 'dashboard' extra: "
         "pip install 'verl-monitor[dashboard]'"),
        (["plotly"], ["demo"],
         "verl-monitor demo: the demo needs the 'dashboard' extra: "
         "pip install 'verl-monitor[dashboard]'"),
        (["wandb"], ["exporter", "--wandb", "proj", "--no-collector.gpu"],
         "verl-monitor exporter: --wandb needs the 'wandb' extra: "
         "pip install 'verl-monitor[wandb]'"),
        (["slack_sdk"], ["exporter", "--slack-webhook-file", "hook.url"],
         "verl-monitor exporter: --slack-webhook-file needs the 'slack' extra: "
         "pip install 'verl-monitor[slack]'"),
        (["wandb"], ["analyze", "train.log", "--wandb", "proj"],
         "verl-monitor analyze: --wandb needs the 'wandb' extra: "
         "pip install 'verl-monitor[wandb]'"),
    ],
)
def test_a_command_without_its_extra_prints_one_line_and_exits_2(blocked, argv, line):
    proc = _cli_without(blocked, argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == line
    assert "Traceback" not in proc.stderr and proc.stdout == ""
