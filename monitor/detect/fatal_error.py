"""fatal_error: the log reports a failure that ends the run (NCCL, Ray, a signal, CUDA).

The parser turns failure lines into events (``monitor.logs.failure_lines``): ``nccl_timeout``,
``nccl_error``, ``actor_died``, ``worker_killed``, ``cuda_error``. Here the fatal ones become
critical flags, one per burst (every rank reports the same timeout; Ray then reports the dead
actors). The evidence leads with the most telling failure of the burst (a CUDA or hardware
error before a killed worker, before an NCCL error, before the timeouts and Ray's reports that
follow them) and the advice fits it. A task that raised an exception (Ray's ``RayTaskError(X)``)
is quoted from its traceback: the exception line, the Ray task (the worker method) and its
phase, the deepest frame and verl's deepest frame (``file:line in function``); its advice is
chosen by the message (``monitor.detect.flag_advice.exception_advice``), not by Ray's worker-death
causes. Failures that follow a CUDA out-of-memory error are left to the ``oom`` flag: they are
its consequences.
"""

from __future__ import annotations

import numpy as np

from monitor.detect.detector_base import Context, group_by_time, make_flag, steps_text
from monitor.detect.flag_advice import failure_advice
from monitor.detect.health import event_time, timed_events, untimed_note
from monitor.logs.failure_lines import FAILURE_KINDS, describe
from monitor.records import Event, Flag

#: Which failure of a burst names its cause best (first wins). A worker that was killed for a
#: known reason (host OOM, SIGKILL, a segfault, SIGBUS) is a cause; an abort or a bare system
#: error exit mostly follows another failure (the watchdog aborts the process after a timeout).
CAUSE_ORDER: tuple[str, ...] = (
    "cuda_error",
    "worker_killed",
    "nccl_error",
    "nccl_timeout",
    "worker_exit",
    "actor_died",
)
_WEAK_REASONS = frozenset({"abort", "system_error", "intended_exit"})


def _is_fatal(event: Event) -> bool:
    return event.kind in FAILURE_KINDS and bool((event.data or {}).get("fatal", True))


def _cause(events: list[Event]) -> Event:
    """The most telling failure of a burst (earliest within the best kind)."""
    rank = {kind: i for i, kind in enumerate(CAUSE_ORDER)}

    def order(e: Event) -> int:
        kind = e.kind
        if kind == "worker_killed" and (e.data or {}).get("reason") in _WEAK_REASONS:
            kind = "worker_exit"
        return rank.get(kind, len(rank))

    return min(events, key=order)


def _counts(events: list[Event]) -> str:
    counts: dict[str, int] = {}
    for e in events:
        counts[e.kind] = counts.get(e.kind, 0) + int((e.data or {}).get("repeated", 1))
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _traceback_of(ctx: Context, cause: Event, lo: float, hi: float) -> Event | None:
    """The traceback that reports ``cause`` (a task's exception of the same type, printed
    within ``[lo, hi]``), None when the log has none."""
    want = (cause.data or {}).get("cause") if cause.kind == "actor_died" else None
    for it in timed_events(ctx, [e for e in ctx.events if e.kind == "traceback"]):
        data = it.event.data or {}
        if not lo <= it.time <= hi or not data.get("exception"):
            continue
        if want is None or str(data.get("type", "")).rsplit(".", 1)[-1] == want:
            return it.event
    return None


def _raised(cause: Event, tb: Event | None) -> tuple[str, dict]:
    """What the cause says, quoting its own exception and where it happened, and the data
    its advice is chosen by."""
    data = dict(cause.data or {})
    if tb is None or cause.kind != "actor_died" or data.get("exception") != "RayTaskError":
        return describe(cause.kind, data), data
    origin = tb.data or {}
    data["message"] = str(origin.get("exception", ""))[:300]
    for key in ("task", "phase", "frame", "verl_frame"):
        if origin.get(key):
            data[key] = origin[key]
    text = data["message"]
    if data.get("task"):
        text += f", in {data['task']}"
        if data.get("phase"):
            text += f" ({data['phase']})"
    if data.get("frame"):
        text += f", at {data['frame']}"
    if data.get("verl_frame"):
        text += f" (verl's last frame: {data['verl_frame']})"
    return text, data


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: the failure lines the log printed.
PREMISES: dict[str, tuple[str, ...]] = {
    "fatal_error": (),
}


def detect_fatal_error(ctx: Context) -> list[Flag]:
    """One critical flag per burst of fatal failure events; closed when a later step completes
    (the run went on, e.g. after an automatic restart), else open."""
    cfg = ctx.cfg("fatal_error")
    group_s = cfg.get_float("group_seconds")
    after_oom_s = cfg.get_float("after_oom_seconds")
    oom_times = sorted(event_time(ctx, e).time for e in ctx.events if e.kind == "oom")
    timed = [
        it for it in timed_events(ctx, [e for e in ctx.events if _is_fatal(e)])
        # a consequence of an out-of-memory error, which the oom flag reports
        if not any(0.0 <= it.time - o <= after_oom_s for o in oom_times)
    ]
    ends = ctx.sf["end"].to_numpy(float) if len(ctx.sf) else np.array([])
    flags: list[Flag] = []
    for grp in group_by_time(timed, group_s):
        events = [it.event for it in grp]
        untimed = not all(it.known for it in grp)
        t0 = grp[0].time
        later = ends[ends > grp[-1].time]
        end = float(later[0]) if len(later) and not untimed else None
        cause = _cause(events)
        stepnos = [e.step for e in events if e.step is not None]
        rng = [min(stepnos), max(stepnos)] if stepnos else None
        scope = {"steps": rng}
        others = [e for e in events if e is not cause]
        tb = _traceback_of(ctx, cause, t0 - group_s, grp[-1].time + group_s)
        said, data = _raised(cause, tb)
        text = f"The run hit a fatal error: {said}"
        if (cause.data or {}).get("ip"):
            text += f" (worker at {cause.data['ip']})"
        if rng:
            text += f", after {steps_text(rng)}"
        if others:
            text += f"; {len(events)} failure lines in all ({_counts(events)})"
        if end is not None:
            text += "; training continued afterwards"
        text += untimed_note(ctx, events)
        flag = make_flag("fatal_error", "critical", t0, end, scope, text + ".")
        flag.advice = failure_advice(cause.kind, data)
        flags.append(flag)
    return flags
