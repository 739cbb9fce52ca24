"""memory_creep: GPU memory that grows step after step, forecast to the capacity line.

``memory_pressure`` speaks once memory is near the capacity; a leak (tensors kept across steps,
a cache that never empties) is visible long before: the per-step peak of each GPU climbs by
about the same amount every step. This detector fits that growth with a robust slope (Theil-Sen:
the median of the pairwise slopes of the last ``window`` peaks, so one odd step does not move
it), and when the growth is steady it opens a warning with the rate and the projected time to
the capacity ("at +18.0 GiB per step, out of memory in about 1 step"). Levels are taken phase
by phase (``_phase_series``): verl frees and refills memory by phase (the rollout engine's
sleep mode, a KV cache that grows through generation), so a level over a whole step drifts
with the phase mix; generation is compared with generation. A one-off jump right
after ``save_checkpoint`` or validation that stays is named as such. The first
``warmup_points`` steps are left out (the allocator and caches fill up there). Without steps in the data
(a log that gives no step lines) the peaks are taken per analysis window and the rate is given
per minute. The host memory (RSS) of the training process tree (the exporter's host samples,
``train_rss_bytes``) is judged the same way per node, and verl's own reserved peak
(``perf/max_memory_reserved_gb``) when no GPU samples exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from monitor.analysis.attribution import label_samples
from monitor.config import Section
from monitor.detect import window as W
from monitor.detect.detector_base import Context, make_flag

GIB = 1024**3


@dataclass
class Creep:
    """The growth of one memory series over its last window of peaks."""

    rate: float  # bytes per unit (step or minute)
    level: float  # latest peak, bytes
    first: float  # first peak of the window, bytes
    units_left: float  # steps or minutes to the capacity at this rate (inf when unknown)


def theil_sen(y: np.ndarray, x: np.ndarray | None = None) -> float:
    """The median of the pairwise slopes of ``y`` over ``x`` (default 0, 1, 2, ...)."""
    y = np.asarray(y, float)
    x = np.arange(len(y), dtype=float) if x is None else np.asarray(x, float)
    i, j = np.triu_indices(len(y), k=1)
    dx = x[j] - x[i]
    ok = dx > 0
    if not ok.any():
        return float("nan")
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))


def creep(peaks: np.ndarray, capacity: float, cfg: Section, min_rate: float,
          x: np.ndarray | None = None) -> Creep | None:
    """The steady growth of ``peaks`` (oldest first), or None when it does not grow steadily.

    Steady: the Theil-Sen slope is at least ``min_rate`` bytes per unit, at least
    ``steady_share`` of the successive differences rise by a quarter of it or more, the
    window grew by ``min_total_gib`` in all, and no single rise is more than
    ``max_jump_share`` of that growth. At least ``min_points`` levels, or fewer for a fast
    leak per step (``_fast``)."""
    peaks = np.asarray(peaks, float)
    if len(peaks) < 3:
        return None
    rate = theil_sen(peaks, x)
    if not np.isfinite(rate) or rate < min_rate:
        return None
    diffs = np.diff(peaks)
    if x is not None:
        diffs = diffs / np.where(np.diff(x) > 0, np.diff(x), np.nan)
    few = len(peaks) < cfg.get_int("min_points")
    if few and (x is not None or not _fast(rate, diffs, len(peaks), cfg)):
        return None
    if np.mean(diffs >= 0.25 * rate) < cfg.get_float("steady_share"):
        return None
    total = peaks[-1] - peaks[0]
    if total < cfg.get_float("min_total_gib") * GIB:
        return None
    # spread over the window, not one jump: a level that steps up once and stays (a mode
    # change, two weight copies kept from then on) fits a slope across the step too
    # (a fast leak's few levels each rose by a good part of its rate already)
    if not few and np.max(np.diff(peaks)) > cfg.get_float("max_jump_share", 1.0) * total:
        return None
    left = (capacity - peaks[-1]) / rate if capacity > 0 else float("inf")
    return Creep(rate=rate, level=float(peaks[-1]), first=float(peaks[0]),
                 units_left=max(0.0, float(left)))


def _fast(rate: float, diffs: np.ndarray, n: int, cfg: Section) -> bool:
    """A leak fast enough to name from fewer than ``min_points`` step levels: at least
    ``fast_points`` of them, a slope of ``fast_rate_gib_per_step`` or more, and every rise at
    least half of that and half of the largest rise: a leak keeps about the same each step,
    while a warm-up that lasts past ``warmup_points`` slows down (real GPU: 26 -> 34 -> 36 GiB,
    then flat). Real verl: a hook that keeps 4 GiB an update is named in the third step after
    it starts, not the sixth."""
    fast = cfg.get_float("fast_rate_gib_per_step", 0.0) * GIB
    return (fast > 0 and n >= cfg.get_int("fast_points", 3) and rate >= fast
            and bool(np.all(diffs >= 0.5 * max(fast, float(np.max(diffs))))))


def forecast_text(rate: float, units_left: float, unit: str) -> str:
    """"at +18.0 GiB per step, out of memory in about 1 step" (or "... capacity unknown")."""
    head = f"at +{rate / GIB:.1f} GiB per {unit}"
    if not np.isfinite(units_left):
        return head
    n = max(1, int(round(units_left)))
    return f"{head}, out of memory in about {n} {unit}{'' if n == 1 else 's'}"


def _levels(df: pd.DataFrame, keys: list[str], col: str, cap_col: str | None, q: float,
            windows: pd.DataFrame) -> pd.DataFrame:
    """Per ``keys`` and analysis window (``df`` has ``win``): the ``q`` quantile of ``col``
    (``peak``: its level in that step, short spikes such as the weight sync's double copy left
    out), the capacity (``cap``, NaN without ``cap_col``), the window's end and step (NaN for
    fixed windows)."""
    df = df[(df["win"] >= 0) & df[col].notna()] if len(df) else df
    if len(df) == 0:
        return pd.DataFrame(columns=[*keys, "win", "peak", "n", "floor", "cap", "end", "step"])
    grp = df.groupby([*keys, "win"])
    per = grp[col].quantile(q).rename("peak").to_frame()
    per["n"] = grp[col].size()
    per["floor"] = grp[col].min()
    per["cap"] = grp[cap_col].max() if cap_col else np.nan
    per = per.reset_index()
    per["end"] = windows["end"].to_numpy(float)[per["win"].to_numpy(int)]
    per["step"] = windows["step"].to_numpy(float)[per["win"].to_numpy(int)]
    return per


def _series(g: pd.DataFrame, cfg: Section) -> pd.DataFrame:
    """One series' levels, oldest first: per step where the data has enough steps (else per
    window), less the first ``warmup_points`` (the allocator and caches fill up there)."""
    g = g.sort_values("end")
    stepped = g[g["step"].notna()]
    if len(stepped) >= cfg.get_int("min_points"):
        g = stepped.drop_duplicates("step", keep="last")
        if "n" in g.columns and float(g["n"].median()) < cfg.get_int("min_samples_per_point"):
            g = _short_steps(g, cfg)
    elif len(g):
        # no steps (a node without the verl log): fixed windows hold a varying mix of phases
        # whose memory differs; judge levels over buckets long enough to hold many steps
        g = _buckets(g, cfg.get_float("unstepped_bucket_s"))
    level = g.attrs.get("level")
    g = g.iloc[cfg.get_int("warmup_points"):]
    g.attrs["level"] = level
    return g


def _short_steps(g: pd.DataFrame, cfg: Section) -> pd.DataFrame:
    """Levels of steps shorter than ``min_samples_per_point`` samples. A middle level is
    whichever phase the few samples hit (gen and training hold different memory); memory kept
    across steps is held through every phase, so each step's lowest sample (its floor) rises
    with a leak and not with the phase mix. With ``min_floor_samples`` or more samples a step
    the floors are judged per step (real verl: 2-3 s steps sampled each second); with fewer the
    memory is judged per minute."""
    if float(g["n"].median()) >= cfg.get_int("min_floor_samples", 2):
        floors = g[g["n"] >= cfg.get_int("min_floor_samples", 2)].assign(peak=lambda d: d["floor"])
        floors.attrs["level"] = "each step's lowest sample"
        return floors
    return _buckets(g, 60.0)


def _buckets(g: pd.DataFrame, seconds: float) -> pd.DataFrame:
    """The levels merged into ``seconds``-long buckets (median level; no step numbers)."""
    b = np.floor((g["end"] - g["end"].iloc[0]) / max(seconds, 1.0))
    return (g.groupby(b.to_numpy())
            .agg(peak=("peak", "median"), cap=("cap", "max"), end=("end", "max"))
            .reset_index(drop=True).assign(step=np.nan))


def _after_save_or_validation(ctx: Context, step: int) -> str | None:
    """"save_checkpoint" or "validation" when step ``step`` or the one before it ran one."""
    sf = ctx.sf
    for col, name in (("save_checkpoint", "save_checkpoint"), ("testing", "validation")):
        if col in sf.columns:
            hit = sf[sf["step"].isin([step, step - 1]) & sf[col].fillna(0).gt(0)]
            if len(hit):
                return name
    for e in ctx.events:
        if e.kind == "validation" and e.step in (step, step - 1):
            return "validation"
    return None


def _jump(ctx: Context, peaks: np.ndarray, steps: np.ndarray, cfg: Section
          ) -> tuple[int, float, str] | None:
    """The first jump right after a checkpoint save or a validation that stays: (index of the
    first peak after it, its size in bytes, what preceded it)."""
    if len(peaks) < 3:
        return None
    diffs = np.diff(peaks)
    lim = cfg.get_float("jump_gib") * GIB
    for i in np.flatnonzero(diffs >= lim) + 1:
        others = np.delete(diffs, i - 1)
        if len(others) and diffs[i - 1] < cfg.get_float("jump_factor") * max(
                float(np.median(np.abs(others))), 1.0):
            continue
        after = peaks[i:i + 3]
        if len(after) < 2 or float(np.median(after)) < peaks[i - 1] + 0.7 * diffs[i - 1]:
            continue
        what = _after_save_or_validation(ctx, int(steps[i]))
        if what:
            return int(i), float(diffs[i - 1]), what
    return None


def choose_advice(advice: list[str], *, jump: bool, saves: bool, host: bool) -> list[str]:
    """memory_creep's advice in the order the evidence makes likely, without what it contradicts:
    a jump after a save or validation puts their frequencies first; a steady creep puts the
    leak first and names the frequencies only when saves or validations ran in its span; host
    memory gets no GPU headroom or offload advice (offloading adds host memory)."""
    save = [a for a in advice if "save_freq" in a]
    room = [a for a in advice if "gpu_memory_utilization" in a and a not in save]
    leak = [a for a in advice if a not in save and a not in room]
    if jump:
        return save + leak
    return leak + (save if saves else []) + ([] if host else room)


def _series_flags(ctx: Context, who: str, scope: dict, peaks: np.ndarray, ends: np.ndarray,
                  steps: np.ndarray, capacity: float, cfg: Section, host: bool = False) -> list:
    """The creep (and checkpoint-jump) flags of one memory series, oldest peak first."""
    if len(peaks) < cfg.get_int("min_points"):
        return []
    per_step = np.isfinite(steps).all() and len(steps) >= cfg.get_int("min_points")
    unit = "step" if per_step else "minute"
    x = None if per_step else (ends - ends[0]) / 60.0
    min_rate = cfg.get_float("min_rate_gib_per_step" if per_step else "min_rate_gib_per_min") * GIB
    width = cfg.get_int("window")
    flags = []
    state: list[Creep | None] = []
    above = cfg.get_float("above_earlier_gib", 0.0) * GIB
    highs = np.maximum.accumulate(peaks)  # highs[k]: the highest level up to point k
    for i in range(len(peaks)):
        lo = max(0, i - width + 1)
        # a leak sets new highs; a level that swings between two modes (a fully-async trainer's
        # steps mix waiting and training) climbs for a few steps back to where it has been
        if lo > 0 and not peaks[i] >= highs[lo - 1] + above:
            state.append(None)
            continue
        state.append(creep(peaks[lo:i + 1], capacity, cfg, min_rate,
                           None if x is None else x[lo:i + 1]))
    i = 0
    while i < len(state):
        if state[i] is None:
            i += 1
            continue
        j = i
        while j + 1 < len(state) and state[j + 1] is not None:
            j += 1
        last = state[j]
        lo = max(0, min(i, j - width + 1))
        span = (f"steps {int(steps[lo])}-{int(steps[j])}" if per_step
                else f"{(ends[j] - ends[lo]) / 60:.0f} min")
        cap = f" of {capacity / GIB:.0f} GiB" if capacity > 0 else ""
        crit = last.units_left <= cfg.get_float("critical_units_left")
        end = None if j == len(state) - 1 else float(ends[j + 1])
        rng = [int(steps[lo]), int(steps[j])] if per_step else None
        flag = make_flag(
            "memory_creep", "critical" if crit else "warning", float(ends[i]), end,
            {**scope, **({"steps": rng} if rng else {})},
            f"{who} memory grows steadily ({span}: {peaks[lo] / GIB:.1f} -> "
            f"{last.level / GIB:.1f} GiB{cap}): "
            f"{forecast_text(last.rate, last.units_left, unit)}.",
        )
        saves = per_step and any(_after_save_or_validation(ctx, int(st))
                                 for st in steps[lo:j + 1])
        flag.advice = choose_advice(flag.advice, jump=False, saves=saves, host=host)
        flags.append(flag)
        i = j + 1
    if per_step and not flags:
        jump = _jump(ctx, peaks, steps, cfg)
        if jump:
            k, size, what = jump
            cap = f" of {capacity / GIB:.0f} GiB" if capacity > 0 else ""
            flag = make_flag(
                "memory_creep", "warning", float(ends[k]), None,
                {**scope, "steps": [int(steps[k - 1]), int(steps[k])]},
                f"{who} memory jumped by {size / GIB:.1f} GiB right after {what} "
                f"(step {int(steps[k - 1])} -> {int(steps[k])}: {peaks[k - 1] / GIB:.1f} -> "
                f"{peaks[k] / GIB:.1f} GiB{cap}) and stayed: memory kept since the {what}.",
            )
            flag.advice = choose_advice(flag.advice, jump=True, saves=True, host=host)
            flags.append(flag)
    return flags


def _phase_series(df: pd.DataFrame, keys: list[str], col: str, cap_col: str | None,
                  ctx: Context, cfg: Section) -> list[tuple[tuple, str | None, pd.DataFrame]]:
    """``(key, phase, levels)`` per series to judge: one per phase of each ``keys`` group.

    verl frees and refills GPU memory by phase (the rollout engine sleeps through training and
    wakes for generation; an HF rollout's KV cache grows through generation), so a step's level
    over all its samples moves with the phase mix: longer generations alone make it climb.
    Each phase is judged against itself, where the steps give it at least ``min_points``
    levels of ``min_samples_per_point`` samples each; a group with no such phase (short steps,
    no step lines) is judged over all its samples as before. Phases with the most samples
    come first."""
    q = cfg.get_float("quantile")
    per = _levels(df, keys, col, cap_col, q, ctx.windows)
    out: list[tuple[tuple, str | None, pd.DataFrame]] = []
    if not len(per):
        return out
    labelled = df[df["phase"].notna()] if "phase" in df.columns else df.iloc[:0]
    by_phase = _levels(labelled, [*keys, "phase"], col, cap_col, q, ctx.windows)
    min_points = cfg.get_int("min_points") + cfg.get_int("warmup_points")
    stepped = by_phase[by_phase["step"].notna()] if len(by_phase) else by_phase
    judged: dict[tuple, list[tuple[int, str, pd.DataFrame]]] = {}
    if len(stepped):
        stats = stepped.groupby([*keys, "phase"], sort=False)["n"].agg(["size", "median", "sum"])
        ok = stats[(stats["size"] >= min_points)
                   & (stats["median"] >= cfg.get_int("min_samples_per_point"))]
        wanted = set(ok.index)
        for name, gp in by_phase.groupby([*keys, "phase"], sort=False):
            if name in wanted:
                judged.setdefault(tuple(name[:-1]), []).append(
                    (-int(ok.loc[name, "sum"]), str(name[-1]), gp))
    for key, g in per.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        if key in judged:
            out.extend((key, phase, _series(gp, cfg)) for _, phase, gp in sorted(
                judged[key], key=lambda row: row[:2]))
        else:
            out.append((key, None, _series(g, cfg)))
    return out


#: What each reading needs of the job (``monitor.detect.premises``): nothing beyond
#: per-step memory levels.
PREMISES: dict[str, tuple[str, ...]] = {
    "memory_creep": (),
}


def detect_memory_creep(ctx: Context) -> list:
    """Steady growth of each GPU's per-step memory level, phase by phase, with the forecast to
    the capacity, or a jump that stays right after a checkpoint save or a validation (see the
    module doc and ``_phase_series``)."""
    cfg = ctx.cfg("memory_creep")
    flags = []
    act = ctx.act_windowed
    series = (_phase_series(act, ["node", "gpu"], "mem_used_bytes", "mem_total_bytes", ctx, cfg)
              if "mem_used_bytes" in act else [])
    by_gpu: dict[tuple, list[list]] = {}
    for (node, gpu), phase, g in series:
        cap = cfg.get_float("capacity_bytes", 0.0) or float(g["cap"].max() or 0.0)
        where = _where(phase, g)
        by_gpu.setdefault((node, gpu), []).append(_series_flags(
            ctx, f"GPU {int(gpu)} on node {node}{where}:", {"node": str(node), "gpus": [int(gpu)]},
            g["peak"].to_numpy(float), g["end"].to_numpy(float),
            g["step"].to_numpy(float), cap if np.isfinite(cap) else 0.0, cfg))
    flags = _merge([f for per_phase in by_gpu.values() for f in _confirmed(per_phase)])
    host = ctx.host
    if "train_rss_bytes" in host.columns and host["train_rss_bytes"].notna().any():
        host = label_samples(host, ctx.timeline)
        host = host.assign(win=W.assign_windows(host["ts"].astype(float), ctx.windows))
        by_node: dict[tuple, list[list]] = {}
        for key, phase, g in _phase_series(host, ["node"], "train_rss_bytes", None, ctx, cfg):
            node = key[0]
            where = _where(phase, g)
            by_node.setdefault(key, []).append(_series_flags(
                ctx, f"Host memory (RSS) of the training processes on node {node}{where}:",
                {"node": str(node)}, g["peak"].to_numpy(float), g["end"].to_numpy(float),
                g["step"].to_numpy(float), cfg.get_float("host_capacity_bytes", 0.0), cfg,
                host=True))
        flags.extend(_merge([f for per in by_node.values() for f in _confirmed(per)]))
    sf = ctx.sf
    if (not series and len(sf) and sf["mem_reserved"].notna().sum() >= cfg.get_int("min_points")):
        s = sf[sf["mem_reserved"].notna()].sort_values("end").iloc[cfg.get_int("warmup_points"):]
        cap = cfg.get_float("capacity_bytes", 0.0)
        flags.extend(_series_flags(ctx, "verl's reserved peak:", {},
                                   s["mem_reserved"].to_numpy(float), s["end"].to_numpy(float),
                                   s["step"].to_numpy(float), cap, cfg))
    return flags


def _where(phase: str | None, g: pd.DataFrame) -> str:
    """" (gen)" for a phase's series, " (each step's lowest sample)" for short steps' floors."""
    label = phase or g.attrs.get("level")
    return f" ({label})" if label else ""


def _confirmed(per_phase: list[list]) -> list:
    """The flags of one series' phases that another phase confirms: memory kept across steps
    is held through every phase, so where two or more phases were judged, a creep (or a jump)
    counts only while another phase's flag overlaps it in time; one phase's noisier levels
    alone do not make a leak."""
    if len(per_phase) < 2:
        return [f for flags in per_phase for f in flags]

    def overlap(a, b) -> bool:
        return (a.end is None or b.start <= a.end) and (b.end is None or a.start <= b.end)

    out = []
    for i, flags in enumerate(per_phase):
        others = [g for j, fl in enumerate(per_phase) if j != i for g in fl]
        out.extend(f for f in flags if any(overlap(f, g) for g in others))
    return out


def _merge(flags: list) -> list:
    """A node's GPUs (or phases of one series) whose flags overlap in time become one flag: the
    worst severity, every GPU in scope, the evidence of the first critical one (else the
    first)."""
    out: list = []
    for f in sorted(flags, key=lambda f: (str(f.scope.get("node")), f.start)):
        prev = out[-1] if out else None
        if (prev is None or prev.scope.get("node") != f.scope.get("node")
                or (prev.end is not None and f.start > prev.end)):
            out.append(f)
            continue
        gpus = sorted(set(prev.scope.get("gpus", [])) | set(f.scope.get("gpus", [])))
        if f.severity == "critical" and prev.severity != "critical":
            prev.severity, prev.evidence = "critical", f.evidence
        if gpus:  # host series have no GPUs
            prev.scope["gpus"] = gpus[:16]
        prev.end = None if prev.end is None or f.end is None else max(prev.end, f.end)
    for f in out:
        if len(f.scope.get("gpus", [])) > 1:
            f.evidence += f" {len(f.scope['gpus'])} GPUs of this node grow alike."
    return out
