"""The landing page served at ``/``: what this exporter collects, with a link to /metrics."""

from __future__ import annotations

import html
from collections.abc import Iterable


def landing_page(
    node: str,
    version: str,
    collectors: Iterable[tuple[str, str, bool]],
    backend: str | None = None,
    interval: float | None = None,
) -> bytes:
    """HTML for ``/``; ``collectors`` yields (name, help text, enabled)."""
    rows = []
    for name, help_text, enabled in collectors:
        state = "on" if enabled else "off"
        rows.append(
            f"<tr><td><code>{html.escape(name)}</code></td><td>{state}</td>"
            f"<td>{html.escape(help_text)}</td></tr>"
        )
    facts = [f"node <b>{html.escape(node)}</b>", f"version {html.escape(version)}"]
    if backend:
        facts.append(f"GPU backend <b>{html.escape(backend)}</b>")
    if interval:
        facts.append(f"sampling every {interval:g} s")
    body = f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>verl-monitor exporter</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 60em; }}
table {{ border-collapse: collapse; }} td, th {{ padding: .3em .8em; border-bottom: 1px solid #ddd;
text-align: left; }}
</style></head>
<body>
<h1>verl-monitor exporter</h1>
<p>{" &middot; ".join(facts)}</p>
<p>Prometheus metrics: <a href="metrics">/metrics</a>. Every series starts with
<code>verlmon_</code>; collection health is in <code>verlmon_collector_success</code> and
<code>verlmon_collector_duration_seconds</code>.</p>
<h2>Collectors</h2>
<table><tr><th>collector</th><th>state</th><th>what it reads</th></tr>
{chr(10).join(rows)}
</table>
<p>Turn one on or off with <code>--collector.NAME</code> / <code>--no-collector.NAME</code>.</p>
</body></html>
"""
    return body.encode("utf-8")
