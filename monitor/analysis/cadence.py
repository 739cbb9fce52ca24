"""How often to save a checkpoint, from the job's own numbers (Young/Daly).

A save costs ``delta`` seconds every interval ``tau`` of work; a failure loses, on average, half
an interval of work since the last save. With failures ``M`` seconds apart on average (the
mean time between failures), the share of the time lost to both is about
``delta / tau + tau / (2 M)``, least at ``tau = sqrt(2 x delta x M)`` (Young 1974; Daly 2006
refines it for long saves). In steps: ``tau`` over the job's step time.

Every number comes from the job: ``delta`` is the median of verl's ``timing_s/save_checkpoint``
(or the wall time a save step takes beyond a plain one, where the log has no such timer and
the printed config gives ``trainer.save_freq``); ``M`` is the time the job's attempts ran over
the failures among them (``monitor.analysis.attempts``), or a rate the user gives; the step
time is the median wall time between two step lines inside an attempt. The advice stands
beside the ``trainer.save_freq`` the job printed and what each failure cost it. A missing
premise is named in ``missing`` and no interval is given.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from monitor.records import StepRecord

#: The advice asks for a change only when the job's interval is this far from the best one.
OFF_BY = 2.0


def duration(seconds: float) -> str:
    """Seconds in words: tenths under 10 s, whole seconds under 2 min, then minutes, hours."""
    s = max(0.0, float(seconds))
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def save_freq(job_config: Mapping[str, Any] | None) -> int | None:
    """``trainer.save_freq`` as the job printed it (None when it printed no config)."""
    trainer = (job_config or {}).get("trainer")
    value = trainer.get("save_freq") if isinstance(trainer, Mapping) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _intervals(steps: list[StepRecord], attempts: list[dict]) -> list[tuple[int, float]]:
    """(step, wall seconds since the step line before it) for consecutive step lines of one
    attempt."""
    timed = sorted((s for s in steps if s.end_time is not None), key=lambda s: s.end_time)
    out = []
    for a in attempts:
        hi = float("inf") if a.get("end") is None else float(a["end"])
        mine = [s for s in timed if float(a["start"]) < float(s.end_time) <= hi]
        for prev, rec in zip(mine, mine[1:], strict=False):
            if rec.step > prev.step:
                out.append((int(rec.step), float(rec.end_time) - float(prev.end_time)))
    return out


def save_cost(steps: list[StepRecord], attempts: list[dict], freq: int | None
              ) -> tuple[float | None, str, int]:
    """(seconds one save costs, how it was measured, saves seen)."""
    timed = [float(s.phases["save_checkpoint"]) for s in steps
             if (s.phases.get("save_checkpoint") or 0.0) > 0]
    if timed:
        return statistics.median(timed), "the median of verl's timing_s/save_checkpoint", \
            len(timed)
    if freq and freq > 0:
        iv = _intervals(steps, attempts)
        saving = [w for st, w in iv if st % freq == 0]
        plain = [w for st, w in iv if st % freq != 0]
        if saving and plain:
            extra = statistics.median(saving) - statistics.median(plain)
            if extra > 0:
                return extra, (f"the wall time a save step (every {freq}) takes beyond a "
                               "plain one"), len(saving)
    return None, "", 0


def step_seconds(steps: list[StepRecord], attempts: list[dict], freq: int | None
                 ) -> float | None:
    """The median wall time between two step lines of one attempt, save steps left out."""
    iv = [w for st, w in _intervals(steps, attempts)
          if not (freq and freq > 0 and st % freq == 0)]
    return statistics.median(iv) if iv else None


def expected_loss(delta: float, tau: float, mtbf: float) -> float:
    """The share of the time lost to saves and to the work since the last save, to first
    order: ``delta / tau + tau / (2 M)``."""
    return delta / tau + tau / (2.0 * mtbf)


def cadence(ledger: Mapping[str, Any], steps: list[StepRecord],
            job_config: Mapping[str, Any] | None = None, *,
            mtbf_s: float | None = None) -> dict[str, Any]:
    """The ``cadence`` object of ``analyze --json``: the premises (``save_cost_s``,
    ``mtbf_s``, ``step_s`` and where each came from), the interval that loses least
    (``interval_s``, ``interval_steps``), the job's ``save_freq``, the expected share lost at
    each, what each failure cost (``failure_costs`` of the ledger), ``advice`` in words
    (None where a premise is missing: ``missing`` names it). ``mtbf_s``: a rate the user
    gives, used instead of the failures seen."""
    atts = list(ledger.get("attempts") or [])
    freq = save_freq(job_config)
    delta, how, saves = save_cost(steps, atts, freq)
    up = sum(float(a.get("wall") or 0.0) for a in atts)
    failures = int(ledger.get("failures") or 0)
    if mtbf_s is not None and mtbf_s > 0:
        mtbf, mtbf_how = float(mtbf_s), "given"
    elif failures:
        mtbf, mtbf_how = up / failures, f"{failures} failure(s) over {duration(up)} of attempts"
    else:
        mtbf, mtbf_how = None, ""
    step_s = step_seconds(steps, atts, freq)
    missing = []
    if delta is None:
        missing.append("no checkpoint save seen: the cost of a save is unknown (verl's "
                       "timing_s/save_checkpoint, or trainer.save_freq in the printed config)")
    if mtbf is None:
        missing.append("no failure seen over the job's attempts: give a mean time between "
                       "failures (--mtbf-hours)")
    if step_s is None:
        missing.append("fewer than two step lines in one attempt: the step time is unknown")
    out: dict[str, Any] = {
        "save_cost_s": _r(delta), "save_cost_source": how, "saves_seen": saves,
        "mtbf_s": _r(mtbf), "mtbf_source": mtbf_how, "failures": failures,
        "step_s": _r(step_s), "save_freq": freq, "interval_s": None, "interval_steps": None,
        "expected_loss": None, "failure_costs": list(ledger.get("failure_costs") or []),
        "advice": None, "missing": missing}
    if missing:
        return out
    tau = math.sqrt(2.0 * delta * mtbf)
    best = max(1, round(tau / step_s))
    out["interval_s"], out["interval_steps"] = round(tau, 3), best
    loss = {"best": round(expected_loss(delta, max(tau, step_s), mtbf), 4)}
    if freq and freq > 0:
        loss["now"] = round(expected_loss(delta, freq * step_s, mtbf), 4)
    out["expected_loss"] = loss
    out["advice"] = advice_text(out)
    return out


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def advice_text(c: Mapping[str, Any]) -> str:
    """The cadence in words: the interval that loses least, beside the job's."""
    best, freq = int(c["interval_steps"]), c.get("save_freq")
    why = (f"sqrt(2 x save {duration(c['save_cost_s'])} x MTBF {duration(c['mtbf_s'])}) = "
           f"{duration(c['interval_s'])}, {best} step(s) of {duration(c['step_s'])}")
    loss = c["expected_loss"]
    if freq is None:
        return (f"Save every {best} step(s): trainer.save_freq={best} ({why}); the log holds "
                "no printed config, so the job's own trainer.save_freq is not known.")
    if freq <= 0:
        return (f"The job saves no checkpoint (trainer.save_freq={freq}): a failure restarts "
                f"it from the start. Save every {best} step(s): trainer.save_freq={best} "
                f"({why}).")
    lost = (f"about {loss['now'] * 100:.1f}% of the time is lost to saves and redone steps "
            f"at {freq}, {loss['best'] * 100:.1f}% at {best}")
    if freq > OFF_BY * best:
        return f"Save more often: trainer.save_freq={best} instead of {freq} ({why}; {lost})."
    if freq * OFF_BY < best:
        return f"Save less often: trainer.save_freq={best} instead of {freq} ({why}; {lost})."
    return (f"trainer.save_freq={freq} is within {OFF_BY:g}x of the interval that loses least, "
            f"{best} step(s) ({why}; {lost}): no change needed.")
