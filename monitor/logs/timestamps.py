"""Leading timestamps on log lines.

Accepted at the start of a line (after optional whitespace):

- ISO 8601: ``2026-01-02T03:04:05``, ``.123`` fraction, ``Z`` or ``+02:00`` / ``-0500`` offset;
- ``[2026-01-02 03:04:05]`` (brackets, optional fraction);
- ``2026-01-02 03:04:05,123`` (Python logging's default).

A timestamp without an offset ("naive", as Python logging's default ``%(asctime)s`` writes
it) is read in the host's time zone (``TZ``, ``/etc/localtime``), or in the zone set with
``set_log_timezone`` (the ``--log-timezone`` option of ``exporter`` and ``analyze``). Times
come back as unix seconds. ``FUTURE_SLACK_S`` and ``PAST_LIMIT_S`` bound the dates a right
clock could have printed (a node whose clock is off prints others).
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
import time
import zoneinfo

#: A line may be dated this much after the time it was read (clocks of nodes differ a little).
FUTURE_SLACK_S = 300.0
#: A line dated more than this before the time it was read is taken for a wrong clock.
PAST_LIMIT_S = 366 * 86400.0

#: The zone naive timestamps are read in; None: the host's (asked each time, so a changed
#: ``TZ`` with ``time.tzset()`` applies at once).
_zone: dt.tzinfo | None = None
_OFFSET_RE = re.compile(r"([+-])(\d\d):?(\d\d)")


def log_timezone(text: str) -> dt.tzinfo | None:
    """The zone a ``--log-timezone`` value names: ``local`` (the host's: None), ``UTC``, an
    offset (``+05:30``, ``-0800``) or an IANA name (``America/New_York``). Raises ValueError
    with a message saying what is accepted."""
    value = text.strip()
    if value.lower() in ("local", "host", ""):
        return None
    if value.upper() in ("UTC", "Z", "GMT"):
        return dt.timezone.utc
    match = _OFFSET_RE.fullmatch(value)
    if match:
        sign, hh, mm = match.groups()
        minutes = int(hh) * 60 + int(mm)
        if minutes >= 24 * 60 or int(mm) >= 60:
            raise ValueError(f"time zone offset {value!r} is out of range")
        return dt.timezone((-1 if sign == "-" else 1) * dt.timedelta(minutes=minutes))
    try:
        return zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {value!r}: give local, UTC, an offset such as "
                         "+05:30, or a name such as America/New_York") from None


def log_timezone_arg(text: str) -> str:
    """argparse type of ``--log-timezone`` (``exporter``, ``analyze``): the name, checked."""
    import argparse

    try:
        log_timezone(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def set_log_timezone(zone: str | dt.tzinfo | None) -> None:
    """Read naive timestamps in ``zone`` from now on (a ``log_timezone`` name or a tzinfo;
    None or ``"local"``: the host's zone)."""
    global _zone
    _zone = log_timezone(zone) if isinstance(zone, str) else zone
    _NAIVE_CACHE.clear()


def naive_epoch(parts: tuple[int, int, int, int, int, int]) -> int | None:
    """Unix seconds of a wall-clock time ``(year, month, day, hour, minute, second)`` without
    an offset, read in the log's zone (the host's, or ``set_log_timezone``'s); None when it
    cannot be one. For any reader of naive dates, so all of them agree. A time the zone shows
    twice is read as the first (a reader keeping order takes the second with
    :func:`later_reading`, see :class:`NaiveOrder`)."""
    zone = _zone
    try:  # a time shown twice (a DST fall-back) is its first reading (``later_reading``)
        if zone is None:
            return int(dt.datetime(*parts).timestamp())
        return int(dt.datetime(*parts, tzinfo=zone).timestamp())
    except (OverflowError, ValueError, OSError):
        return None

def later_reading(unix: float) -> float | None:
    """When ``unix`` was read from a wall-clock time that the log's zone shows twice (the hour
    a DST fall-back repeats) and it is the first of the two: the second, an hour or so later.
    None otherwise (an unambiguous time, a fixed offset, UTC)."""
    zone = _zone
    try:
        local = dt.datetime.fromtimestamp(unix, zone) if zone is not None else \
            dt.datetime.fromtimestamp(unix)
        if local.fold:
            return None
        other = local.replace(fold=1).timestamp()
    except (OverflowError, ValueError, OSError):
        return None
    return other if other > unix else None


#: A naive time may read this much before the one before it and still be taken as written.
NAIVE_BACK_SLACK_S = 600.0


class NaiveOrder:
    """Reads a log's naive times in order through a DST fall-back: a time that falls in the
    repeated hour and reads more than ``NAIVE_BACK_SLACK_S`` before the log's previous naive
    time is taken as the hour's second occurrence when that one keeps the order (round 5: the
    second 01:00-01:50 EST was put an hour early, before the steps it followed)."""

    def __init__(self) -> None:
        self.last: float | None = None

    def read(self, value: float) -> float:
        """``value`` (a naive time as first read), or its later reading; remembered."""
        last = self.last
        if last is not None and value < last - NAIVE_BACK_SLACK_S:
            later = later_reading(value)
            if later is not None and later >= last - NAIVE_BACK_SLACK_S:
                value = later
        self.last = value
        return value


_TS_RE = re.compile(
    r"\s*\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
    r"\s?(Z|[+-]\d\d:?\d\d)?\]?(?:\s+|$)"
)

_EPOCH_CACHE: dict[tuple[str, str, str, str, str, str], int] = {}
_NAIVE_CACHE: dict[tuple, int] = {}


def split_timestamp(line: str) -> tuple[float | None, str]:
    """``(unix seconds, rest of the line)`` when ``line`` starts with a timestamp, else
    ``(None, line)``. Never raises: an impossible date (month 13) counts as no timestamp."""
    value, rest, _ = split_timestamp_naive(line)
    return value, rest


def split_timestamp_naive(line: str) -> tuple[float | None, str, bool]:
    """As :func:`split_timestamp`, and whether the timestamp was naive (no offset: read in the
    log's zone, where a DST fall-back repeats an hour; see :class:`NaiveOrder`)."""
    if not line:
        return None, line, False
    first = line[0]
    if not (first.isdigit() or first == "[" or first == " "):
        return None, line, False
    match = _TS_RE.match(line)
    if match is None:
        return None, line, False
    year, month, day, hour, minute, second, frac, zone = match.groups()
    key = (year, month, day, hour, minute, second)
    if zone:
        base = _EPOCH_CACHE.get(key)
    else:  # naive: the zone's rules (and the host's TZ) are part of the key
        host = (time.timezone, time.altzone, time.tzname) if _zone is None else None
        base = _NAIVE_CACHE.get((host, key))
    if base is None:
        mon, dd, hh, mi, ss = int(month), int(day), int(hour), int(minute), int(second)
        if not (1 <= mon <= 12 and 1 <= dd <= 31 and hh <= 23 and mi <= 59 and ss <= 60):
            return None, line, False
        if zone:
            base = calendar.timegm((int(year), mon, dd, hh, mi, ss, 0, 0, 0))
            cache: dict = _EPOCH_CACHE
        else:
            naive = naive_epoch((int(year), mon, dd, hh, mi, min(ss, 59)))
            if naive is None:
                return None, line, False
            base = naive + (ss == 60)
            cache, key = _NAIVE_CACHE, (host, key)
        if len(cache) > 4096:
            cache.clear()
        cache[key] = base
    value = float(base)
    if frac:
        value += int(frac) / 10 ** len(frac)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        value -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return value, line[match.end() :], not zone


def parse_timestamp(text: str) -> float | None:
    """Unix seconds from a whole timestamp string (as in a JSONL ``"timestamp"``), or None."""
    value, rest = split_timestamp(text.strip())
    if value is None or rest.strip():
        return None
    return value
