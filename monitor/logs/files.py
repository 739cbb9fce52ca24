"""Whole log files: ``parse_file`` streams a file through a ``LogParser``, tells console from
JSONL by content, and fills in the end times the lines did not give."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from monitor.logs.arrivals import CaptureTimes, capture_times
from monitor.logs.clocks import assign_times, covered_seconds, rebuild_times
from monitor.logs.follow import iter_lines, iter_lines_at
from monitor.logs.merge import merge_steps
from monitor.logs.parser import LogParser
from monitor.logs.stats import Item, LogReadError, ParsedLog, ParseStats
from monitor.logs.timestamps import FUTURE_SLACK_S, PAST_LIMIT_S
from monitor.records import Event, StepRecord


def parse_file(path: str | os.PathLike[str], log_end: float | None = None) -> ParsedLog:
    """Parse a whole verl log (console or JSONL, told apart by content), streaming it.

    Step end times come from line timestamps (``time_source="line"``), the capture times of a
    ``<log>.arrivals`` sidecar (``"sidecar"``), or the clocks in the text (``"tqdm"``,
    ``"worker"``: ``monitor.logs.clocks``); the others are rebuilt from the step times from the
    measured ones, or ending at ``log_end`` where the user gives it, ``time_source="rebuilt"``.
    Clocks come only from the log: never from the file's modification time. A log with no
    clock at all has relative times (the first step starts at 0; ``ParsedLog.clock`` is
    ``"relative"``). Records of one step printed on several lines are one record
    (``monitor.logs.merge``). Events without a time take the end time of the step before
    them; in a log with neither timestamps nor steps, they take ``log_end`` (their data then
    says ``time_from: "log_end"``). Raises ``LogReadError`` for a missing or unreadable file.
    """
    p = Path(path)
    try:
        mtime = os.stat(p).st_mtime
    except OSError as exc:
        raise _open_error(p, exc) from exc
    parser = LogParser(source=str(p), read_clocks=True)
    ordered: list[Item] = []
    fmt = "empty"
    first_line_seen = False
    captured = capture_times(p)
    try:
        for item in _iter_with_format(p, parser, captured):
            if isinstance(item, str):
                if not first_line_seen:
                    fmt = _detect_format(item)
                    first_line_seen = True
                continue
            ordered.append(item)
    finally:
        if captured is not None:
            captured.close()
    raw = [item for item in ordered if isinstance(item, StepRecord)]
    end = log_end
    # a date after the file's last write cannot be true (the file is only a bound, not a clock)
    _distrust_dates(raw, log_end if log_end is not None else mtime, parser.stats)
    untimed = 0
    if captured is not None:
        for rec in raw:
            if rec.time_source == "arrival":
                rec.time_source = "sidecar"
        untimed = _trust_open_chunk(raw, captured.open_ts)
    assign_times(raw, parser.clock, end)
    parts: dict[int, StepRecord] = {}
    steps = merge_steps(raw, parser.version_guess, parts)
    rebuild_times(steps, end, parser.clock)
    ordered = [parts.get(id(item), item) if isinstance(item, StepRecord) else item
               for item in _drop_out_of_turn_resumes(ordered, parts)]
    clock = clock_kind(steps, log_end)
    events = _time_events(ordered, end, dated=clock != "relative")
    if clock == "none" and any(e.time is not None for e in events):
        clock = "absolute"  # no step, but dated lines date its events
    side_files = [] if captured is None else [*captured.problems, *filter(None, [captured.ended])]
    if untimed and captured is not None:
        side_files.append(f"{captured.path}: its last record says no chunk end (an older "
                          f"verl-monitor run) and cannot time the {untimed} step line(s) after "
                          "it that its time cannot be (their timers add up past it); they are "
                          "timed by the log's other clocks")
    return ParsedLog(steps, events, parser.version_guess, parser.stats, fmt, parser.actors,
                     clock, side_files, parser.clock.run_start)


def clock_kind(steps: list[StepRecord], log_end: float | None) -> str:
    """``"absolute"`` when a step end is dated (a stamp, a capture time, a dated line, a bar
    placed by one) or the user gave the log's end; ``"relative"`` when steps have times but
    none is dated (relative to the first step's start); ``"none"`` without steps."""
    from monitor.logs.clocks import DATED

    if not steps:
        return "none"
    if log_end is not None or any(s.time_source in DATED for s in steps):
        return "absolute"
    return "relative"


#: Seconds of step timers two step lines of one captured chunk may be apart (``run`` reads
#: the log every 0.05 s; Ray forwards a worker's lines in batches).
OPEN_CHUNK_SLACK_S = 1.0


def _trust_open_chunk(raw: list[StepRecord], open_ts: float | None) -> int:
    """An older sidecar's last record, with no chunk end, gave its time to every later line
    (``arrivals.CaptureTimes.open_ts``). When ``run`` stopped recording (killed while the job
    went on), those lines were printed later: of the step records with that time, the first
    keeps it and each later one only while the timers of those after the first add up to at
    most ``OPEN_CHUNK_SLACK_S`` (lines captured together were printed together); the rest get
    no time (rebuilt from their timers). Returns how many lost it (round 5: 21 one-second
    steps at one time, a 4.98 s run)."""
    if open_ts is None:
        return 0
    group = [r for r in raw if r.time_source == "sidecar" and r.end_time == open_ts]
    spent, untimed = 0.0, 0
    for rec in group[1:]:
        spent += covered_seconds(rec)
        if spent > OPEN_CHUNK_SLACK_S:
            rec.end_time, rec.time_source = None, "rebuilt"
            untimed += 1
    return untimed


def _drop_out_of_turn_resumes(ordered: list[Item], parts: dict[int, StepRecord]
                              ) -> list[Item]:
    """``ordered`` without the ``resume`` events the parser made for a record printed out of
    turn: a step number lower than the line before's (the fully-async rollouter's line after
    the next step's trainer line) whose record joined its step's record printed before it
    (``merge_steps``) never went back (round 5: 4,999 resumes for 5,000 steps)."""
    out: list[Item] = []
    seen: set[int] = set()  # the merged records of the records so far
    waiting: Event | None = None  # a step_backwards resume, until its record is known
    for item in ordered:
        if isinstance(item, StepRecord):
            merged = id(parts.get(id(item), item))
            if waiting is not None and merged not in seen:
                out.append(waiting)
            waiting = None
            seen.add(merged)
            out.append(item)
            continue
        if waiting is not None:
            out.append(waiting)
            waiting = None
        if item.kind == "resume" and (item.data or {}).get("reason") == "step_backwards":
            waiting = item
        else:
            out.append(item)
    if waiting is not None:
        out.append(waiting)
    return out


def _distrust_dates(steps: list[StepRecord], end: float, stats: ParseStats) -> None:
    """A step line dated after the log's end (its last write) or more than a year before the
    log's other dated steps (their median: an old log copied today keeps its dates) is a
    wrong clock: the date is dropped (the step gets the time the log's other clocks or its
    step timers give) and the line counted as a parse error saying so."""
    dated = sorted(r.end_time for r in steps if r.time_source == "line" and r.end_time)
    if not dated:
        return
    median = dated[len(dated) // 2]
    for rec in steps:
        if rec.time_source != "line" or rec.end_time is None:
            continue
        ahead = rec.end_time > end + FUTURE_SLACK_S
        if ahead or rec.end_time < median - PAST_LIMIT_S:
            stats.add_error("dated " + ("after the log's last write" if ahead else
                                        "over a year before the log's other steps")
                            + ": its date is not used", f"step {rec.step}")
            rec.end_time, rec.time_source = None, "rebuilt"


def _open_error(path: Path, exc: OSError) -> LogReadError:
    if isinstance(exc, FileNotFoundError):
        reason = "no such file"
    elif isinstance(exc, IsADirectoryError):
        reason = "is a directory"
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    else:
        reason = (exc.strerror or exc.__class__.__name__).strip().splitlines()[0]
    return LogReadError(f"{path}: cannot read log ({reason})")


def _detect_format(line: str) -> str:
    text = line.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            return "console"
        if isinstance(obj, dict) and "step" in obj:
            return "jsonl"
    return "console"


@dataclass
class _ReaderCounts:
    """What ``iter_lines`` counts; bad UTF-8 is counted by the parser itself (U+FFFD)."""

    bad_utf8_lines: int = 0
    oversize_lines: int = 0


def _iter_with_format(path: Path, parser: LogParser,
                      captured: CaptureTimes | None = None) -> Iterator[Item | str]:
    """Like ``iter_items`` but first yields the first non-blank line (a str) for detection.
    ``captured``: the capture times of the log's lines (``arrivals.capture_times``), or None."""
    seen = False
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        counts = _ReaderCounts()
        lines = (iter_lines_at(path, stats=counts) if captured is not None
                 else ((-1, line) for line in iter_lines(path, stats=counts)))
        for offset, line in lines:
            if not seen and line.strip():
                seen = True
                yield line
            yield from parser.feed(line, captured.at(offset) if captured is not None else None)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    parser.stats.oversize_lines += counts.oversize_lines
    yield from parser.flush()


def _time_events(ordered: list[Item], log_end: float | None = None,
                 dated: bool = True) -> list[Event]:
    """Events in log order; those without a time get the previous step's end time, or the time
    of the last dated line before them where that is later (``dated``: the steps' times are
    dates too) or no step came before (a traceback in a log of dated lines, no step), or
    ``log_end`` where the user gave it; else they keep no time."""
    events: list[Event] = []
    last_end: float | None = None
    first_step = next((item for item in ordered if isinstance(item, StepRecord)), None)
    if first_step is not None and first_step.end_time is not None:
        last_end = first_step.end_time - (first_step.total or 0.0)
    for item in ordered:
        if isinstance(item, StepRecord):
            last_end = item.end_time
            continue
        before = item.data.pop("dated_before", None)
        if item.time is None and last_end is not None:
            item.time = last_end
            if dated and before is not None and before > last_end:
                item.time = before
            item.data.setdefault("time_rebuilt", True)
        elif item.time is None and before is not None and (dated or first_step is None):
            item.time = before
            item.data.setdefault("time_rebuilt", True)
            item.data.setdefault("time_from", "dated_line")
        elif item.time is None and log_end is not None:
            item.time = log_end
            item.data.setdefault("time_rebuilt", True)
            item.data.setdefault("time_from", "log_end")
        events.append(item)
    return events
