"""Leading timestamps on log lines.

Accepted at the start of a line (after optional whitespace):

- ISO 8601: ``2026-01-02T03:04:05``, ``.123`` fraction, ``Z`` or ``+02:00`` / ``-0500`` offset;
- ``[2026-01-02 03:04:05]`` (brackets, optional fraction);
- ``2026-01-02 03:04:05,123`` (Python logging's default).

A timestamp without an offset ("naive") is read as UTC. Times come back as unix seconds.
"""

from __future__ import annotations

import calendar
import re

_TS_RE = re.compile(
    r"\s*\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
    r"\s?(Z|[+-]\d\d:?\d\d)?\]?(?:\s+|$)"
)

_EPOCH_CACHE: dict[tuple[str, str, str, str, str, str], int] = {}


def split_timestamp(line: str) -> tuple[float | None, str]:
    """``(unix seconds, rest of the line)`` when ``line`` starts with a timestamp, else
    ``(None, line)``. Never raises: an impossible date (month 13) counts as no timestamp."""
    if not line:
        return None, line
    first = line[0]
    if not (first.isdigit() or first == "[" or first == " "):
        return None, line
    match = _TS_RE.match(line)
    if match is None:
        return None, line
    year, month, day, hour, minute, second, frac, zone = match.groups()
    key = (year, month, day, hour, minute, second)
    base = _EPOCH_CACHE.get(key)
    if base is None:
        mon, dd, hh, mi, ss = int(month), int(day), int(hour), int(minute), int(second)
        if not (1 <= mon <= 12 and 1 <= dd <= 31 and hh <= 23 and mi <= 59 and ss <= 60):
            return None, line
        base = calendar.timegm((int(year), mon, dd, hh, mi, ss, 0, 0, 0))
        if len(_EPOCH_CACHE) > 4096:
            _EPOCH_CACHE.clear()
        _EPOCH_CACHE[key] = base
    value = float(base)
    if frac:
        value += int(frac) / 10 ** len(frac)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        value -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return value, line[match.end() :]


def parse_timestamp(text: str) -> float | None:
    """Unix seconds from a whole timestamp string (as in a JSONL ``"timestamp"``), or None."""
    value, rest = split_timestamp(text.strip())
    if value is None or rest.strip():
        return None
    return value
