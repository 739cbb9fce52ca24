"""The Rollout page in a real headless Chromium, on ``verl-monitor demo --scenario
agent_loop_demo``: the exporter's simulator serves four vLLM ``/metrics`` endpoints, the
exporter's rollout collector scrapes them into its run store and ``/metrics``, and the page draws
them from the store and from a real Prometheus scraping that exporter.

The screenshot goes to ``test-artifacts/dashboard/rollout.png``; with
``VERLMON_UPDATE_SCREENSHOTS=1`` it also replaces ``docs/screenshots/rollout.png`` (the docs' one
is taken at ``VERLMON_DEMO_SPEED=2``: at 10x a step lasts 1.2 s and the charts alias).
"""

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
import yaml
from playwright.sync_api import Page, expect
from procs import (
    NEEDS_CHROMIUM,
    NEEDS_PROMETHEUS,
    free_port,
    start_process,
    start_prometheus,
    wait_until,
)
from test_dashboard_demo import (  # noqa: F401 - the same Chromium and viewport
    browser_context_args,
    browser_type_launch_args,
)

from dashboards.sources.prometheus import PrometheusSource

pytestmark = [
    pytest.mark.e2e,
    NEEDS_CHROMIUM,
    NEEDS_PROMETHEUS,
]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
SCREENSHOTS = REPO / "docs" / "screenshots"
SPEED = float(os.environ.get("VERLMON_DEMO_SPEED", "10"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The agent-loop demo at 10x, Prometheus scraping its exporter every second, and a
    second dashboard reading that Prometheus."""
    tmp = tmp_path_factory.mktemp("rollout-demo")
    port, exporter_port = free_port(), free_port()
    prom = start_prometheus(tmp / "prom", config_text=yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "verlmon", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"node": "demo-node"}}]}],
    }))
    proc = prom_app = None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "demo", "--scenario", "agent_loop_demo",
             "--speed", f"{SPEED:g}", "--port", str(port), "--exporter-port",
             str(exporter_port), "--dir", str(tmp / "run")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True)
        lines = [proc.stdout.readline() for _ in range(4)]
        assert "(agent_loop trainer)" in lines[2], lines
        metrics_url = lines[1].split("exporter metrics ", 1)[1].strip()
        app_port = free_port()
        prom_app = start_process(
            [sys.executable, "-m", "monitor", "dashboard", "--prometheus", prom.url, "--port",
             str(app_port)], tmp / "prom-app", "dashboard", app_port,
            f"http://127.0.0.1:{app_port}/_stcore/health", timeout=60)
        yield {"url": f"http://127.0.0.1:{port}", "prom_url": prom_app.url,
               "prometheus": prom.url, "started": time.time(), "metrics": metrics_url}
    finally:
        for p in (prom_app, prom):
            if p is not None:
                p.stop()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _open(page: Page, url: str, timeout_ms: int = 60_000) -> None:
    page.goto(url)
    expect(page.get_by_role("heading", name="Rollout", level=1)).to_be_visible(
        timeout=timeout_ms)
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        state="attached", timeout=timeout_ms)


def _sum(url: str, name: str) -> float:
    """The sum of a metric's samples on the exporter's /metrics."""
    text = httpx.get(url, timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def _shoot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    return path


def test_rollout_page_draws_the_engines_from_the_store(page: Page, demo):
    # wait into the full-KV-cache segment (steps 9-15): the engines preempt
    wait_until(lambda: _sum(demo["metrics"], "verlmon_rollout_preemptions_total") > 0,
               timeout=120, what="preemptions on the simulated vLLM servers")
    time.sleep(20.0 / SPEED)  # a few of its steps
    _open(page, f"{demo['url']}/rollout?refresh=off&window=15+min")
    servers = page.get_by_test_id("stMetric").filter(has_text="Engine servers")
    expect(servers).to_contain_text("4", timeout=60_000)
    chart = page.locator(".js-plotly-plot").first
    expect(chart).to_contain_text("KV cache use per server", timeout=60_000)
    expect(page.locator(".js-plotly-plot")).to_have_count(1)  # one chart at a time
    expect(page.get_by_test_id("stException")).to_have_count(0)
    shot = _shoot(page, "rollout")
    assert shot.stat().st_size > 10_000
    if os.environ.get("VERLMON_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOTS / "rollout.png")
    # the tail view, picked in its tab, is bound to the URL
    page.get_by_role("tab", name="Tail").click()
    expect(page).to_have_url(re.compile(r"rollout_view=Tail"), timeout=30_000)
    expect(page.locator(".js-plotly-plot").first).to_contain_text(
        "Generation tail", timeout=30_000)
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_rollout_page_reads_prometheus(page: Page, demo):
    src = PrometheusSource(demo["prometheus"])
    seen = []

    def four_servers() -> bool:
        frame = src.rollout_frame(demo["started"] - 60, time.time())
        seen[:] = [frame]
        return frame["server"].nunique() == 4 and frame["running"].max() > 0

    wait_until(four_servers, timeout=90, what="four engine servers in Prometheus")
    (view,) = seen
    assert set(view["engine"]) == {"vllm"}
    assert view["kv_cache_usage"].between(0, 1).all()
    assert view["tokens_per_s"].max() > 0
    _open(page, f"{demo['prom_url']}/rollout?refresh=off&window=15+min")
    expect(page.get_by_test_id("stMetric").filter(has_text="Engine servers")).to_contain_text(
        "4", timeout=60_000)
    expect(page.locator(".js-plotly-plot").first).to_contain_text(
        "KV cache use per server", timeout=60_000)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    _shoot(page, "prometheus-rollout")
