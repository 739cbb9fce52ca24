"""The goodput ledger: where every GPU-second of a verl run went.

For each step and each GPU, the wall seconds from the end of the previous step line to the end
of this one are split into ``productive`` time and named causes of loss (the values of the
``cause`` label of ``verlmon_gpu_seconds_total``). Every second lands in exactly one cause, so
the causes add up to the wall time x GPUs; what no rule explains is ``unattributed``, never
dropped. The rules, their signals and their blind spots are written in ``docs/goodput.md``.

The module is pure: steps, GPU samples and events in, a data frame out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from monitor.analysis.attribution import overlap_samples, phase_timeline, sample_period
from monitor.config import Section
from monitor.logs.gaps import fill_data_wait
from monitor.logs.modes import run_mode, waits_in_gen
from monitor.records import Event, StepRecord

#: Lost causes, in the order reports list them (metric label values).
LOST_CAUSES: tuple[str, ...] = (
    "warmup",  # the first steps (and the first after a resume): compilation, allocation, caches
    "data_loading",
    "rollout_long_tail",
    "straggler_wait",
    "weight_sync",
    "communication",
    "cpu_phases",
    "validation_checkpoint",
    "low_activity",
    "restarts",
    # split GPU pools (fully-async, V1 separate-async, one-step-off; docs/goodput.md)
    "waiting_for_samples",  # the trainer's "gen": waiting for the rollout pool's samples
    "waiting_for_weights",  # the rollout pool idle until the trainer's next weights arrive
    "parameter_sync",  # a weight sync between separate pools (param_sync, update_weights, ...)
    "preempted_work",  # rollout work the engine threw away by preempting requests
)
#: Every cause a GPU-second can go to: productive, the lost causes, then unattributed.
CAUSES: tuple[str, ...] = ("productive",) + LOST_CAUSES + ("unattributed",)

#: Phases in which the GPUs do the job's work; judged sample by sample.
COMPUTE_PHASES: tuple[str, ...] = (
    "gen", "old_log_prob", "ref", "values", "update_actor", "update_critic",
)
#: Phases whose whole time goes to one cause, whatever the GPUs show.
PHASE_CAUSE: dict[str, str] = {
    "reshard": "weight_sync",
    "comm": "communication",
    "reward": "cpu_phases",
    "adv": "cpu_phases",
    "testing": "validation_checkpoint",
    "save_checkpoint": "validation_checkpoint",
    "rollout_wait": "rollout_long_tail",
    "other": "unattributed",
}
#: What changes where the trainer and the rollout have GPU pools of their own: the trainer's
#: ``gen`` is its wait for samples and the weight sync goes to the other pool.
SPLIT_POOL_PHASE_CAUSE: dict[str, str] = {"gen": "waiting_for_samples", "reshard": "parameter_sync"}


def phase_causes(steps: list[StepRecord], mode: str | None = None) -> dict[str, str]:
    """The phases whose whole time goes to one cause, for the trainer mode of ``steps`` (or
    ``mode``, where the caller judged it)."""
    if waits_in_gen(mode or run_mode(steps)):
        return {**PHASE_CAUSE, **SPLIT_POOL_PHASE_CAUSE}
    return dict(PHASE_CAUSE)
#: Events that end a run: the time from the last step line to one of them is lost work.
CRASH_KINDS: tuple[str, ...] = (
    "oom", "traceback", "nccl_timeout", "nccl_error", "actor_died", "worker_killed",
    "cuda_error",
)

#: ``tail`` marks the row from the last step line to the end of the run (``run_end``).
LEDGER_COLUMNS: list[str] = ["step", "node", "gpu", "start", "end", "tail", "wall", *CAUSES]

#: Used when ``monitor/defaults.yaml`` has no ``goodput:`` section (the same values).
DEFAULTS: dict[str, Any] = {
    "reference_sm": {p: 0.0 for p in COMPUTE_PHASES},
    "auto_quantile": 0.9,
    "auto_min": 10.0,
    "idle_util": 10.0,
    "tail_share": 0.9,
    "tail_thin_share": 0.3,
    "tail_early_share": 0.3,
    "tail_early_quantile": 0.9,
    "tail_min_share": 0.2,
    "spin_util_min": 85.0,
    "spin_sm_max": 10.0,
    "straggler_gap": 15.0,
    "peer_busy_min": 50.0,
    "comm_util_min": 70.0,
    "comm_sm_max": 30.0,
    "sum_tolerance": 0.02,
    "warmup_steps": 1,
    "tail_min_response_ratio": 2.0,
    "tail_agent_ratio": 2.5,
}

#: Each cause in one line for the pages: what it is, then what to do about it.
CAUSE_TEXT: dict[str, tuple[str, str]] = {
    "productive": ("the GPUs doing the job's work at the run's reference activity", ""),
    "warmup": ("the first step(s): compilation, allocation, caches filling",
               "nothing to fix in a long run; judge the steps after it"),
    "data_loading": ("the wait for the next batch before the step timer starts (DataLoader, "
                     "tokenisation)", "raise data.dataloader_num_workers or tokenise the data beforehand"),
    "rollout_long_tail": ("generation waiting on a few long responses while the other GPUs "
                          "idle", "cap data.max_response_length, or roll out "
                          "asynchronously (partial rollout)"),
    "straggler_wait": ("GPUs waiting in a collective for a slower peer",
                       "look at the GPU the flag names (clocks, co-tenant, data skew)"),
    "weight_sync": ("the actor-to-rollout weight sync (reshard)",
                    "check the rollout's tensor parallel size and the sync's bucket size"),
    "communication": ("collectives that no compute overlaps",
                      "raise the micro-batch or overlap the collectives (FSDP prefetch)"),
    "cpu_phases": ("the GPUs waiting for CPU work: reward scoring, advantages",
                   "make compute_score faster or run the reward asynchronously"),
    "validation_checkpoint": ("validation and checkpoint saves",
                              "raise trainer.test_freq / trainer.save_freq if they cost much"),
    "low_activity": ("busy time at SM activity below the run's reference (small kernels, "
                     "small batches, host-bound loops)",
                     "raise actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu and "
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    "restarts": ("time lost to a crash: from the last step to the resume, and redone steps",
                 "fix the crash the flag quotes; checkpoint more often"),
    "waiting_for_samples": ("the trainer waiting for the rollout pool's samples",
                            "give the rollout pool more GPUs or lower the staleness wait"),
    "waiting_for_weights": ("the rollout pool idle until new weights arrive",
                            "raise the staleness allowed or give the trainer more GPUs"),
    "parameter_sync": ("the weight sync between the trainer and rollout pools",
                       "check the sync's bucket size and the network between the pools"),
    "preempted_work": ("rollout work the engine threw away by preempting requests",
                       "raise actor_rollout_ref.rollout.gpu_memory_utilization or lower "
                       "actor_rollout_ref.rollout.max_num_seqs"),
    "unattributed": ("time no rule explains (no timer, no GPU sample)",
                     "give the log timestamps and sample the GPUs through the whole step"),
}


def cause_line(cause: str) -> str:
    """``"rollout_long_tail: what it is; what to do"`` in one line (the cause alone if
    unknown)."""
    what, todo = CAUSE_TEXT.get(cause, ("", ""))
    if not what:
        return cause
    return f"{cause}: {what}" + (f"; {todo}" if todo else "")


def tail_evidence(steps: list[StepRecord], cfg: Mapping[str, Any] | None = None
                  ) -> dict[int, bool]:
    """Per step, what the log says of generation's long tail: True where the longest response
    is at least ``tail_min_response_ratio`` x the mean, or the slowest agent-loop generation at
    least ``tail_agent_ratio`` x the mean; False where the log gives those figures and both are
    below (uniform responses: a thin decode is slow decoding, not a tail). Steps whose log gives
    neither are left out (their GPU samples alone judge them). ``cfg``: ledger settings."""
    sec = settings(cfg) if not isinstance(cfg, Section) else cfg
    limits = ((_RESP_MAX, _RESP_MEAN, sec.get_float("tail_min_response_ratio")),
              (_SLOWEST, _GEN_MEAN, sec.get_float("tail_agent_ratio")))
    out: dict[int, bool] = {}
    for rec in steps:
        known = hit = False
        for top_key, mean_key, lim in limits:
            top, mean = _number(rec.metrics.get(top_key)), _number(rec.metrics.get(mean_key))
            if top is None or mean is None or mean <= 0:
                continue
            known = True
            hit = hit or top / mean >= lim
        if known:
            out[int(rec.step)] = out.get(int(rec.step), False) or hit
    return out


_RESP_MAX, _RESP_MEAN = "response_length/max", "response_length/mean"
_SLOWEST = "timing_s/agent_loop/slowest/generate_sequences"
_GEN_MEAN = "timing_s/agent_loop/generate_sequences/mean"


def _number(value: object) -> float | None:
    """A finite number, or None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return None
    v = float(value)
    return v if np.isfinite(v) else None


def settings(cfg: Mapping[str, Any] | None = None) -> Section:
    """The ledger's settings: ``cfg`` (a ``goodput:`` section) over :data:`DEFAULTS`."""
    out = dict(DEFAULTS)
    ref = dict(DEFAULTS["reference_sm"])
    for key, val in dict(cfg or {}).items():
        if key == "reference_sm" and isinstance(val, Mapping):
            ref.update(val)
        elif key == "reference_sm":
            ref = {p: val for p in COMPUTE_PHASES}
        else:
            out[key] = val
    out["reference_sm"] = ref
    return Section(out)


def default_settings() -> Section:
    """The ``goodput:`` section of the default config merged over :data:`DEFAULTS`."""
    from monitor.config import load_config

    try:
        return settings(load_config().section("goodput"))
    except Exception:  # noqa: BLE001 - an unreadable config falls back to the built-in values
        return settings()


def distinct_steps(steps: list[StepRecord], events: list[Event] | None = None
                   ) -> list[StepRecord]:
    """The step lines without the lines that repeat a step already seen within one step time
    of the line before them, with no crash or resume logged in between: two exporters of one
    job, a step printed twice, or two runs' lines mixed in one Prometheus job. A step redone
    after a restart comes after a restart's gap (longer than the step) or a logged resume."""
    timed = sorted((s for s in steps if s.end_time is not None and s.total is not None),
                   key=lambda s: float(s.end_time))
    drop: set[int] = set()
    top: int | None = None
    last_end: float | None = None
    for rec in timed:
        end = float(rec.end_time)
        if (top is not None and rec.step <= top and end - last_end <= float(rec.total)
                and not _resume_between(list(events or []), last_end, end)):
            drop.add(id(rec))
            continue
        top = rec.step if top is None else max(top, rec.step)
        last_end = end
    return [s for s in steps if id(s) not in drop]


def _step_intervals(steps: list[StepRecord], run_end: float | None,
                    events: list[Event], cfg: Section) -> pd.DataFrame:
    """One row per step line (and a crash tail): its wall interval, what fills the gap, and
    whether it is a warm-up step (the run's first ``warmup_steps``, the first after a resume)."""
    timed = sorted((s for s in steps if s.end_time is not None and s.total is not None),
                   key=lambda s: float(s.end_time))
    rows = []
    prev_end: float | None = None
    top = None
    warm_left = max(0, int(cfg.get_int("warmup_steps", 1)))
    for rec in timed:
        end = float(rec.end_time)
        covered = float(rec.total) + sum(
            float(rec.phases.get(p) or 0.0) for p in ("testing", "save_checkpoint")
            if _outside_step_timer(rec))
        resumed = top is not None and rec.step <= top
        after_resume = resumed or (prev_end is not None
                                   and _resume_between(events, prev_end, end))
        start = end - covered if prev_end is None else prev_end
        if prev_end is not None and end - prev_end <= 0:
            start = end  # two lines at one instant: nothing to split
        warm = int(rec.step) <= warm_left or (after_resume and not resumed)
        rows.append({"step": int(rec.step), "start": start, "end": end,
                     "data_wait": float(rec.data_wait or 0.0) if not after_resume else 0.0,
                     "gap_cause": "restarts" if after_resume else "unattributed",
                     "redone": bool(resumed), "tail": False, "warm": bool(warm)})
        prev_end = end
        top = rec.step if top is None else max(top, rec.step)
    if run_end is not None and prev_end is not None and run_end > prev_end:
        crashed = any(e.kind in CRASH_KINDS and e.time is not None
                      and prev_end < e.time <= run_end + 1e-6 for e in events)
        rows.append({"step": int(top) + 1, "start": prev_end, "end": float(run_end),
                     "data_wait": 0.0, "gap_cause": "restarts" if crashed else "unattributed",
                     "redone": False, "tail": True, "warm": False})
    return pd.DataFrame(rows, columns=["step", "start", "end", "data_wait", "gap_cause",
                                       "redone", "tail", "warm"])


def _outside_step_timer(rec: StepRecord) -> bool:
    """Whether testing/save_checkpoint ran outside ``timing_s/step`` (verl 0.6+)."""
    from monitor.logs.gaps import covered_seconds

    cov = covered_seconds(rec)
    return cov is not None and rec.total is not None and cov > float(rec.total) + 1e-9


def _resume_between(events: list[Event], a: float, b: float) -> bool:
    """A resume, a checkpoint load or a crash logged between two step lines."""
    kinds = ("resume", "checkpoint_load", *CRASH_KINDS)
    return any(e.kind in kinds and e.time is not None and a < e.time <= b for e in events)


def _timeline(steps: list[StepRecord], events: list[Event], iv: pd.DataFrame) -> pd.DataFrame:
    """The phases of the step lines, and those of the lines of their own without a step time
    (the fully-async trainer's ``timing_s/param_sync`` line, printed after its step): each of
    those goes to the step line whose wall interval holds it, so the trainer's wait for the
    weight sync is booked, not left to the next step's gap."""
    timed = [s for s in steps if s.total is not None]
    loose = [s for s in steps if s.total is None and s.end_time is not None and s.phases]
    tl = phase_timeline(timed, events)
    if not loose or len(iv) == 0:
        return tl
    extra = phase_timeline(loose, events)
    if len(extra) == 0:
        return tl
    ends = iv["end"].to_numpy(float)
    mid = (extra["start"].to_numpy(float) + extra["end"].to_numpy(float)) / 2
    at = np.clip(np.searchsorted(ends, mid - 1e-9, side="left"), 0, len(iv) - 1)
    extra = extra.assign(step=iv["step"].to_numpy()[at])
    return pd.concat([tl, extra], ignore_index=True).sort_values(
        ["start", "step"], kind="stable").reset_index(drop=True)


def _clip_timeline(timeline: pd.DataFrame, iv: pd.DataFrame) -> pd.DataFrame:
    """The phases cut to their step's wall interval (the first line of a step with the same
    number twice is measured against its own interval only)."""
    if len(timeline) == 0 or len(iv) == 0:
        return pd.DataFrame(columns=["step", "phase", "start", "end", "row"])
    bounds = pd.DataFrame({"step": iv["step"].to_numpy(), "_lo": iv["start"].to_numpy(float),
                           "_hi": iv["end"].to_numpy(float), "row": np.arange(len(iv))})
    # each phase against every interval of its step number, in interval order (stable)
    tl = timeline.merge(bounds, on="step", how="inner", sort=False)
    tl = tl[(tl["end"] > tl["_lo"]) & (tl["start"] < tl["_hi"] + 1e-9)]
    tl = tl.assign(start=np.maximum(tl["start"].to_numpy(float), tl["_lo"].to_numpy(float)),
                   end=np.minimum(tl["end"].to_numpy(float), tl["_hi"].to_numpy(float)))
    tl = tl[tl["end"] > tl["start"]].sort_values("row", kind="stable")
    if len(tl) == 0:
        return pd.DataFrame(columns=["step", "phase", "start", "end", "row"])
    return tl.drop(columns=["_lo", "_hi"]).reset_index(drop=True)


def _classify(pairs: pd.DataFrame, cfg: Section, no_tail: set[int]) -> pd.DataFrame:
    """Give each (sample, compute phase) pair a cause, or ``compute`` for the work itself.

    Peers are the other GPUs sampled in the same time bin. Generation of the steps in
    ``no_tail`` (uniform responses) has no tail: its thin samples are judged as compute.
    """
    p = pairs.copy()
    has_sm = p["sm_active"].notna()
    p["act"] = p["sm_active"].where(has_sm, p["util"]).astype(float)
    p["util"] = p["util"].astype(float)
    # peers: the highest activity among the other GPUs of the same time bin (one value per
    # GPU and bin, whatever the number of phases its sample touches)
    one = p.drop_duplicates(["tbin", "key"])[["tbin", "key", "act"]]
    one = one.sort_values(["tbin", "act"], ascending=[True, False], kind="stable")
    rank = one.groupby("tbin").cumcount()
    top = pd.DataFrame({
        "top1": one[rank == 0].set_index("tbin")["act"],
        "top2": one[rank == 1].set_index("tbin")["act"],
        "n": one.groupby("tbin").size(),
    })
    p = p.join(top, on="tbin")
    p["peer_max"] = np.where(p["act"] >= p["top1"], p["top2"], p["top1"])
    p["peers"] = p["n"] - 1
    p["cause"] = "compute"
    spin = (p["util"] >= cfg.get_float("spin_util_min")) & has_sm & (
        p["sm_active"] <= cfg.get_float("spin_sm_max"))
    idle = p["util"] <= cfg.get_float("idle_util")
    gen = p["phase"] == "gen"
    p["waiting"] = (spin | idle) & gen
    p.loc[gen_tail(p[gen & ~p["step"].isin(no_tail)], cfg), "cause"] = "rollout_long_tail"
    train = ~gen
    strag = (train & has_sm & (p["peers"] > 0) & (p["util"] >= cfg.get_float("spin_util_min"))
             & (p["peer_max"] >= cfg.get_float("peer_busy_min"))
             & (p["act"] <= p["peer_max"] - cfg.get_float("straggler_gap")))
    p.loc[strag & (p["cause"] == "compute"), "cause"] = "straggler_wait"
    comm = (train & has_sm & (p["util"] >= cfg.get_float("comm_util_min"))
            & (p["sm_active"] <= cfg.get_float("comm_sm_max")))
    p.loc[comm & (p["cause"] == "compute"), "cause"] = "communication"
    return p


def gen_tail(gen: pd.DataFrame, cfg: Section) -> pd.Index:
    """The samples of ``gen`` (columns ts, step, key, act, waiting) in generation's long tail.

    Per step and GPU, generation has thinned once the GPU waits (idle or spinning) or its
    activity falls to ``tail_thin_share`` of its own early generation (the ``tail_early_quantile``
    of its first ``tail_early_share`` of samples): the longest trailing stretch that starts thin
    and stays thin in ``tail_share`` of its samples is the tail, whether the GPU decodes the last
    few long sequences or waits for a peer that does. A stretch shorter than ``tail_min_share``
    of the GPU's gen samples is the ordinary end of generation, not a tail.
    """
    if len(gen) == 0:
        return gen.index
    early_share = cfg.get_float("tail_early_share")
    early_q = cfg.get_float("tail_early_quantile")
    thin_share = cfg.get_float("tail_thin_share")
    keep_share = cfg.get_float("tail_share")
    min_share = cfg.get_float("tail_min_share")
    hits: list[np.ndarray] = []
    for _, grp in gen.sort_values("ts", kind="stable").groupby(["step", "key"], sort=False):
        n = len(grp)
        act = grp["act"].to_numpy(float)
        head = act[: max(1, int(np.ceil(early_share * n)))]
        head = head[np.isfinite(head)]
        early = float(np.quantile(head, early_q)) if len(head) else np.nan
        low = act <= thin_share * early if np.isfinite(early) else np.zeros(n, bool)
        thin = grp["waiting"].to_numpy(bool) | low
        share = np.cumsum(thin[::-1])[::-1] / np.arange(n, 0, -1)
        ok = np.flatnonzero(thin & (share >= keep_share))
        if len(ok) == 0 or (n - int(ok[0])) < min_share * n:
            continue
        first = int(ok[0])
        hits.append(grp.index.to_numpy()[first:][thin[first:]])
    return pd.Index(np.concatenate(hits)) if hits else pd.Index([])


def _references(compute: pd.DataFrame, cfg: Section) -> dict[str, float]:
    """Per compute phase, the activity counted as fully productive (set, or the run's own)."""
    refs: dict[str, float] = {}
    q = cfg.get_float("auto_quantile")
    floor = cfg.get_float("auto_min")
    for phase in COMPUTE_PHASES:
        val = cfg["reference_sm"].get(phase, 0.0)
        if val not in (None, "auto") and float(val) > 0:
            refs[phase] = float(val)
            continue
        sub = compute[compute["phase"] == phase]
        if len(sub) == 0:
            continue
        w = sub["overlap_s"].astype(float)
        per = (sub.assign(aw=sub["act"] * w, w=w).groupby(["step", "key"])[["aw", "w"]].sum())
        means = (per["aw"] / per["w"].where(per["w"] > 0)).dropna()
        refs[phase] = max(floor, float(means.quantile(q))) if len(means) else floor
    return refs


def ledger(
    steps: list[StepRecord],
    gpu: pd.DataFrame,
    events: list[Event] | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    run_end: float | None = None,
    sample_s: float | None = None,
    tail_steps: Mapping[int, bool] | None = None,
    flagged_tail: Iterable[int] = (),
    mode: str | None = None,
) -> pd.DataFrame:
    """Per step and GPU: wall seconds and their split into :data:`CAUSES` (columns
    :data:`LEDGER_COLUMNS`; one row per step line and GPU sampled in the run).

    ``config`` is a ``goodput:`` section (default: ``monitor/defaults.yaml``). ``run_end``, when
    known, adds a last row from the last step line to it: ``restarts`` when a crash is logged
    in between (the work of the unfinished step is lost), else ``unattributed``. The inputs are
    not modified (``data_wait`` is measured on copies where missing).

    ``tail_steps`` (default: :func:`tail_evidence` of the steps) says per step whether the
    responses have a long tail: where False, generation's thin samples are not a tail. The
    steps of ``flagged_tail`` (a ``rollout_long_tail`` flag covers them) book generation's
    whole loss as the tail. In warm-up steps every loss of the compute phases is ``warmup``.
    ``mode``: the run's trainer mode where the caller judged it (default: the steps' keys).
    """
    cfg = settings(config) if config is not None else default_settings()
    events = list(events or [])
    steps = fill_data_wait([dataclasses.replace(s) for s in distinct_steps(steps, events)])
    flagged = {int(s) for s in flagged_tail}
    no_tail = {int(s) for s, hit in (tail_evidence(steps, cfg) if tail_steps is None
                                     else tail_steps).items() if not hit} - flagged
    if gpu is None or len(gpu) == 0 or not steps:
        return pd.DataFrame(columns=LEDGER_COLUMNS)
    samples = gpu[["ts", "node", "gpu", "util", "sm_active"]].astype(
        {"node": str, "gpu": int, "ts": float})
    keys = sorted({(n, int(g)) for n, g in zip(samples["node"], samples["gpu"], strict=True)})
    iv = _step_intervals(steps, run_end, events, cfg)
    if len(iv) == 0:
        return pd.DataFrame(columns=LEDGER_COLUMNS)
    iv = iv.reset_index(drop=True)
    width = float(sample_s) if sample_s else sample_period(samples["ts"])
    tl = _clip_timeline(_timeline(steps, events, iv), iv)

    nrow, nkey = len(iv), len(keys)
    kidx = {k: i for i, k in enumerate(keys)}
    acc = {c: np.zeros((nrow, nkey)) for c in CAUSES}
    wall = (iv["end"] - iv["start"]).to_numpy(float)
    _book_gaps(acc, iv, tl, wall)
    # phases whose whole time has one cause (the trainer's wait for samples in split pools)
    fixed_causes = phase_causes(steps, mode)
    if len(tl):
        fixed = tl[tl["phase"].map(fixed_causes).notna()]
        for (row, phase), grp in fixed.groupby(["row", "phase"]):
            acc[fixed_causes[phase]][int(row)] += float((grp["end"] - grp["start"]).sum())
        judged = [p for p in COMPUTE_PHASES if p not in fixed_causes]
        comp = tl[tl["phase"].isin(judged)].reset_index(drop=True)
        # compute phases: sample by sample
        if len(comp):
            _judge_compute(comp, samples, width, cfg, kidx, acc, no_tail, flagged)
    _whole_step_causes(acc, iv)
    # one row per interval and GPU, intervals in order, GPUs in key order within each
    r_at = np.repeat(np.arange(nrow), nkey)
    k_at = np.tile(np.arange(nkey), nrow)
    out = pd.DataFrame({
        "step": iv["step"].to_numpy(np.int64)[r_at],
        "node": np.array([n for n, _ in keys], dtype=object)[k_at],
        "gpu": np.array([g for _, g in keys], dtype=np.int64)[k_at],
        "start": iv["start"].to_numpy(float)[r_at], "end": iv["end"].to_numpy(float)[r_at],
        "tail": iv["tail"].to_numpy(bool)[r_at], "wall": wall[r_at],
        **{c: acc[c][r_at, k_at] for c in CAUSES},
    })
    return out[LEDGER_COLUMNS]


def _book_gaps(acc: dict[str, np.ndarray], iv: pd.DataFrame, tl: pd.DataFrame,
               wall: np.ndarray) -> None:
    """The gap before each step's first phase, on every GPU: the batch fetch (``data_wait``,
    as far as the gap goes), then a restart or unexplained (the interval's ``gap_cause``)."""
    phase_s = tl.groupby("row")["end"].sum() - tl.groupby("row")["start"].sum() if len(tl) else (
        pd.Series(dtype=float))
    in_phases = phase_s.reindex(range(len(iv))).fillna(0.0).to_numpy(float)
    gap = np.clip(wall - in_phases, 0.0, None)
    dw = np.minimum(iv["data_wait"].to_numpy(float), gap)
    acc["data_loading"] += dw[:, None]
    for cause in ("restarts", "unattributed"):
        mask = (iv["gap_cause"] == cause).to_numpy()
        acc[cause][mask] += (gap - dw)[mask, None]


def _whole_step_causes(acc: dict[str, np.ndarray], iv: pd.DataFrame) -> None:
    """Warm-up steps: what their compute phases lost is the warm-up's; steps run again after
    a resume: all of their time is the restart's (moves seconds in ``acc`` in place)."""
    for flag, target, causes in (
        ("warm", "warmup", ("rollout_long_tail", "straggler_wait", "communication",
                            "low_activity")),
        ("redone", "restarts", tuple(c for c in CAUSES if c != "restarts")),
    ):
        rows = iv[flag].to_numpy(bool)
        if rows.any():
            for c in causes:
                acc[target][rows] += acc[c][rows]
                acc[c][rows] = 0.0


def _judge_compute(comp: pd.DataFrame, samples: pd.DataFrame, width: float,
                   cfg: Section, kidx: dict[tuple[str, int], int],
                   acc: dict[str, np.ndarray], no_tail: set[int] = frozenset(),
                   flagged: set[int] = frozenset()) -> None:
    """Split each compute phase's seconds per GPU (adds to ``acc`` in place); generation's
    share below the reference in ``flagged`` steps is the tail's, not low activity."""
    comp = comp.assign(_pid=np.arange(len(comp)))
    pairs = overlap_samples(samples, comp[["step", "phase", "start", "end"]].assign(
        step=comp["_pid"]), width)
    # overlap_samples carries the phase row's "step" column: here it holds the phase row id
    pairs = pairs.rename(columns={"step": "_pid"})
    pairs["_pid"] = pairs["_pid"].astype(int)
    pairs["row"] = comp["row"].to_numpy()[pairs["_pid"].to_numpy()]
    pairs["step"] = comp["step"].to_numpy()[pairs["_pid"].to_numpy()]
    t0 = float(samples["ts"].min())
    pairs["tbin"] = np.floor((pairs["ts"].astype(float) - t0) / width + 0.5).astype(np.int64)
    pairs["key"] = list(zip(pairs["node"].astype(str), pairs["gpu"].astype(int), strict=True))
    judged = _classify(pairs, cfg, no_tail)
    compute = judged[judged["cause"] == "compute"]
    refs = _references(compute, cfg)
    phase_len = (comp["end"] - comp["start"]).to_numpy(float)
    judged = judged.assign(k=judged["key"].map(kidx), aw=judged["act"] * judged["overlap_s"])
    judged = judged[judged["k"].notna()]
    per = judged.groupby(["_pid", "k", "cause"])[["overlap_s", "aw"]].sum().reset_index()
    seen = per.groupby(["_pid", "k"])["overlap_s"].sum()
    pids = per["_pid"].to_numpy(int)
    ks = per["k"].to_numpy(int)
    length = phase_len[pids]
    total = seen.reindex(list(zip(pids, ks, strict=True))).to_numpy(float)
    scale = np.where(total > length, length / np.where(total > 0, total, 1.0), 1.0)
    rows = comp["row"].to_numpy(int)[pids]
    secs = per["overlap_s"].to_numpy(float) * scale
    causes = per["cause"].to_numpy()
    phases = comp["phase"].to_numpy()[pids]
    for cause in set(causes) - {"compute"}:
        hit = causes == cause
        np.add.at(acc[cause], (rows[hit], ks[hit]), secs[hit])
    # compute: the share of the reference activity reached is productive, the rest is not
    hit = causes == "compute"
    w = per["overlap_s"].to_numpy(float)[hit]
    act = np.divide(per["aw"].to_numpy(float)[hit], w, out=np.zeros_like(w), where=w > 0)
    auto_min = cfg.get_float("auto_min")
    ref = np.array([refs.get(str(ph), auto_min) for ph in phases[hit]], dtype=float)
    ok = (ref > 0) & np.isfinite(act)
    share = np.where(ok, np.minimum(1.0, act / np.where(ref > 0, ref, 1.0)), 0.0)
    np.add.at(acc["productive"], (rows[hit], ks[hit]), secs[hit] * share)
    steps_hit = comp["step"].to_numpy(int)[pids][hit]
    tail = (phases[hit] == "gen") & np.isin(steps_hit, list(flagged))
    for cause, where in (("low_activity", ~tail), ("rollout_long_tail", tail)):
        np.add.at(acc[cause], (rows[hit][where], ks[hit][where]),
                  (secs[hit] * (1.0 - share))[where])
    # seconds of a phase no sample of a GPU covers: nobody knows what it did
    covered = np.zeros((len(comp), len(kidx)))
    for (pid, k), v in seen.items():
        covered[int(pid), int(k)] = min(float(v), phase_len[int(pid)])
    missing = np.clip(phase_len[:, None] - covered, 0.0, None)
    np.add.at(acc["unattributed"], comp["row"].to_numpy(int), missing)


def totals(led: pd.DataFrame) -> dict[str, Any]:
    """The run's sums: the ``goodput`` object of ``analyze --json``.

    ``{"gpu_seconds_total", "productive", "lost": {cause: seconds}, "unattributed",
    "goodput_share", "gpus", "steps"}``; zeros for an empty ledger.
    """
    total = float(led["wall"].sum()) if len(led) else 0.0
    out: dict[str, Any] = {
        "gpu_seconds_total": round(total, 3),
        "productive": round(float(led["productive"].sum()) if len(led) else 0.0, 3),
        "lost": {c: round(float(led[c].sum()) if len(led) else 0.0, 3) for c in LOST_CAUSES},
        "unattributed": round(float(led["unattributed"].sum()) if len(led) else 0.0, 3),
    }
    out["goodput_share"] = round(out["productive"] / total, 4) if total > 0 else None
    out["gpus"] = int(led.groupby(["node", "gpu"]).ngroups) if len(led) else 0
    out["steps"] = int(led.loc[~led["tail"].astype(bool), "step"].nunique()) if len(led) else 0
    return out


def imbalance(led: pd.DataFrame) -> float:
    """The largest relative gap between a row's causes and its wall seconds (0 = adds up)."""
    if len(led) == 0:
        return 0.0
    summed = led[list(CAUSES)].sum(axis=1)
    total = float(led["wall"].sum())
    return abs(float(summed.sum()) - total) / total if total > 0 else 0.0


def by_cause(led: pd.DataFrame, group: list[str] | None = None) -> pd.DataFrame:
    """Seconds per cause, summed over ``group`` columns (e.g. ``["node", "gpu"]``), long form:
    the group columns, ``cause``, ``seconds``."""
    group = list(group or [])
    if len(led) == 0:
        return pd.DataFrame(columns=[*group, "cause", "seconds"])
    if group:
        wide = led.groupby(group)[list(CAUSES)].sum().reset_index()
    else:
        wide = led[list(CAUSES)].sum().to_frame().T
    long = wide.melt(id_vars=group, value_vars=list(CAUSES), var_name="cause",
                     value_name="seconds")
    return long.reset_index(drop=True)


def crash_end(steps: list[StepRecord], events: list[Event]) -> float | None:
    """The time of the last crash logged after the last step line, or None (no crash tail)."""
    ends = [float(s.end_time) for s in steps if s.end_time is not None]
    if not ends:
        return None
    last = max(ends)
    times = [float(e.time) for e in events
             if e.kind in CRASH_KINDS and e.time is not None and e.time > last]
    return max(times) if times else None


def document(
    steps: list[StepRecord],
    gpu: pd.DataFrame,
    events: list[Event] | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    gpu_hour_cost: float | None = None,
    run_end: float | None = None,
    **ledger_kw: Any,
) -> dict[str, Any]:
    """The ``goodput`` object of ``analyze --json``: :func:`totals`, each cause's share of the
    GPU-seconds (``shares``), per-GPU sums (``per_gpu``) and, with ``gpu_hour_cost`` (money per
    GPU-hour), the cost of the whole and of each lost cause (``cost``). ``run_end`` defaults to
    the last crash logged after the last step (:func:`crash_end`); ``ledger_kw`` go to
    :func:`ledger` (``tail_steps``, ``flagged_tail``), or ``led``: the ledger already made."""
    events = list(events or [])
    if run_end is None:
        run_end = crash_end(steps, events)
    led = ledger_kw.pop("led", None)
    if led is None:
        led = ledger(steps, gpu, events, config=config, run_end=run_end, **ledger_kw)
    out = totals(led)
    total = out["gpu_seconds_total"]
    secs = {"productive": out["productive"], **out["lost"], "unattributed": out["unattributed"]}
    out["shares"] = {c: (round(v / total, 4) if total > 0 else None) for c, v in secs.items()}
    per = by_cause(led, ["node", "gpu"])
    out["per_gpu"] = [
        {"node": str(node), "gpu": int(g),
         **{str(r.cause): round(float(r.seconds), 3) for r in grp.itertuples()}}
        for (node, g), grp in per.groupby(["node", "gpu"], sort=True)
    ]
    out["gpu_hour_cost"] = gpu_hour_cost
    if gpu_hour_cost is not None:
        rate = float(gpu_hour_cost) / 3600.0
        out["cost"] = {"total": round(total * rate, 2),
                       "lost": round((total - out["productive"]) * rate, 2),
                       "by_cause": {c: round(v * rate, 2) for c, v in secs.items()}}
    else:
        out["cost"] = None
    return out
