"""Log text is inert in the app (issue 20), in a real headless Chromium: flag evidence and advice
carrying Markdown images, links, bare URLs and raw HTML show as the text they are. No request
reaches the "remote" image host (a real server on 127.0.0.1 that counts every hit), and no
<img> or <a href> made from the evidence exists on the Flags, Overview or GPUs page."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from dashboard_check import chromium_missing, open_page, store_dashboard
from playwright.sync_api import Page, expect
from sample_store import build_store
from test_dashboard_demo import (  # noqa: F401 - the suite's Chromium and 1400 px viewport
    browser_context_args,
    browser_type_launch_args,
)

from monitor.records import Flag
from monitor.store.runstore import RunStore

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bool(chromium_missing()), reason=str(chromium_missing()))]

WORD_JOINER = "\u2060"


class Tracker:
    """The "remote" host a hostile log line points at: records every request it gets."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        tracker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                tracker.hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def hostile_texts(origin: str) -> dict[str, str]:
    return {
        "image": f"![pixel]({origin}/pixel.png) GPU 3 ran at 41%",
        "link": f"[Click here]({origin}/login) to fix the job",
        "html": f'<img src="{origin}/raw.png"><a href="{origin}/a">raw link</a>',
        "bare": f"see {origin}/bare and www.evil.example or ops@evil.example",
    }


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A dashboard on a one-node store with two open flags whose words come from a hostile log."""
    tmp = tmp_path_factory.mktemp("inert")
    tracker = Tracker()
    texts = hostile_texts(tracker.origin)
    path = tmp / "run.db"
    end = time.time()
    build_store(path, scenario="healthy", steps=12, step_seconds=10.0, end_time=end,
                detect=False, nccl=False, nodes=1, gpus_per_node=4)
    with RunStore(path) as rs:
        rs.upsert_flags([
            Flag("fatal_error", "critical", end - 60.0, None, scope={},
                 evidence=f"{texts['image']} {texts['html']}",
                 advice=[texts["link"], texts["bare"]]),
            Flag("gpu_imbalance", "warning", end - 90.0, None, scope={"gpus": [3]},
                 evidence=f"{texts['image']} {texts['link']}"),
        ])
    proc = store_dashboard(path, tmp)
    try:
        yield proc.url, tracker
    finally:
        proc.stop()
        tracker.close()


@pytest.mark.parametrize(("path", "holder"), [
    ("flags", "[class*=st-key-flag_card_]"),
    ("", ".st-key-ov_top_flag"),
    ("gpus", "[data-testid=stAlert]"),
])
def test_evidence_shows_as_text_and_fetches_nothing(page: Page, app, path, holder) -> None:
    base, tracker = app
    requested: list[str] = []
    page.on("request", lambda req: requested.append(req.url))
    open_page(page, f"{base}/{path}?refresh=off&window=all")
    shown = page.locator(holder).filter(has_text="ran at 41%").first
    expect(shown).to_be_visible(timeout=60_000)
    page.wait_for_timeout(500)  # an image would have been requested by now
    # nothing the browser would fetch or follow was made of the log's words...
    origin_host = tracker.origin.removeprefix("http://")
    assert [u for u in requested if origin_host in u] == []
    assert tracker.hits == []
    for selector in (f'img[src*="{origin_host}"]', f'a[href*="{origin_host}"]',
                     'a[href*="evil.example"]', 'a[href^="mailto:"]', 'img[src*="pixel"]'):
        assert page.locator(selector).count() == 0, selector
    # ...and the reader sees them as written
    text = shown.inner_text().replace(WORD_JOINER, "")
    assert f"![pixel]({tracker.origin}/pixel.png)" in text
    if path != "gpus":  # the GPUs page's warning quotes the evidence, not the advice
        assert f"[Click here]({tracker.origin}/login)" in text
        assert f'<img src="{tracker.origin}/raw.png">' in text
