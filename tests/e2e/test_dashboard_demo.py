"""The demo in a real headless Chromium: every page, the scenario's flags arriving live with
their advice, and the same app reading a real Prometheus that scrapes the demo's exporter.

Screenshots go to ``test-artifacts/dashboard/``; the main ones are copied to
``docs/screenshots/`` for the README.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

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

from dashboards.sources.prometheus import PrometheusSource

pytestmark = [
    pytest.mark.e2e,
    NEEDS_CHROMIUM,
    NEEDS_PROMETHEUS,
]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
#: Demo speed (simulated seconds per wall second). 10 plays the scenario in about a minute;
#: `VERLMON_DEMO_SPEED=1 VERLMON_UPDATE_SCREENSHOTS=1` remakes the README's demo-1x shots.
SPEED = float(os.environ.get("VERLMON_DEMO_SPEED", "10"))
#: How long to wait for a flag: two minutes at 10x, scaled up for slower demos.
FLAG_WAIT_MS = int(120_000 * max(1.0, 10.0 / SPEED))
SCREENSHOTS = REPO / "docs" / "screenshots"
PAGES = {  # url path -> title shown on the page
    "": "Overview",
    "gpus": "GPUs",
    "steps": "Steps & phases",
    "communication": "Communication",
    "flags": "Flags",
    "nodes": "Nodes",
}
#: The demo's flags: at 10x the same kinds as at 1x (the exporter measures a sped-up run on its
#: own clock, so a straggler's 60 s of persistence are 6 s of wall time; issue 38 item 3).
DEMO_FLAGS = ("io_starvation", "reshard_spike", "gpu_imbalance", "rollout_long_tail")
#: Extra simulated nodes Prometheus scrapes beside the demo's exporter (same scenario and seed:
#: they raise the same flag kinds at about the same second, as nodes of one job do).
EXTRA_NODES = ("node-b", "node-c")


def _prometheus_config(targets: dict[str, str]) -> str:
    """One scrape job, one static target per node with its ``node`` label, 1 s scrapes."""
    return yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "verlmon", "static_configs": [
            {"targets": [target], "labels": {"node": node}} for node, target in targets.items()
        ]}],
    }, sort_keys=False)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's Chromium (``playwright install`` cannot download browsers here)."""
    return {
        **browser_type_launch_args,
        "executable_path": os.environ.get("CHROMIUM", "/usr/bin/chromium"),
        "args": ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"],
    }


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``verl-monitor demo`` at 10x (the whole scenario in about a minute), plus Prometheus
    scraping its exporter and a second dashboard reading that Prometheus."""
    tmp = tmp_path_factory.mktemp("demo")
    port = free_port()
    exporter_port = free_port()
    ports = {node: free_port() for node in EXTRA_NODES}
    # Prometheus first, scraping the port the demo's exporter will take: at 10x a flag is open
    # for seconds only, so a Prometheus started after the demo could miss every one of them
    targets = {"demo-node": f"127.0.0.1:{exporter_port}",
               **{node: f"127.0.0.1:{p}" for node, p in ports.items()}}
    prom = start_prometheus(tmp / "prom", config_text=_prometheus_config(targets))
    extras = []
    proc = prom_app = None
    try:
        for node, p in ports.items():
            work = tmp / node
            extras.append(start_process(
                [sys.executable, "-m", "monitor", "exporter", "--gpu-backend", "sim",
                 "--scenario", "demo", "--sim-gpus", "2", "--sim-log", str(work / "train.log"),
                 "--sim-speed", f"{SPEED:g}", "--interval", "1", "--node", node,
                 "--listen-address", f"127.0.0.1:{p}", "--nccl-dir", str(work / "nccl")],
                work, f"exporter-{node}", p, f"http://127.0.0.1:{p}/metrics", timeout=60,
                env={"VERLMON_SIM_NCCL_DIR": str(work / "nccl")}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "demo", "--speed", f"{SPEED:g}", "--port",
             str(port), "--exporter-port", str(exporter_port), "--dir", str(tmp / "run")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True)
        lines = [proc.stdout.readline() for _ in range(4)]
        assert "dashboard http://" in lines[0], lines
        assert f":{exporter_port}/metrics" in lines[1], lines
        app_port = free_port()
        prom_app = start_process(
            [sys.executable, "-m", "monitor", "dashboard", "--prometheus", prom.url, "--port",
             str(app_port)], tmp / "prom-app", "dashboard", app_port,
            f"http://127.0.0.1:{app_port}/_stcore/health", timeout=60)
        yield {"url": f"http://127.0.0.1:{port}", "prom_url": prom_app.url, "proc": proc,
               "prometheus": prom.url}
    finally:
        for p in (prom_app, *extras, prom):
            if p is not None:
                p.stop()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _open(page: Page, base: str, path: str, query: str = "?refresh=2+s",
          timeout_ms: int = 30_000) -> None:
    page.goto(f"{base}/{path}{query}")
    expect(page.get_by_role("heading", name=PAGES[path], level=1)).to_be_visible(
        timeout=timeout_ms)
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        state="attached", timeout=timeout_ms)


def _shoot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    return path


def test_scenario_flags_arrive_live_with_advice(page: Page, demo):
    _open(page, demo["url"], "flags")
    # no reload: the live fragment brings each flag in as the detectors raise it
    for kind in DEMO_FLAGS:
        expect(page.get_by_text(re.compile(rf"^{kind} - ")).first).to_be_visible(
            timeout=FLAG_WAIT_MS)
    expect(page.get_by_text("Advice:").first).to_be_visible()
    expect(page.get_by_text("data.dataloader_num_workers").first).to_be_visible()
    expect(page.get_by_test_id("stException")).to_have_count(0)
    _shoot(page, "flags")


def test_every_page_renders_without_exception(page: Page, demo):
    for path, title in PAGES.items():
        _open(page, demo["url"], path)
        # each page opens with its first view: a chart (the Overview's trend is inline SVG),
        # or the node table on Nodes
        expect(page.locator(".js-plotly-plot, [data-testid='stDataFrame'], "
                            "[data-testid='verlmon-trend']").first).to_be_visible(timeout=60_000)
        expect(page.get_by_test_id("stException")).to_have_count(0)
        shot = _shoot(page, path or "overview")
        assert shot.stat().st_size > 10_000, title
    # the overview leads with health and where the GPU time goes
    _open(page, demo["url"], "")
    expect(page.locator("[data-verlmon-stat='Current step']")).to_contain_text(
        re.compile(r"\d+"), timeout=30_000)
    # the banner's forms (monitor/analysis/headline.py): between flags the demo is healthy,
    # its largest loss named as information
    expect(page.get_by_text(re.compile(
        r"^(Healthy|Needs attention|Finished)")).first).to_be_visible()
    # the GPU-time bar is HTML, drawn with the page: a block per cause of the ledger
    bar = page.get_by_test_id("stHtml").filter(has_text="Where the GPU time went")
    expect(bar).to_contain_text("goodput")
    expect(bar.locator("div[title^='productive: ']")).to_have_count(1)
    # the trends draw one trend, the step time, as inline SVG (no Plotly chart to load) until
    # another tab is picked
    expect(page.locator(".js-plotly-plot")).to_have_count(0)
    expect(page.locator("[data-testid='verlmon-trend'] img")).to_have_count(1)
    expect(page.locator("[data-testid='verlmon-trend']")).to_contain_text("Step time")
    page.get_by_role("tab", name="Throughput").click()
    expect(page).to_have_url(re.compile(r"trend=Throughput"), timeout=30_000)
    expect(page.locator("[data-testid='verlmon-trend']").first).to_contain_text("Throughput",
                                                                               timeout=30_000)
    # the demo's simulated NCCL records fill the Communication page
    _open(page, demo["url"], "communication")
    expect(page.get_by_test_id("stMetric").filter(has_text="Busiest collective")).to_contain_text(
        re.compile(r"AllReduce|AllGather"), timeout=60_000)


def test_every_page_reads_prometheus_with_several_nodes(page: Page, demo):
    src = PrometheusSource(demo["prometheus"])
    wait_until(lambda: len(src.nodes()) == 1 + len(EXTRA_NODES), 60,
               what="every node's GPU series in Prometheus")
    # refresh off: each page as opened by URL (a refresh every 2 s on a loaded 2-core machine
    # can keep a 3-node Prometheus page rerunning without an idle moment to check)
    for path, title in PAGES.items():
        # a page opened the first time on a 3-node Prometheus: allow a loaded machine a minute
        _open(page, demo["prom_url"], path, query="?refresh=off", timeout_ms=60_000)
        # each page opens with its first view: a chart (the Overview's trend is inline SVG),
        # or the node table on Nodes
        expect(page.locator(".js-plotly-plot, [data-testid='stDataFrame'], "
                            "[data-testid='verlmon-trend']").first).to_be_visible(timeout=60_000)
        expect(page.get_by_test_id("stException")).to_have_count(0)
        assert _shoot(page, f"prometheus-{path or 'overview'}").stat().st_size > 10_000, title
    _open(page, demo["prom_url"], "nodes", query="?refresh=off")
    expect(page.get_by_test_id("stMetric").filter(has_text="Nodes").first).to_contain_text(
        str(1 + len(EXTRA_NODES)), timeout=30_000)
    _open(page, demo["prom_url"], "communication", query="?refresh=5+s")
    expect(page.get_by_test_id("stMetric").filter(has_text="Busiest collective")).to_contain_text(
        re.compile(r"AllReduce|AllGather"), timeout=60_000)


def test_window_selection_is_shared_through_the_url(page: Page, demo):
    _open(page, demo["url"], "gpus", query="?window=15+min")
    window = page.get_by_role("combobox", name="Window")
    # generous timeouts: on a loaded 2-core machine the page can rerun for several seconds
    expect(window).to_match_aria_snapshot('- combobox "Window": 15 min', timeout=30_000)
    window.click()
    page.get_by_role("option", name="6 h").click()
    expect(page).to_have_url(re.compile(r"window=6\+h"), timeout=30_000)


def test_same_app_reads_prometheus_scraping_the_demo_exporter(page: Page, demo):
    wait_until(lambda: demo["proc"].poll() is None, 5, what="demo running")
    # first the source API, so that a failure says whether Prometheus or the page is at fault
    src = PrometheusSource(demo["prometheus"])
    lo, hi = wait_until(src.time_range, 30, what="the exporter's series in Prometheus")
    wait_until(lambda: src.steps(lo, hi), 30,
               what=f"steps in Prometheus between {lo:.0f} and {hi:.0f}")
    _open(page, demo["prom_url"], "", query="?refresh=5+s")
    expect(page.get_by_test_id("stSidebar")).to_contain_text("Prometheus")
    expect(page.locator("[data-verlmon-stat='Current step']")).to_contain_text(
        re.compile(r"\d+"), timeout=60_000)
    _open(page, demo["prom_url"], "flags", query="?refresh=5+s")
    # any of the scenario's flags read from verlmon_flag_active will do (at 10x some are
    # too short to pass their persistence window)
    any_flag = re.compile(r"^(io_starvation|reshard_spike|rollout_long_tail|gpu_imbalance) - ")
    expect(page.get_by_text(any_flag).first).to_be_visible(timeout=FLAG_WAIT_MS)
    expect(page.get_by_text("Advice:").first).to_be_visible()
    expect(page.get_by_test_id("stException")).to_have_count(0)
    _shoot(page, "prometheus-flags")
    for path in ("gpus", "nodes"):
        _open(page, demo["prom_url"], path, query="?refresh=5+s")
        expect(page.get_by_test_id("stException")).to_have_count(0)
    _shoot(page, "prometheus-nodes")


def test_copy_main_screenshots_for_the_readme(demo):
    """The main pages' screenshots, named for the README. They go to test-artifacts/readme/;
    with VERLMON_UPDATE_SCREENSHOTS=1 they replace docs/screenshots/ (a plain test run must not
    rewrite tracked files)."""
    update = os.environ.get("VERLMON_UPDATE_SCREENSHOTS") == "1"
    target = SCREENSHOTS if update else ARTIFACTS.parent / "readme"
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in ("overview", "gpus", "steps", "flags", "nodes", "communication"):
        src = ARTIFACTS / f"{name}.png"
        if src.exists():
            shutil.copyfile(src, target / f"demo-{SPEED:g}x-{name}.png")
            copied.append(name)
    assert {"overview", "flags", "steps", "gpus"} <= set(copied)
