"""One printable filter for every text that reaches a reader (issue 41 item 4): terminal
escapes, C0/C1 controls, bidirectional overrides and other invisible characters are shown as
backslash escapes, so they act on nothing; printable text, newlines kept, is left alone."""

from __future__ import annotations

import logging
import unicodedata

import pytest

from monitor.printable import PrintableFormatter, one_line, printable

#: What round 5 put in log lines and py-spy frames (N4, N5), and a few more of the kind.
HOSTILE = {
    "OSC 52 (write the clipboard)": "\x1b]52;c;cm0gLXJmIH4vKgo=\x07",
    "OSC 8 (hidden link)": "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07",
    "OSC 0 (window title)": "\x1b]0;owned\x1b\\",
    "CSI clear screen": "\x1b[2J\x1b[31mRED",
    "C1 CSI": "\x9b2J",
    "right-to-left override": "\u202e gnp.exe",
    "bidi isolate": "\u2066x\u2069",
    "zero-width space": "a\u200bb",
    "line separator": "a\u2028b",
    "carriage return": "real\rfake",
    "backspace": "ok\x08\x08no",
    "BOM": "\ufeffhidden",
}


def dangerous(text: str) -> list[str]:
    """The characters of ``text`` that act on a reader or hide: controls, format characters,
    separators other than the space and the newline."""
    return [c for c in text if c != "\n" and (unicodedata.category(c)[0] in "CZ" and c != " ")]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_escape_and_invisible_control_is_shown_escaped(name: str) -> None:
    text = "before " + HOSTILE[name] + " after"
    shown = printable(text)
    assert dangerous(shown) == []
    assert shown.startswith("before ") and shown.endswith(" after")
    assert one_line(text) == shown  # the one-line form agrees (nothing cut here)


def test_the_escape_says_what_was_there() -> None:
    assert printable("x\x1b]52;c;Zm9v\x07y") == "x\\x1b]52;c;Zm9v\\x07y"
    assert printable("\u202egnp.exe") == "\\u202egnp.exe"
    assert printable("tab\there") == "tab\\there"


def test_printable_text_and_newlines_are_left_alone() -> None:
    text = "Steps\n  1 step records — 30.00 s × 2, p50 … done; 日本語, émigré\n"
    assert printable(text) == text
    assert printable("a\nb", keep="") == "a\\nb"


def test_the_log_formatter_shows_a_quoted_escape_escaped() -> None:
    fmt = PrintableFormatter("x: %(message)s")
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "read %s", (
        "evil\x1b]0;title\x07.log",), None)
    assert fmt.format(record) == "x: read evil\\x1b]0;title\\x07.log"
