"""What wraps a log line's text: tqdm redraws, ANSI colours, a leading timestamp, Ray's
``(Actor pid=N, ip=A)`` prefix and its ``[repeated Nx across cluster]`` suffix.

A second prefix of the same shape right after Ray's is the process inside the actor that
printed the line (vLLM's multiprocess workers under verl's ``vLLMHttpServer`` actor:
``(vLLMHttpServer pid=114205) (Worker pid=115537) INFO:2026-07-30 10:34:14,418:...``): it is
taken off too, so the line's own text (and its date) comes first; the actor stays Ray's."""

from __future__ import annotations

import re
from typing import NamedTuple

from monitor.logs.timestamps import split_timestamp_naive

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX_RE = re.compile(r"\((?:([A-Za-z_][\w.:-]*) )?pid=(\d+)(?:, ip=([0-9A-Fa-f.:]+))?\) ?")
_REPEATED_RE = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")


class LineText(NamedTuple):
    """A line's own text and what was around it."""

    line: str  # the whole line, tqdm redraws and ANSI colours removed (for error samples)
    time: float | None  # the leading timestamp, unix seconds
    text: str
    actor: str | None  # Ray actor name of the prefix (``TaskRunner``, ``main_task``)
    ip: str | None  # the prefix's worker IP
    repeated: int  # Ray's de-duplication count (1 when the line was not repeated)
    naive: bool = False  # the timestamp had no offset (read in the log's zone)


def unwrap(line: str) -> LineText:
    """The text of one physical line (its newline, if any, dropped) with its wrapping."""
    if line.endswith("\n"):
        line = line[:-1]
    if "\r" in line:
        # tqdm redraws with carriage returns: the last drawing is the current one.
        parts = [p for p in line.split("\r") if p.strip()]
        line = parts[-1] if parts else ""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    ts, text, naive = split_timestamp_naive(line)
    actor = ip = None
    if text.startswith("("):
        match = _RAY_PREFIX_RE.match(text)
        if match is not None:
            actor = match.group(1) or None
            ip = match.group(3)
            text = text[match.end() :]
            if ts is None:
                ts, text, naive = split_timestamp_naive(text)
            if text.startswith("("):  # the process inside the actor that printed the line
                inner = _RAY_PREFIX_RE.match(text)
                if inner is not None:
                    text = text[inner.end() :]
                    if ts is None:
                        ts, text, naive = split_timestamp_naive(text)
    repeated = 1
    if text.endswith("cluster]"):
        match = _REPEATED_RE.search(text)
        if match is not None:
            repeated = int(match.group(1))
            text = text[: match.start()]
    return LineText(line, ts, text, actor, ip, repeated, naive)
