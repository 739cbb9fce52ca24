"""The ledger across a job's attempts: where the wall time of a job that crashed, hung and
was started again went, and its ETTR.

An *attempt* is one start of the job: one ``verl-monitor run`` of it (``<log>.attempts``,
``monitor.logs.attempt_marks``), else one log file of it, else the part of a log after a
resume line (verl's ``Load from checkpoint folder: .../global_step_N`` and ``Setting global
step to N``, or a step number going back). Each attempt's wall time, from its start to its
end, is booked to exactly one of :data:`BUCKETS`:

- ``productive``: the step time of steps done for the first time (less their checkpoint
  saves and validation);
- ``redone``: the step time of steps done again after a resume: verl resumes from its last
  checkpoint, so the steps since it were lost with the previous attempt;
- ``overhead``: from the attempt's start to its first step's start (Ray, model load, engines,
  a validation before training);
- ``checkpoint``: checkpoint saves (verl's ``timing_s/save_checkpoint``);
- ``validation``: validation in or after a step (``timing_s/testing``);
- ``between_steps``: wall time between steps that no step timer covers (the next batch);
- ``hang``: time held by a hang before it ended: from the last step before a ``hang`` flag to
  the attempt's end (or to the step that ended a hang that cleared);
- ``crash_loss``: from the last step to an attempt's end by a crash, a signal or an error
  exit: the work of the step that never finished, and the crash itself;
- ``shutdown``: from the last step to a clean exit;
- ``after_last_step``: from the last step to an end whose cause the evidence does not name.

Over the job, ``between_attempts`` is the time no attempt ran (waiting to be started again),
and ETTR (effective training time ratio) = productive / the job's wall time, from the first
attempt's start to the last one's end. A running attempt is booked up to its last step (its
time since then is not yet anyone's). Times must be measured (line stamps, capture times):
a log whose step times were rebuilt from the step timers has no wall clock, and no ETTR.

The module is pure: steps, events and flags in; plain data out.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor.analysis.goodput import CRASH_KINDS
from monitor.logs.attempt_marks import END, START
from monitor.logs.gaps import MEASURED_SOURCES, covered_seconds
from monitor.records import Event, Flag, StepRecord

#: Where an attempt's seconds go, in the order reports list them.
BUCKETS: tuple[str, ...] = ("productive", "redone", "overhead", "checkpoint", "validation",
                            "between_steps", "hang", "crash_loss", "shutdown",
                            "after_last_step")
#: Each bucket (and the job's ``between_attempts``) in words.
BUCKET_TEXT: dict[str, str] = {
    "productive": "step time of steps done for the first time",
    "redone": "step time of steps done again after a resume (lost with the attempt before)",
    "overhead": "from the attempt's start to its first step (Ray, model load, engines)",
    "checkpoint": "checkpoint saves",
    "validation": "validation",
    "between_steps": "between steps, outside the step timer (the next batch)",
    "hang": "held by a hang before it ended",
    "crash_loss": "from the last step to a crash, kill or error exit (the unfinished step)",
    "shutdown": "from the last step to a clean exit",
    "after_last_step": "from the last step to an end the evidence does not explain",
    "between_attempts": "no attempt running (waiting to be started again)",
}
#: How an attempt can end; the ones that are a failure of the job.
ENDINGS: tuple[str, ...] = ("finished", "crash", "hang", "terminated", "killed", "error_exit",
                            "running", "unknown")
FAILURES: frozenset[str] = frozenset(("crash", "hang", "terminated", "killed", "error_exit"))
#: Event kinds that say the job started again from a checkpoint (or from scratch).
RESUME_KINDS: tuple[str, ...] = ("checkpoint_load", "resume")
#: The on-hang action's event (``monitor.live.hang_action``).
HANG_ACTION = "hang_action"
_CKPT_STEP = re.compile(r"global_step_(\d+)")
#: Seconds of slack when events and steps are placed in an attempt (clocks, capture jitter).
SLACK_S = 1.0


@dataclass
class Attempt:
    """One attempt and its ledger (seconds by :data:`BUCKETS`)."""

    index: int
    start: float
    end: float | None  # None: still running
    start_source: str  # run | file | resume_line | first_line
    status: int | None = None
    ended_by: str = "unknown"
    detail: str = ""
    resumed_from: int | None = None
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    last_step_end: float | None = None
    redone_steps: int = 0
    saves: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    booked_to: float = 0.0

    @property
    def wall(self) -> float:
        """Seconds booked: from the start to the end (a running one: to its last step)."""
        return max(0.0, self.booked_to - self.start)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``analyze --json``, the store's readers and the dashboard."""
        return {"attempt": self.index, "start": self.start, "end": self.end,
                "start_source": self.start_source, "status": self.status,
                "ended_by": self.ended_by, "detail": self.detail,
                "resumed_from": self.resumed_from, "steps": self.steps,
                "first_step": self.first_step, "last_step": self.last_step,
                "redone_steps": self.redone_steps, "saves": self.saves,
                "wall": round(self.wall, 3),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


@dataclass
class _Span:
    start: float
    end: float | None
    source: str
    status: int | None = None


# ---------------------------------------------------------------------------- splitting
def _timed(events: Iterable[Event], kinds: Iterable[str]) -> list[Event]:
    want = set(kinds)
    return sorted((e for e in events if e.kind in want and e.time is not None),
                  key=lambda e: float(e.time))


def _marked_spans(events: list[Event]) -> list[_Span]:
    """The spans ``attempt_start`` / ``attempt_end`` marks give (an end pairs with the start
    before it; a start without an end is left open)."""
    spans: list[_Span] = []
    for m in _timed(events, (START, END)):
        if m.kind == START:
            spans.append(_Span(float(m.time), None, str((m.data or {}).get("source") or "run")))
        elif spans and spans[-1].end is None:
            spans[-1].end = float(m.time)
            status = (m.data or {}).get("status")
            spans[-1].status = status if isinstance(status, int) else None
    return spans


def _item_times(steps: list[StepRecord], events: list[Event]) -> list[float]:
    return sorted([float(s.end_time) for s in steps if s.end_time is not None]
                  + [float(e.time) for e in events if e.time is not None
                     and e.kind not in (START, END)])


def _step_start(rec: StepRecord) -> float:
    return float(rec.end_time) - float(covered_seconds(rec) or 0.0)


def _sign_time(sign: Event, steps: list[StepRecord]) -> float:
    """Where an attempt that a resume sign starts begins: the sign's line; for a step number
    going back (no resume line printed), the start of that step."""
    if (sign.data or {}).get("reason") == "step_backwards":
        for s in steps:
            if s.end_time is not None and abs(float(s.end_time) - float(sign.time)) < 1e-6:
                return _step_start(s) - 1e-6
    return float(sign.time)


def _split_by_signs(span: _Span, steps: list[StepRecord], events: list[Event],
                    times: list[float]) -> list[_Span]:
    """A span cut where a resume sign follows steps of its own: the job started again
    inside one log without a recorded start."""
    hi = float("inf") if span.end is None else span.end
    out = [span]
    for sign in _timed(events, RESUME_KINDS):
        at = _sign_time(sign, steps)
        cur = out[-1]
        if not cur.start < at <= hi:
            continue
        if not any(s.end_time is not None and cur.start < float(s.end_time) < at for s in steps):
            continue  # the resume of this attempt itself, before its first step
        before = [t for t in times if cur.start < t < at]
        nxt = _Span(at, cur.end, "resume_line", cur.status)
        cur.end, cur.status = (before[-1] if before else at), None
        out.append(nxt)
    return out


def split_attempts(steps: list[StepRecord], events: list[Event]) -> list[_Span]:
    """The job's attempts as time spans, oldest first (see the module's docstring)."""
    times = _item_times(steps, events)
    spans = _marked_spans(events)
    if not times and not spans:
        return []
    if not spans or (times and times[0] < spans[0].start - SLACK_S):
        first = min([_step_start(s) for s in steps if s.end_time is not None]
                    + [t for t in times], default=times[0] if times else 0.0)
        upto = spans[0].start if spans else None
        lead_end = max((t for t in times if upto is None or t < upto), default=first)
        spans.insert(0, _Span(first, lead_end if spans else None, "first_line"))
    for i, sp in enumerate(spans[:-1]):  # a start without its end: ends at its last line
        if sp.end is None:
            nxt = spans[i + 1].start
            sp.end = max((t for t in times if sp.start <= t < nxt), default=sp.start)
    out: list[_Span] = []
    for sp in spans:
        out.extend(_split_by_signs(sp, steps, events, times))
    return out


# ---------------------------------------------------------------------------- endings
def _signal_words(status: int) -> str:
    try:
        return f"signal {status - 128} ({signal.Signals(status - 128).name})"
    except ValueError:
        return f"signal {status - 128}"


def _quote(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _status_ending(status: int | None) -> tuple[str, str]:
    if status is None:
        return "unknown", ""
    if status == 0:
        return "finished", "exit status 0"
    if status > 128:
        return "killed", f"ended by {_signal_words(status)}"
    return "error_exit", f"exit status {status}"


def _ending(att: Attempt, events: list[Event], flags: list[Flag], running: bool
            ) -> tuple[str, str, float | None]:
    """How the attempt ended, in one word and in words, and for a hang that ended it, when it
    was seen (the flag's start), else None."""
    hi = float("inf") if att.end is None else att.end + SLACK_S
    after = att.last_step_end if att.last_step_end is not None else att.start
    by_status, status_words = _status_ending(att.status)
    acted = [e for e in _timed(events, (HANG_ACTION,)) if att.start < float(e.time) <= hi
             and (e.data or {}).get("acted") and (e.data or {}).get("action") == "terminate"]
    hangs = [f for f in flags if f.kind == "hang" and after - SLACK_S <= float(f.start) <= hi]
    # a failure after the last step (read with it, in the same poll, it may carry its time)
    last = att.last_step
    crashes = sorted((e for e in _timed(events, CRASH_KINDS)
                      if (after < float(e.time) or (after - SLACK_S < float(e.time)
                                                    and last is not None and e.step is not None
                                                    and e.step >= last))
                      and float(e.time) <= hi),
                     key=lambda e: e.kind == "traceback")  # the named failure first
    tail = f" ({status_words})" if status_words else ""
    if acted:
        seen = float(hangs[0].start) if hangs else float(acted[0].time)
        return "terminated", _quote(acted[0].message, 400) + tail, seen
    if hangs:
        return "hang", f"hang: {_quote(hangs[0].evidence, 300)}" + tail, float(hangs[0].start)
    if crashes:
        return "crash", f"{crashes[0].kind}: {_quote(crashes[0].message)}" + tail, None
    if by_status != "unknown":
        return by_status, status_words, None
    from monitor.hang.finish import finish_time

    mine = [e for e in events if e.time is not None and att.start <= float(e.time) <= hi]
    done = finish_time(mine)
    if done is not None:
        return "finished", f"training finished ({done[1]})", None
    if running:
        return "running", "still running", None
    return "unknown", "the log says nothing of how it ended", None


# ---------------------------------------------------------------------------- booking
def _book_steps(att: Attempt, recs: list[StepRecord], prior_top: int | None,
                cleared: list[tuple[float, float]]) -> None:
    """Book the steps of one attempt (``att.seconds`` in place): overhead before the first,
    then each step's interval from the previous step's end; a hang that cleared inside an
    interval takes its seconds from the wait before the step, then from the step's work."""
    sec = att.seconds
    prev: float | None = None
    for rec in recs:
        end = float(rec.end_time)
        cov = float(covered_seconds(rec) or 0.0)
        lo = max(att.start, end - cov) if prev is None else prev
        if prev is None:
            sec["overhead"] += max(0.0, lo - att.start)
        piece = max(0.0, end - lo)
        in_step = min(cov, piece)
        ckpt = min(float(rec.phases.get("save_checkpoint") or 0.0), in_step)
        val = min(float(rec.phases.get("testing") or 0.0), in_step - ckpt)
        work, gap = in_step - ckpt - val, piece - in_step
        held = sum(max(0.0, min(h1, end) - max(h0, lo)) for h0, h1 in cleared)
        from_gap = min(held, gap)
        from_work = min(held - from_gap, work)
        redone = prior_top is not None and rec.step <= prior_top
        sec["redone" if redone else "productive"] += work - from_work
        sec["between_steps"] += gap - from_gap
        sec["hang"] += from_gap + from_work
        sec["checkpoint"] += ckpt
        sec["validation"] += val
        att.redone_steps += int(redone)
        att.saves += int(ckpt > 0)
        prev = end


def _cleared_hangs(att: Attempt, recs: list[StepRecord], flags: list[Flag]
                   ) -> list[tuple[float, float]]:
    """Hangs that cleared inside the attempt: from the last step before the flag to the
    first step after it."""
    out = []
    ends = [float(r.end_time) for r in recs]
    for f in flags:
        if f.kind != "hang" or float(f.start) < att.start:
            continue
        later = [t for t in ends if t > float(f.start)]
        if not later:
            continue
        before = [t for t in ends if t <= float(f.start)]
        out.append((before[-1] if before else att.start, later[0]))
    return out


def _tail_bucket(ended_by: str) -> str:
    return {"hang": "hang", "terminated": "hang", "crash": "crash_loss",
            "killed": "crash_loss", "error_exit": "crash_loss",
            "finished": "shutdown"}.get(ended_by, "after_last_step")


def book_attempt(span: _Span, index: int, recs: list[StepRecord], events: list[Event],
                 flags: list[Flag], prior_top: int | None, running: bool) -> Attempt:
    """One attempt's ledger: ``recs`` its steps (time order), ``prior_top`` the highest step
    any earlier attempt finished, ``running``: an attempt without an end still runs."""
    att = Attempt(index, span.start, span.end, span.source, span.status)
    if recs:
        att.steps = len(recs)
        att.first_step, att.last_step = int(recs[0].step), int(recs[-1].step)
        att.last_step_end = float(recs[-1].end_time)
    hi = float("inf") if span.end is None else span.end
    for e in _timed(events, RESUME_KINDS):
        if span.start - SLACK_S <= float(e.time) <= hi and (
                att.last_step_end is None or float(e.time) <= _step_start(recs[0])):
            att.resumed_from = _resumed_step(e)
            if att.resumed_from is not None:
                break
    still = running and span.end is None
    att.ended_by, att.detail, hang_seen = _ending(att, events, flags, still)
    _book_steps(att, recs, prior_top, _cleared_hangs(att, recs, flags))
    last = att.last_step_end if att.last_step_end is not None else att.start
    if span.end is None:
        att.booked_to = last if recs else att.start
        return att
    att.booked_to = max(span.end, last)
    tail = att.booked_to - last
    if recs:
        att.seconds[_tail_bucket(att.ended_by)] += tail
    elif hang_seen is not None:  # hung before its first step: held since its last line
        said = [float(e.time) for e in events if e.time is not None
                and e.kind not in (START, END, HANG_ACTION, "hang_dump", "hang_evidence")
                and att.start < float(e.time) < hang_seen]
        held_from = max(said, default=att.start)
        att.seconds["overhead"] += held_from - att.start
        att.seconds["hang"] += att.booked_to - held_from
    else:
        att.seconds["overhead"] += tail  # it never reached a step: all of it was start-up
    return att


def _resumed_step(e: Event) -> int | None:
    if e.kind == "resume" and (e.data or {}).get("reason") == "setting_global_step":
        return None if e.step is None else int(e.step)
    if e.kind == "checkpoint_load":
        m = _CKPT_STEP.search(str((e.data or {}).get("path") or e.message))
        return int(m.group(1)) if m else None
    return None


# ---------------------------------------------------------------------------- the job
def attempts(steps: list[StepRecord], events: list[Event], flags: Iterable[Flag] = (),
             *, running: bool = False) -> list[Attempt]:
    """The job's attempts with their ledgers, oldest first. ``running``: the newest attempt,
    if it has no recorded end, still runs (the live exporter's view)."""
    events = list(events)
    flags = list(flags)
    timed = sorted((s for s in steps if s.end_time is not None and s.total is not None),
                   key=lambda s: float(s.end_time))
    spans = split_attempts(timed, events)
    if spans and spans[-1].end is None and not running:  # a log read after the fact
        times = [t for t in _item_times(timed, events) if t >= spans[-1].start]
        spans[-1].end = max(times, default=spans[-1].start)
    out: list[Attempt] = []
    top: int | None = None
    for i, sp in enumerate(spans):
        hi = float("inf") if sp.end is None else sp.end + SLACK_S
        nxt = spans[i + 1].start if i + 1 < len(spans) else float("inf")
        recs = _once([s for s in timed if sp.start < float(s.end_time) <= min(hi, nxt)])
        att = book_attempt(sp, i + 1, recs, events, flags, top, running)
        out.append(att)
        if recs:
            top = max([int(r.step) for r in recs] + ([top] if top is not None else []))
    return out


def _once(recs: list[StepRecord]) -> list[StepRecord]:
    """One attempt's step lines without repeats: a step number at or below one already seen
    in the attempt is the same step again (its console line and its file-logger record, two
    exporters), never new work (a resume would have started another attempt)."""
    out: list[StepRecord] = []
    for rec in recs:
        if not out or rec.step > out[-1].step:
            out.append(rec)
    return out


def measured(steps: list[StepRecord]) -> bool:
    """Whether the steps' times are measured (stamps, capture times), not rebuilt."""
    timed = [s for s in steps if s.end_time is not None]
    return bool(timed) and all(s.time_source in MEASURED_SOURCES for s in timed)


def failure_costs(atts: list[Attempt], steps: list[StepRecord]) -> list[dict[str, Any]]:
    """What each failure cost: the wall time from the failed attempt's last step (or its
    start) until a later attempt finished that step again. ``back`` False: no later attempt
    got back there (then the cost is at least ``seconds``, up to the last time seen)."""
    timed = sorted((s for s in steps if s.end_time is not None), key=lambda s: s.end_time)
    out = []
    top: int | None = None
    for att in atts:
        if att.last_step is not None:
            top = att.last_step if top is None else max(top, att.last_step)
        if att.ended_by not in FAILURES or att.end is None:
            continue
        since = att.last_step_end if att.last_step_end is not None else att.start
        back = [float(s.end_time) for s in timed if float(s.end_time) > att.end
                and (top is None or s.step >= top)]
        upto = back[0] if back else max([a.booked_to for a in atts] + [att.end])
        out.append({"attempt": att.index, "ended_by": att.ended_by, "step": top,
                    "seconds": round(upto - since, 3), "back": bool(back)})
    return out


def job_ledger(steps: list[StepRecord], events: list[Event], flags: Iterable[Flag] = (),
               *, running: bool = False) -> dict[str, Any]:
    """The ``attempts`` object of ``analyze --json`` and of the live views: each attempt's
    ledger, the job's sums (with ``between_attempts``), its wall time, ETTR, failures, steps
    redone, checkpoint saves, and what each failure cost. ``ettr`` is None (with the reason in
    ``premises``) where the times are not measured or no attempt is known."""
    atts = attempts(steps, events, flags, running=running)
    sums = dict.fromkeys(BUCKETS, 0.0)
    for a in atts:
        for k, v in a.seconds.items():
            sums[k] += v
    down = sum(max(0.0, b.start - a.booked_to) for a, b in zip(atts, atts[1:], strict=False))
    wall = sum(a.wall for a in atts) + down
    ok = measured(steps)
    premises = [] if ok else ["the log's step times are not measured (no timestamps or "
                              "capture times): the job's wall time, and so ETTR, is unknown"]
    if not atts:
        premises.append("no attempt found: the logs hold no step and no event")
    ettr = round(sums["productive"] / wall, 4) if ok and wall > 0 else None
    return {
        "attempts": [a.to_dict() for a in atts],
        "seconds": {**{k: round(v, 3) for k, v in sums.items()},
                    "between_attempts": round(down, 3)},
        "wall": round(wall, 3), "productive": round(sums["productive"], 3), "ettr": ettr,
        "failures": sum(1 for a in atts if a.ended_by in FAILURES),
        "steps_redone": sum(a.redone_steps for a in atts),
        "saves": sum(a.saves for a in atts),
        "failure_costs": failure_costs(atts, steps),
        "measured": ok, "premises": premises,
    }


#: Columns of the attempts table (wandb, the dashboard).
ATTEMPT_COLUMNS: list[str] = ["attempt", "start", "end", "ended_by", "detail", "resumed_from",
                              "first_step", "last_step", "redone_steps", "saves", "wall",
                              *BUCKETS]


def attempt_rows(ledger: dict[str, Any]) -> list[list[Any]]:
    """The ledger's attempts as rows of :data:`ATTEMPT_COLUMNS`."""
    return [[a.get(c, a["seconds"].get(c)) if c not in BUCKETS else a["seconds"][c]
             for c in ATTEMPT_COLUMNS] for a in ledger.get("attempts") or []]


def ledger_numbers(ledger: dict[str, Any]) -> dict[str, float]:
    """The job's numbers, flat (wandb keys under ``job/``): ETTR (when known), wall time,
    attempts, failures, steps redone, saves, and the seconds of each bucket."""
    out: dict[str, float] = {"wall_s": float(ledger["wall"]),
                             "attempts": float(len(ledger["attempts"])),
                             "failures": float(ledger["failures"]),
                             "steps_redone": float(ledger["steps_redone"]),
                             "checkpoint_saves": float(ledger["saves"])}
    if ledger.get("ettr") is not None:
        out["ettr"] = float(ledger["ettr"])
    out.update({f"seconds/{k}": float(v) for k, v in ledger["seconds"].items()})
    return out
