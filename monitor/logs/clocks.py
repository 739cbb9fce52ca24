"""The clocks a verl log carries in its own text, and the step end times read from them.

A console log rarely stamps verl's ``step:N`` lines, yet it is full of time:

- **tqdm** (``Training Progress:  3%|...| 19/624 [1:02:10<33:01:00, 196.4s/it]``): verl's fit
  loop updates the bar right after logging a step, so the bar's elapsed time printed after a
  step line is that step's end, counted from the bar's start (a resumed run starts a new bar:
  a new segment). Exact to the second, relative to the bar's start. A drawing whose count is
  not the step before it dates the step its count names: verl's V1 trainer under Ray prints
  the bar (stderr) ahead of its step line (stdout), and wandb's ``output.log`` keeps the bar's
  line, frozen at a later state, where the bar was first printed.
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
or from the log's end (``"rebuilt"``, an estimate). A step whose line lost its timers (a capture
that cut a long line) takes the time a bar measured for it, when one did (``step_seconds``).
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field

from monitor.logs.timestamps import NaiveOrder, naive_epoch
from monitor.records import StepRecord

#: Words for each ``StepRecord.time_source`` in reports.
CLOCK_WORDS: dict[str, str] = {
    "line": "stamped on the step lines",
    "arrival": "arrival times (followed live)",
    "sidecar": "capture times (the .arrivals file beside the log)",
    "tqdm": "tqdm's elapsed time (dated by the log's dated lines)",
    "tqdm_end": "tqdm's elapsed time (no dated line places the bar in time)",
    "tqdm_after": "tqdm's elapsed time, the bar placed at the dated line before it (it started "
                  "then or a little later)",
    "worker": "dated worker lines",
    "rebuilt": "estimated (rebuilt from the step times)",
}
#: Sources that are measurements of when a line was printed (``rebuilt`` is not).
MEASURED: frozenset[str] = frozenset({"line", "arrival", "sidecar", "tqdm", "tqdm_end",
                                      "tqdm_after", "worker"})
#: tqdm's sources: the bar's spacing is measured; ``tqdm_end``'s dates are not (the bar is
#: placed to end at the log's end: no dated line says when it ran).
TQDM: frozenset[str] = frozenset({"tqdm", "tqdm_end", "tqdm_after"})
#: Sources whose dates (not only their spacing) are measured.
DATED: frozenset[str] = MEASURED - {"tqdm_end"}  # tqdm_after: placed by a date
#: How far each source can be from the true end (seconds), for the gap between steps.
RESOLUTION_S: dict[str, float] = {"line": 0.05, "arrival": 0.05, "sidecar": 0.05,
                                  "tqdm": 1.0, "tqdm_end": 1.0, "tqdm_after": 1.0,
                                  "worker": 1.0}

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
    count: int | None = None  # a tqdm drawing's count (steps done)
    #: a tqdm drawing whose count is not the step before it: the record it was printed after
    #: (``after`` is then the record of step ``count`` that ``assign_times`` finds for it)
    placed: StepRecord | None = None
    moved: bool = False  # ``after`` was found by the count, not by where the drawing stands


@dataclass
class LineClock:
    """The readings of one log, in log order (see the module docstring).

    Between two step lines only the first and the last dated reading are kept (all that
    ``assign_times`` uses), so a log full of dated worker lines keeps a few readings a step.
    ``enabled=False`` (a live reader, whose lines have arrival times) keeps none.
    """

    readings: list[Reading] = field(default_factory=list)
    enabled: bool = True
    #: ``id(record) -> seconds`` of each step that lost its timers (``_lone_step``) whose time
    #: the bar measured (``assign_times``: what the bar's elapsed time leaves between two of
    #: its drawings, or since its start, once the other steps' timers are taken out)
    stand_ins: dict[int, float] = field(default_factory=dict)
    #: the median time such a measured step took beyond its neighbours' (a validation outside
    #: the step timer whose line lost its timers), for the ones no drawing measured; None
    extra_s: float | None = None
    #: the unix time of the last line read so far that carried a whole date (None before
    #: one): what dates an event printed without a time of its own
    last_abs: float | None = None
    #: when the first bar was drawn at 0 (the run's start by its own clock: before the first
    #: step's timer, the first batch is fetched), set by ``assign_times``; None without one
    run_start: float | None = None
    #: the naive dates read in the text, kept in order through a DST fall-back
    naive: NaiveOrder = field(default_factory=NaiveOrder)

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
        count says otherwise dates the record of step ``count`` instead, found by
        ``assign_times``: a bar drawn on stderr ahead of its step line on stdout (verl's V1
        trainer under Ray), or a console capture that kept only the bar's last state where the
        bar was first printed (wandb's ``output.log``); with no record of that step it dates
        nothing."""
        if elapsed_s is None or elapsed_s < 0:
            return
        placed = None
        if after is not None and count is not None and not 0 <= after.step - count <= 1:
            placed, after = after, None
        self._add(Reading(after, "tqdm", float(elapsed_s), count=count, placed=placed,
                          moved=after is None and count is not None))

    def stamp(self, unix: float, after: StepRecord | None) -> None:
        """A line stamped with a whole date (the parser's leading timestamp)."""
        self.last_abs = float(unix) if self.enabled else None
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
                unix = self.naive.read(unix)
                self.last_abs = unix if self.enabled else None
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


def _resolve_dates(readings: list[Reading], log_end: float | None) -> dict[int, float]:
    """Unix time of each dated reading, by its index: dates without a year take the year of the
    log's whole dates (else of ``log_end``, else 1970: their spacing is measured, their year is
    not), ``HH:MM:SS`` the date of the last dated reading (else ``log_end``'s, else day 0)."""
    years = [time.gmtime(r.value).tm_year for r in readings if r.kind == "abs"]
    year = (statistics.median_low(years) if years
            else time.gmtime(log_end).tm_year if log_end is not None else 1970)
    out: dict[int, float] = {}
    last_abs: float | None = None
    order = NaiveOrder()  # a time of day in a DST fall-back's repeated hour: kept in order
    for n, r in enumerate(readings):
        if r.kind == "abs":
            value = r.value
        elif r.kind == "md":
            value = _on_date(year, r.month, r.day, r.value)
        elif r.kind == "hms":
            base = last_abs if last_abs is not None else log_end
            value = _hms_after(base, r.value) if base is not None else r.value
        else:
            continue
        if value is None:
            continue
        if r.kind != "abs":
            value = order.read(value)
        order.last = last_abs = value
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


def assign_times(steps: list[StepRecord], clock: LineClock, log_end: float | None) -> None:
    """Give each step record with no measured end time the one its log's clocks give
    (``tqdm`` first, then ``worker``: the last dated line before the step line). Records with
    a stamp of their own (``line``) or a capture time keep theirs. A drawing whose count is not
    the step before it dates the record of step ``count`` (``_in_order``); the time the bar
    measured for steps that lost their timers goes into ``clock.stand_ins``. ``log_end``: when
    the log ended, where the user said so (``analyze --log-end``), else None: a bar no dated
    line places is placed by its neighbours, or starts at 0 (``_undated_origins``)."""
    if not clock.readings or not steps:
        return
    readings = _in_order(steps, clock.readings)
    dated = _resolve_dates(readings, log_end)
    segments = _tqdm_segments(readings)
    _measure_lone_steps(steps, readings, segments, clock)
    ends: dict[int, tuple[float, str]] = {}
    origins = [_segment_origin(segment, readings, dated) for segment in segments]
    sources = ["tqdm" if o is not None else "tqdm_end" for o in origins]
    before = [value for n, value in dated.items() if segments and n < segments[0][0]]
    if origins and origins[0] is None and before and log_end is None:
        origins[0], sources[0] = max(before), "tqdm_after"  # the bar started then or later
    _undated_origins(origins, segments, readings,
                     None if log_end is None else _tail_start(steps, readings, log_end, clock))
    for k in range(1, len(sources)):
        if sources[k] == "tqdm_end" and sources[k - 1] in ("tqdm", "tqdm_after"):
            sources[k] = "tqdm_after"  # back to back with a bar a date placed
    for segment, origin, source in zip(segments, origins, sources, strict=True):
        for n in segment:  # the first drawing that dates a step wins: tqdm's close() redraws
            after = readings[n].after  # the same count later (minutes later as a crash unwinds)
            if after is not None:
                ends.setdefault(id(after), (origin + readings[n].value, source))
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
    clock.run_start = _bar_start(segments, readings)


def _bar_start(segments: list[list[int]], readings: list[Reading]) -> float | None:
    """When the first bar was drawn at 0, on the steps' own clock: the first step it dates
    ended that drawing's elapsed seconds after it (so the start agrees with the steps' end
    times, whichever clock placed them); None without a drawing at 0 or a dated step."""
    if not segments or readings[segments[0][0]].value > RESOLUTION_S["tqdm"]:
        return None
    for n in segments[0]:
        rec = readings[n].after
        if rec is not None and rec.end_time is not None and readings[n].value > 0:
            return float(rec.end_time) - readings[n].value
    return None


def _count_target(steps: list[StepRecord], by_step: dict[int, list[int]], where: int,
                  count: int) -> int | None:
    """Index of the record of step ``count`` nearest a drawing printed after ``steps[where]``
    (the first one after it when tied; of a run of records of that step, the one with a step
    timer), or None."""
    found = by_step.get(count)
    if not found:
        return None
    best = min(found, key=lambda k: (k - where - 1 if k > where else where - k, k <= where))
    run = [k for k in found if abs(k - best) <= 3
           and all(steps[j].step == count for j in range(min(k, best), max(k, best) + 1))]
    timed = [k for k in run if steps[k].total is not None]
    return timed[-1] if timed else best


def _in_order(steps: list[StepRecord], readings: list[Reading]) -> list[Reading]:
    """The readings in the order their times were taken: each drawing whose count is not the
    step before it (``Reading.moved``) gets ``after``, the record of step ``count``
    (``_count_target``), and stands right after that record's line (before the readings
    printed after it); one with no record of its step dates nothing and keeps its place."""
    position = {id(s): n for n, s in enumerate(steps)}
    by_step: dict[int, list[int]] = {}
    for n, rec in enumerate(steps):
        by_step.setdefault(rec.step, []).append(n)

    def at(r: Reading) -> int:
        rec = r.after if r.after is not None else r.placed
        return position.get(id(rec), -1) if rec is not None else -1

    moved: list[tuple[int, Reading]] = []
    kept: list[Reading] = []
    for r in readings:
        k = None
        if r.kind == "tqdm" and r.moved and r.count is not None:
            k = _count_target(steps, by_step, at(r), r.count)
        if k is None:
            kept.append(r)
            continue
        r.after = steps[k]
        moved.append((k, r))
    moved.sort(key=lambda item: item[0])
    out: list[Reading] = []
    i = 0
    for r in kept:
        while i < len(moved) and moved[i][0] <= at(r) and not (r.own and r.after is not None
                                                              and moved[i][0] == at(r)):
            out.append(moved[i][1])
            i += 1
        out.append(r)
    out.extend(r for _, r in moved[i:])
    return out


def _segment_start(segment: list[int], readings: list[Reading],
                   position: dict[int, int]) -> int | None:
    """Index of the first record a bar's segment times from its start, when its first reading
    was drawn where the bar started: the drawing at 0 s, or a captured last state that stands
    where the bar was first printed (before the record its count dates); else None."""
    first = readings[segment[0]]
    mark = first.placed if first.moved else first.after
    k = position.get(id(mark), -1) if mark is not None else -1
    if first.value <= RESOLUTION_S["tqdm"]:
        return k + 1
    target = position.get(id(first.after), -1) if first.after is not None else -1
    return k + 1 if first.moved and k < target else None


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


def _undated_origins(origins: list[float | None], segments: list[list[int]],
                     readings: list[Reading], tail: float | None) -> None:
    """Fill in place the origin of each bar no dated line places: back to back with the bar
    after it (the restart's gap is not in the text), else with the bar before it, else, for
    the last bar, ending at ``tail`` (where the user gave the log's end), else at 0: the run's
    times are then relative to the first bar's start."""
    def span(k: int) -> float:
        return readings[segments[k][-1]].value

    if tail is not None and origins and origins[-1] is None:
        origins[-1] = tail - span(len(origins) - 1)
    for k in range(len(origins) - 2, -1, -1):  # before a placed bar: back to back
        if origins[k] is None and origins[k + 1] is not None:
            origins[k] = origins[k + 1] - span(k)
    for k in range(len(origins)):  # after a placed bar (or the first at 0): back to back
        if origins[k] is None:
            origins[k] = 0.0 if k == 0 else origins[k - 1] + span(k - 1)


def _tail_start(steps: list[StepRecord], readings: list[Reading], log_end: float,
                clock: LineClock | None = None) -> float:
    """Where the last tqdm bar's last drawing stands when nothing dates it: the log's end less
    the times of the steps printed after the record it dates (``step_seconds``)."""
    last = next((r.after for r in reversed(readings) if r.kind == "tqdm" and r.after), None)
    position = {id(s): n for n, s in enumerate(steps)}
    k = position.get(id(last), -1) if last is not None else -1
    fallback = _median_step(steps)
    return log_end - sum(step_seconds(steps, n, clock, fallback)
                         for n in range(k + 1, len(steps)))


def _measure_lone_steps(steps: list[StepRecord], readings: list[Reading],
                        segments: list[list[int]], clock: LineClock) -> None:
    """``clock.stand_ins`` and ``clock.extra_s`` from each bar: between two records it dates
    (or its start and the first), the elapsed time less the timers of the records between
    is the time of those that lost their timers (shared evenly)."""
    position = {id(s): n for n, s in enumerate(steps)}
    extras: list[float] = []
    for segment in segments:
        marks: dict[int, float] = {}
        start = _segment_start(segment, readings, position)
        if start is not None:
            marks[start - 1] = 0.0
        for n in segment:
            after = readings[n].after
            if after is not None and id(after) in position:
                marks[position[id(after)]] = readings[n].value
        points = sorted(marks.items())
        for (a, ea), (b, eb) in zip(points, points[1:], strict=False):
            lone = [k for k in range(a + 1, b + 1)
                    if covered_seconds(steps[k]) <= 0 and _lone_step(steps, k)]
            if not lone or eb <= ea:
                continue
            timed = sum(covered_seconds(steps[k]) for k in range(a + 1, b + 1))
            share = max(0.0, eb - ea - timed) / len(lone)
            for k in lone:
                clock.stand_ins[id(steps[k])] = share
                near = _neighbour_seconds(steps, k)
                if near is not None:
                    extras.append(share - near)
    clock.extra_s = statistics.median(extras) if extras else None


def _neighbour_seconds(steps: list[StepRecord], n: int) -> float | None:
    """The mean covered seconds of the nearest timed record either side of ``steps[n]``
    (within 3), or None without one."""
    near = []
    for direction in (-1, 1):
        for k in range(n + direction, n + 4 * direction, direction):
            if 0 <= k < len(steps) and covered_seconds(steps[k]) > 0:
                near.append(covered_seconds(steps[k]))
                break
    return statistics.mean(near) if near else None


def _median_step(steps: list[StepRecord]) -> float:
    known = sorted(v for v in (covered_seconds(s) for s in steps) if v > 0)
    return known[len(known) // 2] if known else 0.0


def step_seconds(steps: list[StepRecord], n: int, clock: LineClock | None,
                 fallback: float) -> float:
    """Wall seconds ``steps[n]`` took on a rebuilt timeline: its covered seconds; for a step of
    its own whose line lost its timers (a capture that cut a long line), the time a tqdm bar
    measured for it (``LineClock.stand_ins``), else its neighbours' time plus what the measured
    ones took beyond theirs (``LineClock.extra_s``), else ``fallback`` (the median step); 0
    for a record that times nothing beside another of its step number."""
    rec = steps[n]
    seconds = covered_seconds(rec)
    if seconds > 0 or not _lone_step(steps, n):
        return seconds
    if clock is not None and id(rec) in clock.stand_ins:
        return clock.stand_ins[id(rec)]
    near = _neighbour_seconds(steps, n)
    if clock is not None and clock.extra_s is not None and near is not None:
        return max(0.0, near + clock.extra_s)
    return fallback


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


def rebuild_times(steps: list[StepRecord], log_end: float | None,
                  clock: LineClock | None = None) -> None:
    """Fill the end times still missing by each step's time (``step_seconds``: its timers,
    validation and checkpointing included; for a step whose line lost its timers, what
    ``clock``'s bar measured for it, or an estimate): ``time_source="rebuilt"``. Backwards
    from the next measured end; after the last measured end, forwards from it (or backwards
    from ``log_end`` where the user gave one); in a log with no measured end at all, forwards
    from 0: its times are relative to the first step's start. No time is invented for a record
    that times nothing beside another of its step number, and none comes from the file."""
    fallback = _median_step(steps)
    last = max((n for n, rec in enumerate(steps)
                if rec.end_time is not None and rec.time_source in MEASURED), default=None)
    top = len(steps) - 1
    if log_end is None:
        anchor = 0.0 if last is None else float(steps[last].end_time)  # type: ignore[arg-type]
        for n in range(0 if last is None else last + 1, len(steps)):
            anchor += step_seconds(steps, n, clock, fallback)
            steps[n].end_time, steps[n].time_source = anchor, "rebuilt"
        if last is None:
            return
        top = last
    anchor = log_end if log_end is not None else 0.0
    for n in range(top, -1, -1):
        rec = steps[n]
        if rec.end_time is not None and rec.time_source in MEASURED:
            anchor = rec.end_time
        else:
            rec.end_time = anchor
            rec.time_source = "rebuilt"
        anchor = rec.end_time - step_seconds(steps, n, clock, fallback)


def _lone_step(steps: list[StepRecord], n: int) -> bool:
    """Whether ``steps[n]`` is the only record of its step number among its neighbours."""
    step = steps[n].step
    return all(not (0 <= k < len(steps)) or steps[k].step != step for k in (n - 1, n + 1))
