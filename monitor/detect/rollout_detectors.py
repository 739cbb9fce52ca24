"""Rollout detectors: rollout_long_tail and rollout_wait."""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.detect import window as W
from monitor.detect.detector_base import Context, make_flag, step_episodes, steps_text
from monitor.records import Flag

SLOWEST = "timing_s/agent_loop/slowest/generate_sequences"
GEN_MEAN = "timing_s/agent_loop/generate_sequences/mean"
RESP_MAX = "response_length/max"
RESP_MEAN = "response_length/mean"


def _metric(ctx: Context, key: str) -> pd.Series:
    s = W.step_metrics(ctx.steps, key)
    return s.reindex(ctx.sf["step"].to_numpy()).reset_index(drop=True)


def gen_tail_share(ctx: Context) -> pd.Series:
    """Per step: share of the gen phase during which only a minority of GPUs was still working.

    During a long tail GPUs fall idle one by one while a few keep generating; this is the
    fraction of gen time with some, but fewer than ``tail_busy_fraction`` of, the GPUs busy.
    """
    cfg = ctx.cfg("rollout_long_tail")
    df = ctx.act
    sf = ctx.sf
    out = pd.Series(np.nan, index=sf.index, dtype=float)
    if len(df) == 0 or len(sf) == 0:
        return out
    gen = df[df["phase"] == "gen"]
    if len(gen) == 0:
        return out
    busy_level = cfg.get_float("gpu_busy_level")
    bin_s = max(ctx.sample_interval, 1e-3)
    tbin = np.floor((gen["ts"].to_numpy(float) - gen["ts"].min()) / bin_s).astype(int)
    tmp = pd.DataFrame({"step": gen["step"].to_numpy(), "tbin": tbin,
                        "busy": (gen["act"] >= busy_level).to_numpy()})
    per_bin = tmp.groupby(["step", "tbin"]).agg(frac=("busy", "mean"), n=("busy", "size"))
    ngpu = df.groupby(["node", "gpu"]).ngroups
    if ngpu < 2:
        return out
    frac_hi = cfg.get_float("tail_busy_fraction")
    per_bin["tail"] = (per_bin["frac"] > 0) & (per_bin["frac"] < frac_hi)
    per_bin["some"] = per_bin["frac"] > 0
    g = per_bin.groupby(level="step")
    share = g["tail"].sum() / g["some"].sum().where(lambda s: s > 0)
    pos = {int(s): i for i, s in enumerate(sf["step"].to_numpy())}
    for step, val in share.items():
        if int(step) in pos:
            out.iloc[pos[int(step)]] = float(val)
    return out


def _grown_tail(ctx: Context, resp_ratio: pd.Series) -> pd.Series:
    """Steps whose longest response grew well past the run's usual max/mean AND whose gen time
    grew with it: the tail is what slowed generation (both against frozen baselines)."""
    cfg = ctx.cfg("rollout_long_tail")
    gen = W.phase(ctx.sf, "gen").astype(float).reset_index(drop=True)
    out = pd.Series(False, index=resp_ratio.index, dtype=bool)
    if gen.isna().all() or resp_ratio.isna().all():
        return out
    r_grow = cfg.get_float("response_ratio_growth")
    g_grow = cfg.get_float("gen_growth")
    hist = cfg.get_int("history_steps")
    minp = cfg.get_int("min_history_steps")
    r_base, _ = W.frozen_baseline(resp_ratio.reset_index(drop=True), hist, minp,
                                  lambda v, m, _mad: v >= m * r_grow)
    g_base, _ = W.frozen_baseline(gen, hist, minp, lambda v, m, _mad: v >= m * g_grow)
    r_min = cfg.get_float("tail_min_response_ratio")
    vals = [bool(pd.notna(r) and pd.notna(rb) and pd.notna(g) and pd.notna(gb)
                 and r >= max(r_min, rb * r_grow) and g >= gb * g_grow)
            for r, rb, g, gb in zip(resp_ratio.reset_index(drop=True), r_base, gen, g_base,
                                    strict=True)]
    return pd.Series(vals, index=resp_ratio.index, dtype=bool)


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: the response lengths and timers they read.
PREMISES: dict[str, tuple[str, ...]] = {
    "rollout_long_tail": (),
    "rollout_wait": (),
}


def detect_rollout_long_tail(ctx: Context) -> list[Flag]:
    """A few sequences keep generation going while most GPUs (or agent workers) wait."""
    cfg = ctx.cfg("rollout_long_tail")
    sf = ctx.sf
    if len(sf) == 0:
        return []
    slow = _metric(ctx, SLOWEST)
    mean = _metric(ctx, GEN_MEAN)
    agent_ratio = slow / mean.where(mean > 0)
    rmax = _metric(ctx, RESP_MAX)
    rmean = _metric(ctx, RESP_MEAN)
    resp_ratio = rmax / rmean.where(rmean > 0)
    tail = gen_tail_share(ctx)
    a_lim = cfg.get_float("agent_slowest_over_mean")
    r_lim = cfg.get_float("response_max_over_mean")
    t_lim = cfg.get_float("tail_share")
    t_rmin = cfg.get_float("tail_min_response_ratio")
    grown = _grown_tail(ctx, resp_ratio)
    cond: list[object] = []
    for a, r, t, g in zip(agent_ratio, resp_ratio, tail, grown, strict=True):
        known = [x for x in (a, r, t) if pd.notna(x)]
        if not known:
            cond.append(None)
            continue
        # GPUs falling idle in gen count only when the responses do differ in length: a step
        # whose longest response is near the mean has no tail to wait for (warm-up steps)
        t_hit = pd.notna(t) and t >= t_lim and (pd.isna(r) or r >= t_rmin)
        hit = (pd.notna(a) and a >= a_lim) or t_hit or bool(g)
        # the response-length ratio alone is weaker evidence: use it only without GPU data
        if pd.isna(t) and pd.notna(r) and r >= r_lim:
            hit = True
        cond.append(bool(hit))
    flags = []
    for ep, start, end, rng in step_episodes(
        ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
    ):
        sl = slice(ep.onset, ep.last + 1)
        parts = []
        if agent_ratio.iloc[sl].notna().any():
            parts.append("the slowest agent-loop generation took "
                         f"{agent_ratio.iloc[sl].mean():.1f}x"
                         " the mean")
        if tail.iloc[sl].notna().any() and tail.iloc[sl].mean() >= 0.05:
            parts.append(f"for {tail.iloc[sl].mean() * 100:.0f}% of gen only a minority of GPUs "
                         "were still busy")
        if resp_ratio.iloc[sl].notna().any():
            parts.append(f"the longest response was {resp_ratio.iloc[sl].mean():.1f}x the mean "
                         "length")
        if grown.iloc[sl].any():
            gen = W.phase(sf, "gen").astype(float)
            before = gen.iloc[:ep.onset].median() if ep.onset else float("nan")
            if pd.notna(before) and before > 0:
                parts.append(f"gen took {gen.iloc[sl].mean():.1f} s per step against "
                             f"{before:.1f} s before")
        worst_tail = float(tail.iloc[sl].mean()) if tail.iloc[sl].notna().any() else 0.0
        known = agent_ratio.iloc[sl].notna().any()
        worst_agent = float(agent_ratio.iloc[sl].mean()) if known else 0.0
        sev = "critical" if (worst_tail >= cfg.get_float("critical_tail_share")
                             or worst_agent >= cfg.get_float("critical_agent_ratio")) else "warning"
        flags.append(make_flag(
            "rollout_long_tail", sev, start, end, {"phase": "gen", "steps": rng},
            f"Rollout long tail, {steps_text(rng)}: " + "; ".join(parts) + ".",
        ))
    return flags


def detect_rollout_wait(ctx: Context) -> list[Flag]:
    """The trainer waits for rollout batches for more than the allowed time per step."""
    cfg = ctx.cfg("rollout_wait")
    sf = ctx.sf
    if len(sf) == 0 or "rollout_wait" not in sf.columns:
        return []
    wait = sf["rollout_wait"].astype(float)
    lim = cfg.get_float("max_seconds")
    cond = [None if pd.isna(w) else bool(w > lim) for w in wait]
    flags = []
    for ep, start, end, rng in step_episodes(
        ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
    ):
        m = float(wait.iloc[ep.onset:ep.last + 1].mean())
        share = m / float(sf["total"].iloc[ep.onset:ep.last + 1].mean() or np.nan)
        sev = "critical" if share >= cfg.get_float("critical_share") else "warning"
        flags.append(make_flag(
            "rollout_wait", sev, start, end, {"phase": "rollout_wait", "steps": rng},
            f"The trainer waited {m * 1000:.0f} ms per step for rollout batches "
            f"({share * 100:.1f}% of the step), {steps_text(rng)}; healthy is under "
            f"{lim * 1000:.0f} ms.",
        ))
    return flags
