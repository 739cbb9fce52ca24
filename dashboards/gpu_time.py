"""Where the GPU time goes, as one bar drawn in plain HTML: by cause of the goodput ledger
(the Overview's headline bar: productive, then each cause of loss, as the banner names them)
or by phase of the mean step (Steps & phases).

Drawn as HTML it appears with the page's text, at no cost in the browser, where a Plotly chart
costs about 0.2 s to draw on a 2-core machine (``bench/dashboard.py``).
"""

from __future__ import annotations

import html
from typing import NamedTuple

import numpy as np

from dashboards.charts import CAUSE_COLORS, PHASE_COLORS

TITLE = "Where the GPU time goes (mean step)"
#: Colour of the phases too short to measure one by one, and of the not-measured block.
SHORT_COLOR = "#B0B0B0"
UNKNOWN_COLOR = "#E8E8E8"
#: The idle share: white with grey hatching, so it reads as "nothing ran".
IDLE_STYLE = ("background: repeating-linear-gradient(135deg, #FFFFFF 0 4px, #BBBBBB 4px 5px);"
              "box-shadow: inset 0 0 0 1px #888888;")


class Segment(NamedTuple):
    """One part of the bar: its legend name, its width in % of the step, its colour (``""``
    for the hatched idle style) and the words shown on hover."""

    name: str
    share: float
    color: str
    hover: str


def gpu_time_segments(phase_seconds: dict[str, float], phase_util: dict[str, float],
                      step_util: float | None = None) -> tuple[str, list[Segment]]:
    """The bar's title and segments: one per measured phase for the time the GPUs were busy in
    it (phase share x its utilization), then the phases too short to measure one by one, then
    the idle share. The segments add up to 100 (none without phase timings).

    The short phases (no utilization in ``phase_util``: fewer samples inside them than the
    attribution needs) are one segment. With ``step_util`` (the GPUs' mean utilization over
    the whole steps, every sample counted) their busy share is what the step's busy time
    leaves after the measured phases, and the rest of it joins the idle share; without it
    the block says "util n/a"."""
    total = sum(v for v in phase_seconds.values() if v and v > 0)
    if total <= 0:
        return f"{TITLE}: no phase timings yet", []
    segments: list[Segment] = []
    idle = unknown = measured = 0.0
    short: list[str] = []
    for phase, secs in phase_seconds.items():
        if not secs or secs <= 0:
            continue
        share = 100.0 * secs / total
        util = phase_util.get(phase)
        if util is None or not np.isfinite(util):
            unknown += share
            short.append(phase)
            continue
        busy = share * min(max(util, 0.0), 100.0) / 100.0
        idle += share - busy
        measured += busy
        segments.append(Segment(phase, busy, PHASE_COLORS.get(phase, "#888888"),
                                f"{phase}: {share:.0f}% of the step, GPUs {util:.0f}% busy in it"))
    tail: list[Segment] = []
    if unknown > 0 and step_util is not None and np.isfinite(step_util):
        short_busy = min(max(min(max(step_util, 0.0), 100.0) - measured, 0.0), unknown)
        idle += unknown - short_busy
        in_short = 100.0 * short_busy / unknown
        segments.append(Segment(
            f"short phases ({unknown:.0f}% of the step, ~{in_short:.0f}% busy)", short_busy,
            SHORT_COLOR, f"{', '.join(short)}: each shorter than the samples can resolve; "
            f"together {unknown:.0f}% of the step, GPUs ~{in_short:.0f}% busy in them (the "
            "steps' busy time less the measured phases')"))
    elif unknown > 0:
        tail.append(Segment(f"util n/a ({unknown:.0f}%)", unknown, UNKNOWN_COLOR,
                            f"{', '.join(short)}: shorter than the sampling interval, "
                            f"{unknown:.0f}% of the step"))
    segments.append(Segment(f"idle ({idle:.0f}%)", idle, "",
                            f"GPUs idle: {idle:.0f}% of the step"))
    return f"{TITLE}: GPUs idle {idle:.0f}% of the step", segments + tail


CAUSE_TITLE = "Where the GPU time went"


def cause_segments(shares: dict[str, float], span: str, goodput: float | None,
                   top_loss: str | None = None) -> tuple[str, list[Segment]]:
    """The headline bar's title and segments: ``productive`` first, then every cause of loss
    largest first, ``unattributed`` last (``shares``: the span's share of each cause, 0..1).
    The segments add up to 100; the top loss is the largest lost segment, named the same."""
    from monitor.api import CAUSE_TEXT

    if not shares or goodput is None:
        return f"{CAUSE_TITLE}: no ledger yet (it needs two finished steps with GPU samples)", []
    order = ["productive"] + sorted((c for c in shares if c not in ("productive", "unattributed")),
                                    key=lambda c: -shares[c]) + ["unattributed"]
    segments = []
    for cause in order:
        share = 100.0 * shares.get(cause, 0.0)
        if share <= 0:
            continue
        what = CAUSE_TEXT.get(cause, ("", ""))[0]
        mark = " (top loss)" if cause == top_loss else ""
        segments.append(Segment(cause, share, CAUSE_COLORS.get(cause, "#888888"),
                                f"{cause}: {share:.0f}% of the GPU time{mark}"
                                + (f": {what}" if what else "")))
    return f"{CAUSE_TITLE} ({span}): goodput {goodput * 100:.0f}%", segments


def _swatch(seg: Segment) -> str:
    return IDLE_STYLE if not seg.color else f"background: {seg.color};"


def _label(seg: Segment) -> str:
    """"gen 48%"; names that carry their share already ("idle (30%)") are left as they are."""
    return seg.name if "%" in seg.name else f"{seg.name} {seg.share:.0f}%"


def stacked_bar_html(title: str, segments: list[Segment], notes: tuple[str, ...] = ()) -> str:
    """The segments as one horizontal bar with a legend under it, in HTML with inline styles
    (hover a segment or a legend entry for its words); ``notes`` (HTML) follow, one paragraph
    each: the bar, its caption and what it calls for are one block to draw."""
    head = f'<div style="font-weight: 600; margin-bottom: 0.3rem;">{html.escape(title)}</div>'
    tail = "".join(f'<div style="margin-top: 0.4rem;">{n}</div>' for n in notes)
    if not segments:
        return f"<div>{head}{tail}</div>"
    parts, legend = [], []
    for seg in segments:
        tip = html.escape(seg.hover, quote=True)
        if seg.share > 0:
            parts.append(f'<div title="{tip}" style="width: {seg.share:.3f}%; {_swatch(seg)}">'
                         "</div>")
        legend.append(f'<span title="{tip}" style="white-space: nowrap; margin-right: 1rem;">'
                      f'<span style="display: inline-block; width: 0.8rem; height: 0.8rem; '
                      f'vertical-align: -0.1rem; margin-right: 0.3rem; {_swatch(seg)}"></span>'
                      f"{html.escape(_label(seg))}</span>")
    bar = ('<div data-testid="verlmon-gpu-time-bar" style="display: flex; height: 1.6rem; '
           'width: 100%; border-radius: 0.25rem; overflow: hidden; '
           'border: 1px solid #88888866;">' + "".join(parts) + "</div>")
    return (f'<div>{head}{bar}<div style="font-size: 0.85rem; margin-top: 0.3rem; '
            f'line-height: 1.6;">{"".join(legend)}</div>{tail}</div>')
