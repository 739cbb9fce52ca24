"""skipped_updates: gradients that were NaN or inf, so verl skipped the optimizer step.

verl's ``_optimizer_step`` (dp_actor, dp_critic, the FSDP and VeOmni engines; verl 0.5 and
main) clips the gradients, and when their norm is not finite it prints ``WARN: rank 0
grad_norm is not finite: nan``, zeroes the gradients and does not step the optimizer: the
weights stay as they were and the step's update time is spent for nothing. The step line
still reports it (``actor/grad_norm:np.float64(nan)``, ``critic/grad_norm``); nothing stops.

Per step (``ctx.sf``) the condition is a non-finite ``actor/grad_norm`` or ``critic/grad_norm``;
a log whose steps print no grad_norm at all is judged by verl's ``WARN`` lines instead (the
parser's ``grad_not_finite`` events, each given to the step after the last one recorded before
it). One flag an episode (persistence ``open_after_steps``, hysteresis ``close_after_steps``):
a warning, critical once ``critical_steps`` steps in a row skipped their update. The evidence
says which role, in how many of the episode's steps, the update time thrown away and which
worker printed the warning; the advice starts with the attention kernel when it began with the
run's first step (sdpa with left-padded prompts gave NaN on every step on the H200), else with
the learning rate and clipping.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from monitor.detect.detector_base import Context, make_flag, step_episodes
from monitor.detect.flag_advice import skipped_updates_advice
from monitor.records import Event, Flag, StepRecord

#: (role, its grad_norm metric, the phase its update is timed in)
ROLES: tuple[tuple[str, str, str], ...] = (
    ("actor", "actor/grad_norm", "update_actor"),
    ("critic", "critic/grad_norm", "update_critic"),
)


def not_finite(value: object) -> str | None:
    """``"NaN"``, ``"inf"`` or ``"-inf"`` for a non-finite number, None otherwise (finite,
    missing, or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return None


@dataclass
class _Step:
    """One step as this detector reads it: the roles whose update was skipped (role -> how
    the norm read), whether any grad_norm was printed, verl's warnings given to it."""

    skipped: dict[str, str]
    printed: bool
    warnings: list[Event]


def _by_step(steps: list[StepRecord]) -> dict[int, StepRecord]:
    out: dict[int, StepRecord] = {}
    for rec in steps:
        out[int(rec.step)] = rec  # a step seen twice (a resume) keeps the last
    return out


def _warnings_by_step(events: list[Event], stepnos: list[int]) -> dict[int, list[Event]]:
    """verl's ``grad_not_finite`` warnings, each given to the first step after the step it
    was printed behind (its ``step``; the first step when it came before any). Ray forwards a
    worker's lines late, so one may come after its step's line: a warning after the last step
    is given to the last step."""
    out: dict[int, list[Event]] = {}
    ordered = sorted(stepnos)
    for e in events:
        if e.kind != "grad_not_finite" or not ordered:
            continue
        # the first step after the warning's, by bisection (one pass per warning over every
        # step was quadratic: 60,000 steps with a warning each took 155 s)
        k = 0 if e.step is None else bisect.bisect_right(ordered, e.step)
        out.setdefault(ordered[k] if k < len(ordered) else ordered[-1], []).append(e)
    return out


def _read_steps(ctx: Context) -> list[_Step]:
    """Per row of ``ctx.sf``: what its step says about its update."""
    records = _by_step(ctx.steps)
    stepnos = [int(s) for s in ctx.sf["step"]]
    warnings = _warnings_by_step(ctx.events, stepnos)
    out = []
    for stepno in stepnos:
        metrics = records[stepno].metrics if stepno in records else {}
        skipped = {}
        printed = False
        for role, key, _ in ROLES:
            if key in metrics:
                printed = True
                read = not_finite(metrics[key])
                if read is not None:
                    skipped[role] = read
        out.append(_Step(skipped, printed, warnings.get(stepno, [])))
    if not any(s.printed for s in out):
        for s in out:  # no grad_norm printed at all: verl's warnings say which steps skipped
            for e in s.warnings:
                s.skipped.setdefault((e.data or {}).get("role") or "a worker",
                                     str((e.data or {}).get("value", "NaN")))
    return out


def step_list(stepnos: list[int]) -> str:
    """"step 4", "steps 1-6", "steps 2-4, 7"."""
    nums = sorted(set(stepnos))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ("step " if len(nums) == 1 else "steps ") + ", ".join(parts)


def _longest_run(flags: list[bool]) -> int:
    best = run = 0
    for f in flags:
        run = run + 1 if f else 0
        best = max(best, run)
    return best


def _reads(values: list[str]) -> str:
    kinds = sorted(set(v.lstrip("-") for v in values))
    return "NaN or inf" if len(kinds) > 1 else kinds[0]


def _worker_text(events: list[Event]) -> str:
    """"; WorkerDict pid=1523 printed "WARN: rank 0 grad_norm is not finite: nan"" for the
    workers that printed verl's warning (the lines naming a rank first; "" without warnings).
    No count: Ray forwards a worker's lines in batches, and the parser keeps one a worker and
    rank between two step lines."""
    if not events:
        return ""
    said: dict[str, dict[str, None]] = {}
    for e in events:
        data = e.data or {}
        who = data.get("worker") or "a worker"
        if data.get("pid") is not None:
            who += f" pid={data['pid']}"
        if data.get("ip"):
            who += f" at {data['ip']}"
        said.setdefault(who, {}).setdefault(e.message, None)  # an ordered set: linear
    parts = []
    for who, lines in list(said.items())[:2]:
        ordered = sorted(lines, key=lambda msg: "rank" not in msg)[:2]
        parts.append(f"{who} printed " + " and ".join(f'"{msg}"' for msg in ordered))
    more = len(said) - 2
    text = "; " + "; ".join(parts)
    return text + (f" ({more} more worker{'s' if more > 1 else ''} too)" if more > 0 else "")


def _evidence(ctx: Context, rows: list[_Step], stepnos: list[int], lo: int, hi: int) -> str:
    """What an episode (rows ``lo..hi``) says, in words."""
    n = hi - lo + 1
    clauses = []
    every = True
    for role in dict.fromkeys(r for s in rows[lo:hi + 1] for r in s.skipped):
        hit = [i for i in range(lo, hi + 1) if role in rows[i].skipped]
        every = every and len(hit) == n
        reads = _reads([rows[i].skipped[role] for i in hit])
        clauses.append(f"{role} grad_norm was {reads} in {len(hit)} of {n} steps "
                       f"({step_list([stepnos[i] for i in hit])})")
    text = " and ".join(clauses)
    if every:
        text += ": verl skipped each optimizer step, so the weights did not change"
    else:
        text += (": verl skipped the optimizer step in each of them, so those steps did not "
                 "change the weights")
    wasted = 0.0
    for role, _, phase in ROLES:
        if phase in ctx.sf.columns:
            secs = ctx.sf[phase].iloc[lo:hi + 1].to_numpy(float)
            wasted += sum(x for i, x in zip(range(lo, hi + 1), secs, strict=True)
                          if role in rows[i].skipped and math.isfinite(x))
    if wasted > 0:
        text += f"; {wasted:.1f} s of update time went to updates that were thrown away"
    return text + _worker_text([e for s in rows[lo:hi + 1] for e in s.warnings])


def _first_step(ctx: Context) -> int | None:
    nums = [int(s.step) for s in [*ctx.reference_steps, *ctx.steps]]
    return min(nums) if nums else None


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: the gradient norms and warnings the log printed.
PREMISES: dict[str, tuple[str, ...]] = {
    "skipped_updates": (),
}


def detect_skipped_updates(ctx: Context) -> list[Flag]:
    """One flag per episode of steps whose actor or critic gradients were NaN or inf."""
    if len(ctx.sf) == 0:
        return []
    cfg = ctx.cfg("skipped_updates")
    rows = _read_steps(ctx)
    cond = [bool(s.skipped) for s in rows]
    if not any(cond):
        return []
    stepnos = [int(s) for s in ctx.sf["step"]]
    first = _first_step(ctx)
    flags = []
    for ep in step_episodes(ctx, cond, cfg.get_int("open_after_steps"),
                            cfg.get_int("close_after_steps")):
        lo, hi = ep.episode.onset, ep.episode.last
        run = _longest_run(cond[lo:hi + 1])
        severity = "critical" if run >= cfg.get_int("critical_steps") else "warning"
        roles = list(dict.fromkeys(r for s in rows[lo:hi + 1] for r in s.skipped))
        phase = "update_actor" if "actor" in roles or "critic" not in roles else "update_critic"
        text = _evidence(ctx, rows, stepnos, lo, hi)
        from_start = first is not None and stepnos[lo] == first
        if from_start:
            text = text.rstrip(".") + "; it began with the run's first step"
        flag = make_flag("skipped_updates", severity, ep.start, ep.end,
                         {"steps": ep.steps, "phase": phase}, text + ".",
                         skipped_updates_advice(roles, from_start))
        flags.append(flag)
    return flags


__all__ = ["ROLES", "detect_skipped_updates", "not_finite", "step_list"]
