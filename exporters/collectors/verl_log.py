"""verl log collector: follows each ``--log`` (console output or file-logger JSONL).

Each log has a ``LogFollower`` (tails the file, waits for it to appear, handles rotation and
truncation) and a ``LogParser`` (lines to canonical StepRecords and Events). Every interval the
new lines are parsed; steps and events go to the rolling window and the run store, and the
latest step becomes the exported gauges: step number, step and per-phase seconds (``reshard``,
``rollout_wait`` and ``comm`` included when known), throughput, peak reserved memory, the time
of the last step and the age of it (computed at scrape time). Lines and parse
errors are counted per log, events per kind.

Restarts: after each poll the position reached (the end of the last line whose records the
parser has given out) goes to the sink with the steps and events read before it, and the store
saves them in one transaction. Started again, each log resumes from its saved position (in the
file it was rotated to, first, when it was); ``--log-from-end`` applies only to a log with no
saved position. A saved position whose file is gone without a copy is counted
(``verlmon_log_unrecovered_total``) and said in one log line.

What accumulates is also a counter, so shares are exact over any range and survive missed
scrapes: seconds per phase (``verlmon_phase_seconds_total``, every canonical phase at 0 from the
start), a histogram of step seconds (``verlmon_step_seconds``: ``_sum`` and ``_count`` over the
steps whose total is known) and the data-wait seconds (``StepRecord.data_wait``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.registry import ExporterContext, register
from exporters.sampling import SampledCollector, log
from monitor import metric_names as m
from monitor.live import FlagGroup, labelled_counter
from monitor.logs.arrivals import ArrivalTail, capture_times
from monitor.logs.canonical_records import LogParser
from monitor.logs.follow import LogFollower, LogPosition
from monitor.logs.gaps import DataWaitTracker
from monitor.logs.safe_read import count_for, note
from monitor.logs.timestamps import FUTURE_SLACK_S, log_timezone_arg, set_log_timezone
from monitor.records import ALL_PHASES, Event, StepRecord

#: A line read live but dated more than this before it was read has a wrong clock or zone.
LIVE_LAG_S = 3600.0
#: Upper bounds (seconds) of the step-duration histogram: RL steps take seconds to an hour.
STEP_BUCKETS: tuple[float, ...] = (5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 1800,
                                   3600)


@dataclass
class StepTotals:
    """Counters over every step seen: phase seconds, step-duration histogram, data wait."""

    phase_seconds: dict[str, float] = field(
        default_factory=lambda: {p: 0.0 for p in ALL_PHASES})
    step_buckets: list[int] = field(default_factory=lambda: [0] * len(STEP_BUCKETS))
    step_count: int = 0
    step_sum: float = 0.0
    data_wait: float = 0.0

    def add(self, step: StepRecord) -> None:
        """Count one step (values that are missing, negative or not finite are left out)."""
        for phase, secs in step.phases.items():
            if phase in self.phase_seconds and _usable(secs):
                self.phase_seconds[phase] += float(secs)
        if _usable(step.total):
            total = float(step.total)
            self.step_count += 1
            self.step_sum += total
            for i, bound in enumerate(STEP_BUCKETS):
                if total <= bound:
                    self.step_buckets[i] += 1
        if _usable(step.data_wait):
            self.data_wait += float(step.data_wait)

    def copy(self) -> StepTotals:
        """An independent copy for the scrape to read."""
        return StepTotals(dict(self.phase_seconds), list(self.step_buckets), self.step_count,
                          self.step_sum, self.data_wait)


def _usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value >= 0


@dataclass
class _Followed:
    path: str
    follower: LogFollower
    parser: LogParser
    lines: int = 0
    waiting_logged: bool = False
    published: LogPosition | None = None  # the last position handed to the sink
    catching_up: bool = False  # the first poll reads what was written before we followed
    saved_at: float | None = None  # when the position resumed from was saved
    anomalies: Counter[str] = field(default_factory=Counter)  # handled, by reason
    backlog: bool = False  # still reading what the log held at the start (polls at the cap)
    arrivals: ArrivalTail = field(init=False)  # the capture-time sidecar, read as it grows

    def __post_init__(self) -> None:
        self.arrivals = ArrivalTail(self.path)


@dataclass
class LogSnapshot:
    """What the exposition reads."""

    last: StepRecord | None = None
    steps: int = 0
    lines: dict[str, int] = field(default_factory=dict)
    parse_errors: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    totals: StepTotals = field(default_factory=StepTotals)
    unrecovered: dict[str, int] = field(default_factory=dict)
    anomalies: dict[str, dict[str, int]] = field(default_factory=dict)


class _OversizeLines:
    """``verlmon_log_dropped_lines_total{log}``: lines over 16 MiB the followers dropped."""

    def __init__(self, logs: list[_Followed]) -> None:
        self.logs = logs

    def collect(self) -> list[Metric]:
        """One sample per followed log."""
        return [labelled_counter(
            m.LOG_DROPPED, "Lines of each followed log dropped unread for being longer than "
            "16 MiB.", "log", ((str(f.path), f.follower.oversize_lines) for f in self.logs))]


def add_flags(group: FlagGroup) -> None:
    """The verl_log collector's flags: the logs to follow, from where, in which time zone."""
    add = group.add_argument
    add("--log", action="append", default=[], metavar="PATH",
        help="verl log to follow: console output or file-logger JSONL; repeat for several. A "
        "log that does not exist yet is waited for")
    add("--log-from-end", action="store_true",
        help="skip what the logs already hold and read only new lines")
    add("--log-timezone", type=log_timezone_arg, metavar="ZONE",
        help="time zone of log timestamps without an offset (Python logging's default "
        "%%(asctime)s): local (the host's, the default), UTC, +05:30 or a name such as "
        "America/New_York")


@register("verl_log", default=True, help="verl training log(s) given with --log: step "
          "number, step and phase seconds, throughput, events (console or JSONL)",
          flags=add_flags)
class VerlLogCollector(SampledCollector):
    """Tails the logs on its thread; the scrape reads the snapshot."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        # naive line timestamps: the host's zone unless --log-timezone names one
        set_log_timezone(getattr(ctx.options, "log_timezone", None))
        paths = list(ctx.options.log)
        start_at_end = ctx.options.log_from_end
        saved = _saved_positions(ctx)
        self.logs = []
        for p in paths:
            resume = saved.get(os.path.abspath(p))
            follower = LogFollower(str(p), start_at_end=start_at_end and resume is None,
                                   resume_from=resume)
            # what the log holds when we start is a backlog too (not at --log-from-end)
            backlog = resume is not None or not start_at_end
            self.logs.append(_Followed(path=str(p), follower=follower, parser=LogParser(str(p)),
                                       published=resume, catching_up=backlog,
                                       saved_at=None if resume is None else resume.saved_at))
        self._events: Counter[str] = Counter()
        self._steps = 0
        self._last: StepRecord | None = None
        self._totals = StepTotals()
        self._gaps: dict[str, DataWaitTracker] = {}
        self.snapshot = LogSnapshot(lines={f.path: 0 for f in self.logs},
                                    parse_errors={f.path: 0 for f in self.logs})
        if self.logs:  # the follower's drops are the exporter's own health
            ctx.health.register(_OversizeLines(self.logs))

    def sample(self) -> None:
        """Read and parse what each log appended; publish steps, events and the snapshot."""
        now = self.ctx.clock()  # the wall clock, or a sped-up simulated run's own
        new_steps: list[StepRecord] = []
        new_events: list[Event] = []
        missing: list[str] = []  # logs whose folder is absent: a mistyped --log, never appears
        positions: list[LogPosition] = []
        for fol in self.logs:
            lines = fol.follower.poll()  # bounded per poll by the follower
            new_events.extend(fol.follower.drain_events())  # truncation / replacement
            for problem in fol.follower.problems:
                log.warning("verl_log: %s", problem)
            fol.follower.problems.clear()
            items: list[StepRecord | Event] = []
            parser = fol.parser
            safe = None  # the last line after which the parser held nothing back
            # when `verl-monitor run` (or the simulator) captured each line, where it says
            captured = None
            if lines:  # the whole sidecar read once when catching up, then as it grows
                captured = (captured_times(fol, lines) if fol.catching_up
                            else live_times(fol, lines))
            at_line: list[int] = []  # the line each item was read with
            for i, line in enumerate(lines):
                got = parser.feed(line, now if captured is None else captured[i] or now)
                items.extend(got)
                at_line.extend([i] * len(got))
                if parser.idle:
                    safe = i
            fol.lines += len(lines)
            if not lines:
                # quiet file: end held multi-line blocks and JSONL objects awaiting a merge
                flushed = parser.flush(now)
                items.extend(flushed)
                at_line.extend([-1] * len(flushed))
                position = fol.follower.saved_position()
                folder = os.path.dirname(os.path.abspath(fol.path))
                if not fol.lines and not os.path.isdir(folder):
                    missing.append(f"{fol.path} (folder {folder} does not exist)")
                elif not fol.lines and not fol.waiting_logged and not os.path.exists(fol.path):
                    log.info("verl_log: waiting for %s to appear", fol.path)
                    fol.waiting_logged = True
            else:
                position = None if safe is None else fol.follower.position_at(safe)
            if position is not None and position != fol.published:
                positions.append(position)
                fol.published = position
            fol.anomalies["bad_timestamp"] += distrust_line_times(
                items, now, backlog=fol.catching_up or fol.backlog)
            fol.backlog = fol.follower.behind and (fol.backlog or fol.catching_up)
            if fol.catching_up:
                fol.catching_up = False
                rebuild_uncaptured(items, at_line, captured, fol.path, now, fol.saved_at)
            fol.anomalies["step_time_clash"] += keep_records_apart(items)
            gaps = self._gaps.setdefault(fol.path, DataWaitTracker())
            for item in items:
                if isinstance(item, StepRecord):
                    gaps.update(item)  # time before the step timer: batch fetch (data wait)
                    new_steps.append(item)
                elif isinstance(item, Event):
                    new_events.append(item)
        for ev in new_events:
            self._events[ev.kind] += 1
        if new_steps:
            self._steps += len(new_steps)
            self._last = new_steps[-1]
            for step in new_steps:
                self._totals.add(step)
            self.ctx.sink.add_steps(new_steps)
        if new_events:
            self.ctx.sink.add_events(new_events)
        if positions:  # after the steps and events read before them
            self.ctx.sink.add_log_positions(positions)
        self.snapshot = LogSnapshot(
            last=self._last,
            steps=self._steps,
            lines={f.path: f.lines for f in self.logs},
            parse_errors={f.path: f.parser.stats.parse_errors for f in self.logs},
            events=dict(self._events),
            totals=self._totals.copy(),
            unrecovered={f.path: f.follower.unrecovered for f in self.logs},
            anomalies={f.path: _anomalies(f) for f in self.logs},
        )
        if missing:
            raise FileNotFoundError("cannot follow --log " + "; ".join(missing)
                                    + ": check the path")

    def close(self) -> None:
        """Close the followed files."""
        for fol in self.logs:
            fol.follower.close()

    def collect(self) -> Iterable[Metric]:
        """Families from the latest snapshot; step gauges only once a step was seen."""
        snap = self.snapshot
        if not self.logs:
            return
        lines = CounterMetricFamily(m.LOG_LINES.removesuffix("_total"),
                                    "Lines read from each followed verl log.", labels=["log"])
        errors = CounterMetricFamily(m.LOG_PARSE_ERRORS.removesuffix("_total"),
                                     "Lines of each log that looked like metrics but could "
                                     "not be parsed.", labels=["log"])
        for path in snap.lines:
            lines.add_metric([path], snap.lines[path])
            errors.add_metric([path], snap.parse_errors.get(path, 0))
        yield lines
        yield errors
        yield labelled_counter(m.LOG_UNRECOVERED, "Saved positions of each log whose file was "
                               "rotated away or truncated without a copy found: lines written "
                               "meanwhile were not read.", "log", snap.unrecovered.items())
        yield _anomaly_family(snap.anomalies)
        yield labelled_counter(m.LOG_EVENTS, "Log events by kind (oom, traceback, resume, ...).",
                               "kind", sorted(snap.events.items()))
        yield CounterMetricFamily(m.STEPS.removesuffix("_total"),
                                  "Training step records parsed from the logs.", value=snap.steps)
        yield from _total_families(snap.totals)
        last = snap.last
        if last is None:
            return
        yield GaugeMetricFamily(m.TRAIN_STEP, "Last training step number seen in the log.",
                                value=last.step)
        if last.total is not None:
            yield GaugeMetricFamily(m.STEP_DURATION, "Last step's total seconds.",
                                    value=last.total)
        phases = GaugeMetricFamily(m.PHASE_DURATION, "Last step's seconds per canonical phase.",
                                   labels=["phase"])
        order = {p: i for i, p in enumerate(ALL_PHASES)}
        for phase, secs in sorted(last.phases.items(), key=lambda kv: order.get(kv[0], 99)):
            if phase in order and secs is not None:
                phases.add_metric([phase], float(secs))
        yield phases
        if last.throughput is not None:
            yield GaugeMetricFamily(m.THROUGHPUT, "perf/throughput of the last step: tokens "
                                    "per second per GPU.", value=last.throughput)
        if last.data_wait is not None:
            yield GaugeMetricFamily(m.STEP_DATA_WAIT, "Seconds before the last step's timer "
                                    "started that no verl timer covers (fetching the batch).",
                                    value=last.data_wait)
        if last.mem_reserved_peak_bytes is not None:
            yield GaugeMetricFamily(m.MEM_RESERVED_PEAK, "Peak reserved GPU memory of the "
                                    "last step, bytes.", value=last.mem_reserved_peak_bytes)
        if last.end_time is not None:
            yield GaugeMetricFamily(m.LAST_STEP_TS, "Unix time the last step ended.",
                                    value=last.end_time)
            yield GaugeMetricFamily(m.SINCE_LAST_STEP, "Seconds since the last step ended.",
                                    value=max(0.0, self.ctx.clock() - last.end_time))


def rebuild_backlog_times(items: list[StepRecord | Event], path: str, now: float,
                          since: float | None = None, stamped: float | None = None,
                          until: float | None = None) -> None:
    """Times for steps written while the exporter was down, read at once when it resumed.

    Lines without a time got the restart's arrival time; instead the last one ends when the
    file was last written and each earlier one a step's ``total`` before the next, never
    before ``since`` (when the position was saved; past it they are spread evenly up to the
    last write). ``time_source`` becomes "rebuilt": no data wait is measured on them.
    ``stamped``: only steps whose arrival time is this one are rebuilt (the others had theirs
    from ``verl-monitor run``'s capture times); ``until``: they end by then (the first capture
    time: lines before the capture started were written before it)."""
    steps = [i for i in items if isinstance(i, StepRecord) and i.time_source == "arrival"
             and (stamped is None or i.end_time == stamped)]
    if not steps:
        return
    try:
        last = min(now, os.stat(path).st_mtime)
    except OSError:
        last = now
    if until is not None:
        last = min(last, until)
    if since is not None and last <= since:
        last = now  # a coarse file clock may lag the save: spread them up to now
    totals = [float(s.total) if _usable(s.total) else 0.0 for s in steps]
    ends = [last - sum(totals[i + 1:]) for i in range(len(steps))]
    if since is not None and ends[0] <= since:
        ends = [since + (last - since) * (i + 1) / len(steps) for i in range(len(steps))]
    for step, end in zip(steps, ends, strict=True):
        step.end_time = end
        step.time_source = "rebuilt"


def rebuild_uncaptured(items: list[StepRecord | Event], at_line: list[int],
                       captured: list[float | None] | None, path: str, now: float,
                       saved_at: float | None) -> None:
    """Times for the steps of the first poll's backlog that ``verl-monitor run`` did not
    capture (``rebuild_backlog_times``), by where their lines lie against its sidecar:

    - before its first record: printed before the capture started, so ending by then;
    - past its last record: printed after ``run``'s last capture (its next pass had not come
      yet, or it was killed while the job went on), so never before that capture. Bounding them
      by the first capture instead dated a step printed just now at the job's start: on a
      loaded machine the exporter's first poll came between the job's write and ``run``'s.

    ``at_line``: the index in ``captured`` of the line each item was read with."""
    known = [i for i, t in enumerate(captured or ()) if t is not None]
    if not known:
        rebuild_backlog_times(items, path, now, saved_at, stamped=now)
        return
    first, last = captured[known[0]], captured[known[-1]]
    late = [it for it, i in zip(items, at_line, strict=True) if i > known[-1]]
    early = [it for it, i in zip(items, at_line, strict=True) if i <= known[-1]]
    rebuild_backlog_times(early, path, now, saved_at, stamped=now, until=first)
    rebuild_backlog_times(late, path, now, last if saved_at is None else max(saved_at, last),
                          stamped=now)


def captured_times(fol: _Followed, lines: list[str]) -> list[float | None] | None:
    """When ``verl-monitor run`` captured each of ``lines`` (the last poll's), from the log's
    ``.arrivals`` sidecar, streamed (``monitor.logs.arrivals.capture_times``): the time of the
    chunk holding the line's start. None without a sidecar; None for a line it does not cover
    (before its first record, past its last chunk, or in a file rotated away during the
    poll). What the sidecar holds that cannot be used is said once and counted
    (``verlmon_log_anomalies_total{reason="side_file"}``)."""
    times = capture_times(fol.path)
    if times is None:
        return None
    with times:
        out: list[float | None] = []
        for i in range(len(lines)):
            start = fol.follower.line_start(i)
            out.append(None if start is None else times.at(start))
    for problem in times.problems:
        note(problem, fol.path)
    return out


def live_times(fol: _Followed, lines: list[str]) -> list[float | None] | None:
    """The capture times of the lines of a live poll, from the sidecar read as it grows
    (``ArrivalTail``: the newest records only): the time of the last record at or before the
    line's start; None without a sidecar, or for a line it does not cover yet."""
    return fol.arrivals.times([fol.follower.line_start(i) for i in range(len(lines))])


def distrust_line_times(items: list[StepRecord | Event], now: float, *,
                        backlog: bool = False) -> int:
    """Steps and events dated by their line more than ``FUTURE_SLACK_S`` after ``now`` (when
    they were read) or, read live (not a ``backlog``), more than ``LIVE_LAG_S`` before it take
    ``now``, their arrival time, instead: a node's wrong clock or time zone neither opens nor
    hides a ``stalled``. Returns how many were re-dated."""
    count = 0
    for item in items:
        if isinstance(item, StepRecord):
            ts = item.end_time if item.time_source == "line" else None
        else:
            ts = item.time
        if ts is None or (ts <= now + FUTURE_SLACK_S and (backlog or ts >= now - LIVE_LAG_S)):
            continue
        count += 1
        if isinstance(item, StepRecord):
            item.end_time, item.time_source = now, "arrival"
        else:
            item.time = now
    return count


def keep_records_apart(items: list[StepRecord | Event]) -> int:
    """Give each step record of one poll that has the step number, end time and source of an
    earlier one (a resume read at once: lines that arrived together) an end time a
    microsecond on, so the store keeps both; returns how many were moved."""
    seen: set[tuple[str, int, float]] = set()
    moved = 0
    for item in items:
        if not isinstance(item, StepRecord) or item.end_time is None:
            continue
        key = (item.source or "", item.step, float(item.end_time))
        if key in seen:
            moved += 1
            while key in seen:
                key = (key[0], key[1], key[2] + 1e-6)
            item.end_time = key[2]
        seen.add(key)
    return moved


def _anomalies(fol: _Followed) -> dict[str, int]:
    """What the log did that would have cost a record, by reason (every reason, from 0)."""
    follower = fol.follower
    counts = {"step_time_clash": fol.anomalies["step_time_clash"],
              "rewritten": follower.rewritten, "not_regular": follower.not_regular,
              "bad_timestamp": fol.anomalies["bad_timestamp"],
              "side_file": count_for(fol.path)}
    return counts


def _anomaly_family(anomalies: dict[str, dict[str, int]]) -> Metric:
    family = CounterMetricFamily(
        m.LOG_ANOMALIES.removesuffix("_total"),
        "What each followed log did that would have lost or replaced a step record, handled: "
        "step_time_clash (records of one step with one end time, kept apart), rewritten (the "
        "log was rewritten in place while not followed: read from its start), not_regular "
        "(a directory or device: not read), bad_timestamp (a line dated after it was read, "
        "or read live but dated over an hour before: its arrival time is used), side_file (a "
        "file beside the log, its .arrivals or .exit, that is not a regular file, too large, "
        "or holds values out of range or order: not used, said once).", labels=["log", "reason"])
    for path, counts in anomalies.items():
        for reason, count in counts.items():
            family.add_metric([path, reason], count)
    return family


def _saved_positions(ctx: ExporterContext) -> dict[str, LogPosition]:
    """The positions the sink's store saved for the followed logs (none without a store)."""
    try:
        return dict(ctx.sink.saved_log_positions())
    except Exception as exc:  # noqa: BLE001 - an unreadable store: follow as configured
        log.warning("verl_log: saved log positions unreadable (%s); following as configured",
                    exc)
        return {}


def _total_families(totals: StepTotals) -> Iterable[Metric]:
    """The counters over every step: phase seconds, step-duration histogram, data wait."""
    phases = CounterMetricFamily(m.PHASE_SECONDS.removesuffix("_total"),
                                 "Seconds spent in each canonical phase, summed over every "
                                 "step (rate() over step seconds gives exact shares).",
                                 labels=["phase"])
    for phase in ALL_PHASES:
        phases.add_metric([phase], totals.phase_seconds.get(phase, 0.0))
    yield phases
    cumulative = []
    for bound, count in zip(STEP_BUCKETS, totals.step_buckets, strict=True):
        cumulative.append((_le(bound), float(count)))
    cumulative.append(("+Inf", float(totals.step_count)))
    yield HistogramMetricFamily(m.STEP_SECONDS, "Step seconds (timing_s/step) of every step "
                                "whose total the log gives.", buckets=cumulative,
                                sum_value=totals.step_sum)
    yield CounterMetricFamily(m.DATA_WAIT_SECONDS.removesuffix("_total"),
                              "Seconds before each step's timer that no verl timer covers "
                              "(fetching the next batch), summed over every step.",
                              value=totals.data_wait)


def _le(bound: float) -> str:
    return f"{float(bound):g}" if float(bound) != int(bound) else f"{int(bound)}.0"
