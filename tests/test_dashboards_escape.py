"""Log text made inert for the app's Markdown (issue 20): what the escaped text turns into once
CommonMark has read its backslash escapes is the text as written (plus invisible word joiners),
with nothing left for an image, a link, an autolink, HTML or a Streamlit directive.
The browser's side is tests/e2e/test_dashboard_inert_text.py."""

from __future__ import annotations

import re
import string

import pytest

from dashboards.escape import WORD_JOINER, escape_markdown, shown_text
from monitor.records import Flag

HOSTILE = [
    "![pixel](http://tracker.example/p.png?u=1)",
    "[Click here](https://evil.example/login) and <https://evil.example/x>",
    '<img src="http://tracker.example/a.png"> <a href="http://evil.example">x</a>',
    "bare http://evil.example/a, www.evil.example and mail ops@evil.example",
    ":red[alarm] :material/warning: $\\int x$ **bold** _it_ `code` # head\n- item\n> quote",
    "GPU 3 ran at 41% while the others ran at 93% during gen (step 12: 1.5 s > 0.9 s)",
    "&lt;img&gt; &#x3C;b&#x3E; \\![x](y) trailing backslash \\",
]


def read_as_commonmark(escaped: str) -> str:
    """The characters a CommonMark parser makes of backslash escapes (``\\X`` is ``X`` for
    ASCII punctuation X; any other backslash stays)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", escaped)


def unescaped_punctuation(escaped: str) -> list[str]:
    """ASCII punctuation that no backslash escapes (where Markdown syntax could start)."""
    out, i = [], 0
    while i < len(escaped):
        if escaped[i] == "\\" and i + 1 < len(escaped):
            i += 2
            continue
        if escaped[i] in string.punctuation:
            out.append(escaped[i])
        i += 1
    return out


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_reads_as_written_and_starts_no_syntax(text: str) -> None:
    escaped = escape_markdown(text)
    assert unescaped_punctuation(escaped) == []
    assert read_as_commonmark(escaped).replace(WORD_JOINER, "") == text


@pytest.mark.parametrize("text", HOSTILE)
def test_no_autolink_can_form_in_the_text_a_parser_sees(text: str) -> None:
    """GFM links bare URLs, www. names and e-mail addresses even inside plain text nodes."""
    seen = read_as_commonmark(escape_markdown(text))
    assert not re.search(r"(?i)https?://|www\.|[\w.+-]@[\w-]", seen), seen


def test_plain_words_are_left_alone() -> None:
    assert escape_markdown("GPU 3 ran slow") == "GPU 3 ran slow"
    assert escape_markdown(42) == "42"


def test_the_flag_card_shows_hostile_evidence_as_text() -> None:
    from dashboards.common import flag_card_markdown

    flag = Flag("fatal_error", "critical", 1_767_225_600.0, None,
                scope={"node": "[n0](http://evil.example)"}, evidence=HOSTILE[0],
                advice=[HOSTILE[1]])
    card = flag_card_markdown(flag)
    head, evidence, advice = card.split("\n\n")
    # the card's own Markdown: the badge and the bold labels
    assert head.startswith(":red-badge[CRITICAL] **fatal\\_error") and head.endswith("UTC**")
    assert evidence == "**Evidence:** " + escape_markdown(HOSTILE[0])
    assert advice == "**Advice:**\n- " + escape_markdown(HOSTILE[1])
    assert escape_markdown("node=[n0](http://evil.example)") in head


def test_controls_and_bidi_overrides_show_as_escapes_on_the_page() -> None:
    """Issue 41 item 4: a right-to-left override (``gnp.exe`` read as ``exe.png``), a
    zero-width space and terminal escapes in evidence are shown as escapes on the page."""
    shown = shown_text(escape_markdown("at evil\x1b]0;x\x07 \u202egnp.exe a\u200bb"))
    assert shown == "at evil\\x1b]0;x\\x07 \\u202egnp.exe a\\u200bb"
