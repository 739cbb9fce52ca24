"""Phase attribution: which phase each GPU sample fell in, and how busy the GPUs were per phase.

verl logs each phase's duration, not its start. ``phase_timeline`` lays the phases of a step out
in verl's order so that the last one ends at the step's end time (unexplained time, ``other``,
last); ``attribute`` joins GPU samples to those intervals, vectorised with ``merge_asof``.
"""

from __future__ import annotations

import bisect

import numpy as np
import pandas as pd

from monitor.records import PHASES, Event, StepRecord

#: Layout order: verl's phases, with the derived ``rollout_wait`` right after generation and
#: ``comm`` (the update's collectives) right after ``update_actor``; ``other`` last.
LAYOUT_ORDER: tuple[str, ...] = (
    ("gen", "rollout_wait")
    + tuple(p for p in PHASES[1:PHASES.index("update_actor") + 1])
    + ("comm",)
    + tuple(p for p in PHASES[PHASES.index("update_actor") + 1:])
    + ("other",)
)

#: Before verl 0.7.1 the weight sync runs as generation starts (inside ``timing_s/gen``).
RESHARD_FIRST_ORDER: tuple[str, ...] = ("reshard",) + tuple(
    p for p in LAYOUT_ORDER if p != "reshard"
)

#: Timers of a weight sync that runs on its own after the update (0.7.1+, async trainers).
_AFTER_UPDATE_TIMERS: tuple[str, ...] = (
    "timing_s/update_weights",
    "timing_s/sync_rollout_weights",
    "timing_s/param_sync",
)

#: Phases that a full verl log always has between gen and the updates.
_SCORING_PHASES: tuple[str, ...] = ("old_log_prob", "ref", "reward")


def _other_after_gen(order: tuple[str, ...]) -> tuple[str, ...]:
    rest = [p for p in order if p != "other"]
    at = rest.index("rollout_wait") + 1 if "rollout_wait" in rest else rest.index("gen") + 1
    return tuple(rest[:at] + ["other"] + rest[at:])


TIMELINE_COLUMNS = ["step", "phase", "start", "end"]


def reshard_after_update(rec: StepRecord) -> bool:
    """Whether this step's weight sync ran after ``update_actor`` (its own timer, 0.7.1+).

    Older releases sync as generation starts (``timing_s/reshard`` nested in gen, or derived).
    """
    return any(key in rec.metrics for key in _AFTER_UPDATE_TIMERS)
ATTRIB_COLUMNS = [
    "step",
    "phase",
    "node",
    "gpu",
    "util_mean",
    "util_p10",
    "sm_mean",
    "sm_p10",
    "samples",
]


def phase_timeline(steps: list[StepRecord], events: list[Event] | None = None) -> pd.DataFrame:
    """Each step's phases as intervals (step, phase, start, end), in verl's order.

    The phases are laid end to end so that the last ends at the step's ``end_time``; the
    weight sync (``reshard``) goes first when the release runs it as generation starts
    (before 0.7.1), after ``update_actor`` from 0.7.1 (``timing_s/update_weights``) or where a
    timestamped ``reshard`` event (``events``) puts it in the second half of the step. In logs
    that name only a few phases (the breakdown format: no reward/old_log_prob/ref), ``other``
    goes right after generation, where that unlogged work runs; otherwise it goes last. When the
    step's total exceeds the sum of its phases and the log gave no ``other``, the remainder is
    added as ``other``. Steps without an end time are skipped.
    """
    rows: list[tuple[int, str, float, float]] = []
    switch_times = sorted(
        e.time for e in (events or []) if e.kind == "reshard" and e.time is not None
        and not e.data.get("time_rebuilt")
    )
    for rec in steps:
        if rec.end_time is None:
            continue
        after = reshard_after_update(rec)
        if not after and rec.total and switch_times and "reshard" in rec.phases:
            # a logged switch (HybridEngine lines with timestamps) in the step's second half
            start = rec.end_time - rec.total
            i = bisect.bisect_left(switch_times, start)
            if i < len(switch_times) and switch_times[i] <= rec.end_time + 1e-6:
                after = switch_times[i] > start + rec.total / 2
        order = LAYOUT_ORDER if after else RESHARD_FIRST_ORDER
        if not any(name in rec.phases for name in _SCORING_PHASES):
            # a breakdown-style log (gen, critic_score, loss_comp, comm): the unlogged time is
            # mostly reward/log-prob/ref work right after generation, so lay `other` out there
            order = _other_after_gen(order)
        durs = [
            (name, float(rec.phases[name]))
            for name in order
            if rec.phases.get(name) is not None
            and np.isfinite(rec.phases[name])
            and rec.phases[name] > 0
        ]
        known = sum(d for _, d in durs)
        if rec.total is not None and "other" not in rec.phases and rec.total - known > 1e-6:
            durs.append(("other", float(rec.total) - known))
            known = float(rec.total)
        t = float(rec.end_time) - known
        for name, dur in durs:
            rows.append((int(rec.step), name, t, t + dur))
            t += dur
    df = pd.DataFrame(rows, columns=TIMELINE_COLUMNS)
    return df.sort_values(["start", "step"], kind="stable").reset_index(drop=True)


def label_samples(samples: pd.DataFrame, timeline: pd.DataFrame) -> pd.DataFrame:
    """Add ``step`` and ``phase`` to each sample (by ``ts``); outside every phase: NaN/None."""
    out = samples.copy()
    if len(out) == 0:
        out["step"] = pd.Series(dtype="float")
        out["phase"] = pd.Series(dtype="object")
        return out
    out["_order"] = np.arange(len(out))
    left = out.sort_values("ts", kind="stable")
    left = left.assign(ts=left["ts"].astype(float))
    if len(timeline) == 0:
        out["step"] = np.nan
        out["phase"] = None
        return out.drop(columns="_order")
    right = timeline.rename(columns={"start": "_pstart", "end": "_pend"}).sort_values("_pstart")
    right = right.assign(_pstart=right["_pstart"].astype(float))
    merged = pd.merge_asof(left, right, left_on="ts", right_on="_pstart", direction="backward")
    inside = merged["ts"] < merged["_pend"]
    merged["step"] = merged["step"].where(inside)
    merged["phase"] = merged["phase"].where(inside, None)
    merged = merged.sort_values("_order").drop(columns=["_order", "_pstart", "_pend"])
    return merged.reset_index(drop=True)


#: Columns ``attribute`` adds after :data:`ATTRIB_COLUMNS` (kept last for older callers):
#: ``seconds`` of sample time inside the phase, ``full_samples`` wholly inside it.
ATTRIB_EXTRA_COLUMNS = ["seconds", "full_samples"]

#: Share of a sample's interval that must lie in a phase for the sample to enter the phase's
#: percentiles (its mean weighs every sample by that share).
_P10_MIN_SHARE = 0.5


def sample_period(ts: pd.Series | np.ndarray) -> float:
    """The typical spacing of sample times (median gap between distinct times; 1 s if unknown).

    A sample at ``ts`` stands for the interval ``[ts, ts + period)``: a bucket of the run store
    or of :func:`monitor.downsample.downsample` starts at its ``ts``, and a raw sample at the
    sampling interval covers the interval up to the next one.
    """
    uniq = np.unique(np.asarray(ts, dtype=float))
    uniq = uniq[np.isfinite(uniq)]
    if len(uniq) < 2:
        return 1.0
    gap = float(np.median(np.diff(uniq)))
    return gap if gap > 0 else 1.0


def overlap_samples(samples: pd.DataFrame, timeline: pd.DataFrame,
                    sample_s: float | None = None) -> pd.DataFrame:
    """One row per (sample, phase) pair whose intervals overlap: the sample's columns plus
    ``step``, ``phase``, ``overlap_s`` (seconds of the sample interval inside the phase) and
    ``share`` (that over the sample interval, 0..1). A sample covers ``[ts, ts + sample_s)``
    (``sample_s`` defaults to :func:`sample_period`), so a phase shorter than the sampling
    interval gets a partial share of its neighbours' samples, never a whole one."""
    cols = [*samples.columns, "step", "phase", "overlap_s", "share"]
    if len(samples) == 0 or len(timeline) == 0:
        return pd.DataFrame(columns=cols)
    width = float(sample_s) if sample_s and sample_s > 0 else sample_period(samples["ts"])
    tl = timeline.sort_values("start", kind="stable").reset_index(drop=True)
    pstart = tl["start"].to_numpy(dtype=float)
    pend = tl["end"].to_numpy(dtype=float)
    reach = np.maximum.accumulate(pend)  # phases sorted by start; ends made monotonic
    a = samples["ts"].to_numpy(dtype=float)
    b = a + width
    first = np.searchsorted(reach, a, side="right")
    last = np.searchsorted(pstart, b, side="left") - 1
    count = np.clip(last - first + 1, 0, None)
    if count.sum() == 0:
        return pd.DataFrame(columns=cols)
    rows = np.repeat(np.arange(len(a)), count)
    offset = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    phase_idx = np.repeat(first, count) + offset
    lo = np.maximum(a[rows], pstart[phase_idx])
    hi = np.minimum(b[rows], pend[phase_idx])
    overlap = hi - lo
    keep = overlap > 1e-9
    rows, phase_idx, overlap = rows[keep], phase_idx[keep], overlap[keep]
    out = samples.iloc[rows].reset_index(drop=True)
    out["step"] = tl["step"].to_numpy()[phase_idx]
    out["phase"] = tl["phase"].to_numpy()[phase_idx]
    out["overlap_s"] = overlap
    out["share"] = np.minimum(overlap / width, 1.0)
    return out


def attribute(
    steps: list[StepRecord], gpu: pd.DataFrame, events: list[Event] | None = None,
    sample_s: float | None = None,
) -> pd.DataFrame:
    """Per step, phase and GPU: mean and 10th percentile of util and SM activity, sample count.

    Each sample stands for the interval ``[ts, ts + sample_s)`` (``sample_s`` defaults to the
    frame's :func:`sample_period`) and counts toward a phase by the share of that interval that
    lies inside the phase, not by its instant: the means and percentiles use the samples wholly
    inside the phase (where there are none, the samples touching it weighed by that share). Columns: :data:`ATTRIB_COLUMNS`
    (``samples`` counts every sample touching the phase) then ``seconds`` (sample time inside
    the phase) and ``full_samples`` (samples wholly inside it: how far to trust the figure).
    ``events`` (optional) place a timestamped weight sync, as in ``phase_timeline``.
    """
    columns = ATTRIB_COLUMNS + ATTRIB_EXTRA_COLUMNS
    if gpu is None or len(gpu) == 0:
        return pd.DataFrame(columns=columns)
    cols = ["ts", "node", "gpu", "util", "sm_active"]
    samples = gpu[[c for c in cols if c in gpu.columns]].copy()
    if "sm_active" not in samples.columns:
        samples["sm_active"] = np.nan
    samples["node"] = samples["node"].astype(str)
    samples["ts"] = samples["ts"].astype(float)
    pairs = overlap_samples(samples, phase_timeline(steps, events), sample_s)
    if len(pairs) == 0:
        return pd.DataFrame(columns=columns)
    pairs = pairs.assign(step=pairs["step"].astype(int), gpu=pairs["gpu"].astype(int))
    w = pairs["share"].astype(float)
    for c in ("util", "sm_active"):
        val = pairs[c].astype(float)
        pairs[c + "_w"] = (val * w).where(val.notna())
        pairs[c + "_n"] = w.where(val.notna(), 0.0)
    pairs["full"] = (w >= 1.0 - 1e-6).astype(int)
    keys = ["step", "phase", "node", "gpu"]
    grouped = pairs.groupby(keys, sort=False)
    out = grouped.agg(
        util_w=("util_w", "sum"), util_n=("util_n", "sum"),
        sm_w=("sm_active_w", "sum"), sm_n=("sm_active_n", "sum"),
        samples=("ts", "size"), seconds=("overlap_s", "sum"), full_samples=("full", "sum"),
    )
    # samples wholly inside the phase measure it alone; where there are none, the samples
    # touching it weigh by their share (and phase_summary withholds the figure)
    full = pairs[pairs["full"] == 1].groupby(keys, sort=False)
    pure = full[["util", "sm_active"]].mean()
    mixed_util = out["util_w"] / out["util_n"].where(out["util_n"] > 0)
    mixed_sm = out["sm_w"] / out["sm_n"].where(out["sm_n"] > 0)
    out["util_mean"] = pure["util"].reindex(out.index).fillna(mixed_util)
    out["sm_mean"] = pure["sm_active"].reindex(out.index).fillna(mixed_sm)
    mostly = pairs[w >= _P10_MIN_SHARE]
    q_full = full[["util", "sm_active"]].quantile(0.1)
    q_mostly = mostly.groupby(keys, sort=False)[["util", "sm_active"]].quantile(0.1)
    out["util_p10"] = q_full["util"].reindex(out.index).fillna(
        q_mostly["util"].reindex(out.index))
    out["sm_p10"] = q_full["sm_active"].reindex(out.index).fillna(
        q_mostly["sm_active"].reindex(out.index))
    out = out.reset_index()
    return out[columns].sort_values(["step", "node", "gpu"], kind="stable").reset_index(
        drop=True
    )


#: Samples wholly inside a phase (summed over the steps) below which ``phase_summary``
#: withholds the phase's figures (the default of its ``min_samples``).
DEFAULT_MIN_PHASE_SAMPLES = 3


def phase_summary(attrib: pd.DataFrame, min_samples: int | None = None) -> pd.DataFrame:
    """Per phase and GPU, averaged over steps (weighted by samples wholly inside the phase, else
    by sample time): util and SM activity.

    Columns: phase, node, gpu, util_mean, sm_mean, util_p10, sm_p10, steps, samples, then
    ``full_samples`` (samples wholly inside the phase), ``seconds`` and ``withheld``: the reason
    the figures are left out (NaN) when fewer than ``min_samples`` samples lie wholly inside the
    phase (default ``dashboard.phase_min_samples`` of ``monitor/defaults.yaml``), else "".
    """
    cols = ["phase", "node", "gpu", "util_mean", "sm_mean", "util_p10", "sm_p10", "steps",
            "samples", "full_samples", "seconds", "withheld"]
    if attrib is None or len(attrib) == 0:
        return pd.DataFrame(columns=cols)
    if min_samples is None:
        min_samples = default_min_phase_samples()
    df = attrib.copy()
    if "full_samples" in df.columns:
        full = df["full_samples"].astype(float)
        secs = df["seconds"] if "seconds" in df.columns else df["samples"]
        w = full.where(full > 0, secs.astype(float) * 1e-6)
    else:  # rows from an older attribute(): weigh by sample count
        w = df["samples"].astype(float)
    if "full_samples" not in df.columns:
        df["full_samples"] = df["samples"]
    if "seconds" not in df.columns:
        df["seconds"] = np.nan
    for c in ("util_mean", "sm_mean", "util_p10", "sm_p10"):
        df[c + "_w"] = df[c] * w
        df[c + "_n"] = w.where(df[c].notna(), 0.0)
    g = df.groupby(["phase", "node", "gpu"], sort=False)
    out = pd.DataFrame({"steps": g["step"].nunique(), "samples": g["samples"].sum(),
                        "full_samples": g["full_samples"].sum(),
                        "seconds": g["seconds"].sum(min_count=1)})
    for c in ("util_mean", "sm_mean", "util_p10", "sm_p10"):
        num = g[c + "_w"].sum(min_count=1)
        den = g[c + "_n"].sum()
        out[c] = (num / den.where(den > 0)).astype(float)
    out = out.reset_index()
    short = out["full_samples"] < min_samples
    out["withheld"] = np.where(
        short,
        [f"{int(n)} sample(s) wholly inside the phase, fewer than {min_samples}: the phase is "
         "shorter than the sampling interval" for n in out["full_samples"]],
        "",
    )
    for c in ("util_mean", "sm_mean", "util_p10", "sm_p10"):
        out.loc[short, c] = np.nan
    order = {p: i for i, p in enumerate(LAYOUT_ORDER)}
    out["_o"] = out["phase"].map(order).fillna(len(order))
    out = out.sort_values(["_o", "node", "gpu"], kind="stable").drop(columns="_o")
    return out[cols].reset_index(drop=True)


def default_min_phase_samples() -> int:
    """``dashboard.phase_min_samples`` from the default config (3 when the key is absent)."""
    from monitor.config import load_config

    try:
        return load_config().get_int("dashboard.phase_min_samples", DEFAULT_MIN_PHASE_SAMPLES)
    except (KeyError, ValueError, TypeError):
        return DEFAULT_MIN_PHASE_SAMPLES
