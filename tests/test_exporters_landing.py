"""The landing page at /."""

from __future__ import annotations

from exporters.landing import landing_page


def test_lists_collectors_escapes_text_and_links_metrics():
    html = landing_page("node<1>", "0.1.0", [("gpu", "GPU <util> & memory", True),
                                             ("nccl", "NCCL dumps", False)],
                        backend="sim", interval=0.5).decode()
    assert html.startswith("<!DOCTYPE html>")
    assert 'href="metrics"' in html
    assert "node&lt;1&gt;" in html and "node<1>" not in html
    assert "GPU &lt;util&gt; &amp; memory" in html
    assert "<code>gpu</code></td><td>on" in html and "<code>nccl</code></td><td>off" in html
    assert "every 0.5 s" in html and "<b>sim</b>" in html
