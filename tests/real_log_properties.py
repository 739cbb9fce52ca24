"""Properties of a real verl text that need no hand label, judged against ``verl-monitor
analyze --json``'s document. Shared by ``bench/real_logs.py`` and ``tests/test_real_logs.py`` so
the two cannot disagree.

Everything the judge knows about the text it reads here with its own simple regexes, never
through the monitor's parser (as ``tests/real_logs.py`` reads the tqdm bar): the text's own
clocks (the ``Training Progress`` bar, ``total time: N seconds``, ``..._ELAPSED_SECONDS=N``,
dated lines of any prefix), the printed config's trainer and knobs, the step lines' values.

Each property returns a :class:`Verdict`: ``ok``, ``violation`` (with what was wrong, in one
line) or ``n/a`` (the text cannot judge it, and why). The properties:

- ``wall_time``: the monitor's wall time (first step's start to last step's end) within 2% of
  every clock the text has for that span: the bar's drawings (step n ended E after the bar's
  start), the dated lines that bracket the first and the last step line, and as an upper bound
  the run's own ``total time`` / elapsed line;
- ``trainer_mode``: the mode equals the one the printed config names, where it names one
  (``trainer.use_v1`` with ``trainer.v1.trainer_mode``; the fully-async recipe's
  ``async_training`` section);
- ``dated_range``: no time in the document outside the text's dated range (widened by the step
  timers printed before the first and after the last dated line);
- ``premises``: no flag whose premise fails (``comm_heavy`` on a one-GPU job, ``io_starvation``
  on a fully-async trainer, ``stalled`` on a finished run) and no advice to lower a knob at its
  floor or to set a value the printed config already has;
- ``not_tracked``: verl's ``-1`` ("not tracked") values are not counted as unreadable.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: The tolerance of the wall-time property (the issue's 2%), and the seconds added for clocks
#: that print whole seconds.
WALL_REL = 0.02
WALL_ABS_S = 2.0

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_RAY_PREFIX = re.compile(r"^\s*\((?:[\w.:<>-]+ )?pid=\d+[^)]*\)\s?")
_TQDM = re.compile(r"Training Progress:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s*\[([\d:]+)<")
_STEP = re.compile(r"(?:^|\s)step:(\d+) - (.*)")
_PAIR = re.compile(r"([\w@/.\-]+):\s?(-?[\d.]+(?:e[-+]?\d+)?|nan|inf|-inf)(?= - |\s*$)", re.I)
_DATE = re.compile(r"(?<!\d)(20\d\d)[-/](\d\d)[-/](\d\d)[ T_-](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?"
                   r"(Z|[+-]\d\d:?\d\d)?(?!\d)")
_TOTAL = re.compile(r"\btotal time: ([\d.]+) seconds")
_ELAPSED = re.compile(r"\b[A-Z_]*ELAPSED_SECONDS=(\d+(?:\.\d+)?)")
#: How far into a line (after the Ray prefix) a date may start to count as the line's stamp.
_DATE_WITHIN = 60


@dataclass(frozen=True)
class Verdict:
    """One property's verdict on one text."""

    status: str  # "ok", "violation" or "n/a"
    detail: str = ""


def ok(detail: str = "") -> Verdict:
    """A held property."""
    return Verdict("ok", detail)


def violation(detail: str) -> Verdict:
    """A failed property, with what was wrong."""
    return Verdict("violation", detail)


def not_judged(why: str) -> Verdict:
    """A property the text cannot judge."""
    return Verdict("n/a", why)


# ---------------------------------------------------------------------------------------------
# The text, read independently of the monitor


@dataclass
class Text:
    """A log's lines (ANSI and Ray's ``(Name pid=N)`` prefix removed, ``\\r`` redraws split)."""

    lines: list[str]

    @classmethod
    def read(cls, raw: str) -> Text:
        """The text of ``raw``."""
        out = []
        for line in raw.replace("\r\n", "\n").split("\n"):
            for part in line.split("\r"):
                out.append(_RAY_PREFIX.sub("", _ANSI.sub("", part)))
        return cls(out)

    def joined(self) -> str:
        """All lines, one string."""
        return "\n".join(self.lines)


@dataclass(frozen=True)
class StepLine:
    """A ``step:N - key:value - ...`` line."""

    index: int
    step: int
    values: dict[str, float]


def step_lines(text: Text) -> list[StepLine]:
    """Every step line, in order (validation-only lines included)."""
    out = []
    for i, line in enumerate(text.lines):
        match = _STEP.search(line)
        if match:
            values = {}
            for key, val in _PAIR.findall(" - " + match.group(2)):
                try:
                    values[key] = float(val)
                except ValueError:
                    continue
            out.append(StepLine(i, int(match.group(1)), values))
    return out


def _timed(lines: list[StepLine]) -> list[StepLine]:
    return [s for s in lines if "timing_s/step" in s.values or "timing/step" in s.values]


def step_time(line: StepLine) -> float:
    """The step's own timer (0 where it printed none)."""
    value = line.values.get("timing_s/step", line.values.get("timing/step", 0.0))
    return value if math.isfinite(value) and value > 0 else 0.0


def tqdm_drawings(text: Text) -> list[tuple[int, int, float]]:
    """(line index, count, elapsed seconds) of each ``Training Progress`` drawing."""
    out = []
    for i, line in enumerate(text.lines):
        for match in _TQDM.finditer(line):
            parts = match.group(3).split(":")
            if all(p.isdigit() for p in parts):
                secs = 0.0
                for part in parts:
                    secs = secs * 60 + int(part)
                out.append((i, int(match.group(1)), secs))
    return out


def _stamp(match: re.Match[str]) -> float | None:
    year, mon, day, hh, mm, ss = (int(match.group(k)) for k in range(1, 7))
    frac = float("0." + match.group(7)) if match.group(7) else 0.0
    try:
        when = datetime(year, mon, day, hh, mm, ss)
    except ValueError:
        return None
    zone = match.group(8)
    if zone:
        if zone == "Z":
            offset = 0
        else:
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return (when - datetime(1970, 1, 1)).total_seconds() - offset + frac
    return time.mktime(when.timetuple()) + frac  # naive: the local time, as the monitor reads it


#: vLLM's own stamp without a year (``WARNING 05-22 07:07:18 [cuda.py:93] ...``).
_MONTH_DAY = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")


def dated_lines(text: Text) -> list[tuple[int, float]]:
    """(line index, epoch seconds) of every line that starts with a full date (any prefix of
    at most ``_DATE_WITHIN`` characters before it: Ray's, vLLM's, MindSpeed's ``[Rank 0 |
    Local Rank 0]``, Ascend's ``[ERROR]``), and of vLLM's month-day stamps, in the year of the
    text's full dates."""
    out = []
    for i, line in enumerate(text.lines):
        match = _DATE.search(line[: _DATE_WITHIN + 40])
        if match and match.start() <= _DATE_WITHIN:
            when = _stamp(match)
            if when is not None:
                out.append((i, when))
    if out:
        year = time.localtime(out[0][1]).tm_year
        for i, line in enumerate(text.lines):
            md = _MONTH_DAY.search(line[: _DATE_WITHIN + 40])
            if md and md.start() <= _DATE_WITHIN:
                mon, day, hh, mi, ss = (int(g) for g in md.groups())
                if 1 <= mon <= 12 and 1 <= day <= 31:
                    out.append((i, time.mktime((year, mon, day, hh, mi, ss, 0, 0, -1))))
        out.sort()
    return out


def stated_totals(text: Text) -> list[tuple[str, float]]:
    """The run's own account of its whole duration: ``total time: N seconds`` (verl's
    fully-async main) and ``..._ELAPSED_SECONDS=N`` (launchers)."""
    out = []
    for line in text.lines:
        for match in _TOTAL.finditer(line):
            out.append(("total time", float(match.group(1))))
        for match in _ELAPSED.finditer(line):
            out.append(("elapsed", float(match.group(1))))
    return out


_SECTION = re.compile(r"""['"]?(\w+)['"]?\s*[:=]\s*""")


def printed_value(text: Text, dotted: str) -> str | None:
    """The value the printed config gives ``dotted`` (``trainer.n_gpus_per_node``), read as
    text: each name of the path is looked for after the previous one, as pprint/JSON/YAML
    dumps print nested sections in order; None where the path is not found."""
    joined = text.joined()
    pos = 0
    names = dotted.split(".")
    for name in names[:-1]:
        match = re.compile(rf"""['"]{re.escape(name)}['"]\s*:\s*\{{""").search(joined, pos)
        if match is None:
            return None
        pos = match.end()
    match = re.compile(rf"""['"]{re.escape(names[-1])}['"]\s*:\s*('[^']*'|"[^"]*"|[^,}}\n]+)"""
                       ).search(joined, pos)
    if match is None or match.start() - pos > 200_000:
        return None
    return match.group(1).strip().strip("'\"")


def printed_mode(text: Text) -> str | None:
    """The trainer the printed config names, or None: verl 0.9's V1 trainer
    (``'use_v1': True`` and ``'trainer_mode': '<mode>'``) and the fully-async recipe (its
    ``async_training`` section)."""
    joined = text.joined()
    if re.search(r"""['"]use_v1['"]\s*:\s*(True|true)""", joined):
        match = re.search(r"""['"]trainer_mode['"]\s*:\s*['"](\w+)['"]""", joined)
        if match:
            return {"separate_async": "separate_async"}.get(match.group(1), "sync-like")
    if re.search(r"""['"]async_training['"]\s*:\s*\{[^}]*staleness_threshold""", joined):
        return "fully_async_trainer"
    return None


def keys_say_fully_async(lines: list[StepLine]) -> bool:
    """Whether the step lines carry the fully-async trainer's keys."""
    return any(k.startswith("fully_async/") or k in ("timing_s/param_sync",)
               for s in lines for k in s.values)


def run_finished(text: Text, lines: list[StepLine]) -> str:
    """Why the text shows a finished run ('' when it does not): the fully-async main's
    ``total time`` line, a bar at its total, or the last step at the printed
    ``total_training_steps``."""
    if stated_totals(text):
        return "it printed its total time"
    drawings = tqdm_drawings(text)
    if drawings:
        totals = [m.group(2) for line in text.lines for m in _TQDM.finditer(line)]
        if totals and drawings[-1][1] == int(totals[-1]):
            return f"its bar reached {drawings[-1][1]}/{totals[-1]}"
    total = printed_value(text, "trainer.total_training_steps")
    if total and total.isdigit() and lines and max(s.step for s in lines) >= int(total) > 0:
        return f"its last step is trainer.total_training_steps ({total})"
    return ""


def not_tracked_keys(lines: list[StepLine]) -> set[str]:
    """Keys printed as exactly -1 (verl's "not tracked")."""
    return {k for s in lines for k, v in s.values.items() if v == -1.0}


# ---------------------------------------------------------------------------------------------
# The monitor's document


def _step_ends(doc: dict[str, Any]) -> dict[int, float]:
    ends: dict[int, float] = {}
    for rec in doc.get("steps") or []:
        if rec.get("end_time") is not None:
            ends[rec["step"]] = rec["end_time"]
    return ends


def _start(doc: dict[str, Any]) -> float | None:
    """When the document says the run started: its wall's start (the bar's zero, where the
    text has one), else the first step's start."""
    summary = doc.get("summary") or {}
    start = (summary.get("wall") or {}).get("start")
    return start if start is not None else (summary.get("steps") or {}).get("start_time")


def document_times(doc: dict[str, Any]) -> list[tuple[str, float]]:
    """Every absolute time in the document, with where it is."""
    out: list[tuple[str, float]] = []
    for rec in doc.get("steps") or []:
        if rec.get("end_time") is not None:
            out.append((f"step {rec['step']} end", rec["end_time"]))
    for ev in doc.get("events") or []:
        if ev.get("time") is not None:
            out.append((f"event {ev.get('kind')}", ev["time"]))
    for flag in doc.get("flags") or []:
        for key in ("start", "end"):
            if flag.get(key) is not None:
                out.append((f"flag {flag['kind']} {key}", flag[key]))
    steps = (doc.get("summary") or {}).get("steps") or {}
    for key in ("start_time", "end_time"):
        if steps.get(key) is not None:
            out.append((f"summary {key}", steps[key]))
    return out


def first_advice(doc: dict[str, Any]) -> str:
    """The first advice a user reads: the fatal error's first line of advice where the run
    died, else the top problem's, else the first warning's or critical flag's ('' if none)."""
    flags = doc.get("flags") or []
    ordered = ([f for f in flags if f.get("kind") == "fatal_error"]
               + ([doc["top_problem"]] if doc.get("top_problem") else [])
               + [f for f in flags if f.get("severity") in ("critical", "warning")])
    for flag in ordered:
        if flag.get("advice"):
            return str(flag["advice"][0])
    return ""


# ---------------------------------------------------------------------------------------------
# The properties


def _within(ours: float, lo: float, hi: float) -> bool:
    return lo * (1 - WALL_REL) - WALL_ABS_S <= ours <= hi * (1 + WALL_REL) + WALL_ABS_S


def _bar_reference(doc: dict[str, Any], text: Text) -> tuple[float, float, str] | None:
    """(ours, the bar's, what) over the span the bar's first and last usable drawings cover
    (a drawing ``n/N [E`` says step n ended E after the bar's start); the last segment where
    the bar restarts."""
    drawings = tqdm_drawings(text)
    segments: list[list[tuple[int, int, float]]] = []
    for d in drawings:
        if not segments or d[2] < segments[-1][-1][2]:
            segments.append([])
        segments[-1].append(d)
    ends, start = _step_ends(doc), _start(doc)
    if not segments or not ends:
        return None
    seg = segments[-1]
    first_step = min(ends)
    anchors = []
    seen: set[int] = set()
    for _, count, elapsed in seg:
        if count in seen:
            continue  # tqdm's close() redraws the last count later (as a crash unwinds)
        seen.add(count)
        if count in ends:
            anchors.append((ends[count], elapsed, count))
        elif count == first_step - 1 and start is not None:
            anchors.append((start, elapsed, count))
    if len(anchors) >= 2 and anchors[-1][2] != anchors[0][2]:
        a, b = anchors[0], anchors[-1]
        return b[0] - a[0], b[1] - a[1], f"bar {a[2]} to {b[2]}"
    if anchors and start is not None and anchors[-1][1] > 0 and len(seg) == 1:
        b = anchors[-1]  # one captured drawing: from the bar's start, the first step's start
        return b[0] - start, b[1], f"bar start to {b[2]}"
    return None


def _dated_interval(doc: dict[str, Any], text: Text,
                    lines: list[StepLine]) -> tuple[float, float] | None:
    """The interval the dated lines bracketing the first and the last step line give for
    the span from the first step's start to the last step's end."""
    dated = dated_lines(text)
    summary = (doc.get("summary") or {}).get("steps") or {}
    first, last = summary.get("first"), summary.get("last")
    timed = _timed(lines)
    if not dated or first is None or last is None or not timed:
        return None
    first_line = next((s for s in timed if s.step == first), None)
    last_line = next((s for s in reversed(timed) if s.step == last), None)
    if first_line is None or last_line is None:
        return None

    def around(index: int) -> tuple[float | None, float | None]:
        before = [t for i, t in dated if i < index]
        after = [t for i, t in dated if i > index]
        return (max(before) if before else None), (min(after) if after else None)

    b1, a1 = around(first_line.index)
    b2, a2 = around(last_line.index)
    dur = step_time(first_line)
    outside = sum(first_line.values.get(k, 0.0) for k in ("timing_s/testing",
                                                            "timing_s/save_checkpoint")
                  if math.isfinite(first_line.values.get(k, 0.0)))
    if outside > dur:  # longer than the step timer: timed outside it (verl 0.6+), before the line
        dur += outside
    lo = (b2 - a1 + dur) if (b2 is not None and a1 is not None) else 0.0
    hi = (a2 - b1 + dur) if (a2 is not None and b1 is not None) else math.inf
    if lo <= 0 and hi == math.inf:
        return None
    return max(lo, 0.0), hi


def wall_time(doc: dict[str, Any], text: Text) -> Verdict:
    """The monitor's wall time against every clock of the text for the same span."""
    lines = step_lines(text)
    ours = ((doc.get("summary") or {}).get("wall") or {}).get("span_s")
    if not _timed(lines) and not _step_ends(doc):
        return not_judged("no step ran")
    checked, wrong = [], []
    if ours is None:
        clocks = [what for what, has in (("the bar", tqdm_drawings(text)), ("dated lines",
                  dated_lines(text)), ("a stated total", stated_totals(text))) if has]
        if clocks:
            return violation(f"steps ran and the text has {', '.join(clocks)}, but the "
                             "document gives no wall time")
        return not_judged("no wall time and no clock in the text")
    bar = _bar_reference(doc, text)
    if bar:
        span_ours, span_bar, what = bar
        checked.append(f"tqdm {what}")
        if not _within(span_ours, span_bar, span_bar):
            wrong.append(f"{span_ours:.0f} s against the bar's {span_bar:.0f} s ({what}, "
                         f"{100 * (span_ours / span_bar - 1) if span_bar else math.inf:+.1f}%)")
    interval = _dated_interval(doc, text, lines)
    if interval:
        lo, hi = interval
        checked.append("dated lines")
        steps = (doc.get("summary") or {}).get("steps") or {}
        # the dated lines bracket the step lines: the span from the first step's start to
        # the last step's end (the wall may start earlier, at the bar's zero)
        span = (steps["end_time"] - steps["start_time"]
                if steps.get("end_time") is not None and steps.get("start_time") is not None
                else ours)
        if not _within(span, lo, hi):
            wrong.append(f"{span:.0f} s outside the dated lines' [{lo:.0f}, {hi:.0f}] s")
    for what, total in stated_totals(text):
        checked.append(what)
        if ours > total * (1 + WALL_REL) + WALL_ABS_S:
            wrong.append(f"{ours:.0f} s is longer than the run's own {what} {total:.0f} s")
    if wrong:
        return violation("; ".join(wrong))
    if not checked:
        return not_judged("no clock in the text")
    return ok(f"{ours:.0f} s; " + ", ".join(checked))


def trainer_mode(doc: dict[str, Any], text: Text) -> Verdict:
    """The mode equals the one the printed config names."""
    printed = printed_mode(text)
    mode = doc.get("trainer_mode")
    if printed is None:
        return not_judged("the printed config names no trainer")
    if not step_lines(text) and not _step_ends(doc):
        return not_judged(f"the config names {printed} but no step ran")
    if printed == "sync-like":
        good = mode in ("sync", "agent_loop")
    else:
        good = mode == printed
    if good:
        return ok(f"{mode} (printed: {printed})")
    return violation(f"read {mode}, the printed config says {printed}")


def _when(epoch: float) -> str:
    """A local date and time, as the text prints it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def dated_range(doc: dict[str, Any], text: Text) -> Verdict:
    """No time outside the text's dated range, widened by the step timers printed before its
    first and after its last dated line (and one longest step, plus a minute)."""
    dated = dated_lines(text)
    if not dated:
        return not_judged("no dated line")
    if doc.get("clock") == "relative":
        first, last = min(t for _, t in dated), max(t for _, t in dated)
        return violation(
            f"the document's times are relative (clock: relative) although the text has "
            f"{len(dated)} dated line(s), {_when(first)} to {_when(last)}")
    lines = step_lines(text)
    first_i = min(i for i, _ in dated)
    last_i = max(i for i, _ in dated)
    longest = max((step_time(s) for s in lines), default=0.0)
    slack = longest + 60.0
    lo = min(t for _, t in dated) - sum(step_time(s) for s in lines if s.index < first_i) - slack
    # the steps after the last dated line: their timers, or the bar's elapsed time over them
    # (which also holds what no timer covers), whichever is longer
    after = sum(step_time(s) for s in lines if s.index > last_i)
    bar = [elapsed for index, _, elapsed in tqdm_drawings(text) if index > last_i]
    hi = max(t for _, t in dated) + max(after, max(bar, default=0.0)) + slack
    outside = [(where, t) for where, t in document_times(doc) if not lo <= t <= hi]
    if outside:
        where, t = max(outside, key=lambda item: max(item[1] - hi, lo - item[1]))
        if t < 1e9:  # seconds from a start, not a date
            return violation(f"{len(outside)} time(s) outside the dated range, e.g. {where} "
                             f"at {t:.0f} s (a relative time) although the text's dated lines "
                             f"run {_when(min(x for _, x in dated))} to "
                             f"{_when(max(x for _, x in dated))}")
        off = t - hi if t > hi else lo - t
        return violation(f"{len(outside)} time(s) outside the dated range, e.g. {where} "
                         f"{off / 3600:.1f} h {'after' if t > hi else 'before'} it")
    return ok(f"{len(document_times(doc))} times within the dated range")


_LOWER = re.compile(r"\b(?:lower|reduce|decrease|shrink)\s+`?([\w.]+)`?[^()\n]{0,80}?"
                    r"\((-?\d+(?:\.\d+)?) in this job\)", re.I)
_SET = re.compile(r"\bset\s+`?([\w.]+)\s*=\s*([\w.\-]+)`?|`([\w.]+)=([\w.\-]+)`", re.I)


def knob_floor(key: str) -> float:
    """The lowest value a knob can take: 0 for worker counts, 1 for sizes and counts."""
    return 0.0 if key.endswith(("num_workers", "dataloader_num_workers")) else 1.0


def _same(printed: str, advised: str) -> bool:
    a, b = printed.strip().lower(), advised.strip().lower().rstrip(".")
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def advice_problems(advice: str, text: Text) -> list[str]:
    """What is wrong with one line of advice: lowering a knob already at its floor, or setting
    a value the printed config already has."""
    wrong = []
    for key, value in _LOWER.findall(advice):
        if float(value) == int(float(value)) and float(value) <= knob_floor(key):
            wrong.append(f"advises lowering {key}, already {value} (its floor)")
    for match in _SET.finditer(advice):
        key = match.group(1) or match.group(3)
        value = match.group(2) or match.group(4)
        if "." not in key:
            continue
        printed = printed_value(text, key)
        if printed is not None and _same(printed, value):
            wrong.append(f"advises {key}={value}, which the printed config already sets")
    return wrong


def _job_gpus(text: Text) -> int | None:
    gpus, nodes = printed_value(text, "trainer.n_gpus_per_node"), printed_value(text, "trainer.nnodes")
    if gpus and nodes and gpus.isdigit() and nodes.isdigit():
        return int(gpus) * int(nodes)
    return None


def premises(doc: dict[str, Any], text: Text) -> Verdict:
    """No flag whose premise fails, no advice for a value already set or below a knob's
    floor (each premise judged where the text can judge it)."""
    lines = step_lines(text)
    flags = [f for f in doc.get("flags") or [] if f.get("severity") in ("warning", "critical")]
    wrong, judged = [], []
    gpus = _job_gpus(text)
    if gpus is not None:
        judged.append(f"{gpus} GPU(s)")
        if gpus == 1:
            wrong += ["comm_heavy on a one-GPU job" for f in flags if f["kind"] == "comm_heavy"]
    if keys_say_fully_async(lines):
        judged.append("fully-async trainer")
        wrong += ["io_starvation on a fully-async trainer (it loads no batches)"
                  for f in flags if f["kind"] == "io_starvation"]
    finished = run_finished(text, lines)
    if finished:
        judged.append("finished")
        wrong += [f"stalled on a finished run ({finished})" for f in flags if f["kind"] == "stalled"]
    for flag in doc.get("flags") or []:
        for line in flag.get("advice") or []:
            wrong += [f"{flag['kind']}: {w}" for w in advice_problems(str(line), text)]
    if wrong:
        return violation("; ".join(dict.fromkeys(wrong)))
    return ok(", ".join(judged) if judged else "advice checked; no premise the text can judge")


def not_tracked(doc: dict[str, Any], text: Text) -> Verdict:
    """verl's -1 ("not tracked") values are not counted as unreadable."""
    keys = not_tracked_keys(step_lines(text))
    if not keys:
        return not_judged("no value printed as -1")
    samples = (doc.get("parse") or {}).get("error_samples") or []
    counted = sorted({k for k in keys for s in samples if f"'{k}'" in s or f" {k}:" in s})
    if counted:
        return violation(f"{len(counted)} key(s) printed as -1 counted as unreadable: "
                         + ", ".join(counted[:4]))
    return ok(f"{len(keys)} key(s) printed as -1, none counted as unreadable")


#: Every property, by name.
PROPERTIES: dict[str, Callable[[dict[str, Any], Text], Verdict]] = {
    "wall_time": wall_time,
    "trainer_mode": trainer_mode,
    "dated_range": dated_range,
    "premises": premises,
    "not_tracked": not_tracked,
}


def judge(doc: dict[str, Any], raw: str) -> dict[str, Verdict]:
    """Every property's verdict on one text."""
    text = Text.read(raw)
    return {name: prop(doc, text) for name, prop in PROPERTIES.items()}


# ---------------------------------------------------------------------------------------------
# Real failures: the first advice against the thread's fix


def advice_matches(advice: str, expected: dict[str, Any]) -> bool:
    """Whether ``advice`` has each of ``expected['advice_has']`` (a word, or a list of
    alternatives of which one is enough; case-insensitive) and none of
    ``expected.get('advice_not')``; with ``no_advice`` (the quoted lines are not a failure),
    whether there is no advice at all."""
    if expected.get("no_advice"):
        return not advice  # not a failure: no advice at all is the right answer
    low = advice.lower()
    for want in expected.get("advice_has") or []:
        options = want if isinstance(want, list) else [want]
        if not any(o.lower() in low for o in options):
            return False
    return not any(str(w).lower() in low for w in expected.get("advice_not") or [])


def failure_quote(raw: str) -> str:
    """A failure fixture's quoted lines, its ``# `` header (URL, fix) left out."""
    return "".join(line for line in raw.splitlines(keepends=True) if not line.startswith("# "))
