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

Where, faster: the collector also takes py-spy stacks of the job's processes (driver and
workers) once the silence passes ``stack_multiple`` recent step times (at least
``min_seconds``). A round that finds a process stuck (the driver scoring rewards, waiting on an
HTTP answer, the data loader, a replay buffer, a worker-group call no worker runs; a worker
method that never returns; ranks outside a collective the others wait in) is the flag at once,
whatever the GPUs do, with the advice for that place. A round that finds a long but healthy
phase (validation, a checkpoint, a generation) keeps the flag quiet; ``stalled`` says it later.
A silence that starts at the run's end (``monitor.hang.finish``) is no silence.

Held past its normal time (issue 39), the first to speak: the exporter reads the driver every
``hang.sample_s`` seconds through the whole run and publishes a ``hang_dump`` event with
``data["hold"]`` once a place has been held past its limit (``monitor.hang.dwell``: twice its
phase's longest step timer or its longest earlier hold, plus a margin); offline, the same holds
come from replaying the saved rounds (:func:`hold_events`). A stuck verdict is the flag at once,
in any phase, whatever the silence so far; a long place (generation, validation, checkpoint,
kernel) only against its own history and while no GPU of its node computes. The evidence says
"in compute_score for 40 s; reward takes at most 0.8 s a step in this run (limit 15 s)".

A rank gone: a process of the job that was alive after the last step and is gone (killed or
crashed) is named as the likely cause, "the worker (PID N, GPU g) is gone: it exited N s after
the last step (killed or crashed); the others wait in a collective for it", with the advice to
read its own log (``ray logs worker --pid N --suffix err``, ``dmesg`` for the OOM killer) and
that ``actor_rollout_ref.nccl_timeout`` will end the others. Two sources: the py-spy round
(the collector watches the job's processes, ``monitor.hang.procs.GoneWatch``, and a round's
verdict is ``gone``), and the GPU collector's ``gpu_process_exited`` events in the silence,
which name the process in the GPU-evidence flag's "Who".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.detect.detector_base import Context, make_flag
from monitor.hang.dwell import HoldLimits, replay
from monitor.hang.finish import SLACK_S, finish_time
from monitor.hang.hang_advice import where_advice
from monitor.hang.where import GONE
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


def stack_limit(recent_step: float, cfg) -> float:
    """Seconds of silence after which py-spy stacks are taken, and a stuck place is a hang."""
    return max(cfg.get_float("stack_multiple", 1.3) * recent_step, cfg.get_float("min_seconds"))


def where_events(events: list[Event], t0: float, t1: float) -> list[Event]:
    """The newest py-spy round per node in (t0, t1] (events with a ``where`` verdict)."""
    newest: dict[str, Event] = {}
    for e in events:
        if (e.kind == "hang_dump" and e.time is not None and t0 < float(e.time) <= t1 + 1e-6
                and isinstance((e.data or {}).get("where"), dict)):
            node = str(e.data.get("node") or "")
            if node not in newest or float(e.time) >= float(newest[node].time):
                newest[node] = e
    return sorted(newest.values(), key=lambda e: float(e.time))


def ended_at(ctx: Context) -> float | None:
    """When the run finished (verl's last progress line or final validation), else None."""
    got = finish_time(ctx.events, ctx.steps)
    return got[0] if got else None


def _after(ctx: Context, a: float) -> str:
    sf = ctx.sf
    if len(sf):
        last_step = sf["step"][sf["end"] <= a + 1e-6]
        if len(last_step):
            return f" after step {int(last_step.iloc[-1])}"
    return ""


def _stack_flag(ctx: Context, a: float, b: float, resumed: bool, recent: float,
                rounds: list[Event]) -> Flag | None:
    """The ``hang`` flag from py-spy rounds that found a process stuck (None otherwise)."""
    cfg = ctx.cfg("hang")
    slim = stack_limit(recent, cfg)
    stuck = [e for e in rounds if e.data["where"].get("stuck")]
    if not stuck:  # a worker-group call no local worker runs: after the longer limit
        slim = silence_limit(recent, between_step_allowance(ctx.steps), cfg)
        stuck = [e for e in rounds if e.data["where"].get("suspect")]
    if not stuck or b - a <= slim:
        return None
    main = stuck[-1]
    verdict = main.data["where"]
    who = verdict.get("who") or [{}]
    node = main.data.get("node") or ""
    lines = [e.message for e in stuck]  # each names its node
    evidence = (f"No progress for {b - a:.0f} s{_after(ctx, a)} (recent step {recent:.0f} s, "
                f"limit {slim:.0f} s). Where (py-spy): " + " ".join(lines))
    fr = [e for e in ctx.events if e.kind == "hang_dump" and e.time is not None
          and float(e.time) > a and e.data.get("method") == "flight_recorder" and e.message]
    if fr:
        evidence += f" Flight Recorder: {fr[-1].message}."
    scope = {"node": node} if node and len({e.data.get('node') for e in stuck}) == 1 else {}
    advice = where_advice(str(verdict.get("place") or ""), str(who[0].get("detail") or ""),
                          ctx.verl_version, who[0].get("pid"))
    return make_flag("hang", "critical", a + slim, b if resumed else None, scope, evidence,
                     advice or None)


def hold_events(ctx: Context) -> list[Event]:
    """The over-events of the run (a place held past its normal time, ``data["hold"]``): the
    live exporter's, and those a replay of the recorded py-spy rounds gives (``analyze
    --stacks``: the dumps saved every few seconds through the run)."""
    if "hang_holds" not in ctx.cache:
        live, rounds = [], []
        for e in ctx.events:
            data = e.data or {}
            if e.kind != "hang_dump" or e.time is None or not isinstance(data.get("where"), dict):
                continue
            (live if isinstance(data.get("hold"), dict) else rounds).append(e)
        replayed = replay(rounds, ctx.steps, HoldLimits.from_config(ctx.cfg("hang"))) \
            if rounds else []
        ctx.cache["hang_holds"] = sorted(live + replayed, key=lambda e: float(e.time))
    return ctx.cache["hang_holds"]


def _hold_counts(ctx: Context, e: Event) -> bool:
    """Whether an over-event is a hang: its verdict is stuck, or it is long by nature, seen
    before in this run, and no GPU of its node computed while it was held."""
    where, hold = e.data["where"], e.data["hold"]
    if where.get("stuck"):
        return True
    if not (hold.get("long") and where.get("long_phase") and hold.get("source")):
        return False
    node = str(e.data.get("node") or "")
    gpu = ctx.gpu
    if node and len(gpu) and "node" in gpu:
        gpu = gpu[gpu["node"].astype(str) == node]
    states = gpu_states(gpu, float(hold.get("since") or e.time), float(e.time), ctx.cfg("hang"))
    return bool(states) and "busy" not in states.values()


def _hold_flag(ctx: Context, a: float, b: float, resumed: bool, recent: float) -> Flag | None:
    """The ``hang`` flag of a place held past its normal time in the silence (a, b]: opens
    when a reading confirmed it; the evidence says how long it was held and how long it
    normally takes ("in compute_score for 40 s; reward takes at most 0.8 s a step ...")."""
    overs = [e for e in hold_events(ctx) if a < float(e.time) <= b + 1e-6
             and _hold_counts(ctx, e)]
    if not overs:
        return None
    first, newest = overs[0], overs[-1]
    verdict = newest.data["where"]
    who = verdict.get("who") or [{}]
    node = newest.data.get("node") or ""
    evidence = (f"No progress for {b - a:.0f} s{_after(ctx, a)} (recent step {recent:.0f} s). "
                f"Held past its normal time: {newest.data['hold']['words']}. "
                f"Where (py-spy): {newest.message}")
    advice = where_advice(str(verdict.get("place") or ""), str(who[0].get("detail") or ""),
                          ctx.verl_version, who[0].get("pid"))
    return make_flag("hang", "critical", float(first.time), b if resumed else None,
                     {"node": node} if node else {}, evidence, advice or None)


def recent_step_time(steps: list) -> float | None:
    """Median of the last five step times (None when no step has one)."""
    tot = [float(s.total) for s in steps[-5:] if s.total is not None and s.total > 0]
    return float(np.median(tot)) if tot else None


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: a silence and the evidence of who waits (its own rules).
PREMISES: dict[str, tuple[str, ...]] = {
    "hang": (),
}


def detect_hang(ctx: Context) -> list[Flag]:
    """A critical ``hang`` flag for each silence where a process is stuck (py-spy), or that the
    GPUs or collectives show as waiting."""
    cfg = ctx.cfg("hang")
    marks = _marks(ctx)
    ordered = sorted(ctx.steps, key=lambda s: float(s.end_time or 0.0))
    recent = recent_step_time(ordered) or ctx.median_step
    if not marks or not recent:
        return []
    lim = silence_limit(recent, between_step_allowance(ctx.steps), cfg)
    first = min(lim, stack_limit(recent, cfg))
    end = ended_at(ctx)
    flags: list[Flag] = []
    bounds = marks + [float(ctx.now)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if end is not None and a >= end - SLACK_S:
            continue  # the silence after the run's end
        resumed = b != bounds[-1]
        held = _hold_flag(ctx, a, b, resumed, recent)
        if held is not None:  # a place held past its normal time: named as soon as read
            flags.append(held)
            continue
        if b - a <= first:
            continue  # short
        rounds = where_events(ctx.events, a, b)
        flag = _stack_flag(ctx, a, b, resumed, recent, rounds)
        if flag is None and rounds and rounds[-1].data["where"].get("long_phase"):
            continue  # validation, a checkpoint, a generation: stalled speaks later
        if flag is None and b - a > lim:
            flag = _evidence_flag(ctx, a, b, resumed, recent, lim)
        if flag is not None:
            flags.append(flag)
    return flags


def _evidence_flag(ctx: Context, a: float, b: float, resumed: bool, recent: float,
                   lim: float) -> Flag | None:
    """The ``hang`` flag from the GPUs' waiting signature, the NCCL Inspector or a Flight
    Recorder round (None without such evidence, or while every GPU computes)."""
    cfg = ctx.cfg("hang")
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
    if not reasons or (states and len(busy) == len(states)):
        return None  # no evidence, or every GPU computes: a long phase, not a hang
    left = gpu_exits(ctx.events, a, b)
    who = _who(newest, busy, idle, waiting)
    if left:  # a process that held a GPU left in the silence: the likely cause
        who = " Who: " + gone_from_gpus(left, a, bool(waiting) or bool(
            newest is not None and newest.data.get("waiting"))) + (
            f" {newest.message}" if newest is not None and newest.message else "")
    evidence = (f"No progress for {b - a:.0f} s{_after(ctx, a)} (recent step {recent:.0f} s, "
                f"limit {lim:.0f} s): " + "; ".join(reasons) + "." + who)
    advice = where_advice(GONE, "", ctx.verl_version, (left[0].data or {}).get("pid")) \
        if left else None
    return make_flag("hang", "critical", a + lim, b if resumed else None, {}, evidence, advice)


def gpu_exits(events: list[Event], t0: float, t1: float) -> list[Event]:
    """The ``gpu_process_exited`` events in (t0, t1]: processes that left a GPU in a silence,
    one per PID (the first GPU it left)."""
    out: dict[object, Event] = {}
    for e in sorted((e for e in events if e.kind == "gpu_process_exited" and e.time is not None
                     and t0 < float(e.time) <= t1 + 1e-6), key=lambda e: float(e.time)):
        key = ((e.data or {}).get("node"), (e.data or {}).get("pid"))
        out.setdefault(key, e)
    return list(out.values())


def gone_from_gpus(left: list[Event], t0: float, others_wait: bool) -> str:
    """One sentence naming the processes that left their GPU after ``t0`` (the last step) as
    gone, and what the others do."""
    parts = []
    for e in left[:4]:
        d = e.data or {}
        ids = ", ".join(x for x in (f"PID {d.get('pid')}", f"GPU {d.get('gpu')}"
                                    if d.get("gpu") is not None else "",
                                    f"node {d.get('node')}" if d.get("node") else "") if x)
        name = f" {d['name']}" if d.get("name") else ""
        parts.append(f"the process{name} ({ids}) is gone: it left its GPU "
                     f"{float(e.time) - t0:.0f} s after the last step (killed or crashed)")
    it = "it" if len(left) == 1 else "them"
    tail = f"; the others wait in a collective for {it}" if others_wait else ""
    return "; ".join(parts) + tail + "."


def _who(newest: Event | None, busy: list, idle: list, waiting: list) -> str:
    if newest is not None and newest.message:
        return f" Who: {newest.message}"
    if busy and waiting:
        names = ", ".join(f"{n}/GPU {g}" for n, g in busy[:4])
        return (f" Who: {names} stays busy while the others wait: the rank on it is stuck "
                "in GPU work (or far slower); ask for its Flight Recorder or py-spy stack.")
    if idle and waiting and len(idle) <= len(waiting):
        names = ", ".join(f"{n}/GPU {g}" for n, g in idle[:4])
        return (f" Who: most likely the rank on {names}: its GPU idles while the others wait "
                "in the collective, so it stopped before it (a data loader, a reward call, a "
                "branch only some ranks take) or its process is gone; ask for its Flight "
                "Recorder or py-spy stack.")
    return (" Who: unknown: no Flight Recorder dump yet (set TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
            " and run the exporter with --fr-dir; see docs/hangs.md).")
