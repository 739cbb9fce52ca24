"""Small blocks of the pages drawn as one piece of HTML each: a row of headline figures, and
inline Markdown (bold, code) turned into HTML.

Every Streamlit element costs the browser some work to mount and style (a row of five
``st.metric`` in columns about 0.1 s of main-thread time on a 2-core machine, measured with
Chromium's task time); one HTML block of the same figures costs next to nothing.
"""

from __future__ import annotations

import html
import re
from typing import NamedTuple

#: Colours of a change for the better and for the worse.
GOOD_COLOR = "#21A366"
BAD_COLOR = "#E0393E"


class Stat(NamedTuple):
    """One headline figure: label, value, an optional change under it (``delta``; ``bad``
    True colours it as a change for the worse, False for the better, None leaves it grey)
    and words shown on hover (``help``)."""

    label: str
    value: str
    delta: str = ""
    bad: bool | None = None
    help: str = ""


def stat_row_html(stats: list[Stat]) -> str:
    """The figures side by side, each in an equal share of the width."""
    cells = []
    for s in stats:
        tip = f' title="{html.escape(s.help, quote=True)}"' if s.help else ""
        delta = ""
        if s.delta:
            color = {True: BAD_COLOR, False: GOOD_COLOR}.get(s.bad, "#808495")
            delta = (f'<div data-verlmon-delta style="font-size: 0.85rem; color: {color};">'
                     f"{html.escape(s.delta)}</div>")
        cells.append(f'<div data-verlmon-stat="{html.escape(s.label, quote=True)}"{tip} '
                     'style="flex: 1 1 0; min-width: 8rem;">'
                     f'<div style="font-size: 0.875rem;">{html.escape(s.label)}</div>'
                     f'<div data-verlmon-value style="font-size: 2rem; line-height: 1.3;">'
                     f"{html.escape(s.value)}</div>{delta}</div>")
    return ('<div style="display: flex; gap: 1rem; flex-wrap: wrap; margin: 0.25rem 0;">'
            + "".join(cells) + "</div>")


def stat_values(block: str) -> dict[str, str]:
    """Label -> value of a block from :func:`stat_row_html` (what a reader sees in it)."""
    pairs = re.findall(r'data-verlmon-stat="([^"]*)".*?data-verlmon-value[^>]*>([^<]*)<', block)
    return {html.unescape(k): html.unescape(v) for k, v in pairs}


def inline_html(text: str) -> str:
    """``**bold**`` and ```code``` of a line of Markdown as HTML, the rest escaped."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
