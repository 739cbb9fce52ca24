"""Health detectors: memory_pressure, oom, gpu_fault, stalled."""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.detect.detector_base import (
    Context,
    EventTime,
    TimedEvent,
    episode_times,
    group_by_time,
    make_flag,
    steps_text,
    window_steps,
)
from monitor.detect.flag_advice import oom_advice
from monitor.detect.persistence import episodes
from monitor.records import TRAINING_PHASES, Event, Flag, StepRecord

#: What each reading needs of the job (``monitor.detect.premises``): a silence between two
#: steps is measured only where a clock dates the step ends; a silence still going at the end
#: of the evidence is a stall only while the run has not finished.
PREMISES: dict[str, tuple[str, ...]] = {
    "memory_pressure": (),
    "oom": (),
    "gpu_fault": (),
    "stalled": (),
    "stalled.silence": ("measured_clock",),
    "stalled.trailing": ("run_not_finished",),
}
GIB = 1024**3

#: NVML clock-event bits that mean the GPU is being slowed by heat or power (not the SW power cap).
THROTTLE_BITS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                 0x40: "hardware thermal slowdown", 0x80: "power brake"}
THROTTLE_WORDS = ("hw_slowdown", "thermal", "power_brake", "hw_power")


def detect_memory_pressure(ctx: Context) -> list[Flag]:
    """GPU memory near capacity, or verl's reserved peak near it, for several windows."""
    cfg = ctx.cfg("memory_pressure")
    win = ctx.windows
    nwin = len(win)
    if nwin == 0:
        return []
    lim = cfg.get_float("used_fraction")
    frac_gpu = pd.Series(np.nan, index=range(nwin), dtype=float)
    worst_gpu: dict[int, list[int]] = {}
    df = ctx.act_windowed
    capacity = cfg.get_float("capacity_bytes", 0.0)
    if len(df) and df["mem_total_bytes"].notna().any():
        sub = df[(df["win"] >= 0) & df["mem_total_bytes"].gt(0)]
        if cfg.get_bool("training_phases_only") and sub["phase"].notna().any():
            # the rollout engine preallocates its KV cache by design
            # (actor_rollout_ref.rollout.gpu_memory_utilization): pressure is judged where the
            # trainer works; samples outside any step (after the log stops) still count
            sub = sub[sub["phase"].isin(TRAINING_PHASES) | sub["step"].isna()]
        sub = sub.assign(frac=sub["mem_used_bytes"] / sub["mem_total_bytes"])
        q = cfg.get_float("quantile")
        per = sub.groupby(["win", "node", "gpu"])["frac"].quantile(q)
        frac_gpu = per.groupby(level="win").max().reindex(range(nwin))
        hot = per[per >= lim].reset_index()
        for w, g in hot.groupby("win"):
            worst_gpu[int(w)] = sorted(g["gpu"].astype(int).unique().tolist())
        if not capacity:
            capacity = float(df["mem_total_bytes"].median())
    frac_step = pd.Series(np.nan, index=range(nwin), dtype=float)
    sf = ctx.sf
    if capacity and len(sf) and sf["mem_reserved"].notna().any():
        res = dict(zip(sf["step"].astype(int), sf["mem_reserved"] / capacity, strict=True))
        frac_step = win["step"].map(lambda s: res.get(int(s), np.nan) if pd.notna(s) else np.nan)
        frac_step = frac_step.astype(float).reset_index(drop=True)
    both = pd.concat([frac_gpu.rename("g"), frac_step.rename("s")], axis=1).max(axis=1)
    cond = [None if pd.isna(v) else bool(v >= lim) for v in both]
    starts = win["start"].to_numpy(float)
    ends = win["end"].to_numpy(float)
    flags = []
    for ep in episodes(cond, ctx.windows_for(cfg.get_float("open_after_s")),
                       ctx.windows_for(cfg.get_float("close_after_s"))):
        start, end = episode_times(ep, starts, ends)
        sl = slice(ep.onset, ep.last + 1)
        peak = float(both.iloc[sl].max())
        gpus = sorted({g for w in range(ep.onset, ep.last + 1) for g in worst_gpu.get(w, [])})
        rng = window_steps(ctx, ep.onset, ep.last)
        parts = []
        if frac_gpu.iloc[sl].notna().any() and float(frac_gpu.iloc[sl].max()) >= lim:
            who = "GPU " + ",".join(map(str, gpus[:8])) if gpus else "GPU memory"
            parts.append(f"{who} used up to {float(frac_gpu.iloc[sl].max()) * 100:.0f}% of "
                         "capacity")
        if frac_step.iloc[sl].notna().any() and float(frac_step.iloc[sl].max()) >= lim:
            peak_res = float(frac_step.iloc[sl].max()) * 100
            parts.append(f"verl's reserved peak reached {peak_res:.0f}%"
                         f" of {capacity / GIB:.0f} GiB")
        sev = "critical" if peak >= cfg.get_float("critical_fraction") else "warning"
        flags.append(make_flag(
            "memory_pressure", sev, start, end, {"gpus": gpus[:16], "steps": rng},
            _cap("; ".join(parts)) + (f", {steps_text(rng)}" if rng else "")
            + ": out-of-memory risk.",
        ))
    return flags


def event_time(ctx: Context, event: object) -> EventTime:
    """An event's time, or ``ctx.now`` (the end of the data) when the log gave none;
    ``known`` is False then, and also when the parser placed it at the log's end."""
    t = getattr(event, "time", None)
    data = getattr(event, "data", {}) or {}
    if t is None:
        return EventTime(float(ctx.now), False)
    return EventTime(float(t), data.get("time_from") != "log_end")


def timed_events(ctx: Context, events: list[Event]) -> list[TimedEvent]:
    """Each event with its time (see ``event_time``)."""
    return [TimedEvent(*event_time(ctx, e), e) for e in events]


def untimed_note(ctx: Context, events: list) -> str:
    """What the evidence says about events the log gave no time ("" when all have one)."""
    if all(getattr(e, "time", None) is not None
           and (getattr(e, "data", {}) or {}).get("time_from") != "log_end" for e in events):
        return ""
    if any(getattr(e, "time", None) is None for e in events):
        where = "at time 0" if ctx.now == 0 else "at the end of the data"
    else:
        where = "at the end of the log"
    return f"; the log gives no time for it, so it is placed {where}"


def _gib(value: object) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return f"{value * 1024:.0f} MiB" if value < 1 else f"{value:.2f} GiB"


def oom_sizes(data: dict) -> str:
    """"asked for 13.91 GiB with 8.85 GiB free of 79.1 GiB on GPU 0" from an oom event's data
    (only the parts the message gave; empty when it gave none)."""
    parts = []
    tried = _gib(data.get("tried_gib"))
    if tried:
        parts.append(f"asked for {tried}")
    free = _gib(data.get("free_gib"))
    total = _gib(data.get("total_gib"))
    if free:
        parts.append(f"with {free} free" + (f" of {total}" if total else ""))
    if data.get("gpu") is not None:
        parts.append(f"on GPU {data['gpu']}")
    if data.get("allocated_gib") is not None:
        parts.append(f"({_gib(data['allocated_gib'])} held by PyTorch)")
    return " ".join(parts)


def detect_oom(ctx: Context) -> list[Flag]:
    """CUDA out-of-memory errors anywhere in the log, with or without times; closed once a
    later step completes. Evidence quotes what was asked and what was free, and the phase the
    traceback names; the advice fits that phase."""
    cfg = ctx.cfg("oom")
    group_s = cfg.get_float("group_seconds")
    timed = timed_events(ctx, [e for e in ctx.events if e.kind == "oom"])
    ends = ctx.sf["end"].to_numpy(float) if len(ctx.sf) else np.array([])
    flags: list[Flag] = []
    for grp in group_by_time(timed, group_s):
        t0 = grp[0].time
        later = ends[ends > grp[-1].time]
        end = float(later[0]) if len(later) and all(it.known for it in grp) else None
        events = [it.event for it in grp]
        stepnos = [e.step for e in events if e.step is not None]
        rng = [min(stepnos), max(stepnos)] if stepnos else None
        first = next((e for e in events if e.data.get("tried_gib") is not None), events[0])
        named = next((e for e in events if e.data.get("phase")), None)
        phase = named.data["phase"] if named else None
        msg = (first.message or "CUDA out of memory").strip().splitlines()[0][:160]
        sizes = oom_sizes(first.data)
        where = (f" in {named.data.get('function') or phase} (phase {phase})" if named else "")
        flag = make_flag(
            "oom", "critical", t0, end, {"steps": rng, "phase": phase},
            f"{len(grp)} CUDA out-of-memory error(s) in the log{where}"
            + (f" after {steps_text(rng)}" if rng else "")
            + (f": {sizes}" if sizes else f": {msg}")
            + ("" if end is None else "; training continued afterwards")
            + untimed_note(ctx, events) + ".",
        )
        flag.advice = oom_advice(phase, first.data)
        flags.append(flag)
    return flags


def _xid_counts(col: pd.Series) -> tuple[pd.Series, list[list[int]]]:
    """Cumulative XID count per sample and the codes seen, from a number or {code: count} dict.

    A plain number is read as the last XID code reported (0 or NaN: none): each change to a
    new non-zero code counts as one more error.
    """
    values = col.tolist()
    if any(isinstance(v, dict) for v in values):
        counts = [float(sum(float(x) for x in v.values())) if isinstance(v, dict) else np.nan
                  for v in values]
        codes = [sorted(int(k) for k, x in v.items() if x) if isinstance(v, dict) else []
                 for v in values]
        return pd.Series(counts, index=col.index, dtype=float).ffill().fillna(0.0), codes
    code = pd.to_numeric(col, errors="coerce")
    active = code.where(code > 0)
    new = active.notna() & (active != active.shift(1))
    codes = [[int(c)] if pd.notna(c) else [] for c in active]
    return new.astype(float).cumsum(), codes


def _throttled(value: object) -> str | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, dict):
        active = [str(k) for k, on in value.items() if on]
        hits = [k for k in active if any(w in k.lower() for w in THROTTLE_WORDS)]
        return ", ".join(hits) if hits else None
    if isinstance(value, (int, float, np.integer, np.floating)):
        bits = int(value)
        names = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
        return ", ".join(names) if names else None
    text = str(value).lower()
    hits = [w for w in THROTTLE_WORDS if w in text]
    return text if hits else None


def detect_gpu_fault(ctx: Context) -> list[Flag]:
    """XID errors, a GPU down or gone silent, hardware thermal/power throttling."""
    cfg = ctx.cfg("gpu_fault")
    gpu = ctx.gpu
    if gpu is None or len(gpu) == 0:
        return []
    gpu = gpu.sort_values("ts", kind="stable")
    flags: list[Flag] = []
    hold = cfg.get_float("xid_hold_seconds")
    interval = ctx.sample_interval
    open_n = max(1, int(np.ceil(cfg.get_float("open_after_s") / interval)))
    close_n = max(1, int(np.ceil(cfg.get_float("close_after_s") / interval)))
    last_ts = float(gpu["ts"].max())
    live_ts = np.unique(gpu.loc[gpu["util"].notna(), "ts"].to_numpy(float))
    for (node, idx), sub in gpu.groupby(["node", "gpu"], sort=True):
        ts = sub["ts"].to_numpy(float)
        scope = {"node": str(node), "gpus": [int(idx)]}
        if "xid" in sub.columns:
            counts, codes_at = _xid_counts(sub["xid"])
            prev = counts.shift(1).fillna(0.0)
            new = counts.notna() & (counts > prev)
            times = ts[new.to_numpy()]
            codes = [code for cs, hit in zip(codes_at, new, strict=True) if hit for code in cs]
            if len(times):
                t0 = float(times[0])
                tl = float(times[-1])
                end = tl + hold if tl + hold < ctx.now else None
                flags.append(make_flag(
                    "gpu_fault", "critical", t0, end, scope,
                    f"GPU {idx} on node {node} reported XID error(s) "
                    f"{', '.join(map(str, sorted(set(codes))))} ({len(times)} time(s)).",
                ))
        if "up" in sub.columns:
            up = pd.to_numeric(sub["up"].map(_as_up), errors="coerce")
        elif sub["util"].isna().any():
            # without an `up` column: no reading from this GPU while others at that time have one
            alive = sub["util"].notna().to_numpy() | ~np.isin(sub["ts"].to_numpy(float), live_ts)
            up = pd.Series(np.where(alive, 1.0, 0.0), index=sub.index)
        else:
            up = None
        if up is not None and (up < 0.5).any():
            cond = [None if pd.isna(u) else bool(u < 0.5) for u in up]
            for ep in episodes(cond, open_n, close_n):
                end = None if ep.closed is None else float(ts[ep.last])
                flags.append(make_flag(
                    "gpu_fault", "critical", float(ts[ep.opened]), end, scope,
                    f"GPU {idx} on node {node} stopped answering (down) at "
                    f"{_clock(ts[ep.onset])}" + ("" if end is None else
                                                f", back after {end - ts[ep.onset]:.0f} s") + ".",
                ))
        if "clock_events" in sub.columns:
            reasons = [_throttled(v) for v in sub["clock_events"]]
            cond = [r is not None for r in reasons]
            for ep in episodes(cond, open_n, close_n):
                end = None if ep.closed is None else float(ts[ep.last])
                why = next(r for r in reasons[ep.onset:ep.last + 1] if r)
                flags.append(make_flag(
                    "gpu_fault", "warning", float(ts[ep.opened]), end, scope,
                    f"GPU {idx} on node {node} is being throttled ({why}) since "
                    f"{_clock(ts[ep.onset])}: it runs slower than its peers.",
                ))
        # a GPU that stops reporting while the others keep going
        gap_lim = cfg.get_float("silent_seconds")
        if last_ts - ts[-1] > gap_lim and len(ts):
            flags.append(make_flag(
                "gpu_fault", "critical", float(ts[-1]) + gap_lim, None, scope,
                f"GPU {idx} on node {node} has sent no sample for {last_ts - ts[-1]:.0f} s "
                "while the other GPUs keep reporting.",
            ))
    return flags


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _as_up(v: object) -> object:
    if isinstance(v, str):
        return {"true": 1, "false": 0, "1": 1, "0": 0}.get(v.strip().lower(), np.nan)
    if isinstance(v, (bool, np.bool_)):
        return 1 if v else 0
    return v


def _clock(ts: float) -> str:
    return pd.Timestamp(float(ts), unit="s").strftime("%H:%M:%S UTC")


def _stalled_where(ctx: Context, a: float, b: float) -> tuple[str, list[str] | None]:
    """Where the newest py-spy round in the silence (a, b] found the job, and the advice for
    that place first (('', None) without a round)."""
    from monitor.detect.flag_advice import advice_for
    from monitor.detect.hang import where_events
    from monitor.hang.hang_advice import where_advice

    rounds = where_events(ctx.events, a, b)
    if not rounds:
        return "", None
    e = rounds[-1]
    place = str(e.data["where"].get("place") or "")
    return (f" Where (py-spy): {e.message}",
            where_advice(place, "", ctx.verl_version)[:1] + advice_for("stalled"))


def _step_seconds(rec: StepRecord) -> float:
    """The seconds a step's timers hold: the step timer, and the validation and checkpoint save
    that verl 0.6+ times outside it (``monitor.logs.gaps.covered_seconds``)."""
    from monitor.logs.gaps import covered_seconds

    return float(covered_seconds(rec) or rec.total or 0.0)


def _closing_steps(ctx: Context) -> dict[float, tuple[bool, float]]:
    """End time -> (rebuilt, seconds of its own timers) of each step the log has closed.

    A gap that a step closes is judged against that step's timers: the step was running for
    ``timing_s/step`` of it (and its validation and checkpoint save, timed outside it). A timeline rebuilt from the step timers (a log without a clock)
    makes each gap the step's own time by construction, so it shows no stall at all."""
    out: dict[float, tuple[bool, float]] = {}
    for rec in ctx.steps:
        if rec.end_time is None:
            continue
        rebuilt, own = out.get(float(rec.end_time), (False, 0.0))
        out[float(rec.end_time)] = (rebuilt or rec.time_source == "rebuilt",
                                    max(own, _step_seconds(rec)))
    # a progress line drawn as step N ended, ahead of step N's own line (verl's V1 trainer,
    # forks that draw the bar first): the gap it closes is judged against step N's timer too
    by_step = {rec.step: rec for rec in ctx.steps if rec.end_time is not None}
    for e in ctx.events:
        rec = by_step.get((e.data or {}).get("current")) if e.kind == "progress" else None
        if rec is None or e.time is None or float(e.time) > float(rec.end_time) + 1.0:
            continue
        rebuilt, own = out.get(float(e.time), (False, 0.0))
        out[float(e.time)] = (rebuilt or rec.time_source == "rebuilt",
                              max(own, _step_seconds(rec)))
    return out


def detect_stalled(ctx: Context) -> list[Flag]:
    """No new step for several median step times (and minutes), or idle GPUs and a silent log;
    nothing after the run's end (its last progress line or final validation)."""
    from monitor.detect.hang import ended_at

    cfg = ctx.cfg("stalled")
    sf = ctx.sf
    flags: list[Flag] = []
    end = ended_at(ctx)
    life = sorted(set(sf["end"].astype(float).tolist())
                  | {float(e.time) for e in ctx.events
                     if e.kind == "progress" and e.time is not None})
    med = ctx.median_step
    if life and med:
        lim = max(cfg.get_float("median_multiple") * med, cfg.get_float("min_seconds"))
        marks = life + [float(ctx.now)]
        step_ends = sf["end"].to_numpy(float)
        closing = _closing_steps(ctx)
        for a, b in zip(marks[:-1], marks[1:], strict=True):
            if b - a <= lim or (end is not None and (a >= end - 1.0 or b >= end - 1.0)):
                continue  # after the run's end, or the last step that ended it (its final
                # validation and checkpoint): the run finished, nothing stalled
            rebuilt, own = closing.get(b, (False, 0.0))
            if rebuilt or b - a - own <= lim:
                continue  # the gap is (or is covered by) the closing step's own timer
            resumed = b != marks[-1] or b in step_ends
            if not ctx.holds("stalled.silence") or (
                    not resumed and not ctx.holds("stalled.trailing")):
                continue
            last_step = sf["step"][sf["end"] <= a + 1e-6]
            after = f" after step {int(last_step.iloc[-1])}" if len(last_step) else ""
            gap = b - a
            sev = "critical" if gap >= cfg.get_float("critical_multiple") * lim else "warning"
            where, advice = _stalled_where(ctx, a, b)
            flags.append(make_flag(
                "stalled", sev, a + lim, b if resumed else None, {},
                f"No new step for {gap / 60:.1f} min{after} (median step time {med:.0f} s)"
                + ("; training resumed afterwards." if resumed else ".") + where, advice,
            ))
    # all GPUs idle while nothing arrives in the log (works without any step yet)
    df = ctx.act
    if len(df):
        idle_level = cfg.get_float("idle_level")
        bin_s = max(ctx.sample_interval, 1e-3)
        tb = np.floor(df["ts"].to_numpy(float) / bin_s).astype(np.int64)
        peak = pd.Series(df["act"].to_numpy(float)).groupby(tb).max()
        idle = (peak <= idle_level).to_numpy()
        times = peak.index.to_numpy(np.int64) * bin_s
        need = cfg.get_float("idle_seconds")
        if med:
            need = max(need, cfg.get_float("idle_median_multiple") * med)
        i = 0
        while i < len(idle):
            if not idle[i]:
                i += 1
                continue
            j = i
            while j + 1 < len(idle) and idle[j + 1]:
                j += 1
            t0, t1 = float(times[i]), float(times[j] + bin_s)
            quiet = not any(t0 < t <= t1 for t in life)
            covered = any(f.start <= t1 and (f.end is None or f.end >= t0) for f in flags)
            finished = end is not None and t0 >= end - 1.0
            if t1 - t0 >= need and quiet and not covered and not finished:
                still = j == len(idle) - 1
                flags.append(make_flag(
                    "stalled", "warning", t0 + need, None if still else t1, {},
                    f"All GPUs idle (peak activity {idle_level:.0f}% or less) for "
                    f"{(t1 - t0) / 60:.1f} min with no new step or progress line in the log.",
                ))
            i = j + 1
    return flags
