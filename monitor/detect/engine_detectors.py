"""Rollout-engine detectors on ``Context.rollout`` (vLLM / SGLang servers' own series).

- ``kv_cache_preemption``: a server's KV cache is full and the engine keeps preempting requests
  (vLLM recomputes a preempted request from its prompt; SGLang retracts it): generation does the
  same work more than once.
- ``generation_tail``: only a few requests still run (a small share of the pool's peak, nothing
  queued) while the rest of the rollout pool idles, for a large share of the time the pool has
  work: the long responses of each batch set the rollout's length.

Both judge fixed time bins (``bin_s``, aligned to multiples of it so a flag's start does not move
between live runs), with persistence and hysteresis over the bins. Bins without engine data, or
(``generation_tail``) without work, are unknown and keep the current state: training phases
between two rollouts neither open nor close a flag. One flag per node (the exporter's), naming
the servers in its scope.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pandas as pd

from monitor.config import Section
from monitor.detect.detector_base import Context, make_flag
from monitor.detect.persistence import Episode, episodes
from monitor.records import Flag


def _bins(ctx: Context, bin_s: float) -> pd.DataFrame:
    """The rollout rows with ``bin`` (aligned bin start), sorted by server and time."""
    df = ctx.rollout
    if df is None or len(df) == 0:
        return pd.DataFrame()
    df = df[df["ts"].notna() & (df["ts"] <= ctx.now + 1e-6)].copy()
    if len(df) == 0:
        return df
    df["node"] = df["node"].astype(str)
    df["server"] = df["server"].astype(str)
    df["bin"] = np.floor(df["ts"].to_numpy(float) / bin_s) * bin_s
    return df.sort_values(["node", "server", "ts"], kind="stable").reset_index(drop=True)


def _bin_index(df: pd.DataFrame, bin_s: float) -> np.ndarray:
    """Every bin start from the first to the last bin of ``df`` (gaps included, unknown)."""
    lo, hi = float(df["bin"].min()), float(df["bin"].max())
    return lo + bin_s * np.arange(int(round((hi - lo) / bin_s)) + 1)


def _episode_span(bins: np.ndarray, bin_s: float, now: float, ep: Episode) -> tuple[float, float | None]:
    """(start, end) of an episode: the start of the bin that met persistence (stable while that
    bin is still filling) and the end of its last true bin (None while open)."""
    start = float(bins[ep.opened])
    end = None if ep.closed is None else min(float(bins[ep.last]) + bin_s, now)
    return start, end


def _bin_episodes(cfg: Section, cond: list[bool | None], bins: np.ndarray, bin_s: float,
                  now: float) -> Iterator[tuple[Episode, float, float | None]]:
    """(episode, start, end) of each episode of ``cond`` over ``bins``, with the section's
    ``open_after_s`` and ``close_after_s`` as whole bins (at least one each)."""
    open_after = max(1, int(math.ceil(cfg.get_float("open_after_s") / bin_s - 1e-9)))
    close_after = max(1, int(math.ceil(cfg.get_float("close_after_s") / bin_s - 1e-9)))
    for ep in episodes(cond, open_after, close_after):
        yield (ep, *_episode_span(bins, bin_s, now, ep))


def _node_flag(kind: str, severity: str, start: float, end: float | None, node: object,
               servers: list[str], message: str) -> Flag:
    """A generation-phase flag of one node, naming (up to 16 of) its ``servers``."""
    return make_flag(kind, severity, start, end,
                     {"node": str(node), "servers": servers[:16], "phase": "gen"}, message)


def _servers_text(servers: list[str], limit: int = 4) -> str:
    more = f" and {len(servers) - limit} more" if len(servers) > limit else ""
    return ", ".join(servers[:limit]) + more


def preemption_deltas(df: pd.DataFrame) -> pd.Series:
    """Preemptions since each server's previous sample (a counter reset counts from zero)."""
    prev = df.groupby(["node", "server"], sort=False)["preemptions_total"].shift(1)
    cur = df["preemptions_total"]
    delta = cur - prev
    return delta.where(delta >= 0, cur).where(prev.notna(), 0.0).fillna(0.0)


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: the rollout servers' own samples.
PREMISES: dict[str, tuple[str, ...]] = {
    "kv_cache_preemption": (),
    "generation_tail": (),
}


def detect_kv_cache_preemption(ctx: Context) -> list[Flag]:
    """A rollout server whose KV cache stays full while the engine keeps preempting requests."""
    cfg = ctx.cfg("kv_cache_preemption")
    full = cfg.get_float("kv_usage_full")
    raw = ctx.rollout
    if raw is None or len(raw) == 0 or not (raw["kv_cache_usage"] >= full).any():
        return []  # the usual case: never full, nothing to bin
    bin_s = max(cfg.get_float("bin_s"), 1.0)
    df = _bins(ctx, bin_s)
    if len(df) == 0 or df["preemptions_total"].notna().sum() == 0:
        return []
    df["preempted"] = preemption_deltas(df)
    min_rate = cfg.get_float("min_preemptions_per_min")
    crit_rate = cfg.get_float("critical_preemptions_per_min")
    flags: list[Flag] = []
    for node, nd in df.groupby("node", sort=True):
        per = nd.groupby(["bin", "server"]).agg(
            kv=("kv_cache_usage", "max"), preempted=("preempted", "sum"),
            waiting=("waiting", "max"), running=("running", "max"),
            engine_name=("engine", "last"))
        # seconds the bin's preemptions were counted over: the whole bin, or less for the bin
        # still filling (now) and for a server's first bin
        starts = per.index.get_level_values("bin").to_numpy(float)
        per["covered"] = np.clip(ctx.now - starts, 1.0, bin_s)
        per["rate"] = per["preempted"] / per["covered"] * 60.0
        per["hit"] = per["kv"].ge(full) & per["rate"].ge(min_rate)
        bins = _bin_index(nd, bin_s)
        hit_by_bin = per.groupby(level="bin")["hit"].any().reindex(bins)
        has_kv = per.groupby(level="bin")["kv"].count().reindex(bins).fillna(0) > 0
        cond = [None if not known else bool(h) for h, known in
                zip(hit_by_bin.fillna(False), has_kv, strict=True)]
        for ep, start, end in _bin_episodes(cfg, cond, bins, bin_s, ctx.now):
            lo, hi = float(bins[ep.onset]), float(bins[ep.last])
            sub = per[(per.index.get_level_values("bin") >= lo)
                      & (per.index.get_level_values("bin") <= hi) & per["hit"]]
            servers = sorted(sub.index.get_level_values("server").unique().tolist())
            minutes = max(float(sub["covered"].groupby(level="bin").max().sum()) / 60.0, 1e-9)
            rate = float(sub["preempted"].sum()) / minutes
            kv = float(sub["kv"].max())
            waiting = sub["waiting"].max()
            engines = sorted(sub["engine_name"].dropna().astype(str).unique().tolist())
            word = "retractions" if engines == ["sglang"] else "preemptions"
            sev = "critical" if rate >= crit_rate else "warning"
            wait_text = (f", {int(waiting)} requests waiting" if pd.notna(waiting) and waiting > 0
                         else "")
            flags.append(_node_flag(
                "kv_cache_preemption", sev, start, end, node, servers,
                f"Rollout server{'s' if len(servers) > 1 else ''} {_servers_text(servers)} "
                f"({'/'.join(engines) or 'engine'}): KV cache {kv * 100:.0f}% full with "
                f"{rate:.0f} {word}/min over {minutes:.1f} min{wait_text}; each preempted "
                "request is recomputed from its prompt, so generation repeats work.",
            ))
    return flags


def _tail_frame(nd: pd.DataFrame) -> pd.DataFrame:
    """Per scrape round (one ``ts`` per round; rounds are grouped by second) of one node: the
    pool's running and waiting requests and its busy, idle and asleep servers."""
    d = nd.assign(round=np.round(nd["ts"].to_numpy(float)))
    asleep = d["sleeping"].fillna(0.0) >= 0.5
    awake = d[~asleep]
    running = awake["running"].fillna(0.0)
    g = awake.assign(busy=(running > 0).astype(int), idle=(running <= 0).astype(int)).groupby(
        "round")
    out = pd.DataFrame({
        "bin": g["bin"].first(),
        "running": g["running"].sum(min_count=1),
        "waiting": g["waiting"].sum(min_count=0),
        "busy": g["busy"].sum(),
        "idle": g["idle"].sum(),
        "servers": g["server"].nunique(),
    })
    return out.sort_index()


def detect_generation_tail(ctx: Context) -> list[Flag]:
    """Few requests still generating while the rest of the rollout pool idles."""
    cfg = ctx.cfg("generation_tail")
    bin_s = max(cfg.get_float("bin_s"), 1.0)
    df = _bins(ctx, bin_s)
    if len(df) == 0 or df["running"].notna().sum() == 0:
        return []
    frac = cfg.get_float("tail_running_fraction")
    min_peak = cfg.get_float("min_peak_running")
    share_min = cfg.get_float("tail_share")
    share_crit = cfg.get_float("critical_tail_share")
    flags: list[Flag] = []
    for node, nd in df.groupby("node", sort=True):
        rounds = _tail_frame(nd)
        rounds = rounds[rounds["running"].notna()]
        if len(rounds) == 0:
            continue
        peak = float(rounds["running"].max())
        if peak < min_peak:
            continue
        work = rounds["running"] > 0
        tail = work & (rounds["running"] <= frac * peak) & (rounds["waiting"].fillna(0) <= 0)
        rounds = rounds.assign(work=work, tail=tail)
        bins = _bin_index(nd, bin_s)
        per = rounds.groupby("bin").agg(work=("work", "sum"), tail=("tail", "sum"))
        per = per.reindex(bins).fillna(0.0)
        # over a trailing lookback: each rollout has its bulk and then its tail, and the
        # training between two rollouts has no work at all
        k = max(1, int(round(cfg.get_float("lookback_s") / bin_s)))
        work_k = per["work"].rolling(k, min_periods=1).sum()
        share = per["tail"].rolling(k, min_periods=1).sum() / work_k.where(work_k > 0)
        cond = [None if (pd.isna(sh) or w <= 0) else bool(sh >= share_min)
                for sh, w in zip(share, per["work"], strict=True)]
        for ep, start, end in _bin_episodes(cfg, cond, bins, bin_s, ctx.now):
            lo, hi = float(bins[ep.onset]) - (k - 1) * bin_s, float(bins[ep.last])
            sel = rounds[(rounds["bin"] >= lo) & (rounds["bin"] <= hi)]
            in_tail = sel[sel["tail"]]
            overall = float(sel["tail"].sum()) / max(float(sel["work"].sum()), 1.0)
            median_running = float(in_tail["running"].median()) if len(in_tail) else 0.0
            servers_total = int(sel["servers"].max()) if len(sel) else 0
            idle = int(in_tail["idle"].median()) if len(in_tail) else 0
            pool = (f" while {idle} of {servers_total} servers idled" if servers_total > 1
                    else "")
            sev = "critical" if overall >= share_crit else "warning"
            servers = sorted(nd["server"].unique().tolist())
            flags.append(_node_flag(
                "generation_tail", sev, start, end, node, servers,
                f"Rollout pool on {node}: for {overall * 100:.0f}% of the time it had work, only "
                f"{median_running:.0f} requests were still running ({median_running / peak * 100:.0f}% "
                f"of its peak {peak:.0f}, none queued){pool}: the longest responses set the "
                "rollout's length.",
            ))
    return flags
