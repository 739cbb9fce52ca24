"""A per-step trend as one inline SVG in HTML: the Overview's step time and throughput.

A Plotly chart makes the browser load and run the Plotly bundle and lay out an interactive
figure (about 0.2-0.3 s on a 2-core machine, ``bench/dashboard.py``); the Overview's trends
only need to show a shape at a glance, so they are drawn as plain SVG with the page's text.
The interactive charts stay on the Steps & phases page.
"""

from __future__ import annotations

import base64
import html
from typing import NamedTuple

import numpy as np

WIDTH, HEIGHT = 1000, 220
#: plot area inside the SVG (left, top, right, bottom margins in SVG units)
MARGIN = (56, 12, 12, 28)


class Line(NamedTuple):
    """One series: its legend name, y values (one per x; NaN leaves a gap), colour and
    whether it is dotted."""

    name: str
    y: np.ndarray
    color: str
    dotted: bool = False


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"


def _path(xs: np.ndarray, ys: np.ndarray) -> str:
    """SVG path data with a gap wherever y is NaN."""
    out, pen = [], "M"
    for x, y in zip(xs, ys, strict=True):
        if not np.isfinite(y):
            pen = "M"
            continue
        out.append(f"{pen}{x:.1f},{y:.1f}")
        pen = "L"
    return " ".join(out)


def trend_html(title: str, x, lines: list[Line], y_label: str = "",
               marks: dict[float, str] | None = None, empty: str = "no data yet") -> str:
    """``lines`` over ``x`` (steps) as HTML with an inline SVG: y from 0 to the highest value,
    the first and last x and the y range written on the axes, a legend under it; ``marks``
    (x -> words) are red dots on the first line. The SVG is an image (``data:`` URL): the
    page's sanitizer keeps no inline SVG, and nothing is fetched."""
    x = np.asarray(x, dtype=float)
    head = f'<div style="font-weight: 600; margin-bottom: 0.3rem;">{html.escape(title)}</div>'
    finite = [ln.y[np.isfinite(ln.y)] for ln in lines]
    if len(x) == 0 or not any(len(f) for f in finite):
        return (f'<div data-testid="verlmon-trend">{head}<div style="opacity: 0.7;">'
                f"{html.escape(empty)}</div></div>")
    left, top, right, bottom = MARGIN
    w, h = WIDTH - left - right, HEIGHT - top - bottom
    y_max = max(float(f.max()) for f in finite if len(f)) or 1.0
    x_lo, x_hi = float(np.nanmin(x)), float(np.nanmax(x))
    span = (x_hi - x_lo) or 1.0

    def sx(v):
        return left + (np.asarray(v, dtype=float) - x_lo) / span * w

    def sy(v):
        return top + h - np.asarray(v, dtype=float) / y_max * h

    parts = [f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" '
             'stroke="#888" stroke-width="1"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#888" '
             'stroke-width="1"/>']
    for ln in lines:
        dash = ' stroke-dasharray="4 4"' if ln.dotted else ""
        parts.append(f'<path d="{_path(sx(x), sy(ln.y))}" fill="none" stroke="{ln.color}" '
                     f'stroke-width="2"{dash}><title>{html.escape(ln.name)}</title></path>')
    if marks and lines:
        first = dict(zip(x.tolist(), lines[0].y.tolist(), strict=True))
        for mx, words in sorted(marks.items()):
            my = first.get(float(mx))
            if my is not None and np.isfinite(my):
                parts.append(f'<circle cx="{float(sx(mx)):.1f}" cy="{float(sy(my)):.1f}" r="5" '
                             f'fill="#D62728"><title>{html.escape(words)}</title></circle>')
    text = 'font-size="13" fill="#555555"'
    parts += [f'<text x="{left - 6}" y="{top + 10}" text-anchor="end" {text}>{_fmt(y_max)}</text>',
              f'<text x="{left - 6}" y="{top + h}" text-anchor="end" {text}>0</text>',
              f'<text x="{left}" y="{HEIGHT - 6}" {text}>step {x_lo:.0f}</text>',
              f'<text x="{left + w}" y="{HEIGHT - 6}" text-anchor="end" {text}>'
              f"step {x_hi:.0f}</text>"]
    if y_label:
        parts.append(f'<text x="{left + 6}" y="{top + 12}" {text} opacity="0.7">'
                     f"{html.escape(y_label)}</text>")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'font-family="sans-serif">' + "".join(parts) + "</svg>")
    # as an image (st.html's sanitizer drops inline <svg>); a data: URL, fetched from nowhere
    src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    img = (f'<img src="{src}" alt="{html.escape(title, quote=True)}" '
           'style="display: block; width: 100%; height: auto;">')
    legend = "".join(
        f'<span style="white-space: nowrap; margin-right: 1rem;"><span style="display: '
        f"inline-block; width: 1.2rem; height: 0; vertical-align: 0.25rem; margin-right: 0.3rem;"
        f' border-top: 2px {"dotted" if ln.dotted else "solid"} {ln.color};"></span>'
        f"{html.escape(ln.name)}</span>" for ln in lines)
    return (f'<div data-testid="verlmon-trend">{head}{img}<div style="font-size: 0.85rem; '
            f'margin-top: 0.3rem;">{legend}</div></div>')
