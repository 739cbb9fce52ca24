"""The pages agree with the alerts (issue 24), in a real headless Chromium: ``verl-monitor
dashboard --prometheus URL --job NAME`` on a real Prometheus where ``GPUStraggler`` fires for
GPU 1 of node3, ``NodeImbalance`` is pending and a ``low_utilization`` flag is held back by its
rule (``tests/prom_alerts.py``).

- the Overview pages on firing alerts only: the straggler is the top open problem, with its
  advice, above the newer flag it explains; what does not page is listed apart;
- the goodput bar measures ``gen`` from the exporters' per-phase counters;
- the GPUs heat map writes STRAGGLER beside GPU 1; the Nodes page marks node3 with the alert;
- the job is named on every page, and no page fetches anything from outside 127.0.0.1.

Screenshots go to ``test-artifacts/dashboard_alerts/``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from procs import NEEDS_CHROMIUM, NEEDS_PROMETHEUS, free_port, start_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    NEEDS_CHROMIUM,
    NEEDS_PROMETHEUS,
]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "dashboard_alerts"
CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
PAGES = ("", "gpus", "steps", "communication", "rollout", "flags", "nodes")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """The alerting Prometheus and a dashboard on it, limited to its job."""
    from prom_alerts import JOB, start_alerting_prometheus

    tmp = tmp_path_factory.mktemp("dash_alerts")
    pair = start_alerting_prometheus(tmp / "prom")
    port = free_port()
    try:
        app = start_process([CLI, "dashboard", "--prometheus", pair.url, "--job", JOB,
                             "--port", str(port)], tmp, "dashboard", port,
                            f"http://127.0.0.1:{port}/_stcore/health", timeout=90)
    except BaseException:
        pair.stop()
        raise
    yield app.url
    app.stop()
    pair.stop()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's Chromium (``playwright install`` cannot download browsers here)."""
    return {**browser_type_launch_args,
            "executable_path": os.environ.get("CHROMIUM", "/usr/bin/chromium"),
            "args": ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--no-first-run"]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


def _open(page, url: str) -> None:
    from playwright.sync_api import expect

    page.goto(url)
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        state="attached", timeout=60_000)
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_overview_pages_on_the_straggler_with_what_does_not_page_apart(page, dashboard):
    from playwright.sync_api import expect
    from prom_alerts import ADVICE, JOB

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _open(page, f"{dashboard}/?window=15+min&refresh=off")
    top = page.locator(".st-key-ov_top_flag")
    expect(top).to_contain_text("GPUStraggler", timeout=60_000)
    expect(top).to_contain_text(ADVICE)
    expect(top).not_to_contain_text("util_overstates_sm")
    main = page.get_by_test_id("stMain")
    expect(main).to_contain_text("Needs attention: 3 open flags (3 warning); top problem: "
                                 "GPUStraggler")
    expect(main).to_contain_text("2 not paging")
    expect(main).to_contain_text("NodeImbalance")
    # the per-phase bar (Steps & phases) measures gen from the per-phase counters (80% busy),
    # no "short phases 100%"
    _open(page, f"{dashboard}/steps?window=15+min&refresh=off")
    bar = page.get_by_test_id("stMain").locator("[data-testid='verlmon-gpu-time-bar']")
    expect(bar.locator("xpath=..")).to_contain_text("gen")
    assert "GPUs 80% busy" in (bar.locator("div[title^='gen:']").get_attribute("title") or "")
    expect(page.get_by_test_id("stSidebar")).to_contain_text(f"job {JOB}")
    page.screenshot(path=ARTIFACTS / "overview.png", full_page=True)


def test_gpus_heat_map_and_nodes_table_name_the_straggler(page, dashboard):
    from playwright.sync_api import expect

    _open(page, f"{dashboard}/gpus?window=15+min&refresh=off&gpu_view=SM+active")
    heat = page.locator(".js-plotly-plot").first
    expect(heat).to_contain_text("node3/1 STRAGGLER", timeout=60_000)
    # the busiest GPU is not called low; the waiting GPU 0 carries its own flag's word
    expect(heat).not_to_contain_text("LOW")
    expect(heat).to_contain_text("node3/0 UTIL > SM")
    page.screenshot(path=ARTIFACTS / "gpus.png", full_page=True)
    _open(page, f"{dashboard}/nodes?window=15+min&refresh=off")
    expect(page.get_by_test_id("stMain")).to_contain_text("GPUStraggler", timeout=60_000)


def test_flags_page_lists_what_does_not_page_apart(page, dashboard):
    from playwright.sync_api import expect

    _open(page, f"{dashboard}/flags?refresh=off")
    pending = page.locator(".st-key-flags_pending")
    expect(pending).to_contain_text("Not paging (2)", timeout=60_000)
    cards = page.locator("[class*='st-key-flag_card_']")
    expect(cards).to_have_count(3)
    expect(cards.first).not_to_contain_text("NodeImbalance")
    page.screenshot(path=ARTIFACTS / "flags.png", full_page=True)


def test_no_page_fetches_anything_from_outside(page, dashboard):
    from prom_alerts import JOB

    outside: list[str] = []

    def note(request) -> None:
        host = urlsplit(request.url).hostname
        if request.url.startswith(("http:", "https:", "ws:", "wss:")) and host != "127.0.0.1":
            outside.append(request.url)

    page.on("request", note)
    for path in PAGES:
        _open(page, f"{dashboard}/{path}?window=15+min&refresh=off")
        page.wait_for_timeout(500)
        assert f"job {JOB}" in page.get_by_test_id("stSidebar").inner_text()
    assert outside == []
