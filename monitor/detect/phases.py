"""Phase detectors over the step records: phase_imbalance, comm_heavy, reshard_spike."""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.analysis import signature as S
from monitor.detect import window as W
from monitor.detect.async_pools import ctx_mode
from monitor.detect.detector_base import Context, make_flag, step_episodes, steps_text
from monitor.detect.nccl_time import nccl_step_share
from monitor.logs.keys import generation_seconds, reshard_is_derived, timers
from monitor.logs.modes import waits_in_gen
from monitor.records import Flag

#: Phases judged by their own detectors, left out of the share-jump rule.
#: What each reading needs of the job (``monitor.detect.premises``): communication can only be
#: heavy where more than one GPU talks; the phase-share and one-step readings need only the
#: step timers they read.
PREMISES: dict[str, tuple[str, ...]] = {
    "comm_heavy": ("several_gpus",),
    "phase_imbalance": (),
    "phase_imbalance.timer_share": ("serial_phases",),
    "reshard_spike": (),
}
OWN_DETECTOR_PHASES = ("reshard", "rollout_wait", "comm", "other", "testing", "save_checkpoint")


def _from_breakdown(ctx: Context) -> pd.Series:
    """Per step (aligned with ``ctx.sf``): True where the step came from a guide-style
    breakdown line (``Step N: total=... | actor_gen=... | critic_score=...``)."""
    source = {int(s.step): s.source == "breakdown" for s in ctx.steps}
    return ctx.sf["step"].map(lambda s: source.get(int(s), False)).astype(bool)


def detect_phase_imbalance(ctx: Context) -> list[Flag]:
    """Generation against the critic's scoring out of proportion, or a phase's share jumping.

    Ratio rules (only where a critic runs: a ``values``/``critic_score`` phase; a rule-based
    ``reward`` is not a critic, so GRPO without one never trips them):

    - the guide's rule, in its breakdown format: ``actor_gen : critic_score`` at 4:1 or more
      (``gen_over_critic_max``); in verl's own keys (``timing_s/gen`` against
      ``timing_s/values``) only when ``verl_gen_over_values_max`` is set (see defaults.yaml);
    - scoring longer than generation (``values_over_gen_max``), in either format.

    Then a phase whose share of the step jumps against its own history
    (:func:`_share_jumps`), and the phases in which the GPUs wait on the host
    (:func:`_waiting_phases`).
    """
    cfg = ctx.cfg("phase_imbalance")
    sf = ctx.sf
    if len(sf) < 2:
        return []
    gen = W.phase(sf, "gen")
    if waits_in_gen(ctx_mode(ctx)):
        # one-step-off, separate-async, fully-async trainer: "gen" is the wait for samples,
        # not generation; pool_imbalance judges it
        gen = gen * np.nan
    values = W.phase(sf, "values")
    critic = values.where(values > 0)
    flags = _generation_over_critic(ctx, cfg, gen, critic) + _slow_scoring(ctx, cfg, gen, critic)
    jumps = _share_jumps(ctx, cfg, flags)
    jumps += _waiting_phases(ctx, cfg, flags + [j[0] for j in jumps])
    merged = flags + _merge_same_cause(jumps)
    return merged + _timer_shares(ctx, cfg, merged)


#: Phases in which verl's synchronous trainer keeps the GPUs from training while they run
#: (the reward and the advantages on the driver, validation, checkpoint saves), with what the
#: timers say of each.
_TIMER_SHARE_WHAT: dict[str, str] = {
    "reward": "the reward is scored on the driver while the GPUs wait",
    "adv": "the advantages are computed on the driver while the GPUs wait",
    "testing": "validation runs instead of training",
    "save_checkpoint": "the checkpoint is written while the GPUs wait",
}


def _timer_shares(ctx: Context, cfg, already: list[Flag]) -> list[Flag]:
    """A phase that holds a large share of the wall time by the step timers alone, without GPU
    samples (``timer_share_min`` of the wall: the step timer, validation and checkpoints);
    a phase another phase_imbalance flag already names for those steps is left to it."""
    min_share = cfg.get_float("timer_share_min")
    sf = ctx.sf
    if not min_share > 0 or len(sf) == 0:
        return []
    wall = W.core_total(sf).astype(float)
    for extra in ("testing", "save_checkpoint"):
        if extra in sf.columns:
            wall = wall + sf[extra].astype(float).fillna(0.0)
    out: list[Flag] = []
    for name, what in _TIMER_SHARE_WHAT.items():
        if name not in sf.columns or not sf[name].notna().any():
            continue
        share = sf[name].astype(float).fillna(0.0) / wall.where(wall > 0)
        cond = [None if pd.isna(sh) else bool(sh >= min_share) for sh in share]
        eps = step_episodes(ctx, cond, cfg.get_int("open_after_steps"),
                            cfg.get_int("close_after_steps"))
        if not eps or not ctx.holds("phase_imbalance.timer_share"):
            continue
        for ep, start, end, rng in eps:
            if any(f.scope.get("phase") == name and (f.end is None or f.end >= start)
                   and (end is None or end >= f.start) for f in already):
                continue
            sl = slice(ep.onset, ep.last + 1)
            secs = float(sf[name].astype(float).iloc[sl].mean())
            whole = float(wall.iloc[sl].mean())
            share_all = float(sf[name].astype(float).iloc[sl].sum() / wall.iloc[sl].sum())
            sev = "critical" if share_all >= cfg.get_float("critical_timer_share") else "warning"
            out.append(make_flag(
                "phase_imbalance", sev, start, end, {"phase": name, "steps": rng},
                f"{name} took {share_all * 100:.0f}% of the wall time, {steps_text(rng)} "
                f"({secs:.1f} s of {whole:.1f} s a step, by verl's timers, timing_s/{name}): "
                f"{what}.", advice=_timer_share_advice(ctx, name),
            ))
    return out


def _timer_share_advice(ctx: Context, phase: str) -> list[str]:
    """Advice for a phase the timers alone show large: the phase's own levers (no signature:
    no GPU sample says how the GPUs spent it), without the advice for a share that jumped."""
    out = [a for a in ctx.advice("phase_imbalance", phase, None) if "jumped" not in a]
    if phase == "adv":
        out.insert(0, "The advantages are computed on the driver's CPU over the whole batch "
                      "(data.train_batch_size x actor_rollout_ref.rollout.n responses): a large "
                      "share points at a custom estimator (algorithm.adv_estimator) or a very "
                      "large batch.")
    return out


def _generation_over_critic(ctx: Context, cfg, gen: pd.Series, critic: pd.Series) -> list[Flag]:
    """Generation at ``gen_over_critic_max`` (guide format) or ``verl_gen_over_values_max``
    (verl's keys, off unless set) times the critic's scoring or more."""
    sf = ctx.sf
    breakdown = _from_breakdown(ctx)
    gen_over = gen.where(gen > 0) / critic
    guide_lim = cfg.get_float("gen_over_critic_max")
    verl_lim = cfg.get_float("verl_gen_over_values_max")
    lim = pd.Series(np.where(breakdown, guide_lim, verl_lim if verl_lim > 0 else np.inf),
                    index=sf.index)
    flags: list[Flag] = []
    cond = [None if pd.isna(r) else bool(r >= li) for r, li in zip(gen_over, lim, strict=True)]
    for ep, start, end, rng in step_episodes(ctx, cond, cfg.get_int("open_after_steps"),
                                             cfg.get_int("close_after_steps")):
        sl = slice(ep.onset, ep.last + 1)
        g, c = float(gen.iloc[sl].mean()), float(critic.iloc[sl].mean())
        ratio = g / c if c > 0 else float(gen_over.iloc[sl].mean())
        guide = bool(breakdown.iloc[sl].any())
        gen_name, critic_name = (("actor_gen", "critic_score") if guide
                                 else ("generation", "the critic's scoring"))
        limit = guide_lim if guide else verl_lim
        sev = "critical" if ratio >= cfg.get_float("critical_gen_over_critic") else "warning"
        sig = _phase_signature(ctx, "gen", ep.onset, ep.last)
        flags.append(make_flag(
            "phase_imbalance", sev, start, end, {"phase": "gen", "steps": rng},
            f"{_cap(gen_name)} took {g:.1f} s per step vs {c:.1f} s for {critic_name} "
            f"({ratio:.1f}:1, {limit:g}:1 or more is out of proportion), {steps_text(rng)}: "
            "generation dominates the step; speed the rollout up or size the critic down."
            + _sig_text(sig),
            advice=ctx.advice("phase_imbalance", "gen", sig),
        ))
    return flags


def _slow_scoring(ctx: Context, cfg, gen: pd.Series, critic: pd.Series) -> list[Flag]:
    """The critic's scoring longer than generation (``values_over_gen_max``)."""
    slow = critic / gen.where(gen > 0)
    score_lim = cfg.get_float("values_over_gen_max")
    flags: list[Flag] = []
    cond = [None if pd.isna(r) else bool(r > score_lim) for r in slow]
    for ep, start, end, rng in step_episodes(ctx, cond, cfg.get_int("open_after_steps"),
                                             cfg.get_int("close_after_steps")):
        sl = slice(ep.onset, ep.last + 1)
        g = float(gen.where(gen > 0).iloc[sl].mean())
        c = float(critic.iloc[sl].mean())
        sev = ("critical" if float(slow.iloc[sl].mean())
               >= cfg.get_float("critical_values_over_gen") else "warning")
        sig = _phase_signature(ctx, "values", ep.onset, ep.last)
        flags.append(make_flag(
            "phase_imbalance", sev, start, end, {"phase": "values", "steps": rng},
            f"The critic's scoring took longer than generation: {c:.1f} s per step vs {g:.1f} s "
            f"(1:{g / c:.2f}), {steps_text(rng)}: the critic is the bottleneck."
            + _sig_text(sig),
            advice=ctx.advice("phase_imbalance", "values", sig),
        ))
    return flags


def _share_jumps(ctx: Context, cfg, flags: list[Flag]) -> list[tuple[Flag, object, float]]:
    """A phase whose share of the step jumps against its own history (a frozen median + MAD
    baseline that leaves out the warm-up), and whose seconds grew too. A jump in a phase the
    ratio rules already flagged (``flags``) joins that flag's evidence instead."""
    sf = ctx.sf
    total = W.core_total(sf)
    window = cfg.get_int("history_steps")
    k = cfg.get_float("mad_k")
    min_jump = cfg.get_float("share_jump_min")
    jump_ratio = cfg.get_float("share_jump_ratio")

    def limit(med, mad):
        return np.maximum(med + k * 1.4826 * mad, np.maximum(med + min_jump, med * jump_ratio))

    jumps: list[tuple[Flag, object, float]] = []
    warm = _warmup_mask(ctx)
    for name in [c for c in sf.columns if c in W.ALL_PHASES and c not in OWN_DETECTOR_PHASES]:
        seconds = sf[name].astype(float).where(~warm)
        share = seconds / total.where(total > 0)
        med, mad = W.frozen_baseline(share, window, cfg.get_int("min_history_steps"),
                                     lambda v, m, d: v > limit(m, d))
        lim = limit(med, mad)
        grew = _grew_in_seconds(seconds, share, med, lim, window)
        cond = [None if pd.isna(s) or pd.isna(m) else bool(s > li and g)
                for s, m, li, g in zip(share, med, lim, grew, strict=True)]
        for ep, start, end, rng in step_episodes(
            ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
        ):
            sl = slice(ep.onset, ep.last + 1)
            now_share = float(share.iloc[sl].mean())
            before = float(med.iloc[ep.onset])
            sev = ("critical" if now_share - before >= cfg.get_float("critical_share_jump")
                   else "warning")
            text = (f"{name} took {now_share * 100:.0f}% of the step, {steps_text(rng)}, vs "
                    f"{before * 100:.0f}% in the steps before.")
            group = ("values", "reward") if name in ("values", "reward") else (name,)
            same = [f for f in flags + [j[0] for j in jumps] if f.scope.get("phase") in group
                    and (f.end is None or f.end >= start) and (end is None or end >= f.start)]
            if same:  # the ratio rule already flagged this phase: add the share to its evidence
                same[0].evidence = same[0].evidence.rstrip(".") + "; " + text
                continue
            sig = _phase_signature(ctx, name, ep.onset, ep.last)
            jumps.append((make_flag(
                "phase_imbalance", sev, start, end, {"phase": name, "steps": rng},
                text + _sig_text(sig), advice=ctx.advice("phase_imbalance", name, sig),
            ), sig, now_share - before))
    return jumps


def _warmup_mask(ctx: Context) -> pd.Series:
    """Per step (aligned with ``ctx.sf``): True for the run's warm-up steps, the first
    ``goodput.warmup_steps`` of it (compilation, allocation, caches). A share measured there
    is no baseline for the steps after it, nor judged against one."""
    n = max(0, ctx.config.section("goodput").get_int("warmup_steps", 1))
    return pd.Series(np.arange(len(ctx.sf)) < n, index=ctx.sf.index)


def _grew_in_seconds(seconds: pd.Series, share: pd.Series, med: pd.Series, lim: pd.Series,
                     window: int) -> list[bool]:
    """Per step: whether the phase took more seconds than the median of the steps its share
    baseline holds (the last ``window`` steps whose share was not a jump). A share that rose
    only because the other phases shrank (shorter responses, a faster rollout) is no
    imbalance of this phase."""
    hist: list[float] = []
    out: list[bool] = []
    for sec, sh, m, li in zip(seconds, share, med, lim, strict=True):
        recent = hist[-window:]
        out.append(bool(recent) and pd.notna(sec) and float(sec) > float(np.median(recent)))
        if pd.notna(sh) and pd.notna(sec) and (pd.isna(m) or not sh > li):
            hist.append(float(sec))
    return out


def _waiting_phases(ctx: Context, cfg, already: list[Flag]) -> list[tuple[Flag, object, float]]:
    """Phases in which the GPUs wait on the host (CPU-bound) or on PCIe copies, taking a large
    share of the step: judged from the first steps on, no history needed (a run that starts
    with a slow reward function or with offload has no "before")."""
    min_share = cfg.get_float("waiting_share_min")
    if not min_share > 0:
        return []
    sig = ctx.signatures
    sf = ctx.sf
    if len(sig) == 0 or len(sf) == 0 or "step" not in sig.columns:
        return []
    total = W.core_total(sf)
    out: list[tuple[Flag, object, float]] = []
    for name in [c for c in sf.columns if c in W.ALL_PHASES and c not in OWN_DETECTOR_PHASES
                 and c != "gen"]:
        rows = sig[sig["phase"] == name]
        if len(rows) == 0:
            continue
        # the signature most samples of the phase show in each step
        per_step = (rows.groupby(["step", "signature"])["n"].sum().reset_index()
                    .sort_values("n", ascending=False, kind="stable")
                    .drop_duplicates("step").set_index("step")["signature"])
        share = sf[name].astype(float) / total.where(total > 0)
        waits = sf["step"].map(per_step).isin(_SHARED_CAUSES)
        cond = [None if pd.isna(sh) else bool(w and sh >= min_share)
                for sh, w in zip(share, waits, strict=True)]
        for ep, start, end, rng in step_episodes(
            ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
        ):
            if any(f.scope.get("phase") == name and (f.end is None or f.end >= start)
                   and (end is None or end >= f.start) for f in already):
                continue
            now_share = float(share.iloc[ep.onset:ep.last + 1].mean())
            found = _phase_signature(ctx, name, ep.onset, ep.last)
            sev = ("critical" if now_share >= cfg.get_float("critical_share_jump")
                   else "warning")
            out.append((make_flag(
                "phase_imbalance", sev, start, end, {"phase": name, "steps": rng},
                f"{name} took {now_share * 100:.0f}% of the step, {steps_text(rng)}, while the "
                "GPUs waited." + _sig_text(found),
                advice=ctx.advice("phase_imbalance", name, found),
            ), found, now_share))
    return out


#: Signatures whose share jumps in several phases at once are one cause (offload copies in
#: every log-prob pass, the host busy in several phases): one flag tells them.
_SHARED_CAUSES = ("pcie_bound", "cpu_bound")


def _merge_same_cause(jumps: list[tuple[Flag, object, float]]) -> list[Flag]:
    """Share-jump flags overlapping in time with the same waiting signature become one flag,
    led by the phase whose share rose most; the others' evidence is added to it."""
    out: list[Flag] = []
    used: set[int] = set()
    order = sorted(range(len(jumps)), key=lambda i: -jumps[i][2])
    for i in order:
        if i in used:
            continue
        flag, sig, _ = jumps[i]
        used.add(i)
        name = getattr(sig, "name", None)
        if name in _SHARED_CAUSES:
            for j in order:
                other, osig, _ = jumps[j]
                if j in used or getattr(osig, "name", None) != name:
                    continue
                if (flag.end is None or flag.end >= other.start) and (
                        other.end is None or other.end >= flag.start):
                    used.add(j)
                    flag.evidence += " Also: " + other.evidence
                    flag.start = min(flag.start, other.start)
                    flag.end = None if flag.end is None or other.end is None else max(
                        flag.end, other.end)
                    if other.severity == "critical":
                        flag.severity = "critical"
        out.append(flag)
    return sorted(out, key=lambda f: f.start)


def _phase_signature(ctx: Context, phase: str, onset: int, last: int) -> S.Signature | None:
    """The signature of ``phase`` over the steps ``onset..last`` (rows of ``ctx.sf``)."""
    sf = ctx.sf
    lo, hi = float(sf["start"].iloc[onset]), float(sf["end"].iloc[last])
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    return ctx.signature_between(lo, hi, phases=(phase,))


def _sig_text(sig: S.Signature | None) -> str:
    return " " + sig.evidence() if sig is not None else ""


def gpu_comm_seconds(ctx: Context) -> pd.Series:
    """Per step (aligned with ``ctx.sf``): seconds of the update phases that look like collectives.

    verl's console log folds the gradient collectives into ``timing_s/update_actor``. On the
    GPUs they show as high utilization with few SMs active (the kernels wait on NVLink/IB). The
    time in ``update_actor``/``update_critic`` with that signature is counted; when the
    forward-only phases (``old_log_prob``, ``ref``, ``values``) show it too, the signature means
    tiny kernels rather than communication and the step is left unknown (NaN).
    """
    cfg = ctx.cfg("comm_heavy")
    sf = ctx.sf
    out = pd.Series(np.nan, index=sf.index, dtype=float)
    df = ctx.act
    if len(df) == 0 or len(sf) == 0 or df["sm_active"].notna().sum() == 0:
        return out
    df = df[df["phase"].notna() & df["sm_active"].notna()]
    if len(df) == 0:
        return out
    bin_s = max(ctx.sample_interval, 1e-3)
    tb = np.floor(df["ts"].to_numpy(float) / bin_s).astype(np.int64)
    fleet = pd.DataFrame({"step": df["step"].to_numpy(), "phase": df["phase"].to_numpy(),
                          "tb": tb, "util": df["util"].to_numpy(float),
                          "sm": df["sm_active"].to_numpy(float)})
    fleet = fleet.groupby(["step", "phase", "tb"], sort=False)[["util", "sm"]].mean().reset_index()
    sig = (fleet["util"] >= cfg.get_float("signature_util_min")) & (
        fleet["sm"] <= cfg.get_float("signature_sm_max")
    )
    fleet["sig"] = sig
    update = fleet[fleet["phase"].isin(("update_actor", "update_critic"))]
    forward = fleet[fleet["phase"].isin(("old_log_prob", "ref", "values"))]
    comm_s = update.groupby("step")["sig"].sum() * bin_s
    fwd_share = forward.groupby("step")["sig"].mean()
    limit = cfg.get_float("forward_signature_max")
    pos = {int(s): i for i, s in enumerate(sf["step"].to_numpy())}
    for step, secs in comm_s.items():
        if int(step) not in pos:
            continue
        fs = fwd_share.get(step, np.nan)
        if pd.notna(fs) and fs > limit:
            continue
        out.iloc[pos[int(step)]] = float(secs)
    return out


def detect_comm_heavy(ctx: Context) -> list[Flag]:
    """Communication above its share of the step (comm phase, GPU signature, or NCCL share)."""
    cfg = ctx.cfg("comm_heavy")
    sf = ctx.sf
    if len(sf) == 0:
        return []
    total = W.core_total(sf)
    comm = W.phase(sf, "comm")
    from_gpu = comm.isna().all()
    if from_gpu:
        comm = gpu_comm_seconds(ctx)
    comm_share = comm / total.where(total > 0)
    nccl = W.step_metrics(ctx.steps, cfg.get_str("nccl_share_metric"))
    nccl = nccl.reindex(sf["step"].to_numpy()).reset_index(drop=True)
    inspector = nccl_step_share(ctx)
    from_inspector = nccl.isna().all() and inspector["share"].notna().any()
    if from_inspector:
        nccl = inspector["share"]
    c_lim = cfg.get_float("comm_share_max")
    n_lim = cfg.get_float("nccl_share_max")
    cond = []
    for c, n in zip(comm_share, nccl, strict=True):
        if pd.isna(c) and pd.isna(n):
            cond.append(None)
        else:
            cond.append(bool((pd.notna(c) and c > c_lim) or (pd.notna(n) and n > n_lim)))
    flags = []
    for ep, start, end, rng in step_episodes(
        ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
    ):
        sl = slice(ep.onset, ep.last + 1)
        parts = []
        worst = 0.0
        if comm_share.iloc[sl].notna().any():
            c = float(comm_share.iloc[sl].mean())
            worst = max(worst, c)
            how = (" (update phases at high utilization with few SMs active)" if from_gpu
                   else "")
            parts.append(f"communication took {c * 100:.0f}% of the step{how}, limit "
                         f"{c_lim * 100:.0f}%")
        if nccl.iloc[sl].notna().any():
            n = float(nccl.iloc[sl].mean())
            worst = max(worst, n)
            if from_inspector:
                secs = float(inspector["seconds"].iloc[sl].mean())
                top = inspector["top"].iloc[sl].dropna()
                what = f", mostly {top.mode().iloc[0]}" if len(top) else ""
                parts.append(f"the NCCL Inspector timed {secs:.2f} s of collectives per GPU "
                             f"per step{what}: {n * 100:.0f}% of the step (bad above "
                             f"{n_lim * 100:.0f}%)")
            else:
                parts.append(f"NCCL time was {n * 100:.0f}% of the window (bad above "
                             f"{n_lim * 100:.0f}%)")
        sev = "critical" if worst >= cfg.get_float("critical_share") else "warning"
        flags.append(make_flag(
            "comm_heavy", sev, start, end, {"phase": "comm", "steps": rng},
            f"{_cap(steps_text(rng))}: " + "; ".join(parts) + ".",
        ))
    return flags


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def reshard_series(ctx: Context) -> pd.Series:
    """Reshard seconds per step (aligned with ``ctx.sf``), from the phase or version fallbacks.

    verl 0.6-0.7.0 logs no reshard timer: approximate as ``gen`` less its generation
    (``monitor.logs.keys.generation_seconds``). Before 0.4.1 the switch hides inside gen and
    there is nothing to read (NaN).
    """
    sf = ctx.sf
    out = W.phase(sf, "reshard")
    if out.notna().any():
        return out
    gen = W.phase(sf, "gen")
    by_step: dict[int, float] = {}
    for rec in ctx.steps:
        seconds = generation_seconds(timers(rec.metrics))
        if seconds is not None:
            by_step[int(rec.step)] = seconds
    gs = sf["step"].map(lambda n: by_step.get(int(n))).astype(float)
    if gs.notna().any():
        return (gen - gs).clip(lower=0.0)
    # HybridEngine / ParameterSynchronizer events with seconds, attributed to the step they end in
    ev = [(e.time, float(e.data.get("seconds"))) for e in ctx.events
          if e.kind == "reshard" and e.time is not None and e.data.get("seconds") is not None]
    if ev:
        ends = sf["end"].to_numpy(float)
        idx = np.searchsorted(ends, [t for t, _ in ev], side="left")
        vals = pd.Series(np.nan, index=sf.index, dtype=float)
        for i, (_, secs) in zip(idx, ev, strict=True):
            if i < len(vals):
                vals.iloc[i] = secs if pd.isna(vals.iloc[i]) else vals.iloc[i] + secs
        return vals
    return out


def reshard_memory_peak(ctx: Context, min_samples: int = 3) -> pd.Series:
    """Per step (aligned with ``ctx.sf``): peak share of GPU memory used during the reshard.

    Steps whose reshard holds fewer than ``min_samples`` samples of a GPU are left NaN: a
    sub-second switch is not sampled well enough to judge its peak.
    """
    sf = ctx.sf
    out = pd.Series(np.nan, index=sf.index, dtype=float)
    df = ctx.act
    if len(df) == 0 or "mem_used_bytes" not in df.columns:
        return out
    sub = df[(df["phase"] == "reshard") & (df["mem_total_bytes"] > 0)]
    if len(sub) == 0:
        return out
    frac = sub["mem_used_bytes"] / sub["mem_total_bytes"]
    counts = sub.groupby(["step", "node", "gpu"]).size().groupby(level="step").min()
    peak = frac.groupby(sub["step"]).max()
    peak = peak[counts.reindex(peak.index).fillna(0) >= min_samples]
    pos = {int(s): i for i, s in enumerate(sf["step"].to_numpy())}
    for step, val in peak.items():
        if int(step) in pos:
            out.iloc[pos[int(step)]] = float(val)
    return out


def detect_reshard_spike(ctx: Context) -> list[Flag]:
    """Weight sync far above its rolling median (median + k*MAD, with a floor), or a memory jump."""
    cfg = ctx.cfg("reshard_spike")
    sf = ctx.sf
    if len(sf) < 2:
        return []
    rs = reshard_series(ctx)
    derived = _reshard_derived(ctx)
    k = cfg.get_float("mad_k")
    floor_s = cfg.get_float("floor_seconds")
    floor_r = cfg.get_float("floor_ratio")

    def limit(med, mad):
        return np.maximum(med + k * 1.4826 * mad, np.maximum(med + floor_s, med * floor_r))

    med, mad = W.frozen_baseline(rs, cfg.get_int("history_steps"), cfg.get_int("min_history_steps"),
                                 lambda v, m, d: v > limit(m, d))
    lim = limit(med, mad)
    mem_peak = reshard_memory_peak(ctx, cfg.get_int("memory_min_samples"))
    jump = cfg.get_float("memory_jump_fraction")
    mem_med, _ = W.frozen_baseline(mem_peak, cfg.get_int("history_steps"),
                                   cfg.get_int("min_history_steps"), lambda v, m, d: v > m + jump)
    mem = (mem_peak - mem_med).where(mem_peak >= cfg.get_float("memory_peak_min"))
    mem_lim = jump
    cond = []
    for r, li, mj in zip(rs, lim, mem, strict=True):
        hit_t = pd.notna(r) and pd.notna(li) and r > li
        hit_m = pd.notna(mj) and mj > mem_lim
        if (pd.isna(r) or pd.isna(li)) and pd.isna(mj):
            cond.append(None)
        else:
            cond.append(bool(hit_t or hit_m))
    flags = []
    for ep, start, end, rng in step_episodes(
        ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
    ):
        sl = slice(ep.onset, ep.last + 1)
        parts = []
        peak = float(rs.iloc[sl].max()) if rs.iloc[sl].notna().any() else float("nan")
        base = float(med.iloc[ep.onset]) if pd.notna(med.iloc[ep.onset]) else float("nan")
        if pd.notna(peak) and pd.notna(base):
            def _s(x: float) -> str:
                return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"
            parts.append(f"weight sync (reshard) took up to {_s(peak)} vs a rolling median of "
                         f"{_s(base)}")
        if mem.iloc[sl].notna().any() and float(mem.iloc[sl].max()) > mem_lim:
            parts.append(f"GPU memory peaked at {float(mem_peak.iloc[sl].max()) * 100:.0f}% of "
                         f"capacity during the switch, {float(mem.iloc[sl].max()) * 100:.0f} "
                         "points above its usual peak")
        ratio = peak / base if pd.notna(peak) and base and base > 0 else 0.0
        sev = "critical" if ratio >= cfg.get_float("critical_ratio") else "warning"
        note = ""
        if derived and not (mem.iloc[sl].notna().any() and float(mem.iloc[sl].max()) > mem_lim):
            # an estimate that also holds the batch's gathering: never critical on its own
            sev = "warning"
            note = (" (estimated: verl prints no sync timer here, so the sync is gen less the"
                    " slowest sample's generation, tool calls and scoring)")
        flags.append(make_flag(
            "reshard_spike", sev, start, end, {"phase": "reshard", "steps": rng},
            f"{_cap(steps_text(rng))}: " + "; ".join(parts or ["reshard spike"]) + note + ".",
        ))
    return flags


def _reshard_derived(ctx: Context) -> bool:
    """True when the run's weight-sync times are derived (``gen`` less its generation) on
    every step that has one, rather than read from a sync timer."""
    if W.phase(ctx.sf, "reshard").isna().all():  # reshard_series' fallbacks
        return any(generation_seconds(timers(s.metrics)) is not None for s in ctx.steps)
    with_sync = [s for s in ctx.steps if "reshard" in s.phases]
    return bool(with_sync) and all(reshard_is_derived(s.metrics) for s in with_sync)
