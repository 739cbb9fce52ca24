"""io_starvation: the GPUs wait on data loading or host work."""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.detect import window as W
from monitor.detect.detector_base import (
    Context,
    episode_times,
    make_flag,
    step_episodes,
    steps_text,
)
from monitor.detect.persistence import episodes
from monitor.records import TRAINING_PHASES, Flag

#: What each reading needs of the job (``monitor.detect.premises``): the GPUs can wait on data
#: loading only in a trainer that loads batches (not the fully-async trainer, which takes its
#: samples from the rollouter's queue); the wall time before the step timer is the batch fetch
#: only in a trainer that fetches its batch there (verl's synchronous trainer; not the
#: one-step-off or V1 trainers); the swing reading reads GPU samples.
PREMISES: dict[str, tuple[str, ...]] = {
    "io_starvation": ("loads_batches",),
    "io_starvation.data_wait": ("fetches_batches_before_timer",),
    "io_starvation.host_swing": ("gpu_samples",),
}


def _host_windows(ctx: Context) -> pd.DataFrame:
    host = ctx.host
    nwin = len(ctx.windows)
    cols = ["cpu_max", "iowait"]
    if host is None or len(host) == 0 or nwin == 0:
        return pd.DataFrame(np.nan, index=range(nwin), columns=cols)
    win = W.assign_windows(pd.to_numeric(host["ts"], errors="coerce"), ctx.windows)
    cpu = pd.to_numeric(host["cpu_max_core_pct"], errors="coerce")
    h = pd.DataFrame({"win": win, "cpu_max": cpu,
                      "iowait": pd.to_numeric(host.get("iowait_pct"), errors="coerce")
                      if "iowait_pct" in host.columns else np.nan})
    h = h[h["win"] >= 0]
    return h.groupby("win")[cols].mean().reindex(range(nwin))


def detect_io_starvation(ctx: Context) -> list[Flag]:
    """Deep GPU troughs while a host core is pegged or iowait high; or unexplained time grows."""
    cfg = ctx.cfg("io_starvation")
    flags: list[Flag] = []
    # (a) GPUs swing with deep troughs while the host is the bottleneck
    df = ctx.act_windowed
    nwin = len(ctx.windows)
    if len(df) and nwin:
        sub = df[df["win"] >= 0]
        if sub["phase"].notna().any():
            sub = sub[sub["phase"].isin(TRAINING_PHASES)]
        bin_s = max(ctx.sample_interval, 1e-3)
        tb = np.floor(sub["ts"].to_numpy(float) / bin_s).astype(np.int64)
        fleet = pd.DataFrame({"tb": tb, "win": sub["win"].to_numpy(), "act": sub["act"].to_numpy()})
        fleet = fleet.groupby(["win", "tb"])["act"].mean().reset_index()
        g = fleet.groupby("win")["act"]
        lo = g.quantile(cfg.get_float("trough_quantile")).reindex(range(nwin))
        hi = g.quantile(cfg.get_float("peak_quantile")).reindex(range(nwin))
        n = g.size().reindex(range(nwin)).fillna(0)
        host = _host_windows(ctx)
        pegged = host["cpu_max"] >= cfg.get_float("cpu_core_pegged")
        iow = host["iowait"] >= cfg.get_float("iowait_high")
        cond = []
        for i in range(nwin):
            if n.iloc[i] < cfg.get_int("min_samples") or (
                pd.isna(host["cpu_max"].iloc[i]) and pd.isna(host["iowait"].iloc[i])
            ):
                cond.append(None)
                continue
            swing = lo.iloc[i] <= cfg.get_float("trough_max") and hi.iloc[i] >= cfg.get_float("peak_min")
            cond.append(bool(swing and (pegged.iloc[i] or iow.iloc[i])))
        starts = ctx.windows["start"].to_numpy(float)
        ends = ctx.windows["end"].to_numpy(float)
        swings = episodes(cond, ctx.windows_for(cfg.get_float("open_after_s")),
                          ctx.windows_for(cfg.get_float("close_after_s")))
        if swings and not ctx.holds("io_starvation.host_swing"):
            swings = []
        for ep in swings:
            start, end = episode_times(ep, starts, ends)
            sl = slice(ep.onset, ep.last + 1)
            s = ctx.windows["step"].iloc[sl].dropna()
            rng = [int(s.min()), int(s.max())] if len(s) else None
            cpu = float(host["cpu_max"].iloc[sl].mean())
            io = host["iowait"].iloc[sl].mean()
            host_txt = f"the busiest CPU core averaged {cpu:.0f}%"
            if pd.notna(io):
                host_txt += f" and iowait {io:.0f}%"
            flags.append(make_flag(
                "io_starvation", "warning", start, end, {"steps": rng},
                f"GPU activity swung between {lo.iloc[sl].mean():.0f}% and "
                f"{hi.iloc[sl].mean():.0f}%"
                f" while {host_txt}" + (f", {steps_text(rng)}" if rng else "")
                + ": the GPUs wait for data.",
            ))
    # (b) a growing share of the step that no phase explains
    sf = ctx.sf
    if len(sf) >= 2 and "other" in sf.columns:
        total = W.core_total(sf)
        share = sf["other"].astype(float) / total.where(total > 0)
        med, _ = W.rolling_baseline(share, cfg.get_int("history_steps"),
                                    min_periods=cfg.get_int("min_history_steps"))
        base = med
        lim_abs = cfg.get_float("other_share_min")
        rise = cfg.get_float("other_share_rise")
        cond = [None if pd.isna(s) or pd.isna(b) else bool(s >= lim_abs and s >= b + rise)
                for s, b in zip(share, base, strict=True)]
        for ep, start, end, rng in step_episodes(
            ctx, cond, cfg.get_int("open_after_steps"), cfg.get_int("close_after_steps")
        ):
            sl = slice(ep.onset, ep.last + 1)
            m = float(share.iloc[sl].mean())
            secs = float(sf["other"].iloc[sl].mean())
            sev = "critical" if m >= cfg.get_float("critical_other_share") else "warning"
            flags.append(make_flag(
                "io_starvation", sev, start, end, {"phase": "other", "steps": rng},
                f"{secs:.1f} s per step ({m * 100:.0f}% of the step) went to no logged phase, "
                f"{steps_text(rng)}, up from {float(base.iloc[ep.onset]) * 100:.0f}%: data "
                "loading or host work is holding the step.",
            ))
    flags.extend(_data_wait_flags(ctx))
    return _merge(flags)


def _mean_in(df: pd.DataFrame, col: str, spans: list[tuple[float, float]]) -> float:
    """Mean of ``col`` over the rows of ``df`` whose ``ts`` falls in any of ``spans``."""
    if df is None or len(df) == 0 or col not in df.columns or not spans:
        return float("nan")
    ts = pd.to_numeric(df["ts"], errors="coerce").to_numpy(float)
    mask = np.zeros(len(df), dtype=bool)
    for a, b in spans:
        mask |= (ts >= a) & (ts <= b)
    vals = pd.to_numeric(df[col], errors="coerce")[mask]
    return float(vals.mean()) if vals.notna().any() else float("nan")


def _data_wait_flags(ctx: Context) -> list[Flag]:
    """(c) Wall time before the step timer (the batch fetch) that no verl timer covers."""
    cfg = ctx.cfg("io_starvation")
    sf = ctx.sf
    if len(sf) == 0 or "data_wait" not in sf.columns or sf["data_wait"].isna().all():
        return []
    wait = sf["data_wait"].astype(float)
    wall = wait + W.core_total(sf).astype(float)
    share = wait / wall.where(wall > 0)
    lim_s = cfg.get_float("data_wait_min_s")
    lim_share = cfg.get_float("data_wait_share")
    cond = [None if pd.isna(w) or pd.isna(sh) else bool(w >= lim_s and sh >= lim_share)
            for w, sh in zip(wait, share, strict=True)]
    out = []
    found = step_episodes(ctx, cond, cfg.get_int("data_wait_open_after_steps"),
                          cfg.get_int("data_wait_close_after_steps"))
    if found and not ctx.holds("io_starvation.data_wait"):
        return []
    for ep, _start, end, rng in found:
        sl = slice(ep.onset, ep.last + 1)
        rows = sf.iloc[sl]
        # the gaps themselves: from the previous step's end to this step's timer start
        spans = [(float(e - t - w), float(e - t)) for e, t, w in
                 zip(rows["end"], W.core_total(rows), rows["data_wait"], strict=True)
                 if pd.notna(w) and w > 0]
        m_wait = float(wait.iloc[sl].mean())
        m_share = float(share.iloc[sl].mean())
        sev = "critical" if m_share >= cfg.get_float("critical_data_wait_share") else "warning"
        bits = []
        cpu = _mean_in(ctx.host, "cpu_max_core_pct", spans)
        if not np.isnan(cpu):
            bits.append(f"the busiest CPU core averaged {cpu:.0f}%")
        iow = _mean_in(ctx.host, "iowait_pct", spans)
        if not np.isnan(iow) and iow >= 1:
            bits.append(f"iowait {iow:.0f}%")
        act = ctx.act
        if len(act):
            g_sm = _mean_in(act, "act", spans)
            g_ut = _mean_in(act, "util", spans)
            if not np.isnan(g_sm):
                bits.append(f"GPU SM activity {g_sm:.0f}% (utilization {g_ut:.0f}%)")
        host_txt = (" Meanwhile " + ", ".join(bits) + ".") if bits else ""
        # the flag opens when the step that showed the wait was logged
        start = float(rows["end"].iloc[0] - W.core_total(rows).iloc[0]
                      - (rows["data_wait"].iloc[0] or 0.0))
        out.append(make_flag(
            "io_starvation", sev, start, end, {"phase": "data_wait", "steps": rng},
            f"{m_wait:.1f} s per step passed before the step timer started ({m_share * 100:.0f}% "
            f"of the wall time), {steps_text(rng)}: verl fetches the next batch there, so the "
            f"GPUs waited on data loading.{host_txt}",
        ))
    return out


def _merge(flags: list[Flag]) -> list[Flag]:
    """One io_starvation flag per overlapping stretch, with both kinds of evidence."""
    flags = sorted(flags, key=lambda f: f.start)
    out: list[Flag] = []
    for f in flags:
        if out and (out[-1].end is None or f.start <= out[-1].end):
            prev = out[-1]
            prev.end = None if (prev.end is None or f.end is None) else max(prev.end, f.end)
            more = f.evidence[:1].lower() + f.evidence[1:]
            prev.evidence = prev.evidence.rstrip(".") + "; also " + more
            if f.severity == "critical":
                prev.severity = "critical"
            continue
        out.append(f)
    return out
