"""The clocks a verl log carries in its own text, and the step end times read from them.

A console log rarely stamps verl's ``step:N`` lines, yet it is full of time:

- **tqdm** (``Training Progress:  3%|...| 19/624 [1:02:10<33:01:00, 196.4s/it]``): verl's fit
  loop updates the bar right after logging a step, so the bar's elapsed time printed after a
  step line is that step's end, counted from the bar's start (a resumed run starts a new bar:
  a new segment). Exact to the second, relative to the bar's start.
- **dated lines** (``2025-06-04 23:48:30,126 INFO ...`` at the start of a line or after Ray's
  prefix, ``INFO:2025-10-07 07:01:41,025:...`` of verl's workers, ``[2025-08-17 10:00:00]``):
  absolute times. Dates without an offset are wall-clock times in the log's zone (the host's,
  or ``--log-timezone``), read as ``monitor.logs.timestamps`` reads them.
- **dated lines without a year** (vLLM's ``INFO 12-01 14:11:02 file.py:12]``, glog's
  ``[W228 01:39:36.9 ...]``): the year of the log's other dates (else of its end).
- **``HH:MM:SS`` stamps** at the start of a trainer's own line, or ending the fully-async
  trainer's ``[FullyAsyncTrainer] global_steps: N ... HH:MM:SS.mmm`` print: the date of the
  last dated line before them (a stamp earlier than the one before it is the next day).
- **capture times** that ``verl-monitor run`` wrote beside the log (``<log>.arrivals``, see
  ``monitor.logs.arrivals``): the time each line was read from the job's output.

``LineClock`` is fed by the parser with each line's readings, each tied to the step record
before it; ``assign_times`` then gives every step record without a stamp of its own the best
measured end time there is (``time_source``: ``"sidecar"``, ``"tqdm"``, or ``"tqdm_end"`` when
no dated line places the bar in time, ``"worker"``), and
``rebuild_times`` fills what is left from the step times, backwards from the next measured end
or from the log's end (``"rebuilt"``, an estimate).
"""

from __future__ import annotations

import bisect
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from monitor.logs.timestamps import naive_epoch
from monitor.records import StepRecord

#: Words for each ``StepRecord.time_source`` in reports.
CLOCK_WORDS: dict[str, str] = {
    "line": "stamped on the step lines",
    "arrival": "arrival times (followed live)",
    "sidecar": "capture times (the .arrivals file beside the log)",
    "tqdm": "tqdm's elapsed time (dated by the log's dated lines)",
    "tqdm_end": "tqdm's elapsed time (placed to end at the log's end)",
    "worker": "dated worker lines",
    "rebuilt": "estimated (rebuilt from the step times, ending at the log's end)",
}
#: Sources that are measurements of when a line was printed (``rebuilt`` is not).
MEASURED: frozenset[str] = frozenset({"line", "arrival", "sidecar", "tqdm", "tqdm_end",
                                      "worker"})
#: tqdm's sources: the bar's spacing is measured; ``tqdm_end``'s dates are not (the bar is
#: placed to end at the log's end: no dated line says when it ran).
TQDM: frozenset[str] = frozenset({"tqdm", "tqdm_end"})
#: Sources whose dates (not only their spacing) are measured.
DATED: frozenset[str] = MEASURED - {"tqdm_end"}
#: How far each source can be from the true end (seconds), for the gap between steps.
RESOLUTION_S: dict[str, float] = {"line": 0.05, "arrival": 0.05, "sidecar": 0.05,
                                  "tqdm": 1.0, "tqdm_end": 1.0, "worker": 1.0}

_FULL_DATE_RE = re.compile(
    r"(?:^|[\s\[:(])(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?")
_MONTH_DAY_RE = re.compile(
    r"^(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))? ")
_GLOG_RE = re.compile(r"^\[?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))? ")
_HMS_RE = re.compile(r"^\[?(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?\]? ")
#: The fully-async trainer's print after each of its steps ends with the time of day.
_TRAILING_HMS_RE = re.compile(r"global_steps: \d+ .* (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s*$")
_DAY_S = 86400.0


@dataclass
class Reading:
    """One time read from the text, after the step record ``after`` (None: before any)."""

    after: StepRecord | None
    kind: str  # "tqdm" (elapsed s), "abs" (unix), "md" (month, day, s of day), "hms" (s of day)
    value: float
    month: int = 0
    day: int = 0
    own: bool = False  # the stamp of ``after``'s own line: its end time


@dataclass
class LineClock:
    """The readings of one log, in log order (see the module docstring).

    Between two step lines only the first and the last dated reading are kept (all that
    ``assign_times`` uses), so a log full of dated worker lines keeps a few readings a step.
    ``enabled=False`` (a live reader, whose lines have arrival times) keeps none.
    """

    readings: list[Reading] = field(default_factory=list)
    enabled: bool = True

    def _add(self, reading: Reading) -> None:
        if not self.enabled:
            return
        if reading.kind != "tqdm" and len(self.readings) >= 2:
            last, before = self.readings[-1], self.readings[-2]
            if (last.kind != "tqdm" and before.kind != "tqdm" and not last.own
                    and last.after is reading.after and before.after is reading.after):
                self.readings[-1] = reading  # keep the gap's first and last dated lines
                return
        self.readings.append(reading)

    def tqdm(self, elapsed_s: float | None, after: StepRecord | None,
             count: int | None = None) -> None:
        """A ``Training Progress`` bar drawn after ``after`` with this elapsed time and count.

        verl updates the bar once per step right after logging it, so the count after step N's
        line is N (N - 1 for the bar's closing drawing after the last step). A drawing whose
        count says otherwise (a console capture that kept only the bar's last state, printed
        somewhere else) does not date the step before it."""
        if elapsed_s is None or elapsed_s < 0:
            return
        if after is not None and count is not None and not 0 <= after.step - count <= 1:
            after = None
        self._add(Reading(after, "tqdm", float(elapsed_s)))

    def stamp(self, unix: float, after: StepRecord | None) -> None:
        """A line stamped with a whole date (the parser's leading timestamp)."""
        self._add(Reading(after, "abs", float(unix)))

    def line(self, text: str, after: StepRecord | None) -> str:
        """Read a date or time at the start of a line's text (after Ray's prefix), if it has
        one; returns the text after a leading ``HH:MM:SS`` or month-day stamp (the whole text
        otherwise), so that a stamped step line can be read as a step line."""
        head = text[:64]
        if not head or not (head[0].isalpha() or head[0].isdigit() or head[0] == "["):
            return text
        match = _MONTH_DAY_RE.match(head) or _GLOG_RE.match(head)
        if match is not None:
            mon, day, hh, mi, ss, frac = match.groups()
            if 1 <= int(mon) <= 12 and 1 <= int(day) <= 31:
                self._add(Reading(after, "md", _day_seconds(hh, mi, ss, frac),
                                  int(mon), int(day)))
            return text[match.end():]
        match = _FULL_DATE_RE.search(head)
        if match is not None:
            unix = _unix(*match.groups())
            if unix is not None:
                self._add(Reading(after, "abs", unix))
            return text
        match = _HMS_RE.match(head)
        if match is not None and int(match.group(1)) < 24:
            self._add(Reading(after, "hms", _day_seconds(*match.groups())))
            return text[match.end():]
        if "global_steps: " in text:
            match = _TRAILING_HMS_RE.search(text)
            if match is not None and int(match.group(1)) < 24:
                self._add(Reading(after, "hms", _day_seconds(*match.groups())))
        return text

    def own(self, record: StepRecord) -> None:
        """The reading just taken was the stamp of ``record``'s own line: its end time."""
        if self.enabled and self.readings and self.readings[-1].kind in ("md", "hms"):
            self.readings[-1].after = record
            self.readings[-1].own = True


def _day_seconds(hh: str, mi: str, ss: str, frac: str | None) -> float:
    value = int(hh) * 3600 + int(mi) * 60 + int(ss)
    return value + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _unix(year: str, mon: str, day: str, hh: str, mi: str, ss: str,
          frac: str | None) -> float | None:
    m, d, h, n, s = int(mon), int(day), int(hh), int(mi), int(ss)
    if not (1 <= m <= 12 and 1 <= d <= 31 and h <= 23 and n <= 59 and s <= 60):
        return None
    value = naive_epoch((int(year), m, d, h, n, s))
    if value is None:
        return None
    return value + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _on_date(year: int, month: int, day: int, day_s: float) -> float | None:
    """Unix time of ``day_s`` seconds of wall-clock time into a date, in the log's zone (see
    ``monitor.logs.timestamps.naive_epoch``: the host's, or ``--log-timezone``)."""
    whole = int(day_s)
    value = naive_epoch((year, month, day, whole // 3600, whole // 60 % 60, whole % 60))
    return None if value is None else value + (day_s - whole)


def _local_date(unix: float, days: int = 0) -> tuple[int, int, int]:
    """The date, in the log's zone, of ``unix`` (plus ``days``)."""
    utc = time.gmtime(int(unix))
    naive = naive_epoch((utc.tm_year, utc.tm_mon, utc.tm_mday, utc.tm_hour, utc.tm_min,
                         utc.tm_sec))
    offset = int(unix) - naive if naive is not None else 0  # the zone's offset east of UTC
    local = time.gmtime(int(unix) + offset + days * int(_DAY_S))
    return local.tm_year, local.tm_mon, local.tm_mday


def _hms_after(base: float, day_s: float) -> float | None:
    """A time of day read after ``base``: on ``base``'s date in the log's zone, or the next
    one when that is more than half a day before ``base`` (past midnight)."""
    value = _on_date(*_local_date(base), day_s)
    if value is not None and value < base - _DAY_S / 2:
        value = _on_date(*_local_date(base, 1), day_s)
    return value


def _resolve_dates(readings: list[Reading], log_end: float) -> dict[int, float]:
    """Unix time of each dated reading, by its index: dates without a year take the year of the
    log's whole dates (else of ``log_end``), ``HH:MM:SS`` the date of the last dated reading."""
    years = [time.gmtime(r.value).tm_year for r in readings if r.kind == "abs"]
    year = statistics.median_low(years) if years else time.gmtime(log_end).tm_year
    out: dict[int, float] = {}
    last_abs: float | None = None
    for n, r in enumerate(readings):
        if r.kind == "abs":
            value = r.value
        elif r.kind == "md":
            value = _on_date(year, r.month, r.day, r.value)
        elif r.kind == "hms":
            value = _hms_after(last_abs if last_abs is not None else log_end, r.value)
        else:
            continue
        if value is None:
            continue
        last_abs = value
        out[n] = value
    return out


def _tqdm_segments(readings: list[Reading]) -> list[list[int]]:
    """Indexes of the tqdm readings, split where the elapsed time goes back (a new bar: a
    restarted run)."""
    segments: list[list[int]] = []
    last: float | None = None
    for n, r in enumerate(readings):
        if r.kind != "tqdm":
            continue
        if last is None or r.value < last - 1.0:
            segments.append([])
        segments[-1].append(n)
        last = r.value
    return segments


def _segment_origin(segment: list[int], readings: list[Reading],
                    dated: dict[int, float]) -> float | None:
    """Unix time of a tqdm segment's zero from the dated lines printed while it ran, or None
    without any. A dated line after a drawing of ``e`` seconds puts the zero at its time less
    ``e`` or earlier; one before a drawing of ``e`` (whole seconds), at its time less ``e + 1``
    or later: the middle of what they leave (their median when they disagree)."""
    highs: list[float] = []
    lows: list[float] = []
    elapsed: float | None = None
    waiting: list[float] = []  # dated times since the last drawing
    for n in range(segment[0], segment[-1] + 1):
        if readings[n].kind == "tqdm":
            lows += [t - readings[n].value - RESOLUTION_S["tqdm"] for t in waiting]
            waiting = []
            elapsed = readings[n].value
        elif n in dated:
            waiting.append(dated[n])
            if elapsed is not None:
                highs.append(dated[n] - elapsed)
    if not highs and not lows:
        return None
    low, high = (max(lows) if lows else None), (min(highs) if highs else None)
    if low is not None and high is not None:
        return (low + high) / 2 if low <= high else statistics.median(highs + lows)
    return high if high is not None else low


def assign_times(steps: list[StepRecord], clock: LineClock, log_end: float) -> None:
    """Give each step record with no measured end time the one its log's clocks give
    (``tqdm`` first, then ``worker``: the last dated line before the step line). Records with
    a stamp of their own (``line``) or a capture time keep theirs."""
    readings = clock.readings
    if not readings or not steps:
        return
    dated = _resolve_dates(readings, log_end)
    ends: dict[int, tuple[float, str]] = {}
    next_origin = _tail_start(steps, readings, log_end)
    for segment in reversed(_tqdm_segments(readings)):
        origin = _segment_origin(segment, readings, dated)
        source = "tqdm"
        if origin is None:
            # no dated line while it ran: the bar ends where the next one starts (back to
            # back: the restart's gap is not in the text), else at the log's end
            origin = next_origin - readings[segment[-1]].value
            source = "tqdm_end"
        for n in segment:  # the last drawing after a step line wins (tqdm's close())
            after = readings[n].after
            if after is not None:
                ends[id(after)] = (origin + readings[n].value, source)
        next_origin = origin
    worker = _bracketed(steps, readings, dated)
    for n, value in dated.items():
        if readings[n].own and readings[n].after is not None:
            ends[id(readings[n].after)] = (value, "line")
    for n, rec in enumerate(steps):
        if rec.end_time is not None and rec.time_source in ("line", "arrival", "sidecar"):
            continue
        found = ends.get(id(rec))
        if found is not None:
            rec.end_time, rec.time_source = found
        elif n in worker:
            rec.end_time, rec.time_source = worker[n], "worker"
    _snap_to_timers(steps)


def _snap_to_timers(steps: list[StepRecord]) -> None:
    """tqdm prints whole seconds: where two tqdm-dated steps lie as far apart as the later
    one's timers, give or take that second, they ran back to back, and the timers (to the
    millisecond) place the earlier one; working back from the last."""
    for k in range(len(steps) - 1, 0, -1):
        rec, prev = steps[k], steps[k - 1]
        if rec.time_source not in TQDM or prev.time_source not in TQDM:
            continue
        if rec.end_time is None or prev.end_time is None or rec.step <= prev.step:
            continue
        start = rec.end_time - covered_seconds(rec)
        if abs(start - prev.end_time) < RESOLUTION_S["tqdm"]:
            prev.end_time = start


def _tail_start(steps: list[StepRecord], readings: list[Reading], log_end: float) -> float:
    """Where the last tqdm bar's last drawing stands when nothing dates it: the log's end less
    the timers of the steps printed after it."""
    last = next((r.after for r in reversed(readings) if r.kind == "tqdm"), None)
    position = {id(s): n for n, s in enumerate(steps)}
    k = position.get(id(last), -1) if last is not None else -1
    return log_end - sum(covered_seconds(s) for s in steps[k + 1:])


def _bracketed(steps: list[StepRecord], readings: list[Reading],
               dated: dict[int, float]) -> dict[int, float]:
    """Step index -> end time from the dated lines either side of its step line: the last one
    before it and the first one after it, when they are close enough (a second, or a tenth of
    the step's timers) to pin the line down; their middle."""
    position = {id(s): n for n, s in enumerate(steps)}
    before: dict[int, float] = {}
    after: dict[int, float] = {}
    for n, value in dated.items():
        if readings[n].own:
            continue
        prev = readings[n].after
        k = position.get(id(prev), -1) if prev is not None else -1
        if k >= 0:
            after.setdefault(k, value)
        if k + 1 < len(steps):
            before[k + 1] = value
    out: dict[int, float] = {}
    for k, low in before.items():
        high = after.get(k)
        if high is None or high < low:
            continue
        if high - low <= max(RESOLUTION_S["worker"], 0.1 * covered_seconds(steps[k])):
            out[k] = (low + high) / 2
    return out


def covered_seconds(rec: StepRecord) -> float:
    """Wall seconds a step's timers account for (``monitor.logs.gaps.covered_seconds``); for a
    record without a step timer the sum of the timers it has (a rollouter's ``version_time``
    among them); 0 when it has none: no time is invented for a record that times nothing."""
    from monitor.logs.gaps import covered_seconds as covered
    from monitor.logs.keys import async_value

    value = covered(rec)
    if value is not None:
        return float(value) if value >= 0 else 0.0
    timed = sum(float(v) for k, v in rec.phases.items() if k != "other" and v and v > 0)
    if timed > 0:
        return timed
    version = async_value(rec.metrics, "fully_async/rollouter/version_time")
    return float(version) if version is not None and version > 0 else 0.0


def rebuild_times(steps: list[StepRecord], log_end: float) -> None:
    """Fill the end times still missing, backwards from the next measured end (or ``log_end``)
    by each step's covered seconds (its timers, validation and checkpointing included):
    ``time_source="rebuilt"``. A step of its own whose line lost its timers (a capture that
    cut a long line) ran all the same: the median step stands in for it; a record that times
    nothing beside another of its step number takes no time (none is invented for it)."""
    known = sorted(v for v in (covered_seconds(s) for s in steps) if v > 0)
    fallback = known[len(known) // 2] if known else 0.0
    anchor = log_end
    for n in range(len(steps) - 1, -1, -1):
        rec = steps[n]
        if rec.end_time is not None and rec.time_source in MEASURED:
            anchor = rec.end_time
        else:
            rec.end_time = anchor
            rec.time_source = "rebuilt"
        seconds = covered_seconds(rec)
        if seconds <= 0 and _lone_step(steps, n):
            seconds = fallback
        anchor = rec.end_time - seconds


def _lone_step(steps: list[StepRecord], n: int) -> bool:
    """Whether ``steps[n]`` is the only record of its step number among its neighbours."""
    step = steps[n].step
    return all(not (0 <= k < len(steps)) or steps[k].step != step for k in (n - 1, n + 1))


def arrival_times(log_path: str | os.PathLike[str]) -> list[float] | None:
    """The capture time of each physical line of ``log_path`` (by index, lines split at
    ``\\n``) from its ``.arrivals`` sidecar: the time recorded for the chunk holding the line's
    start; None when the log has no sidecar or the sidecar has no record."""
    from monitor.logs.arrivals import read_arrivals

    pairs = read_arrivals(log_path)
    if not pairs:
        return None
    try:
        data = Path(log_path).read_bytes()
    except OSError:
        return None
    offsets = [off for off, _ in pairs]
    times = [ts for _, ts in pairs]
    out: list[float] = []
    start = 0
    while start < len(data):
        k = bisect.bisect_right(offsets, start) - 1
        out.append(times[k] if k >= 0 else times[0])
        nl = data.find(b"\n", start)
        if nl < 0:
            break
        start = nl + 1
    return out
