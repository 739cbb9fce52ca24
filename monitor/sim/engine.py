"""The scenario simulator: a whole verl run — steps, logs, GPU and host telemetry, and truth.

``SimRun("io_starvation", steps=60, seed=1)`` plans every step at construction (phase
timeline, metrics, log lines) and samples telemetry on demand (``gpu_sample_at(t)``), so the
exporter's simulated backend, the live demo, the detector benchmark and the tests all read one
consistent run. Everything is deterministic for a seed.

Timeline of a step (times are exact milliseconds): a host-side gap (batch preparation), then
``reshard`` (before gen up to 0.7.0; after ``update_actor`` from 0.7.1, as
``timing_s/update_weights``), ``gen``, ``rollout_wait`` (only when logged), ``reward``,
``old_log_prob``, ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor`` (whose last
part is collective communication, ``comm``), with short host gaps between phases. The gaps are
the canonical ``other``. ``steps[i].phases`` holds the intervals a parser can recover from the
chosen log format (see :meth:`SimRun._reported_phases`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS
from monitor.sim import logtext
from monitor.sim.metrics import build_metrics
from monitor.sim.scenarios import (
    BASE_GAP_SHARE,
    BASE_SHARES,
    SCRIPT_STEP_SECONDS,
    SCRIPTS,
    SIM_MODES,
    SPLIT_POOL_MODES,
    TRAINING_TIMELINE,
    Scenario,
    ScenarioContext,
    SegmentInfo,
    StepPlan,
    resolve_script,
    script_mode,
)
from monitor.sim.telemetry import MEM_LEVELS, Segment, Telemetry
from monitor.sim.versions import get_profile, ray_prefix

#: 2026-01-01T00:00:00Z: the default start, so a seed gives byte-identical files.
DEFAULT_START = 1_767_225_600.0
LOG_FORMATS: tuple[str, ...] = ("console", "breakdown")
#: Timeline label of the fully-async trainer's wait for samples (logged as ``timing_s/gen``):
#: its GPUs idle, so it has its own telemetry signature; the parser sees the phase ``gen``.
WAIT_LABEL = "wait_samples"


@dataclass
class SimStep:
    """One completed step: absolute times, phase intervals, and the raw keys verl logged."""

    step: int
    start: float
    end: float
    phases: dict[str, tuple[float, float]]
    metrics: dict[str, Any]
    scenario: str = "healthy"
    timeline: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Step time in seconds (``timing_s/step``), exact to the millisecond."""
        return round(self.end - self.start, 3)

    def durations(self) -> dict[str, float]:
        """Seconds per reported phase, plus ``other`` (step time no phase explains)."""
        out = {p: round(e - s, 3) for p, (s, e) in self.phases.items()}
        out["other"] = round(max(0.0, self.total - sum(out.values())), 3)
        return out


@dataclass
class _Line:
    t: float
    text: str
    prefixed: bool = True


def _mem_level(label: str, plan: StepPlan) -> float:
    base = MEM_LEVELS.get(label, 0.62)
    if label in TRAINING_TIMELINE or label == "comm":
        if plan.mem_train is not None:
            return plan.mem_train - (0.74 - base) * 0.3
    elif label in ("gen", "rollout_wait", "reward", "reshard") and plan.mem_gen is not None:
        return plan.mem_gen
    return base


class SimRun:
    """A simulated verl run with an injected problem (or none).

    ``scenario`` is a scenario or script name (``list_scenarios()``), a ``"name:steps,..."``
    string, or a list of ``(scenario, steps)``. ``steps`` defaults to 60 (a script keeps its
    own length). ``step_seconds`` defaults to 30 (12 for the ``demo`` script). ``onset`` is
    the healthy share before a single scenario starts (at least a third). ``log_format`` is
    ``console`` (the release's ``step:N - k:v`` lines) or ``breakdown`` (``Step N: total=..``).

    Attributes: ``steps`` (completed :class:`SimStep` list), ``truth`` (dicts with ``kind``,
    ``start``, ``end``, ``scope``, ``detail``, ``related``), ``start_time``, ``end_time`` (end
    of telemetry: after an OOM or a stall it runs past the last step), ``log_end_time`` (end of
    the last completed step: the log's mtime), ``node_names``, ``outcome`` (``completed``,
    ``oom`` or ``stalled``), ``script`` (the resolved ``(scenario, steps)`` segments),
    ``planned_steps``, ``profile`` (the release's :class:`VersionProfile`), ``mode`` (the
    trainer mode: ``sync``, ``agent_loop`` or ``fully_async``; by default the one the
    scenarios need, see ``scenarios.SIM_MODES``). The rollout engines' series of the
    agent-loop and fully-async modes come from :meth:`rollout_states_at`.
    """

    def __init__(
        self,
        scenario: str | Scenario | list[tuple[str | Scenario, int]] = "healthy",
        steps: int | None = None,
        nodes: int = 1,
        gpus_per_node: int = 8,
        seed: int = 0,
        verl_version: str = "0.7.1",
        start_time: float | None = None,
        step_seconds: float | None = None,
        noise: float = 1.0,
        timestamps: bool = False,
        onset: float = 0.4,
        log_format: str = "console",
        mode: str | None = None,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be >= 1")
        if log_format not in LOG_FORMATS:
            raise ValueError(f"unknown log format {log_format!r}; valid: {', '.join(LOG_FORMATS)}")
        self.profile = get_profile(verl_version)
        self.verl_version = self.profile.version
        self.scenario = scenario if isinstance(scenario, str) else "custom"
        if step_seconds is None:
            step_seconds = SCRIPT_STEP_SECONDS.get(self.scenario, 30.0)
        if step_seconds <= 0:
            raise ValueError("step_seconds must be > 0")
        self.segments_plan = resolve_script(scenario, steps, onset)
        self.mode = mode or script_mode(self.segments_plan)
        if self.mode not in SIM_MODES:
            raise ValueError(f"unknown trainer mode {self.mode!r}; valid: {', '.join(SIM_MODES)}")
        if self.mode != "sync" and (log_format != "console" or not self.profile.agent_loop):
            raise ValueError(f"the {self.mode} mode needs the console log of verl 0.6 or later")
        self._mode_state: dict[str, Any] = {}
        self.script: list[tuple[str, int]] = [(s.name, n) for s, n in self.segments_plan]
        self.nodes = int(nodes)
        self.gpus_per_node = int(gpus_per_node)
        self.n_gpus = self.nodes * self.gpus_per_node
        self.node_names = [f"node{i}" for i in range(self.nodes)]
        self.seed = int(seed)
        self.step_seconds = float(step_seconds)
        self.noise = float(noise)
        self.timestamps = bool(timestamps)
        self.log_format = log_format
        self.start_time = float(DEFAULT_START if start_time is None else start_time)
        self.planned_steps = sum(n for _, n in self.script)
        self.with_rollout_wait = log_format == "breakdown" or any(
            s.uses_rollout_wait for s, _ in self.segments_plan
        )
        ss = np.random.SeedSequence(self.seed)
        self._rng_time, self._rng_metrics, self._rng_misc = (
            np.random.default_rng(s) for s in ss.spawn(3)
        )
        self._seg_seeds = ss.spawn(len(self.segments_plan) + 1)
        self.pid = int(self._rng_misc.integers(2000, 4_000_000))
        self.ips = [f"10.0.{i // 250}.{11 + i % 250}" for i in range(self.nodes)]
        self.steps: list[SimStep] = []
        self.truth: list[dict[str, Any]] = []
        self.outcome = "completed"
        self._step_lines: list[list[_Line]] = []
        self._preamble: list[_Line] = []
        self._timeline: list[Segment] = []
        self._xid: list[tuple[float, int, int]] = []
        self._down: dict[int, float] = {}
        self._hang_idle: set[int] = set()
        self._build()
        self._telemetry = Telemetry(
            self._timeline, self.node_names, self.gpus_per_node, self.seed, self.noise,
            self._xid, self._down,
        )
        self._telemetry.hang_idle = set(self._hang_idle)

    # ------------------------------------------------------------------ planning
    def _base_plan(self, index: int) -> StepPlan:
        rng = self._rng_time
        jitter = 0.025 * self.noise
        drift = 1.0 + 0.04 * index / max(self.planned_steps, 1)
        durations: dict[str, float] = {}
        for phase, share in BASE_SHARES.items():
            d = share * self.step_seconds * max(0.5, 1.0 + jitter * rng.standard_normal())
            if phase == "gen":
                d *= drift
            durations[phase] = d
        if self.with_rollout_wait:
            durations["rollout_wait"] = float(rng.uniform(0.005, 0.02))
        if self.mode in SPLIT_POOL_MODES:  # gen is the wait for samples: short when all is well
            durations["gen"] *= 0.09
        finish = 1.0 - np.abs(rng.normal(0.0, 0.025 * max(self.noise, 0.2), self.n_gpus))
        finish = np.clip(finish, 0.88, 1.0)
        finish[int(np.argmax(finish))] = 1.0
        gaps = BASE_GAP_SHARE * self.step_seconds * max(0.5, 1.0 + jitter * rng.standard_normal())
        return StepPlan(durations=durations, gaps=gaps, gen_finish=[float(f) for f in finish])

    @property
    def _reshard_after(self) -> bool:
        """Whether the weight sync follows the update (0.7.1+, and every fully-async step)."""
        return self.profile.reshard_after_update or self.mode in SPLIT_POOL_MODES

    def _order(self) -> list[str]:
        order: list[str] = []
        if not self._reshard_after:
            order.append("reshard")
        order.append(WAIT_LABEL if self.mode in SPLIT_POOL_MODES else "gen")
        if self.with_rollout_wait:
            order.append("rollout_wait")
        order += ["reward", "old_log_prob", "ref", "values", "adv", "update_critic"]
        order += ["update_actor", "comm"]
        if self._reshard_after:
            order.append("reshard")
        return order

    def _layout(self, plan: StepPlan, t0_ms: int) -> tuple[list[tuple[str, int, int]], int]:
        """Integer-millisecond layout of one step: [(label, start_ms, end_ms)], end_ms.

        The phases run end to end and the step's untimed host work (the canonical ``other``)
        comes last, where the attribution lays it out (``phase_timeline``): spread between the
        phases instead, it shifted each phase off the one the analysis reads its samples in,
        and a healthy step's short training phases read their neighbours' idle samples (a
        healthy update_critic at 34% SM)."""
        order = self._order()
        dur_ms = {p: max(1, round(plan.durations["gen" if p == WAIT_LABEL else p] * 1000))
                  for p in order}
        gaps_ms = max(0, round(plan.gaps * 1000))
        out: list[tuple[str, int, int]] = []
        cur = t0_ms
        for p in order + (["gap"] if gaps_ms else []):
            dur = gaps_ms if p == "gap" else dur_ms[p]
            out.append((p, cur, cur + dur))
            cur += dur
        return out, cur

    def _build(self) -> None:
        s0 = self.start_time
        cur_ms = 0
        index = 0
        prev_mem = MEM_LEVELS["idle"]
        terminal = False
        ms = 1000.0
        for seg_i, (sc, n) in enumerate(self.segments_plan):
            ctx = ScenarioContext(
                rng=np.random.default_rng(self._seg_seeds[seg_i]),
                nodes=self.nodes,
                gpus_per_node=self.gpus_per_node,
                step_seconds=self.step_seconds,
                node_names=self.node_names,
            )
            sc.setup(ctx)
            seg_start = s0 + cur_ms / ms
            first_step: int | None = None
            if sc.terminal in ("stall", "hang"):
                end_ms = cur_ms + round(n * self.step_seconds * 1000)
                label = "hung" if sc.terminal == "hang" else "stalled"
                self._timeline.append(
                    Segment(seg_start, s0 + end_ms / ms, label, None, None, prev_mem)
                )
                if sc.terminal == "hang":
                    self._hang_idle.update(ctx.state.get("global", []))
                info = SegmentInfo(None, None, seg_start, s0 + end_ms / ms, ctx.state)
                entries = sc.truth(info)
                if sc.kind == "gpu_fault":
                    down_t = seg_start + 0.3 * self.step_seconds
                    for g in ctx.state["global"]:
                        self._down[g] = down_t
                        self._xid.append((down_t, g, sc.xid))
                    for e in entries:
                        e["start"] = down_t
                    entries.append({
                        "kind": "stalled", "scenario": sc.name, "start": seg_start,
                        "end": s0 + end_ms / ms, "scope": {},
                        "detail": "No step completes after the GPU went down.",
                        "related": [],
                    })
                self.truth.extend(entries)
                cur_ms = end_ms
                self.outcome = "stalled"
                terminal = True
                break
            spikes: list[int] = []
            for k in range(n):
                plan = self._base_plan(index)
                sc.apply(plan, k, n, ctx)
                if plan.data_wait > 0:
                    # the batch fetch before the step timer: wall time, in no step's total
                    dw = round(plan.data_wait * 1000)
                    self._timeline.append(Segment(s0 + cur_ms / ms, s0 + (cur_ms + dw) / ms,
                                                  "data_wait", index, plan, prev_mem))
                    cur_ms += dw
                layout, end_ms = self._layout(plan, cur_ms)
                failing = sc.terminal == "oom" and k == min(getattr(sc, "precursor_steps", 2), n - 1)
                if failing:
                    self._oom(sc, ctx, plan, layout, seg_start, first_step, prev_mem)
                    terminal = True
                    break
                step_no = index + 1
                if first_step is None:
                    first_step = step_no
                timeline = []
                for label, a, b in layout:
                    mem = prev_mem if label == "gap" else _mem_level(label, plan)
                    self._timeline.append(Segment(s0 + a / ms, s0 + b / ms, label, index, plan, mem))
                    timeline.append((label, s0 + a / ms, s0 + b / ms))
                    prev_mem = mem
                dur = {("gen" if p == WAIT_LABEL else p): (b - a) / ms
                       for p, a, b in layout if p != "gap"}
                total = (end_ms - cur_ms) / ms
                metrics = build_metrics(
                    self.profile, step_no, self.planned_steps, dur, total, plan, self.n_gpus,
                    self._rng_metrics, self.with_rollout_wait, mode=self.mode,
                    mode_state=self._mode_state,
                )
                step = SimStep(
                    step=step_no,
                    start=s0 + cur_ms / ms,
                    end=s0 + end_ms / ms,
                    phases=self._reported_phases(timeline),
                    metrics=metrics,
                    scenario=sc.name,
                    timeline=timeline,
                )
                self.steps.append(step)
                if sc.kind == "gpu_fault" and k % 3 == 0:
                    for g in ctx.state["global"]:
                        self._xid.append((step.start + 0.4 * step.total, g, sc.xid))
                if sc.kind == "step_time_spikes" and spikes != ctx.state.get("spikes", []):
                    spikes = list(ctx.state["spikes"])
                    ctx.state.setdefault("spike_steps", []).append(step_no)
                cur_ms = end_ms
                index += 1
            if terminal:
                break
            if first_step is not None:
                info = SegmentInfo(
                    first_step, self.steps[-1].step, seg_start, self.steps[-1].end, ctx.state,
                    spike_steps=list(ctx.state.get("spike_steps", [])),
                )
                self.truth.extend(sc.truth(info))
        if not self._timeline:
            self._timeline.append(Segment(s0, s0, "idle", None, None, prev_mem))
        self.end_time = self._timeline[-1].end
        self.log_end_time = self.steps[-1].end if self.steps else self.start_time
        self._make_lines()

    def _oom(
        self,
        sc: Scenario,
        ctx: ScenarioContext,
        plan: StepPlan,
        layout: list[tuple[str, int, int]],
        seg_start: float,
        first_step: int | None,
        prev_mem: float,
    ) -> None:
        s0 = self.start_time
        ms = 1000.0
        t_oom = None
        index = len(self.steps)
        for label, a, b in layout:
            if label == "update_actor":
                t_oom = s0 + (a + 0.4 * (b - a)) / ms
                self._timeline.append(Segment(s0 + a / ms, t_oom, label, index, plan, 0.995))
                break
            mem = prev_mem if label == "gap" else _mem_level(label, plan)
            self._timeline.append(Segment(s0 + a / ms, s0 + b / ms, label, index, plan, mem))
            prev_mem = mem
        assert t_oom is not None
        end = t_oom + 2.0 * self.step_seconds
        self._timeline.append(Segment(t_oom, end, "exited", None, None, 0.0))
        self.oom_time = t_oom
        self.outcome = "oom"
        scope = sc.scope(ctx.state)
        self.truth.append({
            "kind": "oom", "scenario": sc.name, "start": t_oom, "end": end,
            "scope": {**scope, "steps": [index + 1, index + 1]},
            "detail": sc.description,
            "related": ["memory_pressure", "stalled"],
        })
        if first_step is not None:
            self.truth.append({
                "kind": "memory_pressure", "scenario": sc.name, "start": seg_start,
                "end": t_oom, "scope": {"steps": [first_step, index + 1]},
                "detail": "GPU memory climbing toward capacity before the OOM.",
                "related": ["oom"],
            })
        gpu = ctx.state.get("gpu", 0)
        ip = self.ips[ctx.state.get("node", 0)]
        text = logtext.oom_traceback(gpu, ip, self.pid + 311, float(ctx.rng.uniform(0, 1)))
        self._oom_lines = [_Line(t_oom + 0.01 * i, line) for i, line in enumerate(text)]

    def _reported_phases(
        self, timeline: list[tuple[str, float, float]]
    ) -> dict[str, tuple[float, float]]:
        """The phase intervals a parser recovers from this run's log format and version.

        console: canonical phases; ``update_actor`` includes its collective tail; up to 0.4.0
        ``gen`` includes the weight sync (no reshard key). breakdown: ``gen``,
        ``rollout_wait``, ``values`` (critic_score: the log-prob, reference and critic passes'
        seconds together, from the first's start), ``update_actor`` (loss_comp, compute only)
        and ``comm``; ``reshard`` too (from the times of its [HybridEngine] lines: stamped, or
        captured in the ``.arrivals`` file that ``write`` leaves beside the log).
        """
        iv = {label: (a, b) for label, a, b in timeline if label != "gap"}
        out: dict[str, tuple[float, float]] = {}
        if self.log_format == "breakdown":
            out["reshard"] = iv["reshard"]
            for p in ("gen", "rollout_wait", "update_actor", "comm"):
                out[p] = iv[p]
            # critic_score: the scoring side's passes together, from the first one's start
            a0 = iv["old_log_prob"][0]
            out["values"] = (a0, a0 + sum(iv[p][1] - iv[p][0]
                                          for p in ("old_log_prob", "ref", "values")))
            return dict(sorted(out.items(), key=lambda kv: kv[1][0]))
        for label, (a, b) in iv.items():
            if label == WAIT_LABEL:
                out["gen"] = (a, b)
                continue
            if label == "comm":
                continue
            if label == "update_actor":
                out[label] = (a, iv["comm"][1])
            elif label == "reshard" and self.profile.reshard == "none":
                continue
            elif label == "gen" and self.profile.reshard == "none":
                out[label] = (iv["reshard"][0], b)
            else:
                out[label] = (a, b)
        return dict(sorted(out.items(), key=lambda kv: kv[1][0]))

    # ------------------------------------------------------------------ log text
    def _make_lines(self) -> None:
        rng = self._rng_misc
        t0 = self.start_time
        if self.log_format == "console":
            score = float(0.42 + 0.02 * rng.standard_normal())
            val = logtext.validation_metrics(score)
            self._val_metrics = val
            block = logtext.initial_validation_block(self.profile, val)
            self._preamble = [_Line(t0 - 3.0, line) for line in block]
            self._preamble.append(_Line(t0 - 3.0, logtext.console_line(self.profile, 0, val)))
            self._preamble.append(
                _Line(t0 - 2.0, logtext.tqdm_line(0, self.planned_steps, 0.0), True)
            )
        else:
            self._val_metrics = {}
            self._preamble = [
                _Line(t0 - 2.0, f"Start training: total_steps={self.planned_steps}", False)
            ]
        for i, st in enumerate(self.steps):
            lines: list[_Line] = []
            if self.log_format == "breakdown":
                iv = {lab: (a, b) for lab, a, b in st.timeline}
                ra, rb = iv["reshard"]
                he = logtext.hybrid_engine_lines()
                lines += [
                    _Line(ra, he[0], False), _Line((ra + rb) / 2, he[1], False),
                    _Line(rb, he[2], False),
                ]
                d = {lab: b - a for lab, a, b in st.timeline if lab != "gap"}
                fields = {
                    "actor_gen": d["gen"],
                    # the guide's critic_score is the whole scoring side (log-prob, reference
                    # and critic passes): its own example reads 412:387 ms, healthy ~1-3:1
                    "critic_score": d["old_log_prob"] + d["ref"] + d["values"],
                    "rollout_wait": d["rollout_wait"],
                    "loss_comp": d["update_actor"],
                    "comm": d["comm"],
                }
                lines.append(_Line(st.end, logtext.breakdown_line(st.step, st.total, fields), False))
            else:
                lines.append(_Line(st.end, logtext.console_line(self.profile, st.step, st.metrics)))
                lines.append(
                    _Line(st.end, logtext.tqdm_line(st.step, self.planned_steps, st.end - t0))
                )
            if i == len(self.steps) - 1 and getattr(self, "_oom_lines", None):
                lines += self._oom_lines
            self._step_lines.append(lines)

    def _render(self, line: _Line) -> str:
        text = line.text
        if line.prefixed and self.log_format == "console":
            text = ray_prefix(self.profile, self.pid, self.ips[0]) + text
        if self.timestamps:
            text = f"{logtext.iso_timestamp(line.t)} {text}"
        return text

    def preamble(self) -> list[str]:
        """Lines before step 1: the initial validation pprint block, ``step:0``, tqdm at 0%."""
        return [self._render(x) for x in self._preamble]

    def log_lines(self, step_index: int) -> list[str]:
        """The console line(s) of ``steps[step_index]`` plus any lines the scenario injects."""
        return [self._render(x) for x in self._step_lines[step_index]]

    def timed_lines(self) -> list[tuple[float, str]]:
        """Every log line of the run with the simulated time it is written, in order."""
        out = [(x.t, self._render(x)) for x in self._preamble]
        for lines in self._step_lines:
            out += [(x.t, self._render(x)) for x in lines]
        return out

    def jsonl_objects(self, step_index: int) -> list[dict[str, Any]]:
        """The file logger's JSON objects for ``steps[step_index]`` (NaN/inf as null)."""
        st = self.steps[step_index]
        return [{"step": st.step, "data": logtext.jsonable(st.metrics)}]

    # ------------------------------------------------------------------ telemetry
    def gpu_sample_at(self, t: float) -> list[dict[str, Any]]:
        """One dict per (node, gpu) at simulated time ``t``: ``GPU_COLUMNS`` plus extras
        (``sm_occupancy``, ``temperature_c``, ``sm_clock_hz``, ``energy_j``, ``up``, ``xid``,
        ``clock_events``, PCIe/NVLink bytes per second)."""
        return self._telemetry.gpu_sample_at(t)

    def phase_at(self, t: float) -> str:
        """The timeline label at simulated time ``t``: a phase (``comm`` is the collective tail
        of update_actor), ``gap`` (host-side, the canonical ``other``), ``idle`` (outside the
        run), ``stalled`` or ``exited`` (after an OOM)."""
        seg = self._telemetry.segment_at(t)
        if seg is not None:
            return seg.label
        if self._timeline and t >= self._timeline[-1].end:
            last = self._timeline[-1].label
            return last if last in ("stalled", "exited") else "idle"
        return "idle"

    def host_sample_at(self, t: float, node: str) -> dict[str, Any]:
        """One node's host sample (``HOST_COLUMNS``) at simulated time ``t``."""
        return self._telemetry.host_sample_at(t, node)

    def _grid(self, interval: float) -> np.ndarray:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        n = int(math.floor((self.end_time - self.start_time) / interval + 1e-9)) + 1
        return self.start_time + interval * np.arange(n)

    def gpu_frame(self, interval: float = 1.0) -> pd.DataFrame:
        """GPU samples every ``interval`` seconds over the run (``monitor.frames.GPU_COLUMNS``)."""
        cols: dict[str, list[Any]] = {c: [] for c in GPU_COLUMNS}
        for t in self._grid(interval):
            for row in self._telemetry.gpu_sample_at(float(t)):
                for c in GPU_COLUMNS:
                    v = row[c]
                    cols[c].append(math.nan if v is None else v)
        df = pd.DataFrame(cols)
        df["gpu"] = df["gpu"].astype("Int64")
        return df

    def host_frame(self, interval: float = 1.0) -> pd.DataFrame:
        """Host samples of every node every ``interval`` seconds (``HOST_COLUMNS``)."""
        cols: dict[str, list[Any]] = {c: [] for c in HOST_COLUMNS}
        for t in self._grid(interval):
            for node in self.node_names:
                row = self._telemetry.host_sample_at(float(t), node)
                for c in HOST_COLUMNS:
                    cols[c].append(row[c])
        return pd.DataFrame(cols)

    def step_plans(self) -> dict[int, StepPlan]:
        """The plan of every step by 0-based index (what the scenario made of it)."""
        return {seg.step_index: seg.plan for seg in self._timeline
                if seg.step_index is not None and seg.plan is not None}

    def rollout_frame(self, interval: float = 1.0) -> pd.DataFrame:
        """The rollout engines' samples every ``interval`` seconds (``monitor.frames``'s
        rollout columns; empty in the ``sync`` mode, which has no engine servers)."""
        from monitor.sim.rollout_engines import RolloutSim

        return RolloutSim(self).frame(interval)

    # ------------------------------------------------------------------ time base
    def rebase(self, start_time: float) -> None:
        """Shift every time in the run so that it starts at ``start_time`` (LiveSim uses it)."""
        dt = float(start_time) - self.start_time
        if dt == 0:
            return
        self.start_time += dt
        self.end_time += dt
        self.log_end_time += dt
        if hasattr(self, "oom_time"):
            self.oom_time += dt
        for st in self.steps:
            st.start += dt
            st.end += dt
            st.phases = {p: (a + dt, b + dt) for p, (a, b) in st.phases.items()}
            st.timeline = [(lab, a + dt, b + dt) for lab, a, b in st.timeline]
        for e in self.truth:
            e["start"] += dt
            e["end"] += dt
        for seg in self._timeline:
            seg.start += dt
            seg.end += dt
        for line in self._preamble:
            line.t += dt
        for lines in self._step_lines:
            for line in lines:
                line.t += dt
        self._xid = [(t + dt, g, x) for t, g, x in self._xid]
        self._down = {g: t + dt for g, t in self._down.items()}
        self._telemetry = Telemetry(
            self._timeline, self.node_names, self.gpus_per_node, self.seed, self.noise,
            self._xid, self._down,
        )
        self._telemetry.hang_idle = set(self._hang_idle)

    # ------------------------------------------------------------------ output
    def summary(self) -> dict[str, Any]:
        """The run's settings, outcome, truth and per-step phase seconds (``truth.json``)."""
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "script": [[s, n] for s, n in self.script],
            "seed": self.seed,
            "verl_version": self.verl_version,
            "log_format": self.log_format,
            "timestamps": self.timestamps,
            "nodes": self.node_names,
            "gpus_per_node": self.gpus_per_node,
            "step_seconds": self.step_seconds,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "log_end_time": self.log_end_time,
            "outcome": self.outcome,
            "truth": self.truth,
            "steps": [
                {
                    "step": st.step,
                    "start": st.start,
                    "end": st.end,
                    "scenario": st.scenario,
                    "phases": {p: round(v, 6) for p, v in st.durations().items()},
                }
                for st in self.steps
            ],
        }

    def write(self, out_dir: str | os.PathLike[str], jsonl: bool = False) -> None:
        """Write ``train.log`` (and ``train.jsonl``), ``gpu.csv``, ``host.csv``, ``truth.json``
        and, for a run with rollout engines (agent-loop, fully-async), ``rollout.csv``.

        Beside the log, ``train.log.arrivals`` holds the time each line was printed, as
        ``verl-monitor run`` records it (``monitor.logs.arrivals``): the recording is what a
        real run under the monitor leaves, and its clock is the log's own (the file's
        modification time is set to the end of the last completed step too, but nothing reads
        time from it).
        """
        from monitor.logs.arrivals import ArrivalWriter, sidecar_path

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        log = out / "train.log"
        sidecar_path(log).unlink(missing_ok=True)
        offset = 0
        with log.open("wb") as fh:
            arrivals = ArrivalWriter(log)
            try:
                for t, line in self.timed_lines():
                    data = (line + "\n").encode("utf-8")
                    arrivals.record(offset, t, offset + len(data))
                    fh.write(data)
                    offset += len(data)
            finally:
                arrivals.close()
        os.utime(log, (self.log_end_time, self.log_end_time))
        if jsonl:
            path = out / "train.jsonl"
            with path.open("w", encoding="utf-8") as fh:
                if self._val_metrics:
                    fh.write(json.dumps({"step": 0, "data": self._val_metrics}) + "\n")
                for i in range(len(self.steps)):
                    for obj in self.jsonl_objects(i):
                        fh.write(json.dumps(obj) + "\n")
            os.utime(path, (self.log_end_time, self.log_end_time))
        _rounded(self.gpu_frame(1.0)).to_csv(out / "gpu.csv", index=False)
        _rounded(self.host_frame(1.0)).to_csv(out / "host.csv", index=False)
        if self.mode != "sync":
            self.rollout_frame(1.0).to_csv(out / "rollout.csv", index=False)
        (out / "truth.json").write_text(json.dumps(self.summary(), indent=2) + "\n")


def _rounded(df: pd.DataFrame) -> pd.DataFrame:
    """Round telemetry for CSV: ms timestamps, 0.01 percent, whole bytes, 0.1 W."""
    df = df.copy()
    for col in df.columns:
        if col == "ts":
            df[col] = df[col].round(3)
        elif col.endswith("_bytes") or col.endswith("_bps"):
            df[col] = df[col].round(0).astype("Int64")
        elif col in ("node", "gpu"):
            continue
        else:
            df[col] = df[col].round(2)
    return df


def is_script(name: str) -> bool:
    """Whether ``name`` is a scripted scenario (a list of segments)."""
    return name in SCRIPTS
