"""The ``hang`` flag: no progress, the job's GPUs or collectives say it waits, and who holds it.

A hang is a silence in the log (no step, no tqdm progress line) longer than ``median_multiple``
recent step times (at least ``min_seconds``; the longest validation or checkpoint seen so far
is added, since those run between steps) *and* evidence that the job waits in a collective:

- the waiting signature on the job's GPUs: utilization high with SM activity near zero (an
  NCCL kernel spinning for a peer, as measured on H200s), on at least one GPU;
- or the NCCL Inspector's collectives stopped (records before the silence, none in it);
- or a Flight Recorder dump taken in the silence shows collectives pending.

GPUs that all compute (a long generation or validation) or all idle (a checkpoint written by
the CPU, a data stall) are not a hang; ``stalled`` covers a silence without that evidence.

Who: the newest ``hang_dump`` event in the silence (the exporter's ``flight_recorder``
collector asks the ranks when the flag opens) names the rank and its frame; without one, a GPU
that stays busy while the others wait is named from the GPU samples.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.detect.base import Context, make_flag
from monitor.records import Event, Flag

#: Phases that run between steps and may legitimately keep the log silent.
BETWEEN_STEP_PHASES: tuple[str, ...] = ("testing", "save_checkpoint")


def _marks(ctx: Context) -> list[float]:
    sf = ctx.sf
    marks = set(sf["end"].dropna().astype(float).tolist()) if len(sf) else set()
    marks |= {float(e.time) for e in ctx.events if e.kind == "progress" and e.time is not None}
    return sorted(marks)


def between_step_allowance(steps: list) -> float:
    """The longest testing + checkpoint time any step reported (0 when none)."""
    best = 0.0
    for s in steps:
        extra = sum(float(s.phases.get(p) or 0.0) for p in BETWEEN_STEP_PHASES)
        best = max(best, extra)
    return best


def gpu_states(gpu: pd.DataFrame, t0: float, t1: float, cfg) -> dict[tuple[str, int], str]:
    """Each GPU's state over [t0, t1]: waiting, busy, idle or mixed (needs SM activity)."""
    if not len(gpu):
        return {}
    df = gpu[(gpu["ts"] > t0) & (gpu["ts"] <= t1)]
    if not len(df) or df["sm_active"].isna().all():
        return {}
    share = cfg.get_float("waiting_share")
    out: dict[tuple[str, int], str] = {}
    for (node, g), part in df.groupby(["node", "gpu"], sort=True):
        util = part["util"].to_numpy(float)
        sm = part["sm_active"].to_numpy(float)
        ok = ~np.isnan(sm)
        if ok.sum() < cfg.get_float("min_samples"):
            continue
        util, sm = util[ok], sm[ok]
        waiting = (util >= cfg.get_float("waiting_util")) & (sm <= cfg.get_float("waiting_sm"))
        if waiting.mean() >= share:
            out[(str(node), int(g))] = "waiting"
        elif np.nanmean(sm) >= cfg.get_float("busy_sm"):
            out[(str(node), int(g))] = "busy"
        elif (util <= cfg.get_float("idle_level")).mean() >= share:
            out[(str(node), int(g))] = "idle"
        else:
            out[(str(node), int(g))] = "mixed"
    return out


def _nccl_stopped(nccl: pd.DataFrame, t0: float, t1: float, quiet_s: float) -> str | None:
    """Words when the Inspector recorded collectives before ``t0`` and none in the silence."""
    if not len(nccl) or t1 - t0 < quiet_s:
        return None
    ts = nccl["ts"].to_numpy(float)
    before = ts[(ts <= t0) & (ts > t0 - 600)]
    if not len(before) or (ts > t0 + 1e-6).any():
        return None
    return f"the NCCL Inspector recorded no collective for {t1 - float(before.max()):.0f} s"


def _dump_events(events: list[Event], t0: float) -> list[Event]:
    return [e for e in events if e.kind == "hang_dump" and e.time is not None and e.time > t0]


def silence_limit(recent_step: float, between_steps: float, cfg) -> float:
    """Seconds of silence after which a waiting job is a hang (see the module docstring)."""
    lim = max(cfg.get_float("median_multiple") * recent_step, cfg.get_float("min_seconds"))
    return lim + cfg.get_float("between_step_multiple") * between_steps


def recent_step_time(steps: list) -> float | None:
    """Median of the last five step times (None when no step has one)."""
    tot = [float(s.total) for s in steps[-5:] if s.total is not None and s.total > 0]
    return float(np.median(tot)) if tot else None


def detect_hang(ctx: Context) -> list[Flag]:
    """A critical ``hang`` flag for each silence that the GPUs or collectives show as waiting."""
    cfg = ctx.cfg("hang")
    marks = _marks(ctx)
    ordered = sorted(ctx.steps, key=lambda s: float(s.end_time or 0.0))
    recent = recent_step_time(ordered) or ctx.median_step
    if not marks or not recent:
        return []
    lim = silence_limit(recent, between_step_allowance(ctx.steps), cfg)
    flags: list[Flag] = []
    bounds = marks + [float(ctx.now)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b - a <= lim:
            continue
        resumed = b != bounds[-1]
        look_from = max(a, b - cfg.get_float("evidence_window_s"))
        states = gpu_states(ctx.gpu, look_from, b, cfg)
        waiting = sorted(k for k, v in states.items() if v == "waiting")
        busy = sorted(k for k, v in states.items() if v == "busy")
        idle = sorted(k for k, v in states.items() if v == "idle")
        reasons: list[str] = []
        if waiting:
            names = ", ".join(f"{n}/GPU {g}" for n, g in waiting[:8])
            reasons.append(f"{len(waiting)} of {len(states)} GPUs wait in a collective "
                           f"(utilization high, SM activity near zero): {names}")
        stopped = _nccl_stopped(ctx.nccl, a, b, cfg.get_float("nccl_quiet_s"))
        if stopped:
            reasons.append(stopped)
        dumps = _dump_events(ctx.events, a)
        newest = dumps[-1] if dumps else None
        if newest is not None and newest.data.get("waiting"):
            reasons.append("py-spy stacks show ranks waiting in a collective"
                           if newest.data.get("method") == "py-spy"
                           else "the Flight Recorder shows collectives pending")
        if not reasons:
            continue
        if states and len(busy) == len(states):
            continue  # every GPU computes: a long phase, not a hang
        after = ""
        sf = ctx.sf
        if len(sf):
            last_step = sf["step"][sf["end"] <= a + 1e-6]
            if len(last_step):
                after = f" after step {int(last_step.iloc[-1])}"
        who = ""
        if newest is not None and newest.message:
            who = f" Who: {newest.message}"
        elif busy and waiting:
            names = ", ".join(f"{n}/GPU {g}" for n, g in busy[:4])
            who = (f" Who: {names} stays busy while the others wait: the rank on it is stuck "
                   "in GPU work (or far slower); ask for its Flight Recorder or py-spy stack.")
        elif idle and waiting and len(idle) <= len(waiting):
            names = ", ".join(f"{n}/GPU {g}" for n, g in idle[:4])
            who = (f" Who: most likely the rank on {names}: its GPU idles while the others wait "
                   "in the collective, so it stopped before it (a data loader, a reward call, a "
                   "branch only some ranks take) or its process is gone; ask for its Flight "
                   "Recorder or py-spy stack.")
        else:
            who = (" Who: unknown: no Flight Recorder dump yet (set TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
                   " and run the exporter with --fr-dir; see docs/hangs.md).")
        evidence = (f"No progress for {b - a:.0f} s{after} (recent step {recent:.0f} s, limit "
                    f"{lim:.0f} s): " + "; ".join(reasons) + "." + who)
        flags.append(make_flag("hang", "critical", a + lim, b if resumed else None, {},
                               evidence))
    return flags
