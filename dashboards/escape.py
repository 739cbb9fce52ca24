"""Text from a training log shown inert in the app's Markdown.

Flag evidence quotes log lines, and scope and node names come from the source: any of them can
carry Markdown (``![x](http://host/pixel.png)`` would make every viewer's browser fetch that
image, with the dashboard's address as Referer; ``[Click here](http://...)`` a disguised link),
raw HTML, or Streamlit's own directives (``:red[...]``, ``$...$`` LaTeX). :func:`escape_markdown`
makes such text read exactly as written: every ASCII punctuation character is backslash-escaped
(CommonMark shows an escaped character literally), and a word joiner (U+2060, invisible) follows
each ``:`` and ``@`` and splits ``www.``, so GitHub-flavoured Markdown's bare-URL and e-mail
autolinks cannot form either.
"""

from __future__ import annotations

import re

from monitor.api import printable

#: Invisible, zero-width, never a line break: splits what autolinking looks for.
WORD_JOINER = "\u2060"
_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_AUTOLINK_HINTS = re.compile(r"([:@])|(?i:(w)(ww\.))")
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def _split_autolink(match: re.Match[str]) -> str:
    if match.group(1):
        return match.group(1) + WORD_JOINER
    return match.group(2) + WORD_JOINER + match.group(3)


def escape_markdown(text: object) -> str:
    """``text`` as Markdown that renders as the same characters and nothing else: no image,
    link, autolink, HTML, emphasis, heading, list, LaTeX or Streamlit directive; controls,
    bidirectional overrides and other invisible characters shown as backslash escapes
    (``monitor.printable``, before the word joiners this adds)."""
    out = _AUTOLINK_HINTS.sub(_split_autolink, printable(text))
    return _ASCII_PUNCTUATION.sub(r"\\\1", out)


def shown_text(markdown: str) -> str:
    """What a reader sees of text escaped by :func:`escape_markdown`: CommonMark's backslash
    escapes read, the word joiners dropped (for checks of what a page says)."""
    return _ESCAPED.sub(r"\1", markdown).replace(WORD_JOINER, "")
