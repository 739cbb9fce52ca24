"""The lines a raised Python exception prints, recognised one line at a time.

A traceback ends with its exception's line (``ValueError: ...``,
``omegaconf.errors.ConfigAttributeError: Key 'x' is not in struct``, a bare ``AssertionError``);
a log or a quote often holds that line, or the frames, without the ``Traceback (most recent call
last):`` header (a quote cut short, Ray's re-raised ``RayTaskError(X): ray::Task()`` followed by
the worker's frames). And a few messages name a raised error without its type, because the
quote kept only the message (``Key 'x' is not in struct``, ``...so: undefined symbol: ...``).

Pure functions over one line's text (its Ray or date prefix already taken off); the block reader
(``monitor.logs.blocks``) and the parser use them. Warnings are not exceptions: a
``RuntimeWarning: ...`` line is never one.
"""

from __future__ import annotations

import re
from typing import NamedTuple

#: ``pkg.mod.SomeError``, ``SomeException``, ``KeyboardInterrupt``, ``SystemExit``, and
#: ``Exception`` itself; never a bare ``Error`` (reward code prints "Error: tag not found").
_TYPE = (r"(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt)|Exception|"
         r"StopIteration)")
_EXCEPTION_RE = re.compile(rf"^({_TYPE})(?:\(([A-Z]\w*)\))?(?::(?:\s+(.*))?)?$")
_FRAME_RE = re.compile(r'^File "[^"]+", line \d+, in [\w<>.]+')

#: Messages that name a raised error without its type (a quote kept only the message, or the
#: library printed it so): each with the exception it belongs to.
UNTYPED_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    # omegaconf reading a key its config does not define (ConfigAttributeError/ConfigKeyError)
    (re.compile(r"^Key '[^']+' is not in struct\b"), "ConfigAttributeError"),
    (re.compile(r"^Key '[^']+' not in '\w+'"), "ConfigKeyError"),
    # a compiled extension that does not load against the installed libraries
    (re.compile(r"\.so(?:\.[\d.]+)?: undefined symbol: \S+"), "ImportError"),
    # torch.ops.<ns> without the op a compiled extension should have registered
    (re.compile(r"^'_OpNamespace' '\w+' object has no attribute '\w+'"), "AttributeError"),
    # vLLM refusing a prompt longer than its max_model_len
    (re.compile(r"^Input prompt \(\d+ tokens\) is too long and exceeds limit of \d+"),
     "ValueError"),
    # a file named by its path that is not there (verl's model merger, checkpoint loaders)
    (re.compile(r"^\S+\.\w+ does not exist\.?$"), "FileNotFoundError"),
    # torch.distributed's TCPStore client giving up its connect timeout (c10d prints the
    # message in its warning before the DistNetworkError it raises)
    (re.compile(r"The client socket has timed out after \d+ms while trying to connect to \("),
     "DistNetworkError"),
)


#: A word each of the ``UNTYPED_MESSAGES`` holds (a cheap test before the patterns).
_UNTYPED_WORDS = ("Key '", "undefined symbol", "_OpNamespace", "Input prompt", "does not exist",
                  "timed out after")


class ExceptionLine(NamedTuple):
    """An exception's line: its type (``omegaconf.errors.ConfigAttributeError``), the type a
    Ray ``RayTaskError(X)`` wraps (``X``, else None), its message ('' when none), and whether
    the type was printed (False for an ``UNTYPED_MESSAGES`` line, whose type is implied)."""

    type: str
    wrapped: str | None
    message: str
    typed: bool = True

    @property
    def name(self) -> str:
        """The exception's class name without its module (the wrapped one for RayTaskError)."""
        return self.wrapped or self.type.rsplit(".", 1)[-1]


def exception_line(text: str) -> ExceptionLine | None:
    """The exception a line prints (``text`` stripped of its prefix), None for any other line:
    ``Type: message``, a bare ``Type``, ``ray.exceptions.RayTaskError(X): ray::...``, or one of
    ``UNTYPED_MESSAGES``."""
    stripped = text.strip()
    if not stripped or len(stripped) > 4000:
        return None
    if stripped[0].isalpha() and ("Error" in stripped or "Exception" in stripped
                                  or "Exit" in stripped or "Interrupt" in stripped
                                  or "StopIteration" in stripped):
        head = stripped.split(":", 1)[0]
        if " " not in head and not head.endswith("Warning"):
            match = _EXCEPTION_RE.match(stripped)
            if match is not None:
                return ExceptionLine(match.group(1), match.group(2), match.group(3) or "")
    if not any(word in stripped for word in _UNTYPED_WORDS):
        return None  # most lines: no message of UNTYPED_MESSAGES can be in them
    for pattern, implied in UNTYPED_MESSAGES:
        if pattern.search(stripped):
            return ExceptionLine(implied, None, stripped, typed=False)
    return None


def is_frame_line(text: str) -> bool:
    """True for a traceback frame's line, ``File "path", line N, in function`` (indented or
    not)."""
    return _FRAME_RE.match(text.lstrip()) is not None


__all__ = ["UNTYPED_MESSAGES", "ExceptionLine", "exception_line", "is_frame_line"]
