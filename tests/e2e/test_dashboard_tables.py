"""The Nodes and GPUs tables in a real headless Chromium at 1400 px: every column, the last one
included, lies inside the table's frame, and every header is as wide as its text, with long
open-flag text in the cells."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from procs import NEEDS_CHROMIUM, free_port, start_process
from sample_store import build_store
from test_dashboard_demo import (  # noqa: F401 - the suite's Chromium and 1400 px viewport
    browser_context_args,
    browser_type_launch_args,
)

from monitor.records import Flag
from monitor.store.runstore import RunStore

pytestmark = [
    pytest.mark.e2e,
    NEEDS_CHROMIUM,
    pytest.mark.skipif(shutil.which("streamlit") is None and not Path(sys.executable).parent
                       .joinpath("streamlit").exists(), reason="streamlit not installed"),
]

#: Horizontal padding glide-data-grid draws on each side of a header's text (px).
HEADER_PAD_PX = 8
#: Per table: the width the user sees, the width of all columns, and each column's title,
#: width and text width in the header font. The column widths are the grid's own (its React
#: props); the text is measured with the header font the grid draws with.
TABLES_JS = """() => [...document.querySelectorAll('[data-testid=stDataFrame]')].map(df => {
  const scroller = df.querySelector('.dvn-scroller');
  const stack = df.querySelector('.dvn-stack > div');
  const fiberKey = Object.keys(scroller).find(k => k.startsWith('__reactFiber$'));
  let fiber = scroller[fiberKey];
  let columns = null;
  while (fiber) {
    const props = fiber.memoizedProps;
    if (props && Array.isArray(props.columns) && props.columns.length
        && props.columns[0].title !== undefined) { columns = props.columns; break; }
    fiber = fiber.return;
  }
  const themed = df.querySelector('[style*=gdg-header-font-style]') || df;
  const style = getComputedStyle(themed);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = (style.getPropertyValue('--gdg-header-font-style') + ' '
              + style.getPropertyValue('--gdg-font-family')).trim();
  return {visible: scroller.clientWidth, total: parseFloat(stack.style.width),
          columns: (columns || []).map(c => ({title: c.title, width: c.width,
                                              text: ctx.measureText(c.title).width}))};
})"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A dashboard on a 3-node store where two long-worded flags are open on one node."""
    tmp = tmp_path_factory.mktemp("tables")
    path = tmp / "run.db"
    end = time.time()
    build_store(path, scenario="healthy", steps=20, step_seconds=10.0, end_time=end,
                detect=False, nccl=False, nodes=3, gpus_per_node=4)
    with RunStore(path) as rs:
        rs.upsert_flags([
            Flag("gpu_imbalance", "warning", end - 120.0, None,
                 scope={"node": "node1", "gpus": [3]},
                 evidence="GPU 3 ran at 41% while its peers ran at 88% for 6 steps"),
            Flag("io_starvation", "critical", end - 100.0, None, scope={"node": "node1"},
                 evidence="the data loader kept the GPUs idle 35% of each step"),
        ])
    port = free_port()
    proc = start_process(
        [sys.executable, "-m", "monitor", "dashboard", "--store", str(path), "--port",
         str(port)], tmp, "dashboard", port, f"http://127.0.0.1:{port}/_stcore/health",
        timeout=90)
    try:
        yield proc.url
    finally:
        proc.stop()


def _tables(page: Page, base: str, path: str, query: str = "") -> list[dict]:
    page.goto(f"{base}/{path}?refresh=off&window=all{query}")
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        state="attached", timeout=60_000)
    page.locator("[data-testid=stDataFrame] .dvn-stack").first.wait_for(
        state="attached", timeout=60_000)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    return page.evaluate(TABLES_JS)


@pytest.mark.parametrize(("path", "query", "headers", "warned"), [
    ("nodes", "", {"node", "util %", "lowest GPU %", "open flags"}, "io_starvation critical"),
    ("gpus", "&node=node1", {"GPU", "peak mem GiB", "low 1-min %", "vs median", "open flags"},
     "GPU 3 ran at 41%"),
])
def test_every_column_and_header_is_visible_at_1400_px(page: Page, app, path, query,
                                                       headers, warned):
    tables = _tables(page, app, path, query)
    table = next(t for t in tables if headers <= {c["title"] for c in t["columns"]})
    # the last column (the open flags, long words in it) ends inside the frame: no column
    # is pushed past the right edge behind a scroll bar
    assert table["total"] <= table["visible"], table
    for col in table["columns"]:
        # each header's text fits its column: "open flags", not "open fl" or "statu"
        assert col["width"] >= col["text"] + 2 * HEADER_PAD_PX, (path, col)
    # the open flags' words are there in full above the table
    expect(page.get_by_test_id("stAlert").filter(has_text=warned).first).to_be_visible()
