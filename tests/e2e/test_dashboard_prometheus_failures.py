"""The dashboard on a Prometheus that misbehaves, in a real headless Chromium (issue 20): a
server dripping its answers and one answering JSON of the wrong shape. Before, the first left
every page blank and "Running" for good and the second showed a traceback on every page; now
each page shows the one-line message in an error box and finishes its run, and the pages
stay usable (the sidebar still moves between them).

The misbehaving server is ``tests/bad_prometheus.py`` in a process of its own; the dashboard is
started as a user starts it, with ``--prometheus-timeout 2``.
"""

from __future__ import annotations

import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from dashboard_check import CHROMIUM, CHROMIUM_ARGS, CLI, chromium_missing
from procs import free_port, start_process, wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(chromium_missing() is not None,
                                 reason=chromium_missing() or "")]

REPO = Path(__file__).resolve().parents[2]
MS = 60_000


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("mode, message", [
    ("drip", "did not answer within 2 s"),
    ("data-list", "answered in a shape verl-monitor cannot read"),
])
def test_every_page_shows_the_one_line_and_finishes(tmp_path: Path, mode: str,
                                                    message: str) -> None:
    prom_port, app_port = free_port(), free_port()
    bad = start_process([sys.executable, str(REPO / "tests" / "bad_prometheus.py"), mode,
                         str(prom_port)], tmp_path, "bad-prometheus", prom_port, None)
    app = None
    try:
        wait_until(lambda: _listening(prom_port), 30, what="the misbehaving server")
        app = start_process(
            [CLI, "dashboard", "--prometheus", f"http://127.0.0.1:{prom_port}",
             "--prometheus-timeout", "2", "--port", str(app_port)],
            tmp_path, "dashboard", app_port, f"http://127.0.0.1:{app_port}/_stcore/health",
            timeout=90)
        with ThreadPoolExecutor(1) as pool:  # the sync API wants a thread without a loop
            pool.submit(_browse, app.url, message, tmp_path / f"{mode}.png").result()
    finally:
        if app is not None:
            app.stop()
        bad.stop()


def _browse(url: str, message: str, shot: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            for path, title in (("", "Overview"), ("gpus", "GPUs"), ("nodes", "Nodes")):
                page.goto(f"{url}/{path}?refresh=off")
                expect(page.get_by_role("heading", name=title, level=1)).to_be_visible(
                    timeout=MS)
                alert = page.get_by_test_id("stAlert").filter(has_text=message)
                expect(alert.first).to_be_visible(timeout=MS)
                page.locator("[data-testid='stApp'][data-test-script-state='notRunning']"
                             ).wait_for(state="attached", timeout=MS)
                expect(page.get_by_test_id("stException")).to_have_count(0)
                text = alert.first.inner_text().strip()
                assert "\n" not in text and "Traceback" not in text, text
            # still usable: the sidebar moves to another page, which says the same
            page.get_by_test_id("stSidebarNav").get_by_text("Flags").click()
            expect(page.get_by_role("heading", name="Flags", level=1)).to_be_visible(timeout=MS)
            expect(page.get_by_test_id("stAlert").filter(has_text=message).first).to_be_visible(
                timeout=MS)
            page.screenshot(path=shot, full_page=True)
        except Exception:
            page.screenshot(path=shot, full_page=True)
            raise
        finally:
            browser.close()
