"""Step-level detectors: step_time_spikes and throughput_regression."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pandas as pd

from monitor.detect import window as W
from monitor.detect.detector_base import Context, make_flag, step_episodes, steps_text
from monitor.records import ALL_PHASES, Flag

#: The throughput_regression advice that asks the reader to find the phase that grew: dropped
#: when the detector names that phase itself.
_FIND_THE_PHASE = "Compare the phases of recent steps with the baseline"


def spike_steps(ctx: Context) -> pd.Series:
    """Per step (aligned with ``ctx.sf``): True where the step time is far above its rolling median.

    Testing and checkpoint time are taken out first: they are periodic by design.
    """
    cfg = ctx.cfg("step_time_spikes")
    sf = ctx.sf
    total = W.core_total(sf)
    med, mad = W.rolling_baseline(total, cfg.get_int("history_steps"),
                                  min_periods=cfg.get_int("min_history_steps"))
    lim = np.maximum(med + cfg.get_float("mad_k") * 1.4826 * mad, med * cfg.get_float("ratio"))
    high = [None if pd.isna(t) or pd.isna(li) else bool(t > li)
            for t, li in zip(total, lim, strict=True)]
    # a spike is a step that is high while the next one is back to normal: a lasting change of
    # level is not a spike (throughput_regression and the phase detectors judge those)
    out: list[object] = []
    for i, h in enumerate(high):
        if h is None or not h:
            out.append(h)
            continue
        if i + 1 >= len(high):
            out.append(None)  # not confirmed yet
            continue
        nxt = total.iloc[i + 1]
        prev = total.iloc[i - 1] if i > 0 else np.nan
        drop = cfg.get_float("neighbour_ratio")
        back = pd.notna(nxt) and pd.notna(lim.iloc[i]) and nxt <= lim.iloc[i]
        # both neighbours clearly lower: a spike, not the edge of a change of level
        apart = (pd.notna(nxt) and nxt * drop <= total.iloc[i]
                 and (pd.isna(prev) or prev * drop <= total.iloc[i]))
        out.append(bool(back and apart))
    return pd.Series(out, index=sf.index, dtype=object)


def period_of(step_numbers: list[int], min_share: float = 0.7) -> int | None:
    """The period (in steps) of spikes when most gaps between them are equal, else None."""
    if len(step_numbers) < 3:
        return None
    gaps = np.diff(sorted(step_numbers))
    gaps = gaps[gaps > 0]
    if len(gaps) < 2:
        return None
    gap, count = Counter(gaps.tolist()).most_common(1)[0]
    return int(gap) if count / len(gaps) >= min_share and gap > 1 else None


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: the step timers and throughput they read.
PREMISES: dict[str, tuple[str, ...]] = {
    "step_time_spikes": (),
    "throughput_regression": (),
}


def lone_outliers(ctx: Context) -> list[Flag]:
    """One step that held the job far longer than its neighbours (``single_ratio`` times
    their median step time, and ``single_min_extra_s`` seconds more), named as what it was:
    the phase whose seconds grew most against the same phase in those neighbours (a reward
    call that held the job 202 s at step 12). The first step (warm-up) is not judged."""
    cfg = ctx.cfg("step_time_spikes")
    min_extra = cfg.get_float("single_min_extra_s")
    sf = ctx.sf
    k = cfg.get_int("single_neighbours")
    if not min_extra > 0 or len(sf) < 3:
        return []
    total = W.core_total(sf).astype(float).to_numpy()
    phases = [c for c in sf.columns if c in W.ALL_PHASES and c != "other"]
    out: list[Flag] = []
    for i in range(1, len(sf)):
        near = [j for j in range(max(1, i - k), min(len(sf), i + k + 1)) if j != i]
        base = float(np.nanmedian(total[near])) if near else float("nan")
        if not (base > 0) or np.isnan(total[i]):
            continue
        extra = total[i] - base
        if total[i] < cfg.get_float("single_ratio") * base or extra < min_extra:
            continue
        grew = {p: float(sf[p].iloc[i]) - float(np.nanmedian(sf[p].iloc[near].astype(float)))
                for p in phases if pd.notna(sf[p].iloc[i])}
        step = int(sf["step"].iloc[i])
        what = ""
        if grew:
            top = max(grew, key=lambda p: grew[p])
            if grew[top] > 0.5 * extra:
                usual = float(np.nanmedian(sf[top].iloc[near].astype(float)))
                what = (f": its {top} took {float(sf[top].iloc[i]):.0f} s (timing_s/{top}; "
                        f"{usual:.1f} s in the steps around it)")
        end = float(sf["end"].iloc[i])
        out.append(make_flag(
            "step_time_spikes", "warning", end, end, {"steps": [step, step]},
            f"Step {step} held the job {extra:.0f} s longer than the steps around it: "
            f"{total[i]:.0f} s against a median of {base:.0f} s{what}.",
            advice=lone_step_advice(grew and max(grew, key=lambda p: grew[p])),
        ))
    return out


def lone_step_advice(phase: str | None) -> list[str]:
    """What to do about one step that held the job, by the phase that grew."""
    if phase == "reward":
        return ["One reward call held the whole job: give the reward function a timeout per "
                "sample (an HTTP call, a sandbox, a symbolic check without one can hold every "
                "GPU) and score in parallel workers (reward.num_workers).",
                "Find the sample in that step's batch (its prompt and response) and run "
                "compute_score on it alone to see where it goes."]
    if phase == "gen":
        return ["One generation held the job: a response that ran to data.max_response_length "
                "or a stuck request; cap the length, and look at response_length/max of that "
                "step."]
    return ["Look at what the log printed around that step (a retry, a checkpoint, a slow "
            "disk); global_profiler.tool with global_profiler.steps set to it profiles a "
            "repeat."]


def detect_step_time_spikes(ctx: Context) -> list[Flag]:
    """Repeated steps far above the rolling median; says whether they are periodic."""
    cfg = ctx.cfg("step_time_spikes")
    sf = ctx.sf
    if len(sf) < cfg.get_int("min_history_steps") + 1:
        return lone_outliers(ctx)
    spikes = spike_steps(ctx)
    window = cfg.get_int("count_window_steps")
    need = cfg.get_int("min_spikes")
    is_spike = spikes.map(lambda v: bool(v) if v is not None else False).astype(int)
    recent = is_spike.rolling(window, min_periods=1).sum()
    cond = [None if spikes.iloc[i] is None and recent.iloc[i] == 0 else bool(recent.iloc[i] >= need)
            for i in range(len(sf))]
    total = W.core_total(sf)
    med, _ = W.rolling_baseline(total, cfg.get_int("history_steps"),
                                min_periods=cfg.get_int("min_history_steps"))
    flags = []
    for ep, start, end, _rng in step_episodes(ctx, cond, 1, window):
        lo = max(0, ep.onset - window + 1)
        idx = [i for i in range(lo, ep.last + 1) if is_spike.iloc[i]]
        if not idx:
            continue
        stepnos = [int(sf["step"].iloc[i]) for i in idx]
        rng = [stepnos[0], stepnos[-1]]
        ratios = [float(total.iloc[i] / med.iloc[i]) for i in idx if med.iloc[i] > 0]
        worst = max(ratios) if ratios else float("nan")
        period = period_of(stepnos)
        confirm = min(ep.opened + 1, len(sf) - 1)
        start = float(sf["end"].iloc[confirm])
        end = None if ep.closed is None else float(sf["end"].iloc[min(idx[-1] + 1, len(sf) - 1)])
        kind = (f"periodic, every {period} steps" if period
                else "irregular (no fixed period)")
        sev = "critical" if worst >= cfg.get_float("critical_ratio") else "warning"
        flags.append(make_flag(
            "step_time_spikes", sev, start, end, {"steps": rng},
            f"{len(idx)} steps ran up to {worst:.1f}x the rolling median step time "
            f"({float(med.iloc[idx[0]]):.1f} s), {steps_text(rng)}; {kind}.",
        ))
        flags[-1].scope["period_steps"] = period if period else None
        if flags[-1].scope["period_steps"] is None:
            del flags[-1].scope["period_steps"]
    alone = [f for f in lone_outliers(ctx) if not any(
        g.scope["steps"][0] <= f.scope["steps"][0] <= g.scope["steps"][1] for g in flags)]
    return flags + alone


def throughput(ctx: Context) -> tuple[pd.Series, str]:
    """Throughput per step (aligned with ``ctx.sf``) and its unit.

    perf/throughput (tokens/s per GPU), else perf/total_num_tokens / step time, else (logs
    without token counts, such as the breakdown format) steps per hour.
    """
    sf = ctx.sf
    tp = sf["throughput"].astype(float) if "throughput" in sf.columns else None
    if tp is not None and tp.notna().sum() >= 2:
        return tp, "tokens/s"
    total = W.core_total(sf)
    tok = W.step_metrics(ctx.steps, "perf/total_num_tokens")
    tok = tok.reindex(sf["step"].to_numpy()).reset_index(drop=True)
    if tok.notna().sum() >= 2:
        return tok / total.where(total > 0), "tokens/s"
    return 3600.0 / total.where(total > 0), "steps/h"


def with_run_start(ctx: Context) -> Context:
    """``ctx`` with the run's first steps (``reference_steps``) put back in front of its steps
    when they have left the window; ``ctx`` itself when there are none or they are still in."""
    ref = ctx.reference_steps
    if not ref or not ctx.steps:
        return ctx
    ref_keys = {(s.step, s.end_time) for s in ref}
    if (ctx.steps[0].step, ctx.steps[0].end_time) in ref_keys:
        return ctx  # the window still starts with the run's start
    later = [s for s in ctx.steps if (s.step, s.end_time) not in ref_keys]
    return replace(ctx, steps=list(ref) + later, cache={})


def detect_throughput_regression(ctx: Context) -> list[Flag]:
    """Tokens/s down by the configured share against the run's own baseline (its first steps,
    from ``ctx.reference_steps`` when a live window no longer holds them)."""
    ctx = with_run_start(ctx)
    cfg = ctx.cfg("throughput_regression")
    sf = ctx.sf
    tp, unit = throughput(ctx)
    if tp.notna().sum() < cfg.get_int("warmup_steps") + cfg.get_int("baseline_steps") + 1:
        return []
    skip = cfg.get_int("warmup_steps")
    n_base = cfg.get_int("baseline_steps")
    valid = tp.dropna()
    base_vals = valid.iloc[skip:skip + n_base]
    baseline = float(base_vals.median())
    if not baseline or baseline <= 0:
        return []
    smooth = tp.rolling(cfg.get_int("smooth_steps"), min_periods=1).median()
    drop = 1.0 - smooth / baseline
    lim = cfg.get_float("drop")
    first_after = base_vals.index[-1]
    cond = [None if (pd.isna(d) or i <= first_after) else bool(d >= lim)
            for i, d in enumerate(drop)]
    flags = []
    for ep, start, end, rng in step_episodes(
        ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
    ):
        sl = slice(ep.onset, ep.last + 1)
        cur = float(tp.iloc[sl].median())
        d = 1.0 - cur / baseline
        sev = "critical" if d >= cfg.get_float("critical_drop") else "warning"
        b_lo, b_hi = int(sf["step"].iloc[base_vals.index[0]]), int(sf["step"].iloc[first_after])
        grew = grown_phase(sf, base_vals.index, valid.index[(valid.index >= ep.onset)
                                                             & (valid.index <= ep.last)])
        words = ""
        if grew is not None:
            words = (f" {grew[0]} grew most: {grew[1]:.1f} s a step in the baseline, "
                     f"{grew[2]:.1f} s now.")
        flags.append(make_flag(
            "throughput_regression", sev, start, end, {"steps": rng},
            f"Throughput fell to {cur:,.0f} {unit}, {d * 100:.0f}% below the run's baseline of "
            f"{baseline:,.0f} (steps {b_lo}-{b_hi}), {steps_text(rng)}"
            + (" (the log gives no token counts)." if unit == "steps/h" else ".") + words,
            advice=_regression_advice(ctx, grew[0] if grew else None),
        ))
    return flags


def grown_phase(sf: pd.DataFrame, base_rows: pd.Index, now_rows: pd.Index
                ) -> tuple[str, float, float] | None:
    """(phase, baseline median s, recent median s) of the phase whose time per step grew the
    most seconds between the baseline rows and the recent rows of ``sf``; None when no phase
    is timed or none grew."""
    best = None
    for name in ALL_PHASES:
        if name not in sf.columns or len(base_rows) == 0 or len(now_rows) == 0:
            continue
        col = sf[name].astype(float)
        before, after = col.loc[base_rows].median(), col.loc[now_rows].median()
        if pd.notna(before) and pd.notna(after) and after > before and (
                best is None or after - before > best[2] - best[1]):
            best = (name, float(before), float(after))
    return best


def _regression_advice(ctx: Context, phase: str | None) -> list[str]:
    """The advice for ``phase``'s regression; once the phase is named, no piece asks the
    reader to find it, and the profiler line names it."""
    advice = ctx.advice("throughput_regression", phase, None)
    if phase is None:
        return advice
    return [f"Profile {phase} in one step with global_profiler.tool to see what got slower."
            if a.startswith(_FIND_THE_PHASE) else a for a in advice]
