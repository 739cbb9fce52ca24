"""Text from outside made inert wherever it is shown: a terminal, Slack, a Prometheus label, a
page, one log line.

A log line, a py-spy frame, an HTTP answer or a file name can hold what acts on the reader:
terminal escapes (CSI ``ESC [``, OSC ``ESC ]`` such as OSC 52, which writes the clipboard, OSC
8, hidden links, OSC 0, the window title), other C0 and C1 controls (``BEL``, ``CR`` that
overwrites a line), bidirectional overrides and isolates (U+202E shows ``exe.png`` for
``gnp.exe``) and other invisible characters (zero-width spaces, line separators). Every text
that reaches a reader goes through :func:`printable` (the report of ``analyze``, the command
line's error lines, the exporter's log, Slack messages, Prometheus label values, the app's
flags): each such character is shown as a backslash escape (``\\x1b``, ``\\u202e``), so an
escape sequence becomes plain characters and the reader sees that something was there.
:func:`one_line` does the same on one line, cut to a length.
"""

from __future__ import annotations

import logging

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_char(ch: str) -> str:
    """``ch`` as it is shown: itself when printable, else its backslash escape."""
    if ch.isprintable():
        return ch
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object, keep: str = "\n") -> str:
    """``text`` with every character that is not printable (controls, escapes, bidirectional
    and other invisible format characters, separators other than the space) shown as a
    backslash escape; the characters in ``keep`` stay as they are (the newlines of a
    multi-line report)."""
    s = str(text)
    if s.isprintable():
        return s
    if keep == "\n":
        return "\n".join(line if line.isprintable() else _escaped(line, "")
                         for line in s.split("\n"))
    return _escaped(s, keep)


def _escaped(text: str, keep: str) -> str:
    return "".join(ch if ch in keep else escape_char(ch) for ch in text)


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one printable line of at most ``limit`` characters (an ellipsis marks a cut):
    newlines and other control or unprintable characters become backslash escapes."""
    raw = str(text)[: limit * 4]
    out: list[str] = []
    size = 0
    for ch in raw:
        piece = escape_char(ch)
        out.append(piece)
        size += len(piece)
        if size > limit:
            break
    shown = "".join(out)
    if len(shown) > limit or len(raw) < len(str(text)):
        return shown[: limit - 1] + "…"
    return shown


class PrintableFormatter(logging.Formatter):
    """A log formatter whose lines are :func:`printable` (newlines kept, for tracebacks): a
    message quoting a log line or a file name cannot act on the terminal it is shown on."""

    def format(self, record: logging.LogRecord) -> str:
        """The record formatted as usual, then made printable."""
        return printable(super().format(record))
