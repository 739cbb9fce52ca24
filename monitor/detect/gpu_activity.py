"""GPU activity detectors: gpu_imbalance, low_utilization, util_overstates_sm.

All three work per analysis window (a step, or a fixed window where no step covers the data)
on ``act``: SM activity where the GPU reports it, NVML utilization where it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from monitor.analysis import signature as S
from monitor.detect.contention import contention_flags
from monitor.detect.detector_base import (
    Context,
    episode_times,
    make_flag,
    merge_episodes,
    pct,
    severity_for,
    step_episodes,
    steps_text,
    window_steps,
)
from monitor.detect.persistence import Episode, episodes
from monitor.records import TRAINING_PHASES, Flag


def _wide(ctx: Context, value: str = "act") -> pd.DataFrame:
    """Samples as one column per (node, gpu), one row per time bin (plus ``ts`` and ``win``)."""
    df = ctx.act_windowed
    if len(df) == 0:
        return pd.DataFrame()
    bin_s = max(ctx.sample_interval, 1e-3)
    tbin = np.floor((df["ts"].to_numpy(float) - df["ts"].min()) / bin_s).astype(np.int64)
    key = df["node"].astype(str) + "/" + df["gpu"].astype(str)
    tmp = pd.DataFrame({"tbin": tbin, "key": key.to_numpy(), "v": df[value].to_numpy(float)})
    wide = tmp.groupby(["tbin", "key"], sort=True)["v"].mean().unstack("key")
    meta = pd.DataFrame({"tbin": tbin, "ts": df["ts"].to_numpy(float),
                         "win": df["win"].to_numpy()}).groupby("tbin").max()
    return wide.join(meta)


def _phase_words(ctx: Context, onset: int, last: int) -> str:
    win = ctx.windows
    lo, hi = float(win["start"].iloc[onset]), float(win["end"].iloc[last])
    df = ctx.act
    sub = df[(df["ts"] >= lo) & (df["ts"] < hi) & df["phase"].notna()]
    if len(sub) == 0:
        return ""
    return str(sub["phase"].value_counts().index[0])


@dataclass(frozen=True)
class GpuEpisode:
    """One GPU's episode below its peers: its mean activity and the peers' median over it."""

    node: str
    gpu: int
    episode: Episode
    own: float
    peer: float


@dataclass(frozen=True)
class OverstatedEpisode:
    """One GPU's episode of high utilization with low SM activity, and the phases it covers
    (most samples first)."""

    node: str
    gpu: int
    episode: Episode
    util: float
    sm: float
    phases: list[str]


def _group_overlapping(
    items: list[GpuEpisode] | list[OverstatedEpisode], close_n: int
) -> list[list]:
    """Items (one per GPU episode) grouped so that episodes starting within ``close_n`` bins of
    the group's latest end become one flag; groups in onset order."""
    groups: list[list] = []
    for it in sorted(items, key=lambda it: it.episode.onset):
        if groups and it.episode.onset <= max(x.episode.last for x in groups[-1]) + close_n:
            groups[-1].append(it)
        else:
            groups.append([it])
    return groups


#: What each reading needs of the job (``monitor.detect.premises``): GPU samples, except the
#: imbalance's readings of another process on a GPU (the GPU processes' events).
PREMISES: dict[str, tuple[str, ...]] = {
    "gpu_imbalance": (),
    "low_utilization": ("gpu_samples",),
    "util_overstates_sm": ("gpu_samples",),
}

STRAGGLER_ADVICE = [
    "Find what slows this GPU: another process on it (nvidia-smi's process list), lower clocks "
    "or throttling (nvidia-smi -q -d PERFORMANCE), or a bad link (dmesg for XID errors).",
    "If its rank simply gets more tokens, turn on trainer.balance_batch=True and actor_rollout_ref."
    "actor.use_dynamic_bsz=True with actor_rollout_ref.actor.ppo_max_token_len_per_gpu so every "
    "rank gets a similar load.",
]


@dataclass(frozen=True)
class PhaseSpread:
    """One step's phase in which one GPU kept working while others spun in a collective."""

    step: int
    phase: str
    straggler: str  # "node/gpu", or several joined by ";" (a whole slow node)
    slow_act: float  # the straggler's SM activity (or util), %
    waiters: tuple[str, ...]
    wait_act: float  # the waiting GPUs' mean SM activity, %
    wait_util: float  # ... and their mean utilization, %
    seconds: float  # the phase's length


def phase_spreads(ctx: Context) -> list[PhaseSpread]:
    """Per step and training phase: a GPU busy while its peers wait at high util, low SM.

    Only GPUs that report SM activity can show the pattern (utilization alone reads 100% on
    both the worker and the waiter). Generation is left to ``rollout_long_tail``.
    """
    cfg = ctx.cfg("gpu_imbalance")
    df = ctx.act
    if len(df) == 0 or "phase" not in df.columns or not df["phase"].notna().any():
        return []
    df = df[df["phase"].isin(TRAINING_PHASES + ("reshard",)) & df["step"].notna()
            & (df["act_source"] == "sm")]
    if df["node"].astype(str).str.cat(df["gpu"].astype(str), sep="/").nunique() < 2:
        return []
    df = df.assign(key=df["node"].astype(str) + "/" + df["gpu"].astype(str))
    g = df.groupby(["step", "phase", "key"])
    per = pd.DataFrame({"act": g["act"].mean(), "util": g["util"].mean(), "n": g.size()})
    per = per[per["n"] >= cfg.get_int("straggler_min_samples")].reset_index()
    tl = ctx.timeline
    dur = {}
    if len(tl):
        dur = {(int(r.step), r.phase): float(r.end - r.start) for r in tl.itertuples()}
    gap = cfg.get_float("straggler_gap")
    ratio = cfg.get_float("straggler_ratio")
    util_min = cfg.get_float("waiting_util_min")
    # a phase must span a few samples: a sample straddling the phase's edge must not decide
    min_s = max(cfg.get_float("straggler_min_phase_s"),
                cfg.get_float("straggler_min_samples") * ctx.sample_interval)
    out = []
    for (step, phase), grp in per.groupby(["step", "phase"]):
        if len(grp) < 2 or dur.get((int(step), phase), 0.0) < min_s:
            continue
        top = float(grp["act"].max())
        low = grp["act"] <= top - gap
        wait = grp[low & (grp["util"] >= util_min)]
        busy = grp[~low]
        if len(wait) == 0 or len(wait) < len(busy) or len(wait) < low.sum():
            # the pattern: a few GPUs busy, the rest (all of the low ones) spinning in the
            # collective at high utilization; a split fleet or idle GPUs are not it
            continue
        if float(wait["act"].mean()) > ratio * float(busy["act"].mean()):
            continue  # a few points of spread between busy GPUs is noise, not waiting
        out.append(PhaseSpread(int(step), str(phase), ";".join(sorted(busy["key"])),
                               float(busy["act"].mean()), tuple(wait["key"]),
                               float(wait["act"].mean()), float(wait["util"].mean()),
                               dur.get((int(step), phase), 0.0)))
    return out


def straggler_flags(ctx: Context) -> list[Flag]:
    """Name the GPU the others wait for, phase by phase (gpu_imbalance with the straggler)."""
    cfg = ctx.cfg("gpu_imbalance")
    spreads = phase_spreads(ctx)
    sf = ctx.sf
    if not spreads or len(sf) == 0:
        return []
    # the strongest spread of each step (longest phase times widest gap)
    best: dict[int, PhaseSpread] = {}
    for sp in spreads:
        cur = best.get(sp.step)
        score = sp.seconds * (sp.slow_act - sp.wait_act)
        if cur is None or score > cur.seconds * (cur.slow_act - cur.wait_act):
            best[sp.step] = sp
    judged = {int(s) for s in ctx.act["step"].dropna().unique()} if len(ctx.act) else set()
    flags: list[Flag] = []
    for key in sorted({sp.straggler for sp in best.values()}):
        cond: list[object] = []
        for st in sf["step"].to_numpy():
            st = int(st)
            if st in best:
                cond.append(best[st].straggler == key)
            else:
                cond.append(False if st in judged else None)
        for ep, start, end, rng in step_episodes(ctx, cond, cfg.get_int("straggler_open_after_steps"),
                                                 cfg.get_int("straggler_close_after_steps")):
            steps_in = [int(x) for x in sf["step"].iloc[ep.onset:ep.last + 1]]
            mine = [best[s] for s in steps_in if s in best and best[s].straggler == key]
            phases = pd.Series([m.phase for m in mine]).value_counts()
            phase = str(phases.index[0])
            slow_keys = key.split(";")
            node = slow_keys[0].split("/")[0]
            gpus = sorted(int(k.split("/")[1]) for k in slow_keys if k.split("/")[0] == node)
            waiters = sorted({w for m in mine for w in m.waiters})
            slow = float(np.mean([m.slow_act for m in mine]))
            w_act = float(np.mean([m.wait_act for m in mine]))
            w_util = float(np.mean([m.wait_util for m in mine]))
            all_nodes = {k.split("/")[0] for k in waiters} | {k.split("/")[0] for k in slow_keys}
            one_node = len(all_nodes) == 1
            node_gpus = {k for k in waiters + slow_keys if k.split("/")[0] == node}
            whole_node = not one_node and set(slow_keys) == node_gpus
            if whole_node:
                who, its = f"Node {node} ({len(gpus)} GPUs)", "their"
            elif len(slow_keys) == 1:
                who, its = _gpu_name(key, one_node), "its"
            else:
                who, its = ", ".join(_gpu_name(k, one_node) for k in slow_keys[:8]), "their"
            n_w = len(waiters)
            wait_txt = (", ".join(_gpu_name(w, one_node) for w in waiters[:4])
                        + (f" and {n_w - 4} more" if n_w > 4 else ""))
            scope = {"node": node, "gpus": gpus[:16], "phase": phase, "steps": rng}
            flag = make_flag(
                "gpu_imbalance", "warning", start, end, scope,
                f"{who} {'is' if its == 'its' else 'are'} the straggler in {phase}, "
                f"{steps_text(rng)}: {its} SM activity averaged {pct(slow)} while {wait_txt} "
                f"averaged {pct(w_act)} SM activity at {pct(w_util)} utilization, spinning in "
                "collectives while waiting.",
            )
            flag.advice = list(STRAGGLER_ADVICE)
            flags.append(flag)
    return flags


def _gpu_name(key: str, one_node: bool) -> str:
    node, gpu = key.split("/")
    return f"GPU {gpu}" if one_node else f"node {node} GPU {gpu}"


def detect_gpu_imbalance(ctx: Context) -> list[Flag]:
    """A GPU the others wait for (straggler), or a GPU or node well below its busy peers."""
    stragglers = straggler_flags(ctx)
    contention = contention_flags(ctx)
    flags = [s for s in stragglers if not _absorbed(s, contention)] + contention
    return flags + [f for f in _below_peers(ctx) if not _explained(f, stragglers)]


def _absorbed(straggler: Flag, contention: list[Flag]) -> bool:
    """A straggler whose GPU another process shares at the same time: the process's flag
    (which opens first, after one slow step) tells it, with the straggler's evidence added, so
    a live page keeps one flag for that GPU instead of swapping one for another."""
    for c in contention:
        same_node = straggler.scope.get("node") in (None, c.scope.get("node"))
        if same_node and c.scope.get("gpus") == straggler.scope.get("gpus") and _explained(
                straggler, [c]):
            c.evidence += " " + straggler.evidence
            return True
    return False


def _explained(flag: Flag, stragglers: list[Flag]) -> bool:
    """A GPU below its peers while a straggler is named at the same time is one that waits."""
    for s in stragglers:
        s_end = s.end if s.end is not None else float("inf")
        f_end = flag.end if flag.end is not None else float("inf")
        if flag.start <= s_end and s.start <= f_end:
            return True
    return False


@dataclass(frozen=True)
class _PeerTest:
    """The settings and windows ``_below_peers`` judges every series by."""

    winidx: np.ndarray  # each row's window (-1: none)
    nwin: int
    starts: np.ndarray
    ends: np.ndarray
    busy_min: float
    ratio: float
    gap: float
    critical_ratio: float
    min_busy_frac: float
    open_n: int
    close_n: int
    source: str  # "SM activity" or "utilization"

    def windowed(self, own: np.ndarray, peer: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
        """Per window: below the peers (None where too few busy samples), own and peer means."""
        ok = self.winidx >= 0
        w = self.winidx[ok]
        busy = ((peer >= self.busy_min) & np.isfinite(own) & np.isfinite(peer))[ok]
        n = np.bincount(w, minlength=self.nwin).astype(float)
        nb = np.bincount(w, weights=busy.astype(float), minlength=self.nwin)
        own_s = np.bincount(w, weights=np.where(busy, own[ok], 0.0), minlength=self.nwin)
        peer_s = np.bincount(w, weights=np.where(busy, peer[ok], 0.0), minlength=self.nwin)
        with np.errstate(invalid="ignore", divide="ignore"):
            own_m = own_s / nb
            peer_m = peer_s / nb
            frac = nb / n
        known = frac >= self.min_busy_frac
        bad = (own_m <= peer_m * self.ratio) & (peer_m - own_m >= self.gap)
        cond = [bool(b) if k else None for b, k in zip(bad, known, strict=True)]
        return cond, own_m, peer_m

    def severity(self, own_m: float, peer_m: float) -> str:
        """warning or critical by how far below its peers the series is."""
        sev = severity_for(own_m / peer_m if peer_m else 0.0, self.ratio, self.critical_ratio,
                           higher_is_worse=False)
        return "warning" if sev == "info" else sev


def _below_peers(ctx: Context) -> list[Flag]:
    """A GPU (or a whole node) stays well below its peers' median activity while they are busy."""
    cfg = ctx.cfg("gpu_imbalance")
    wide = _wide(ctx)
    if wide.empty:
        return []
    keys = [c for c in wide.columns if c not in ("ts", "win")]
    if len(keys) < 2:
        return []
    test = _PeerTest(
        winidx=wide["win"].to_numpy(int), nwin=len(ctx.windows),
        starts=ctx.windows["start"].to_numpy(float), ends=ctx.windows["end"].to_numpy(float),
        busy_min=cfg.get_float("peer_busy_min"), ratio=cfg.get_float("ratio"),
        gap=cfg.get_float("gap"), critical_ratio=cfg.get_float("critical_ratio"),
        min_busy_frac=cfg.get_float("min_busy_fraction"),
        open_n=ctx.windows_for(cfg.get_float("open_after_s")),
        close_n=ctx.windows_for(cfg.get_float("close_after_s")),
        source="SM activity" if (ctx.act["act_source"] == "sm").any() else "utilization")
    vals = wide[keys].to_numpy(float)
    nodes = sorted({k.split("/")[0] for k in keys})
    flags, node_flags = _nodes_below_peers(ctx, test, vals, keys, nodes)
    return flags + _gpus_below_peers(ctx, test, vals, keys, nodes, node_flags)


def _nodes_below_peers(ctx: Context, test: _PeerTest, vals: np.ndarray, keys: list[str],
                       nodes: list[str]) -> tuple[list[Flag], dict[str, list[tuple[float, float]]]]:
    """With two nodes or more: each node's mean against the median of the other nodes. The
    flags, and the spans each node is flagged over."""
    flags: list[Flag] = []
    node_flags: dict[str, list[tuple[float, float]]] = {}
    if len(nodes) < 2:
        return flags, node_flags
    starts, ends = test.starts, test.ends
    node_mean = {n: np.nanmean(vals[:, [i for i, k in enumerate(keys) if k.split("/")[0] == n]],
                               axis=1) for n in nodes}
    for n in nodes:
        others = np.vstack([node_mean[m] for m in nodes if m != n])
        peer = np.nanmedian(others, axis=0)
        cond, own_w, peer_w = test.windowed(node_mean[n], peer)
        for ep in episodes(cond, test.open_n, test.close_n):
            start, end = episode_times(ep, starts, ends)
            own_m = float(np.nanmean(own_w[ep.onset:ep.last + 1]))
            peer_m = float(np.nanmean(peer_w[ep.onset:ep.last + 1]))
            rng = window_steps(ctx, ep.onset, ep.last)
            node_flags.setdefault(n, []).append((starts[ep.onset], ends[ep.last]))
            flags.append(make_flag(
                "gpu_imbalance", test.severity(own_m, peer_m), start, end,
                {"node": n, "steps": rng},
                f"Node {n} averaged {pct(own_m)} {test.source} vs a median of {pct(peer_m)} on "
                f"the other nodes, {steps_text(rng) or _for_seconds(start, end, ctx.now)}.",
            ))
    return flags, node_flags


def _gpus_below_peers(ctx: Context, test: _PeerTest, vals: np.ndarray, keys: list[str],
                      nodes: list[str],
                      node_flags: dict[str, list[tuple[float, float]]]) -> list[Flag]:
    """Each GPU against the median of every other GPU; overlapping episodes of one node's
    GPUs are one flag, and none where the whole node is flagged."""
    starts, ends = test.starts, test.ends
    per_gpu: list[GpuEpisode] = []
    for i, key in enumerate(keys):
        others = np.delete(vals, i, axis=1)
        peer = np.nanmedian(others, axis=1) if others.shape[1] else np.full(len(vals), np.nan)
        cond, own_w, peer_w = test.windowed(vals[:, i], peer)
        for ep in episodes(cond, test.open_n, test.close_n):
            own_m = float(np.nanmean(own_w[ep.onset:ep.last + 1]))
            peer_m = float(np.nanmean(peer_w[ep.onset:ep.last + 1]))
            node, gpu = key.split("/")[0], int(key.split("/")[1])
            per_gpu.append(GpuEpisode(node, gpu, ep, own_m, peer_m))
    by_node: dict[str, list[GpuEpisode]] = {}
    for item in per_gpu:
        lo, hi = starts[item.episode.onset], ends[item.episode.last]
        if any(lo < b and hi > a for a, b in node_flags.get(item.node, [])):
            continue  # the whole node is already flagged
        by_node.setdefault(item.node, []).append(item)
    flags: list[Flag] = []
    for node, items in by_node.items():
        for grp in _group_overlapping(items, test.close_n):
            onset, opened, last, still_open = merge_episodes([x.episode for x in grp])
            gpus = sorted({x.gpu for x in grp})
            own_m = float(np.mean([x.own for x in grp]))
            peer_m = float(np.mean([x.peer for x in grp]))
            rng = window_steps(ctx, onset, last)
            phase = _phase_words(ctx, onset, last)
            where = f" on node {node}" if len(nodes) > 1 else ""
            during = f" (mostly during {phase})" if phase else ""
            flags.append(make_flag(
                "gpu_imbalance", test.severity(own_m, peer_m), float(ends[opened]),
                None if still_open else float(ends[last]),
                {"node": node, "gpus": gpus[:16], "steps": rng},
                f"{_gpu_label(gpus)}{where} averaged {pct(own_m)} {test.source}{during} vs a "
                f"peer median of {pct(peer_m)}, "
                f"{steps_text(rng) or 'since ' + _clock(starts[onset])}.",
            ))
    return flags


def _gpu_label(gpus: list[int]) -> str:
    return "GPU " + ",".join(map(str, gpus)) if len(gpus) <= 8 else f"{len(gpus)} GPUs"


def _for_seconds(start: float, end: float | None, now: float) -> str:
    return f"for {int((end if end is not None else now) - start)} s"


def _clock(ts: float) -> str:
    return pd.Timestamp(ts, unit="s").strftime("%H:%M:%S UTC")


def detect_low_utilization(ctx: Context) -> list[Flag]:
    """SM activity (else util) below the healthy floor for minutes during the training phases."""
    cfg = ctx.cfg("low_utilization")
    df = ctx.act_windowed
    if len(df) == 0:
        return []
    df = df[df["win"] >= 0]
    # Without the phase timeline (a node that does not follow the verl log) generation cannot
    # be told from training, and a healthy step's whole-step SM activity sits below the line:
    # judge nothing here; the cross-node Prometheus rules compare such nodes with their peers.
    df = df[df["phase"].isin(TRAINING_PHASES)]
    # the run's first steps warm up (CUDA context, allocator, kernels chosen): SM activity there
    # says nothing about the run (real H200 runs: 37-65% in step 1, 70-78% after)
    df = df[~(df["step"] <= cfg.get_int("skip_first_steps"))]
    if len(df) == 0:
        return []
    threshold = cfg.get_float("threshold")
    nodes = sorted(df["node"].unique())
    nwin = len(ctx.windows)
    starts = ctx.windows["start"].to_numpy(float)
    ends = ctx.windows["end"].to_numpy(float)
    # "for minutes" or for a few whole steps, whichever comes first: each step window averages
    # every training phase, so short steps (seconds each, as on the real-GPU bench) need not
    # wait minutes, and long ones (verl's usual minutes) open after the same time as before
    open_n = min(ctx.windows_for(cfg.get_float("open_after_s")), cfg.get_int("open_after_steps"))
    close_n = ctx.windows_for(cfg.get_float("close_after_s"))
    min_samples = cfg.get_int("min_samples")
    # a step whose training phases last fewer than min_samples sampling intervals is not
    # judged: its few samples mostly straddle the phase edges, where the GPUs ramp (a healthy
    # 4-node job at 10x simulated speed read low here)
    short = _short_training_windows(ctx, min_samples * ctx.sample_interval)
    source = "SM activity" if (df["act_source"] == "sm").any() else "utilization"
    flags = []
    groups = [(None, df)] if len(nodes) == 1 else list(df.groupby("node"))
    for node, sub in groups:
        g = sub.groupby("win")["act"]
        mean = g.mean().reindex(range(nwin))
        count = g.size().reindex(range(nwin)).fillna(0)
        cond = [None if c < min_samples or i in short else bool(m < threshold)
                for i, (m, c) in enumerate(zip(mean, count, strict=True))]
        for ep in episodes(cond, open_n, close_n):
            start, end = episode_times(ep, starts, ends)
            m = float(mean.iloc[ep.onset:ep.last + 1].mean())
            sev = severity_for(m, threshold, cfg.get_float("critical_below"), higher_is_worse=False)
            rng = window_steps(ctx, ep.onset, ep.last)
            phases = "training phases"
            who = f"Node {node} GPUs" if node is not None else "The GPUs"
            sig = _training_signature(ctx, sub, starts[ep.onset], ends[ep.last])
            advice = ctx.advice("low_utilization", sig.phase if sig else None, sig)
            waiting = _looks_like_waiting(sig, ctx.signature_thresholds)
            flags.append(make_flag(
                "low_utilization", sev, start, end, {"node": node, "steps": rng},
                f"{who} averaged {int(m)}% {source} during {phases}, "
                f"{steps_text(rng) or _for_seconds(starts[ep.onset], end, ctx.now)}"
                f" (healthy is {pct(threshold)} or more)."
                + (" " + _signature_words(sig) if sig is not None else "")
                + (" " + WAITERS_EVIDENCE if waiting else ""),
                advice=advice_once([WAITERS_ADVICE, *advice] if waiting else advice),
            ))
    return flags


def _signature_words(sig: S.Signature) -> str:
    """The training phases' signature in a low_utilization flag's evidence. A phase whose SMs
    clear the classifier's busy line is still under the flag's healthy line: it is said to come
    closest, not to be "well used" (which the flag's own first sentence contradicts)."""
    text = sig.evidence()
    if sig.name == "busy":
        text = text.replace(f" was {S.WORDS['busy']}", " came closest to the line, still under it")
    return text


def advice_once(advice: list[str]) -> list[str]:
    """``advice`` without a piece whose verl keys the pieces before it all name already (the
    phase's advice and the kind's often give the same micro-batch levers)."""
    from monitor.detect.flag_advice import named_keys

    out: list[str] = []
    seen: set[str] = set()
    for piece in advice:
        keys = set(named_keys(piece))
        if keys and keys <= seen:
            continue
        seen |= keys
        out.append(piece)
    return out


#: Utilization at least this high with SM activity under the busy line: kernels resident all
#: phase long with part of the SMs idle, which is also how a rank waiting in a collective looks.
WAITERS_UTIL_MIN = 90.0
WAITERS_EVIDENCE = ("Utilization near 100% with the SMs under the busy line is also how GPUs "
                    "waiting in collectives for a slower rank look (the real 2-GPU straggler "
                    "run: the waiting GPU at util 99-100%, SM 47-57%).")
WAITERS_ADVICE = ("Before tuning this node, rule out a slower GPU or node elsewhere in the job: "
                  "the GPUStraggler and NodeImbalance alerts and the dashboard's straggler heat "
                  "map name it; a node that only waits needs no change of its own.")


def _looks_like_waiting(sig: S.Signature | None, th: S.Thresholds) -> bool:
    """The training phases' signature reads as a waiter's (see WAITERS_UTIL_MIN)."""
    return (sig is not None and sig.name in ("light", "thin", "memory_bound")
            and sig.util >= WAITERS_UTIL_MIN and sig.sm < th.busy_sm_min)


def _short_training_windows(ctx: Context, min_seconds: float) -> set[int]:
    """Indices of the step windows whose training phases last less than ``min_seconds``."""
    sf = ctx.sf
    wins = ctx.windows
    cols = [p for p in TRAINING_PHASES if p in sf.columns]
    if not cols or len(sf) == 0 or len(wins) == 0:
        return set()
    train_s = sf.set_index("step")[cols].fillna(0.0).sum(axis=1)
    train_s = train_s[~train_s.index.duplicated(keep="last")]
    out = set()
    for i, step in enumerate(wins["step"].to_numpy(float)):
        if np.isfinite(step) and float(train_s.get(step, np.inf)) < min_seconds:
            out.add(i)
    return out


#: Signatures that explain low activity by a wait outside the SMs: they lead when they hold
#: a third of the samples, even if the rest of the training phases look otherwise.
_WAIT_SIGNATURES = ("pcie_bound", "cpu_bound", "collective_spin")


def _training_signature(ctx: Context, sub: pd.DataFrame, lo: float, hi: float
                        ) -> S.Signature | None:
    """The dominant signature of the training phases of ``sub``'s GPUs in ``[lo, hi)``."""
    df = ctx.act_host
    nodes = set(sub["node"].astype(str))
    part = df[(df["ts"] >= lo) & (df["ts"] < hi) & df["phase"].isin(TRAINING_PHASES)
              & ~(df["step"] <= ctx.cfg("low_utilization").get_int("skip_first_steps"))]
    part = part[part["node"].astype(str).isin(nodes)]
    if len(part) == 0:
        return None
    table = S.summarize(part, ["phase", "node", "gpu"], ctx.signature_thresholds)
    return S.dominant(table, _WAIT_SIGNATURES)


def detect_util_overstates_sm(ctx: Context) -> list[Flag]:
    """NVML utilization says busy while SM activity says most SMs are idle, phase by phase."""
    cfg = ctx.cfg("util_overstates_sm")
    df = ctx.act_windowed
    if len(df) == 0 or df["sm_active"].notna().sum() == 0:
        return []
    df = df[(df["win"] >= 0) & df["sm_active"].notna() & df["util"].notna()]
    util_min = cfg.get_float("util_min")
    sm_max = cfg.get_float("sm_max")
    gap = cfg.get_float("gap")
    nwin = len(ctx.windows)
    starts = ctx.windows["start"].to_numpy(float)
    ends = ctx.windows["end"].to_numpy(float)
    open_n = ctx.windows_for(cfg.get_float("open_after_s"))
    close_n = ctx.windows_for(cfg.get_float("close_after_s"))
    min_n = cfg.get_int("min_phase_samples")
    df = df.assign(phase=df["phase"].fillna("(unlabelled)"))
    agg = df.groupby(["node", "gpu", "win", "phase"], sort=False).agg(
        u=("util", "mean"), s=("sm_active", "mean"), n=("util", "size")).reset_index()
    agg = agg[agg["n"] >= min_n]
    agg["bad"] = (agg["u"] >= util_min) & (agg["s"] <= sm_max) & (agg["u"] - agg["s"] >= gap)
    per: list[OverstatedEpisode] = []
    for (node, gpu), sub in agg.groupby(["node", "gpu"], sort=True):
        anybad = sub.groupby("win")["bad"].any().reindex(range(nwin))
        cond = [None if pd.isna(v) else bool(v) for v in anybad]
        for ep in episodes(cond, open_n, close_n):
            bad = sub[sub["bad"] & sub["win"].between(ep.onset, ep.last)]
            if len(bad) == 0:
                continue
            w = bad["n"].astype(float)
            u = float((bad["u"] * w).sum() / w.sum())
            sm = float((bad["s"] * w).sum() / w.sum())
            phases = bad.groupby("phase")["n"].sum().sort_values(ascending=False).index.tolist()
            per.append(OverstatedEpisode(str(node), int(gpu), ep, u, sm, phases))
    flags = []
    for node in sorted({p.node for p in per}):
        items = [p for p in per if p.node == node]
        for grp in _group_overlapping(items, close_n):
            onset, opened, last, still_open = merge_episodes([x.episode for x in grp])
            gpus = sorted({x.gpu for x in grp})
            u = float(np.mean([x.util for x in grp]))
            sm = float(np.mean([x.sm for x in grp]))
            phases: list[str] = []
            for x in grp:
                phases += [p for p in x.phases if p not in phases]
            rng = window_steps(ctx, onset, last)
            sev = severity_for(sm, sm_max, cfg.get_float("critical_sm_below"), higher_is_worse=False)
            sev = "warning" if sev == "info" else sev
            label = _gpu_label(gpus)
            where = f" during {', '.join(phases[:3])}" if phases != ["(unlabelled)"] else ""
            scope_phase = phases[0] if len(phases) == 1 and phases[0] != "(unlabelled)" else None
            flags.append(make_flag(
                "util_overstates_sm", sev, float(ends[opened]),
                None if still_open else float(ends[last]),
                {"node": node, "gpus": gpus[:16], "phase": scope_phase, "steps": rng},
                f"{label} showed {pct(u)} utilization but only {pct(sm)} SM activity{where}, "
                f"{steps_text(rng) or 'since ' + _clock(starts[onset])}: the kernels keep few SMs "
                "busy, so utilization overstates the work done.",
            ))
    return flags
