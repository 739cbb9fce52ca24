"""Check, in a real headless Chromium, that ``verl-monitor dashboard`` on a Prometheus lists
every node of a job on its Nodes page. Shared by the deploy tests (Slurm, Ray)::

    from dashboard_check import nodes_shown_by_dashboard

    shown = nodes_shown_by_dashboard(prom.url, tmp_path / "dash", expected=names)
    assert shown == sorted(names)

The dashboard is started as a user starts it (``verl-monitor dashboard --prometheus URL``) and
stopped afterwards. Chromium is Debian's (``CHROMIUM``, default ``/usr/bin/chromium``).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from procs import free_port, start_process, wait_until

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_missing() -> str | None:
    """Why the check cannot run here (no Chromium or no Playwright), else None."""
    if not Path(CHROMIUM).exists():
        return f"chromium not installed at {CHROMIUM} (make sysdeps)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    return None


def nodes_shown_by_dashboard(prometheus_url: str, workdir: Path, expected: Sequence[str],
                             timeout_s: float = 90) -> list[str]:
    """Open the Nodes page of a dashboard reading ``prometheus_url`` and return the node names
    it offers (its "Drill down to node" list), sorted, once its "Nodes" metric reads
    ``len(expected)``. Raises (Playwright's assertion error) when the page never shows that
    many nodes or shows an exception."""
    from playwright.sync_api import sync_playwright

    from dashboards.sources.prometheus import PrometheusSource

    # the page reads what Prometheus holds: first every node's GPU series, as a user would wait
    # for the first scrapes
    src = PrometheusSource(prometheus_url)
    wait_until(lambda: len(src.nodes()) >= len(expected), timeout_s,
               what=f"{len(expected)} nodes' GPU series in Prometheus")
    port = free_port()
    app = start_process(
        [CLI, "dashboard", "--prometheus", prometheus_url, "--port", str(port)],
        workdir, "dashboard", port, f"http://127.0.0.1:{port}/_stcore/health", timeout=90)
    ms = int(timeout_s * 1000)

    def browse() -> list[str]:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                workdir.mkdir(parents=True, exist_ok=True)
                shot = workdir / "nodes.png"
                try:
                    return _listed_nodes(page, app.url, expected, ms, shot)
                except Exception:
                    page.screenshot(path=shot, full_page=True)  # what the page showed
                    raise
            finally:
                browser.close()

    try:
        # on a thread of its own: the sync API refuses to run where an asyncio loop runs, which
        # pytest-playwright's fixtures leave in the main thread of a session that used them
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(browse).result()
    finally:
        app.stop()


def _listed_nodes(page, url: str, expected: Sequence[str], ms: int, shot: Path) -> list[str]:
    from playwright.sync_api import expect

    # the drill-down list is on the "One node" tab; the page reruns until the window has the
    # samples
    page.goto(f"{url}/nodes?nodes_view=One+node&refresh=5+s")
    expect(page.get_by_role("heading", name="Nodes", level=1)).to_be_visible(timeout=ms)
    expect(page.get_by_test_id("stMetric").filter(has_text="Nodes").first).to_contain_text(
        str(len(expected)), timeout=ms)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    page.get_by_role("combobox", name="Drill down to node").click()
    options = page.get_by_role("option")
    expect(options).to_have_count(len(expected), timeout=ms)
    shown = [re.sub(r"\s+", " ", t).strip() for t in options.all_inner_texts()]
    page.screenshot(path=shot, full_page=True)
    return sorted(shown)


def store_dashboard(store: Path, workdir: Path):
    """``verl-monitor dashboard --store STORE`` started as a user starts it, once its health
    endpoint answers (a ``procs.Proc``: ``.url``, ``.stop()``)."""
    port = free_port()
    return start_process([sys.executable, "-m", "monitor", "dashboard", "--store", str(store),
                          "--port", str(port)], workdir, "dashboard", port,
                         f"http://127.0.0.1:{port}/_stcore/health", timeout=90)


def open_page(page, url: str) -> None:
    """Open ``url`` and wait until the app's script has run, without an exception shown."""
    from playwright.sync_api import expect

    page.goto(url)
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        state="attached", timeout=60_000)
    expect(page.get_by_test_id("stException")).to_have_count(0)
