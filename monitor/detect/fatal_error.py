"""fatal_error: the log reports a failure that ends the run, and what caused it.

Two kinds of evidence end a run: failure lines (``monitor.logs.failure_lines``: an NCCL timeout
or error, a Ray actor's death, a killed worker, a CUDA error) and the exceptions the run printed
(``traceback`` events: a traceback, or an exception's line quoted without its header). Both
become one critical flag per burst (every rank reports the same timeout; Ray then reports the
dead actors).

The flag leads with the cause. The first printed exception that shows a cause of the table
(``monitor.detect.crash_causes``: a library built for another torch, a missing module, a config
key the code reads and the config lacks, CUDA or host memory, an assertion in verl ...) is it,
with the table's advice; then a hardware or kill failure line (a CUDA error, a worker killed for
host memory or by a signal); then an exception the table does not know, quoted with its frame;
then NCCL errors and timeouts; the "a worker died" advice of Ray's reports comes only where
nothing printed a cause. A Ray task's exception (``RayTaskError(X)``) is quoted from its
traceback: the exception, the Ray task and its phase, the deepest frame and verl's deepest
frame. Failures that follow a CUDA out-of-memory error are left to the ``oom`` flag.

A printed exception ends the run only where the run did not go on: an exception followed by a
completed step, one printed after the run finished (its last progress line at its total, its
final validation), or one a logger printed (``ERROR:...:Traceback``: the code caught it) raises
nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from monitor.detect.crash_causes import Hit, Raised, diagnose
from monitor.detect.detector_base import Context, group_by_time, make_flag, steps_text
from monitor.detect.flag_advice import advice_for, exception_advice, failure_advice
from monitor.detect.health import TimedEvent, event_time, timed_events, untimed_note
from monitor.logs.exception_lines import ExceptionLine
from monitor.logs.failure_lines import FAILURE_KINDS, describe, match_failure
from monitor.records import Event, Flag

#: Which failure line of a burst names its cause best (first wins), after the printed
#: exceptions' causes. A worker that was killed for a known reason (host OOM, SIGKILL, a
#: segfault, SIGBUS) is a cause; an abort or a bare system error exit mostly follows another
#: failure (the watchdog aborts the process after a timeout).
CAUSE_ORDER: tuple[str, ...] = (
    "cuda_error",
    "worker_killed",
    "nccl_error",
    "nccl_timeout",
    "worker_exit",
    "actor_died",
)
_WEAK_REASONS = frozenset({"abort", "system_error", "intended_exit"})
#: Exceptions that only report a Ray worker's death: no cause of their own.
RAY_DEATHS = frozenset({"RayActorError", "ActorDiedError", "ActorUnavailableError",
                        "WorkerCrashedError", "NodeDiedError", "RaySystemError",
                        "unhandled error"})
#: Tiers of a reading (lower names the cause better): a printed root cause or a hardware/kill
#: failure line; a printed exception the table does not know, a consequence (a peer closed),
#: an NCCL error; an NCCL timeout; Ray's report of a death with no cause printed.
_ROOT, _PRINTED, _TIMEOUT, _NO_CAUSE = range(4)

#: What each reading needs of the job (``monitor.detect.premises``). A failure line needs
#: nothing beyond itself; a printed exception ends the run only while the run has not
#: finished (an exception after the last step of a finished run is its shutdown's).
PREMISES: dict[str, tuple[str, ...]] = {
    "fatal_error": (),
    "fatal_error.exception": ("run_not_finished",),
}


@dataclass
class Reading:
    """One event of a burst read for its cause: the tier, what it says, the advice."""

    event: Event
    tier: int
    rank: int
    said: str
    advice: list[str]
    data: dict


def _is_fatal(event: Event) -> bool:
    return event.kind in FAILURE_KINDS and bool((event.data or {}).get("fatal", True))


def _kind_rank(e: Event) -> int:
    rank = {kind: i for i, kind in enumerate(CAUSE_ORDER)}
    kind = e.kind
    if kind == "worker_killed" and (e.data or {}).get("reason") in _WEAK_REASONS:
        kind = "worker_exit"
    return rank.get(kind, len(rank))


def _counts(events: list[Event]) -> str:
    counts: dict[str, int] = {}
    for e in events:
        counts[e.kind] = counts.get(e.kind, 0) + int((e.data or {}).get("repeated", 1))
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _covered(data: dict) -> bool:
    """Whether a traceback's own exception line is a failure line (a CUDA or NCCL error, a
    killed worker): that failure event reads it."""
    found = match_failure(str(data.get("exception") or ""))
    return found is not None and found.kind != "actor_died"


def _bare(data: dict) -> bool:
    """An exception's line printed alone: no traceback header, no frame, no Ray task."""
    return bool(data.get("headless")) and not data.get("frames") and not data.get("task") \
        and "RayTaskError(" not in str(data.get("exception", ""))


def printed_exceptions(ctx: Context) -> list[Event]:
    """The tracebacks and exception lines that may have ended the run: with an exception,
    not caught and logged, not a failure line's (that event reads it), and only while the run
    has not finished (``fatal_error.exception``'s premise). An exception's line printed alone
    counts only in a text without step records (a quote): a run that dies of an exception
    prints its traceback, so a lone line among the steps is a print of one the code handled."""
    found = [e for e in ctx.events if e.kind == "traceback"
             and (e.data or {}).get("exception") and not (e.data or {}).get("logged")
             and not _covered(e.data or {})
             and not (ctx.steps and _bare(e.data or {}))]
    if not found or not ctx.holds("fatal_error.exception"):
        return []
    return found


def _traceback_of(ctx: Context, cause: Event, lo: float, hi: float) -> Event | None:
    """The traceback that reports ``cause`` (a task's exception of the same type, printed
    within ``[lo, hi]``), None when the log has none."""
    want = (cause.data or {}).get("cause") if cause.kind == "actor_died" else None
    for it in timed_events(ctx, [e for e in ctx.events if e.kind == "traceback"]):
        data = it.event.data or {}
        if not lo <= it.time <= hi or not data.get("exception"):
            continue
        if want is None or _names(data, want):
            return it.event
    return None


def _names(data: dict, want: str) -> bool:
    """Whether a traceback's exception (or its chain) is of type ``want``."""
    raised = Raised.from_event(data)
    return any(e.name == want for e in raised.chain)


def _quote(data: dict, exception: str) -> str:
    """The exception quoted with where it happened."""
    text = exception[:300]
    if data.get("task"):
        text += f", in {data['task']}"
        if data.get("phase"):
            text += f" ({data['phase']})"
    if data.get("frame"):
        text += f", at {data['frame']}"
    if data.get("verl_frame"):
        text += f" (verl's last frame: {data['verl_frame']})"
    return text


def _shown(exc: ExceptionLine) -> str:
    """An exception as its line printed it."""
    kind = f"{exc.type}({exc.wrapped})" if exc.wrapped else exc.type
    if not exc.typed:
        return exc.message
    return f"{kind}: {exc.message}" if exc.message else kind


def _exception_reading(event: Event, data: dict, index: int) -> Reading:
    """A printed exception read against the cause table."""
    raised = Raised.from_event(data)
    hit: Hit | None = diagnose(raised)
    last = raised.last
    if hit is not None:
        tier = _ROOT if hit.cause.root else _PRINTED
        said = _quote(data, _shown(hit.exception)) + f"; cause: {hit.cause.identifies}"
        return Reading(event, tier, index, said, hit.advice, {**data, "crash_cause":
                                                                 hit.cause.id})
    message = str(data.get("exception") or "")
    if last is None or last.name in RAY_DEATHS or all(e.name in RAY_DEATHS | {"RayTaskError"}
                                                      for e in raised.chain):
        return Reading(event, _NO_CAUSE, index, _quote(data, message),
                       failure_advice("actor_died", {"exception": "RayActorError"}), data)
    advice = exception_advice({"exception": "RayTaskError", "cause": last.name,
                               "task": data.get("task"), "message": message,
                               "phase": data.get("phase")}) if data.get("task") else []
    if not advice:
        where = f" at {data['frame']}" if data.get("frame") else ""
        advice = [f"The run raised {last.name}{where}; nothing else in the log names a cause: "
                  f"the quoted message and frame say what failed, and the process's own log "
                  f"(a Ray worker's under /tmp/ray/session_latest/logs) holds the whole "
                  f"traceback."]
    return Reading(event, _PRINTED, index, _quote(data, message), advice, data)


def _failure_reading(ctx: Context, event: Event, index: int, lo: float, hi: float) -> Reading:
    """A failure line read for its cause (a Ray task's exception through its traceback)."""
    data = dict(event.data or {})
    kind = event.kind
    if kind == "actor_died" and data.get("exception") == "RayTaskError" and \
            data.get("cause") not in RAY_DEATHS:
        tb = _traceback_of(ctx, event, lo, hi)
        if tb is not None and not _covered(tb.data or {}):
            reading = _exception_reading(event, {**(tb.data or {}),
                                                 "task": (tb.data or {}).get("task")
                                                 or data.get("task")}, index)
            reading.data = {**data, **reading.data}
            return reading
        if tb is None:
            own = {"exception": f"RayTaskError({data.get('cause')}): ray::{data.get('task')}()",
                   "task": data.get("task"), "phase": data.get("phase")}
            reading = _exception_reading(event, own, index)
            if reading.tier == _ROOT:
                return reading
    advice = failure_advice(kind, data)
    if kind == "worker_killed":
        # Ray's OutOfMemoryError raised through the driver's frames: where it ran out (a
        # checkpoint save) is in them
        tb = _quoting(ctx, event, lo, hi)
        hit = diagnose(Raised.from_event(tb.data or {})) if tb is not None else None
        if hit is not None and hit.cause.root:
            advice = hit.advice
    if kind == "cuda_error" or (kind == "worker_killed" and
                                data.get("reason") not in _WEAK_REASONS):
        tier = _ROOT
    elif kind == "nccl_error":
        tier = _PRINTED
    elif kind == "nccl_timeout":
        tier = _TIMEOUT
    else:
        tier = _NO_CAUSE
    return Reading(event, tier, index, describe(kind, data), advice, data)


def _quoting(ctx: Context, event: Event, lo: float, hi: float) -> Event | None:
    """The traceback whose exception line is this failure line (its frames), or None."""
    said = (event.message or "").strip()[:80]
    if not said:
        return None
    for it in timed_events(ctx, [e for e in ctx.events if e.kind == "traceback"]):
        if lo <= it.time <= hi and str((it.event.data or {}).get("exception", "")).startswith(
                said):
            return it.event
    return None


def _choose(ctx: Context, grp: list[TimedEvent], order: dict[int, int], lo: float,
            hi: float) -> Reading:
    """The reading that names the burst's cause: the lowest tier; within the two first tiers
    the first printed, within the others the kind's rank (``CAUSE_ORDER``) first."""
    readings = []
    for it in grp:
        index = order.get(id(it.event), 0)
        if it.event.kind == "traceback":
            readings.append((it, _exception_reading(it.event, it.event.data or {}, index)))
        else:
            readings.append((it, _failure_reading(ctx, it.event, index, lo, hi)))

    def key(pair: tuple[TimedEvent, Reading]) -> tuple[float, ...]:
        it, r = pair
        if r.tier <= _PRINTED:
            return (r.tier, it.time, r.rank, 0)
        return (r.tier, _kind_rank(it.event), it.time, r.rank)

    return min(readings, key=key)[1]


def _went_on(ctx: Context, it: TimedEvent, ends: np.ndarray) -> bool:
    """Whether a step completed after this event: a later step end, or (where the log gives
    no time) a step record after the step the event was placed at."""
    if it.known and len(ends) and bool((ends > it.time).any()):
        return True
    if not ctx.steps:
        return False
    placed = it.event.step
    return placed is None or max(s.step for s in ctx.steps) > placed


def _signature(event: Event) -> tuple[str, str]:
    """An exception's class and the start of its message, digits blanked: the same error
    printed again (with another sample's text or number) has the same signature."""
    raised = Raised.from_event(event.data or {})
    last = raised.last
    if last is None:
        return ("", "")
    return (last.name, re.sub(r"\d+", "#", last.message[:24]))


def _candidates(ctx: Context, after_oom_s: float) -> list[TimedEvent]:
    """The fatal failure lines, and the printed exceptions the run did not go on after (no
    completed step followed them, nor the same error printed earlier); none that follow a
    CUDA out-of-memory error (the ``oom`` flag reports those)."""
    oom_times = sorted(event_time(ctx, e).time for e in ctx.events if e.kind == "oom")
    ends = ctx.sf["end"].to_numpy(float) if len(ctx.sf) else np.array([])
    failures = timed_events(ctx, [e for e in ctx.events if _is_fatal(e)])
    printed = timed_events(ctx, printed_exceptions(ctx))
    survived = {_signature(it.event) for it in printed if _went_on(ctx, it, ends)}
    printed = [it for it in printed if _signature(it.event) not in survived]
    return [it for it in failures + printed
            if not any(0.0 <= it.time - o <= after_oom_s for o in oom_times)]


def detect_fatal_error(ctx: Context) -> list[Flag]:
    """One critical flag per burst of fatal failures and printed exceptions; closed when a
    later step completes (the run went on, e.g. after an automatic restart), else open."""
    cfg = ctx.cfg("fatal_error")
    group_s = cfg.get_float("group_seconds")
    timed = _candidates(ctx, cfg.get_float("after_oom_seconds"))
    order = {id(e): i for i, e in enumerate(ctx.events)}
    ends = ctx.sf["end"].to_numpy(float) if len(ctx.sf) else np.array([])
    flags: list[Flag] = []
    for grp in group_by_time(timed, group_s):
        events = [it.event for it in grp]
        untimed = not all(it.known for it in grp)
        t0 = grp[0].time
        later = ends[ends > grp[-1].time]
        end = float(later[0]) if len(later) and not untimed else None
        cause = _choose(ctx, grp, order, t0 - group_s, grp[-1].time + group_s)
        stepnos = [e.step for e in events if e.step is not None]
        rng = [min(stepnos), max(stepnos)] if stepnos else None
        lines = [e for e in events if e.kind != "traceback"]
        text = f"The run hit a fatal error: {cause.said}"
        if (cause.data or {}).get("ip"):
            text += f" (worker at {cause.data['ip']})"
        if rng:
            text += f", after {steps_text(rng)}"
        if len(lines) > 1 or (lines and cause.event not in lines):
            text += f"; {len(lines)} failure lines in all ({_counts(lines)})"
        if end is not None:
            text += "; training continued afterwards"
        text += untimed_note(ctx, events)
        flag = make_flag("fatal_error", "critical", t0, end, {"steps": rng}, text + ".")
        flag.advice = _advice(cause)
        flags.append(flag)
    return flags


def _advice(cause: Reading) -> list[str]:
    """The cause's advice, then the general ``fatal_error`` advice; no sentence twice."""
    out: list[str] = []
    general = advice_for("fatal_error")
    for sentence in [*cause.advice, *general]:
        if sentence not in out:
            out.append(sentence)
    return out
