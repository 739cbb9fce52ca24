"""Detectors for today's verl trainers, from the log: split GPU pools, staleness, weight-sync
pauses and the agent loop (``pool_imbalance``, ``stale_samples``, ``weight_sync_pause``,
``agent_loop_overhead``).

All four read the raw keys of each step (docs/verl_modes.md). The fully-async trainer prints
its rollouter's statistics on a line of their own with the same step number; the lines of one
step number are read together (:func:`step_table`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from monitor.detect.detector_base import Context, make_flag, steps_text
from monitor.detect.flag_advice import pool_advice
from monitor.detect.persistence import episodes
from monitor.logs.keys import async_value, timers
from monitor.logs.modes import run_mode, trainer_mode, waits_in_gen
from monitor.records import Flag

#: Columns of :func:`step_table` besides step/end/total/mode.
_VALUES = ("gen", "trainer_idle", "rollouter_idle", "generate_async", "sync_s", "evicted",
           "failed", "dropped_total", "staleness", "partial_ratio", "tool_mean", "score_mean",
           "generate_mean", "slowest_tool", "slowest_score", "slowest_generate")
_SYNC_TIMERS = ("param_sync", "update_weights", "sync_rollout_weights")


def _f(metrics: dict[str, Any], key: str) -> float:
    v = metrics.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return np.nan
    v = float(v)
    return v if np.isfinite(v) else np.nan


def _row(metrics: dict[str, Any]) -> dict[str, float]:
    """The per-step values the four detectors judge, from one step's merged metrics."""
    t = timers(metrics)
    # the standalone rollout pauses for these; V1's hybrid switches only move trainer GPUs
    sync = next((t[n] for n in _SYNC_TIMERS if n in t), np.nan)
    evicted = _f(metrics, "training/off_policy/evicted_samples")
    idle = async_value(metrics, "fully_async/trainer/idle_ratio")
    ro_idle = async_value(metrics, "fully_async/rollouter/idle_ratio")
    return {
        "gen": t.get("gen", np.nan),
        "trainer_idle": np.nan if idle is None else idle,
        "rollouter_idle": np.nan if ro_idle is None else ro_idle,
        "generate_async": t.get("generate_async", np.nan),
        "sync_s": sync,
        "evicted": evicted,
        "failed": _f(metrics, "training/rollout_failure/evicted_samples"),
        "dropped_total": _nan(async_value(metrics, "fully_async/count/dropped_stale_samples")),
        "staleness": _f(metrics, "training/off_policy/trajectory_staleness/mean"),
        "partial_ratio": _nan(async_value(metrics, "fully_async/partial/partial_ratio")),
        "tool_mean": t.get("agent_loop/tool_calls/mean", np.nan),
        "score_mean": t.get("agent_loop/compute_score/mean", np.nan),
        "generate_mean": t.get("agent_loop/generate_sequences/mean", np.nan),
        "slowest_tool": t.get("agent_loop/slowest/tool_calls", np.nan),
        "slowest_score": t.get("agent_loop/slowest/compute_score", np.nan),
        "slowest_generate": t.get("agent_loop/slowest/generate_sequences", np.nan),
    }


def _nan(v: float | None) -> float:
    return np.nan if v is None else float(v)


def step_table(ctx: Context) -> pd.DataFrame:
    """One row per step number (lines of one step number merged, in log order): ``step``,
    ``end`` (the latest line's time), ``total`` (the step's timer), ``mode`` and the values of
    :data:`_VALUES`. Steps without a time are left out. Cached on the context."""
    cached = ctx.cache.get("async_pools.steps")
    if cached is not None:
        return cached
    merged: dict[int, dict[str, Any]] = {}
    ends: dict[int, float] = {}
    totals: dict[int, float] = {}
    order: list[int] = []
    for rec in ctx.steps:
        if rec.end_time is None:
            continue
        step = int(rec.step)
        if step not in merged:
            merged[step] = {}
            order.append(step)
        merged[step].update(rec.metrics)
        ends[step] = max(ends.get(step, -np.inf), float(rec.end_time))
        if rec.total is not None:
            totals[step] = float(rec.total)
    rows = []
    for step in order:
        m = merged[step]
        rows.append({"step": step, "end": ends[step], "total": totals.get(step, np.nan),
                     "mode": trainer_mode(m), **_row(m)})
    cols = ["step", "end", "total", "mode", *_VALUES]
    df = pd.DataFrame(rows, columns=cols).sort_values("end", kind="stable").reset_index(drop=True)
    ctx.cache["async_pools.steps"] = df
    return df


def ctx_mode(ctx: Context) -> str:
    """The trainer mode of the context's steps, the printed config deciding where the keys
    cannot (``judge_mode``; cached)."""
    mode = ctx.cache.get("async_pools.mode")
    if mode is None:
        mode = run_mode(ctx.steps, ctx.printed_mode)
        ctx.cache["async_pools.mode"] = mode
    return mode


def _episodes(df: pd.DataFrame, cond: list[object], cfg: Any) -> list[tuple[Any, float,
                                                                             float | None,
                                                                             list[int]]]:
    ends = df["end"].to_numpy(float)
    steps = df["step"].to_numpy()
    out = []
    for ep in episodes(cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")):
        end = None if ep.closed is None else float(ends[ep.last])
        out.append((ep, float(ends[ep.opened]), end, [int(steps[ep.onset]), int(steps[ep.last])]))
    return out


def _mean(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.mean()) if len(s) else float("nan")


# --- pool_imbalance ----------------------------------------------------------------------------


def trainer_wait_share(df: pd.DataFrame) -> pd.Series:
    """Per step, the share of the trainer's step spent waiting for samples: verl's
    ``fully_async/trainer/idle_ratio`` where printed, else ``gen / step`` in the modes whose
    gen is a wait (NaN in the others)."""
    share = df["gen"] / df["total"].where(df["total"] > 0)
    share = share.where(df["mode"].map(waits_in_gen).astype(bool))
    return df["trainer_idle"].where(df["trainer_idle"].notna(), share)


def rollouter_idle_share(df: pd.DataFrame) -> pd.Series:
    """Per step, the share of time the rollout pool sat idle waiting for weights: verl's
    ``fully_async/rollouter/idle_ratio``, or in one-step-off ``1 - generate_async / step``."""
    one = 1.0 - df["generate_async"] / df["total"].where(df["total"] > 0)
    one = one.clip(lower=0.0).where(df["mode"] == "one_step_off")
    return df["rollouter_idle"].where(df["rollouter_idle"].notna(), one)


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: the split-pool and server-mode keys they read say the trainer is one.
PREMISES: dict[str, tuple[str, ...]] = {
    "pool_imbalance": (),
    "stale_samples": (),
    "weight_sync_pause": (),
    "agent_loop_overhead": (),
}


def detect_pool_imbalance(ctx: Context) -> list[Flag]:
    """A split-pool trainer whose trainer waits for samples (the rollout pool is the
    bottleneck), or whose rollout pool sits idle waiting for weights (the trainer is)."""
    cfg = ctx.cfg("pool_imbalance")
    df = step_table(ctx)
    if len(df) == 0:
        return []
    mode = ctx_mode(ctx)
    wait = trainer_wait_share(df)
    ro_idle = rollouter_idle_share(df)
    flags: list[Flag] = []
    wait_min = cfg.get_float("trainer_wait_share")
    trainer_cond = [None if pd.isna(w) else bool(w >= wait_min) for w in wait]
    for ep, start, end, rng in _episodes(df, trainer_cond, cfg):
        sl = slice(ep.onset, ep.last + 1)
        share = _mean(wait.iloc[sl])
        gen = _mean(df["gen"].iloc[sl])
        total = _mean(df["total"].iloc[sl])
        parts = [f"The trainer waited for samples from the rollout pool {share * 100:.0f}% of "
                 f"its time, {steps_text(rng)} (timing_s/gen {gen:.1f} s of {total:.1f} s"]
        if df["trainer_idle"].iloc[sl].notna().any():
            parts[0] += f"; fully_async/trainer/idle_ratio {share:.2f}"
        parts[0] += ")"
        ro = _mean(ro_idle.iloc[sl])
        if not np.isnan(ro):
            parts.append(f"the rollouter was idle only {ro * 100:.0f}% of the time "
                         "(fully_async/rollouter/idle_ratio)")
        parts.append("the rollout pool is the bottleneck: the trainer's GPUs idle for want of "
                     "samples, not for small micro-batches")
        sev = "critical" if share >= cfg.get_float("critical_share") else "warning"
        flag = make_flag("pool_imbalance", sev, start, end,
                         {"phase": "gen", "steps": rng, "pool": "rollout"},
                         "; ".join(parts) + ".")
        flag.advice = pool_advice("trainer_waits", mode)
        flags.append(flag)
    idle_min = cfg.get_float("rollouter_idle_share")
    ro_cond = [None if pd.isna(r) else bool(r >= idle_min and not (pd.notna(w) and w >= wait_min))
               for r, w in zip(ro_idle, wait, strict=True)]
    for ep, start, end, rng in _episodes(df, ro_cond, cfg):
        sl = slice(ep.onset, ep.last + 1)
        idle = _mean(ro_idle.iloc[sl])
        w = _mean(wait.iloc[sl])
        source = ("fully_async/rollouter/idle_ratio" if df["rollouter_idle"].iloc[sl].notna().any()
                  else "1 - timing_s/generate_async / timing_s/step")
        text = (f"The rollout pool sat idle waiting for new weights {idle * 100:.0f}% of the "
                f"time, {steps_text(rng)} ({source} {idle:.2f})")
        if not np.isnan(w):
            text += f", while the trainer waited for samples only {w * 100:.0f}% of its steps"
        text += "; the trainer pool is the bottleneck."
        sev = "critical" if idle >= cfg.get_float("critical_share") else "warning"
        flag = make_flag("pool_imbalance", sev, start, end,
                         {"steps": rng, "pool": "trainer"}, text)
        flag.advice = pool_advice("rollouter_waits", mode)
        flags.append(flag)
    return flags


# --- stale_samples -----------------------------------------------------------------------------


def detect_stale_samples(ctx: Context) -> list[Flag]:
    """Samples trained too many versions old, or evicted / dropped (stale or failed)."""
    cfg = ctx.cfg("stale_samples")
    df = step_table(ctx)
    if len(df) == 0:
        return []
    dropped = df["dropped_total"].diff().clip(lower=0.0)
    thrown = pd.concat([df["evicted"], df["failed"], dropped], axis=1).sum(axis=1, min_count=1)
    stale = df["staleness"]
    have = thrown.notna() | stale.notna()
    if not have.any():
        return []
    lim_thrown = cfg.get_float("evicted_per_step")
    lim_stale = cfg.get_float("staleness_versions")
    cond = [None if not h else bool((pd.notna(t) and t >= lim_thrown)
                                    or (pd.notna(s) and s >= lim_stale))
            for h, t, s in zip(have, thrown, stale, strict=True)]
    flags = []
    for ep, start, end, rng in _episodes(df, cond, cfg):
        sl = slice(ep.onset, ep.last + 1)
        parts = []
        ev = df["evicted"].iloc[sl].sum(min_count=1)
        fa = df["failed"].iloc[sl].sum(min_count=1)
        dr = dropped.iloc[sl].sum(min_count=1)
        if pd.notna(ev) and ev > 0:
            parts.append(f"{ev:.0f} prompt groups evicted as too stale "
                         "(training/off_policy/evicted_samples)")
        if pd.notna(fa) and fa > 0:
            parts.append(f"{fa:.0f} evicted after failed rollouts "
                         "(training/rollout_failure/evicted_samples)")
        if pd.notna(dr) and dr > 0:
            parts.append(f"{dr:.0f} samples dropped by the rollouter as stale "
                         "(fully_async/count/dropped_stale_samples)")
        st = _mean(stale.iloc[sl])
        if not np.isnan(st):
            parts.append(f"trained trajectories lagged the policy by {st:.1f} versions on "
                         "average (training/off_policy/trajectory_staleness/mean)")
        per_step = _mean(thrown.iloc[sl])
        sev = "critical" if ((not np.isnan(per_step)
                              and per_step >= cfg.get_float("critical_evicted_per_step"))
                             or (not np.isnan(st)
                                 and st >= cfg.get_float("critical_staleness_versions"))
                             ) else "warning"
        flags.append(make_flag("stale_samples", sev, start, end, {"steps": rng},
                               f"Stale samples, {steps_text(rng)}: " + "; ".join(parts) + "."))
    return flags


# --- weight_sync_pause -------------------------------------------------------------------------


def detect_weight_sync_pause(ctx: Context) -> list[Flag]:
    """A weight sync that pauses generation for a long share of the step (server-mode and
    split-pool trainers: ``param_sync``, ``update_weights``, ``sync_rollout_weights``,
    V1's switches; the ``[ParameterSynchronizer] ... pause:P s`` line where printed)."""
    cfg = ctx.cfg("weight_sync_pause")
    df = step_table(ctx)
    if len(df) == 0:
        return []
    if not waits_in_gen(ctx_mode(ctx)):
        # colocated rollout (legacy or server mode behind the agent loop): the engines sleep
        # while the trainer syncs, no request is paused, and the sync is the reshard
        # (reshard_spike); only split pools keep generating across a sync
        return []
    pauses = _pause_seconds(ctx, df)
    sync = df["sync_s"].where(df["sync_s"].notna(), pauses)
    pause = pauses.where(pauses.notna(), sync)
    share = pause / df["total"].where(df["total"] > 0)
    min_s = cfg.get_float("min_seconds")
    lim = cfg.get_float("pause_share")
    cond = [None if pd.isna(p) or pd.isna(s) else bool(p >= min_s and s >= lim)
            for p, s in zip(pause, share, strict=True)]
    flags = []
    for ep, start, end, rng in _episodes(df, cond, cfg):
        sl = slice(ep.onset, ep.last + 1)
        p, s = _mean(pause.iloc[sl]), _mean(share.iloc[sl])
        what = ("the [ParameterSynchronizer] pause" if pauses.iloc[sl].notna().any()
                else "the weight sync (" + _sync_key(ctx) + ")")
        sev = "critical" if s >= cfg.get_float("critical_share") else "warning"
        flags.append(make_flag(
            "weight_sync_pause", sev, start, end, {"phase": "reshard", "steps": rng},
            f"Generation paused {p:.1f} s per step for {what}, {s * 100:.0f}% of the step, "
            f"{steps_text(rng)}.",
        ))
    return flags


def _sync_key(ctx: Context) -> str:
    keys: set[str] = set()
    for rec in ctx.steps[-5:]:
        keys.update(rec.metrics)
    for name in ("timing_s/timing_s/param_sync", "timing_s/param_sync", "timing_s/update_weights",
                 "timing_s/sync_rollout_weights", "timing_s/switch_to_rollout"):
        if name in keys:
            return name
    return "timing_s/update_weights"


def _pause_seconds(ctx: Context, df: pd.DataFrame) -> pd.Series:
    """Seconds of the ``[ParameterSynchronizer]`` pause logged before each step line."""
    out = pd.Series(np.nan, index=df.index)
    evs = sorted((e for e in ctx.events if e.kind == "reshard" and e.time is not None
                  and isinstance(e.data.get("pause_s"), (int, float))), key=lambda e: e.time)
    if not evs:
        return out
    ends = df["end"].to_numpy(float)
    for e in evs:
        i = int(np.searchsorted(ends, float(e.time), side="left"))
        if i < len(out):
            prev = out.iloc[i]
            out.iloc[i] = float(e.data["pause_s"]) + (0.0 if pd.isna(prev) else prev)
    return out


# --- agent_loop_overhead -----------------------------------------------------------------------


def detect_agent_loop_overhead(ctx: Context) -> list[Flag]:
    """Tool calls or ``compute_score`` take most of the agent loop's time per sample."""
    cfg = ctx.cfg("agent_loop_overhead")
    df = step_table(ctx)
    if len(df) == 0 or df["generate_mean"].isna().all():
        return []
    extra = df[["tool_mean", "score_mean"]].sum(axis=1, min_count=1)
    whole = extra + df["generate_mean"]
    share = extra / whole.where(whole > 0)
    s_extra = df[["slowest_tool", "slowest_score"]].sum(axis=1, min_count=1)
    s_whole = s_extra + df["slowest_generate"]
    s_share = s_extra / s_whole.where(s_whole > 0)
    lim = cfg.get_float("overhead_share")
    min_s = cfg.get_float("min_seconds")
    cond = [None if pd.isna(s) else bool(s >= lim and (pd.notna(x) and x >= min_s))
            for s, x in zip(share, extra, strict=True)]
    flags = []
    for ep, start, end, rng in _episodes(df, cond, cfg):
        sl = slice(ep.onset, ep.last + 1)
        tool, score = _mean(df["tool_mean"].iloc[sl]), _mean(df["score_mean"].iloc[sl])
        gen = _mean(df["generate_mean"].iloc[sl])
        sh = _mean(share.iloc[sl])
        main = "tool calls" if (np.nan_to_num(tool) >= np.nan_to_num(score)) else "compute_score"
        text = (f"The agent loop spent {sh * 100:.0f}% of a sample's time outside generation, "
                f"mostly in {main}, {steps_text(rng)}: per sample {tool:.1f} s in tool calls and "
                f"{score:.1f} s in compute_score against {gen:.1f} s generating "
                "(timing_s/agent_loop/*/mean)")
        ss = _mean(s_share.iloc[sl])
        if not np.isnan(ss):
            text += f"; the slowest sample spent {ss * 100:.0f}% so (timing_s/agent_loop/slowest/*)"
        sev = "critical" if sh >= cfg.get_float("critical_share") else "warning"
        flags.append(make_flag("agent_loop_overhead", sev, start, end,
                               {"phase": "gen", "steps": rng}, text + "."))
    return flags
