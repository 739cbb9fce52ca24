"""``--help`` texts match what the commands do (issue 31 item 9): the dashboard's lists every
page of the app, the demo's promises the time its default run takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli.main import main

APP = Path(__file__).resolve().parents[1] / "dashboards" / "app.py"


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_dashboard_help_names_every_page(capsys) -> None:
    titles = re.findall(r'st\.Page\("views/\w+\.py", title="([^"]+)"', APP.read_text())
    assert "Rollout" in titles
    text = _help(capsys, "dashboard")
    assert all(t in text for t in titles), (titles, text)


def test_demo_help_promises_what_the_default_speed_takes(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = " ".join(capsys.readouterr().out.split())
    assert "working in a minute" not in top
    assert "about ten minutes" in top and "--speed 10" in top
