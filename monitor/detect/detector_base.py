"""What every detector shares: the prepared inputs (``Context``) and the flag builder."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from monitor.analysis import signature as S
from monitor.analysis.attribution import label_samples, phase_timeline
from monitor.config import Config, Section
from monitor.detect import window as W
from monitor.detect.flag_advice import advice_for
from monitor.detect.persistence import Episode, episodes
from monitor.frames import empty_nccl_frame, empty_rollout_frame
from monitor.records import Event, Flag, StepRecord


@dataclass
class Context:
    """The inputs of one ``run_all`` call, with the derived tables detectors share (lazily)."""

    steps: list[StepRecord]
    gpu: pd.DataFrame
    host: pd.DataFrame
    events: list[Event]
    config: Config
    now: float
    cache: dict[str, Any] = field(default_factory=dict)
    #: The run's first steps, kept by a live caller after they have left its rolling window
    #: (the run's own baseline for throughput_regression); empty when ``steps`` is the whole run.
    reference_steps: list[StepRecord] = field(default_factory=list)
    #: NCCL Inspector records (``monitor.frames.NCCL_COLUMNS``); empty without the plugin.
    nccl: pd.DataFrame = field(default_factory=empty_nccl_frame)
    #: Rollout-engine samples (``monitor.frames.ROLLOUT_COLUMNS``: vLLM / SGLang servers);
    #: empty without ``--rollout-server`` / discovery.
    rollout: pd.DataFrame = field(default_factory=empty_rollout_frame)
    #: The trainer mode the job's printed config names (``monitor.logs.modes.printed_mode``),
    #: None without one: it decides the mode where the step keys cannot (``judge_mode``).
    printed_mode: str | None = None
    #: The job's printed config, flattened to dotted keys (``monitor.logs.job_config.flatten``);
    #: empty when the job printed none. Premises read it (``monitor.detect.premises``).
    job: dict[str, Any] = field(default_factory=dict)
    #: Ray actor names the log's prefixes showed (``TaskRunner``, ``TaskRunnerV1``, ...).
    actors: frozenset[str] = frozenset()
    #: Every premise judged so far (``holds``), for the report's "not judged" list.
    judged: list[Any] = field(default_factory=list)

    def holds(self, reading: str) -> bool:
        """Whether every premise of ``reading`` (its detector's ``PREMISES`` table) holds on
        this job; each verdict is kept in ``judged`` (once per reading)."""
        from monitor.detect.premise_tables import TABLES
        from monitor.detect.premises import judge

        done = self.cache.setdefault("premises", {})
        if reading not in done:
            verdicts = judge(self, reading, TABLES.get(reading, ()))
            self.judged.extend(verdicts)
            done[reading] = all(v.holds is True for v in verdicts)
        return done[reading]

    def fails(self, reading: str) -> bool:
        """Whether a premise of ``reading`` is known to fail on this job (``holds`` is False
        for that and for a premise that cannot be judged; this only for the first)."""
        self.holds(reading)
        return any(j.reading == reading and j.holds is False for j in self.judged)

    @cached_property
    def mode(self) -> str:
        """The run's trainer mode (its keys, or the printed config where they cannot tell)."""
        from monitor.logs.modes import judge_mode

        return judge_mode(self.steps, self.printed_mode).mode

    @cached_property
    def finished_at(self) -> float | None:
        """When the run finished (its last progress line, final validation), else None."""
        from monitor.hang.finish import finish_time

        got = finish_time(self.events, self.steps)
        return got[0] if got else None

    def version_upper_below(self, version: str) -> bool:
        """Whether the verl version the keys reveal is known to be older than ``version``."""
        from monitor.logs.keys import version_below

        return version_below(self.verl_version, version)

    def cfg(self, section: str) -> Section:
        """One detector's settings."""
        return self.config.section(section)

    @cached_property
    def sf(self) -> pd.DataFrame:
        """The step frame (see ``window.step_frame``)."""
        return W.step_frame(self.steps)

    @cached_property
    def median_step(self) -> float | None:
        """Median step time of the run (without testing/checkpoint time), None when unknown."""
        if len(self.sf) == 0:
            return None
        v = W.core_total(self.sf).median()
        return float(v) if pd.notna(v) and v > 0 else None

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """Phase intervals of every step."""
        return phase_timeline(self.steps, self.events)

    @cached_property
    def act(self) -> pd.DataFrame:
        """GPU samples with ``act`` (SM activity, else util), ``phase`` and ``step`` labels."""
        df = W.activity(self.gpu)
        if len(df) == 0:
            df["phase"] = pd.Series(dtype=object)
            df["step"] = pd.Series(dtype=float)
            return df
        return label_samples(df, self.timeline)

    @cached_property
    def sample_interval(self) -> float:
        """Typical seconds between two samples of one GPU (1.0 when unknown)."""
        df = self.act
        if len(df) < 2:
            return 1.0
        first = df.groupby(["node", "gpu"], sort=False)["ts"]
        diffs = first.diff().dropna()
        diffs = diffs[diffs > 0]
        return float(diffs.median()) if len(diffs) else 1.0

    @cached_property
    def windows(self) -> pd.DataFrame:
        """Analysis windows: each step's interval, and fixed windows where no step covers the data.

        Columns start, end, step (NaN for fixed windows), sorted, not overlapping.
        """
        length = self.config.get_float("windows.length_s", 30.0)
        if self.median_step:
            length = max(length, min(self.median_step, 4 * length))
        parts = []
        sf = self.sf
        lo = self.act["ts"].min() if len(self.act) else np.nan
        hi = self.now
        if len(sf):
            sw = sf[["start", "end", "step"]].copy()
            sw = sw[sw["end"] > sw["start"]]
            # consecutive steps must not overlap: clip each start at the previous end
            prev_end = sw["end"].shift(1)
            sw["start"] = np.where(prev_end.notna(), np.maximum(sw["start"], prev_end), sw["start"])
            sw = sw[sw["end"] > sw["start"]]
            parts.append(sw)
            if pd.notna(lo) and lo < sw["start"].min():
                pre = W.time_windows(float(lo), float(sw["start"].min()), length)
                parts.append(pre.assign(step=np.nan))
            tail_start = float(sw["end"].max())
        else:
            tail_start = float(lo) if pd.notna(lo) else np.nan
        if pd.notna(tail_start) and hi is not None and hi > tail_start:
            parts.append(W.time_windows(tail_start, float(hi) + 1e-9, length).assign(step=np.nan))
        if not parts:
            return pd.DataFrame(columns=["start", "end", "step"], dtype=float)
        out = pd.concat(parts, ignore_index=True).sort_values("start", kind="stable")
        return out.reset_index(drop=True)

    @cached_property
    def act_windowed(self) -> pd.DataFrame:
        """``act`` samples with ``win`` (index into ``windows``; -1 outside every window)."""
        df = self.act.copy()
        df["win"] = W.assign_windows(df["ts"], self.windows) if len(df) else []
        return df

    def windows_for(self, seconds: float) -> int:
        """How many analysis windows make up ``seconds`` (nearest whole number, at least 1).

        Steps of 29.9 s and a 30 s persistence make one window, not two.
        """
        length = self.windows_length
        return max(1, int(math.floor(seconds / length + 0.5)))

    # --- signatures (issue 23): what the GPUs and the host did in each phase ----------------
    @cached_property
    def signature_thresholds(self) -> S.Thresholds:
        """The classifier's lines (``signature`` section of the config)."""
        return S.Thresholds.from_config(self.cfg("signature"))

    @cached_property
    def act_host(self) -> pd.DataFrame:
        """``act`` samples with ``cpu_max``: their node's busiest core at the same time."""
        return S.with_host_cpu(self.act, self.host, self.signature_thresholds.host_match_s)

    @cached_property
    def signatures(self) -> pd.DataFrame:
        """Per (step, phase, node, gpu): the samples' means and their signature
        (``monitor.analysis.signature.summarize``); the ledger and the evidence read it."""
        return S.step_phase_signatures(self.act_host, None, self.signature_thresholds)

    @cached_property
    def pcie_measured(self) -> bool:
        """Whether any GPU sample carries PCIe rates (GPM), so a quiet PCIe is evidence."""
        df = self.act
        return any(c in df.columns and df[c].notna().any() for c in ("pcie_tx_bps",
                                                                      "pcie_rx_bps"))

    def signature_between(
        self,
        lo: float,
        hi: float,
        phases: tuple[str, ...] | None = None,
        prefer: tuple[str, ...] = (),
    ) -> S.Signature | None:
        """The dominant signature of the samples in ``[lo, hi)`` (only ``phases`` when given),
        judged per phase and GPU; None without samples."""
        df = self.act_host
        if len(df) == 0:
            return None
        sub = df[(df["ts"] >= lo) & (df["ts"] < hi)]
        if phases is not None:
            sub = sub[sub["phase"].isin(phases)]
        else:
            sub = sub.assign(phase=sub["phase"].fillna("(unlabelled)"))
        if len(sub) == 0:
            return None
        table = S.summarize(sub, ["phase", "node", "gpu"], self.signature_thresholds)
        return S.dominant(table, prefer)

    @cached_property
    def verl_version(self) -> str:
        """verl's version range as the step metrics reveal it (``guess_version``)."""
        from monitor.logs.keys import guess_version

        keys: set[str] = set()
        for s in self.steps[:50]:
            keys.update(s.metrics.keys())
        return guess_version(keys) if keys else "unknown"

    def advice(self, kind: str, phase: str | None, signature: S.Signature | str | None
               ) -> list[str]:
        """Advice for a flag of ``kind`` chosen by its phase and signature (see ``advice_for``)."""
        name = signature.name if isinstance(signature, S.Signature) else signature
        return advice_for(kind, phase=phase, signature=name, version=self.verl_version,
                          measured=("pcie",) if self.pcie_measured else ())

    @cached_property
    def windows_length(self) -> float:
        """Typical window length in seconds."""
        win = self.windows
        if len(win) == 0:
            return self.config.get_float("windows.length_s", 30.0)
        return float(max(1e-3, (win["end"] - win["start"]).median()))


def severity_for(
    value: float, warning: float, critical: float, higher_is_worse: bool = True
) -> str:
    """``critical`` past the critical threshold, else ``warning`` past the warning one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "info"
    if higher_is_worse:
        if value >= critical:
            return "critical"
        return "warning" if value >= warning else "info"
    if value <= critical:
        return "critical"
    return "warning" if value <= warning else "info"


def make_flag(
    kind: str,
    severity: str,
    start: float,
    end: float | None,
    scope: dict[str, Any],
    evidence: str,
    advice: list[str] | None = None,
) -> Flag:
    """A Flag with the advice for its kind attached (or ``advice``, chosen by the detector,
    e.g. ``Context.advice`` by phase and signature); empty scope entries are dropped."""
    clean = {k: v for k, v in scope.items() if v is not None and v != [] and v != ""}
    return Flag(
        kind=kind,
        severity=severity,
        start=float(start),
        end=None if end is None else float(end),
        scope=clean,
        evidence=evidence,
        advice=list(advice) if advice else advice_for(kind),
    )


def episode_times(ep: Episode, starts: np.ndarray, ends: np.ndarray) -> tuple[float, float | None]:
    """Flag start (end of the point that met persistence) and end (end of the last true point)."""
    start = float(ends[ep.opened])
    end = None if ep.closed is None else float(ends[ep.last])
    return start, end


def step_range(steps: pd.Series, ep: Episode) -> list[int] | None:
    """[first, last] step numbers of an episode over a step-indexed series (None if unknown)."""
    vals = steps.to_numpy()
    lo = vals[ep.onset]
    hi = vals[ep.last]
    if pd.isna(lo) or pd.isna(hi):
        return None
    return [int(lo), int(hi)]


def window_steps(ctx: Context, onset: int, last: int) -> list[int] | None:
    """[first, last] step numbers of the analysis windows ``onset..last`` (None if no window
    there belongs to a step)."""
    s = ctx.windows["step"].iloc[onset:last + 1].dropna()
    return [int(s.min()), int(s.max())] if len(s) else None


class EpisodeSpan(NamedTuple):
    """Several overlapping episodes seen as one: the earliest onset and opening, the latest
    last point, and whether any of them is still open."""

    onset: int
    opened: int
    last: int
    still_open: bool


def merge_episodes(eps: list[Episode]) -> EpisodeSpan:
    """The span of overlapping episodes (one flag for several GPUs' episodes)."""
    return EpisodeSpan(
        onset=min(ep.onset for ep in eps),
        opened=min(ep.opened for ep in eps),
        last=max(ep.last for ep in eps),
        still_open=any(ep.closed is None for ep in eps),
    )


class EventTime(NamedTuple):
    """When an event happened; ``known`` is False where the log gave no time of its own."""

    time: float
    known: bool


class TimedEvent(NamedTuple):
    """An event with its time (see ``EventTime``)."""

    time: float
    known: bool
    event: Event


def group_by_time(timed: list[TimedEvent], group_s: float) -> list[list[TimedEvent]]:
    """Events in time order, grouped into bursts: an event within ``group_s`` seconds of the
    previous one joins its burst."""
    groups: list[list[TimedEvent]] = []
    for item in sorted(timed, key=lambda it: it.time):
        if groups and item.time - groups[-1][-1].time <= group_s:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def steps_text(rng: list[int] | None) -> str:
    """"steps 41-60" or "step 41" or ""."""
    if not rng:
        return ""
    if rng[0] == rng[1]:
        return f"step {rng[0]}"
    return f"steps {rng[0]}-{rng[1]}"


def pct(x: float) -> str:
    """A 0-100 value as "84%"."""
    return f"{x:.0f}%"


class StepEpisode(NamedTuple):
    """An episode of a per-step condition: the flag's start and end times, its step range."""

    episode: Episode
    start: float
    end: float | None
    steps: list[int]


def step_episodes(
    ctx: Context, cond: list[object], open_after: int, close_after: int
) -> list[StepEpisode]:
    """Episodes of a per-step condition (aligned with ``ctx.sf``)."""
    sf = ctx.sf
    ends = sf["end"].to_numpy(float)
    stepnos = sf["step"].to_numpy()
    out = []
    for ep in episodes(cond, open_after, close_after):
        start = float(ends[ep.opened])
        end = None if ep.closed is None else float(ends[ep.last])
        out.append(StepEpisode(ep, start, end, [int(stepnos[ep.onset]), int(stepnos[ep.last])]))
    return out
