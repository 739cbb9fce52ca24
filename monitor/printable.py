"""Text from outside (an HTTP answer, a corrupt file's error) made safe for one log line.

A hostile or broken peer can put newlines, terminal escapes or raw bytes into what it answers;
logged as they are, they forge log lines or garble the terminal. :func:`one_line` shows every
character that is not printable as an escape (``\\n``, ``\\x1b``) and cuts the result.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one printable line of at most ``limit`` characters (an ellipsis marks a cut):
    newlines and other control or unprintable characters become backslash escapes."""
    raw = str(text)[: limit * 4]
    out: list[str] = []
    size = 0
    for ch in raw:
        piece = ch if ch.isprintable() else _NAMED.get(ch) or (
            f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        out.append(piece)
        size += len(piece)
        if size > limit:
            break
    shown = "".join(out)
    if len(shown) > limit or len(raw) < len(str(text)):
        return shown[: limit - 1] + "…"
    return shown
