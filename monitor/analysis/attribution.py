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


def attribute(
    steps: list[StepRecord], gpu: pd.DataFrame, events: list[Event] | None = None
) -> pd.DataFrame:
    """Per step, phase and GPU: mean and 10th percentile of util and SM activity, sample count.

    ``events`` (optional) place a timestamped weight sync, as in ``phase_timeline``.
    """
    if gpu is None or len(gpu) == 0:
        return pd.DataFrame(columns=ATTRIB_COLUMNS)
    cols = ["ts", "node", "gpu", "util", "sm_active"]
    samples = gpu[[c for c in cols if c in gpu.columns]].copy()
    if "sm_active" not in samples.columns:
        samples["sm_active"] = np.nan
    samples["node"] = samples["node"].astype(str)
    labelled = label_samples(samples, phase_timeline(steps, events))
    labelled = labelled[labelled["phase"].notna()]
    if len(labelled) == 0:
        return pd.DataFrame(columns=ATTRIB_COLUMNS)
    labelled = labelled.assign(step=labelled["step"].astype(int), gpu=labelled["gpu"].astype(int))
    grouped = labelled.groupby(["step", "phase", "node", "gpu"], sort=False)
    out = grouped.agg(
        util_mean=("util", "mean"),
        sm_mean=("sm_active", "mean"),
        samples=("ts", "size"),
    )
    quant = grouped[["util", "sm_active"]].quantile(0.1)
    out["util_p10"] = quant["util"]
    out["sm_p10"] = quant["sm_active"]
    out = out.reset_index()
    return out[ATTRIB_COLUMNS].sort_values(["step", "node", "gpu"], kind="stable").reset_index(
        drop=True
    )


def phase_summary(attrib: pd.DataFrame) -> pd.DataFrame:
    """Per phase and GPU, averaged over steps (weighted by samples): util and SM activity.

    Columns: phase, node, gpu, util_mean, sm_mean, util_p10, sm_p10, steps, samples.
    """
    cols = ["phase", "node", "gpu", "util_mean", "sm_mean", "util_p10", "sm_p10", "steps",
            "samples"]
    if attrib is None or len(attrib) == 0:
        return pd.DataFrame(columns=cols)
    df = attrib.copy()
    w = df["samples"].astype(float)
    for c in ("util_mean", "sm_mean", "util_p10", "sm_p10"):
        df[c + "_w"] = df[c] * w
        df[c + "_n"] = w.where(df[c].notna(), 0.0)
    g = df.groupby(["phase", "node", "gpu"], sort=False)
    out = pd.DataFrame({"steps": g["step"].nunique(), "samples": g["samples"].sum()})
    for c in ("util_mean", "sm_mean", "util_p10", "sm_p10"):
        num = g[c + "_w"].sum(min_count=1)
        den = g[c + "_n"].sum()
        out[c] = (num / den.where(den > 0)).astype(float)
    out = out.reset_index()
    order = {p: i for i, p in enumerate(LAYOUT_ORDER)}
    out["_o"] = out["phase"].map(order).fillna(len(order))
    out = out.sort_values(["_o", "node", "gpu"], kind="stable").drop(columns="_o")
    return out[cols].reset_index(drop=True)
