"""Scenarios: what goes wrong in a simulated verl run, and when.

A run follows a *script*: a list of ``(scenario, n_steps)`` segments. A single scenario name
becomes ``[("healthy", baseline), (name, rest)]`` so detectors that compare a run with its own
history see a healthy baseline first. Each step gets a :class:`StepPlan` (phase durations plus
telemetry and metric knobs) from the healthy model; the segment's scenario then edits it in
:meth:`Scenario.apply`. Terminal scenarios (``oom``, ``stalled``, ``gpu_fault`` in ``down``
mode) end the run. :meth:`Scenario.truth` describes the injected problem in
``monitor.records.FLAG_KINDS`` vocabulary.

How the signals are carried (what a detector can read):

- ``comm_heavy``: in the console formats the collective time sits inside ``update_actor``
  (``timing_s/update_actor`` grows and its last part shows util ~88% with SM activity ~15% and
  high NVLink traffic); with ``log_format="breakdown"`` it is the ``comm=`` field.
- ``rollout_wait``: console runs whose script contains it log ``timing_s/rollout_wait``
  (seconds, a fork-style key; 5-20 ms when healthy); the breakdown format always has
  ``rollout_wait=``.
- ``reshard_spike``: the version's reshard key (``timing_s/reshard``, ``timing_s/update_weights``,
  or gen minus the agent loop's slowest ``generate_sequences``) grows ~9x, GPU memory peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Phases of the telemetry timeline, in the order a step runs them (reshard may come first).
BUSY_PHASES: frozenset[str] = frozenset(
    {"gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "testing"}
)
TRAINING_TIMELINE: frozenset[str] = frozenset(
    {"old_log_prob", "ref", "values", "update_critic", "update_actor"}
)

#: Healthy share of a step per timeline phase (``comm`` is the tail of update_actor).
BASE_SHARES: dict[str, float] = {
    "gen": 0.48,
    "reward": 0.015,
    "old_log_prob": 0.07,
    "ref": 0.06,
    "values": 0.045,
    "adv": 0.005,
    "update_critic": 0.055,
    "update_actor": 0.20,
    "comm": 0.02,
    "reshard": 0.03,
}
#: Healthy share of host-side gaps (the canonical ``other``).
BASE_GAP_SHARE = 0.02


@dataclass
class StepPlan:
    """Everything that shapes one simulated step; scenarios edit it in place.

    Durations are seconds per timeline phase. Telemetry knobs apply to busy phases unless
    named otherwise; ``gpu_factor`` maps a global GPU index to (util, sm, tensor) multipliers.
    """

    durations: dict[str, float]
    gaps: float
    gen_finish: list[float]
    gpu_factor: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    troughs: float = 0.0
    trough_period: float = 3.0
    training_override: tuple[float, float, float, float] | None = None  # util, sm, tensor, dram
    training_scale: tuple[float, float, float] | None = None  # util, sm, tensor multipliers
    gen_scale: tuple[float, float, float] | None = None  # util, sm, dram multipliers in gen
    #: (from, util, sm): after this share of gen the GPUs still decoding run a thin batch (the
    #: last few long sequences): their util and SM activity times these multipliers
    gen_thin: tuple[float, float, float] | None = None
    mem_train: float | None = None  # absolute fraction of memory in training phases
    mem_gen: float | None = None
    reshard_peak: float = 0.84
    host: dict[str, float] = field(default_factory=dict)  # cpu_max, iowait, disk_bps, cpu_avg
    thermal_gpus: tuple[int, ...] = ()
    response_mean: float = 520.0
    response_max: float = 1400.0
    clip_ratio: float = 0.002
    slowest_ratio: float = 0.55  # agent loop: mean / max generate_sequences time
    tokens_factor: float = 1.0
    scenario: str = "healthy"
    #: seconds BEFORE the step timer starts (verl fetches the next batch there; no timer covers
    #: it): the wall time between two step lines grows, the logged step time does not
    data_wait: float = 0.0
    #: phases where ``gpu_factor`` applies (None: every busy phase)
    gpu_factor_phases: tuple[str, ...] | None = None
    #: the rollout engines (agent-loop and fully-async modes; monitor/sim/rollout_engines.py)
    engine: EnginePlan = field(default_factory=lambda: EnginePlan())


@dataclass
class EnginePlan:
    """How the rollout engines (vLLM / SGLang servers) behave during one step.

    Shares are of the engines' active window: the gen phase for colocated engines (agent
    loop), the whole step but the weight sync for a separate rollout pool (fully async).
    """

    kv_level: float = 0.55  # KV cache use with a full batch in flight (0..1)
    preempt_per_s: float = 0.0  # preemptions per second per server while generating
    waiting_share: float = 0.0  # requests queued (waiting) as a share of the batch per server
    tail_from: float | None = None  # after this share of the window only a few requests run
    tail_running: int = 2  # requests left in the tail (on one server; the others idle)
    queue_time_s: float = 0.04  # mean time a request waits in the engine's queue
    saturated: bool = False  # fully async: the pool never drains (requests always queued)
    idle_share: float = 0.0  # fully async: share of the step the rollouter idles (no weights)
    tool_share: float = 0.0  # agent loop: tool calls as a share of a sample's time
    score_share: float = 0.0  # agent loop: compute_score as a share of a sample's time
    preempted_mean: float = 0.0  # agent loop: num_preempted per sample
    stale_share: float = 0.02  # fully async: trajectories generated by an older policy
    dropped_per_step: int = 0  # fully async: stale samples dropped per step
    partial_span: int = 1  # fully async: max policy versions a partial sample spans
    switching: bool = False  # V1 separate async: hybrid replicas lent to the rollout


@dataclass
class ScenarioContext:
    """What a scenario may read while planning: run shape, a private RNG, a state dict."""

    rng: np.random.Generator
    nodes: int
    gpus_per_node: int
    step_seconds: float
    node_names: list[str]
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def n_gpus(self) -> int:
        """GPUs in the whole run."""
        return self.nodes * self.gpus_per_node


@dataclass
class SegmentInfo:
    """Where a segment landed in the run, passed to :meth:`Scenario.truth`."""

    first_step: int | None
    last_step: int | None
    start: float
    end: float
    state: dict[str, Any]
    spike_steps: list[int] = field(default_factory=list)


@dataclass
class Scenario:
    """A healthy run; subclasses inject one problem. ``kind`` is the truth flag kind."""

    name: str = "healthy"
    kind: str | None = None
    description: str = "A healthy run: steps vary a few percent, every GPU busy in its phases."
    terminal: str | None = None  # "oom" or "stall": the run ends in this segment
    uses_rollout_wait: bool = False
    #: Kinds a detector may rightly raise as a consequence (truth entries list them as
    #: ``related``; a benchmark should not count them as false positives).
    related: tuple[str, ...] = ()
    #: Trainer mode the scenario needs (``monitor.logs.modes`` names): None runs in any mode
    #: (the run's mode comes from its other segments, else ``sync``).
    trainer_mode: str | None = None

    def setup(self, ctx: ScenarioContext) -> None:
        """Pick targets (GPU, node) once per segment; store them in ``ctx.state``."""

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Edit step ``k`` (0-based) of ``n`` in this segment."""
        plan.scenario = self.name

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The truth scope (node / gpus / phase)."""
        return {}

    def detail(self, ctx_state: dict[str, Any]) -> str:
        """One sentence saying what was injected."""
        return self.description

    def truth(self, seg: SegmentInfo) -> list[dict[str, Any]]:
        """Truth entries for this segment (none for healthy)."""
        if self.kind is None:
            return []
        scope = dict(self.scope(seg.state))
        if seg.first_step is not None:
            scope["steps"] = [seg.first_step, seg.last_step]
        entry: dict[str, Any] = {
            "kind": self.kind,
            "scenario": self.name,
            "start": seg.start,
            "end": seg.end,
            "scope": scope,
            "detail": self.detail(seg.state),
            "related": list(self.related),
        }
        if seg.spike_steps:
            entry["spike_steps"] = list(seg.spike_steps)
        return [entry]


def _pick_target(ctx: ScenarioContext) -> None:
    """One GPU (single node) or one whole node (several nodes), chosen by the RNG."""
    if ctx.nodes > 1:
        node = int(ctx.rng.integers(ctx.nodes))
        ctx.state["node"] = node
        ctx.state["gpus"] = list(range(ctx.gpus_per_node))
    else:
        ctx.state["node"] = 0
        ctx.state["gpus"] = [int(ctx.rng.integers(ctx.gpus_per_node))]


def _target_scope(ctx_state: dict[str, Any]) -> dict[str, Any]:
    node = ctx_state.get("node", 0)
    return {"node": ctx_state.get("node_name", f"node{node}"), "gpus": list(ctx_state["gpus"])}


def _global_gpus(ctx: ScenarioContext) -> list[int]:
    return [ctx.state["node"] * ctx.gpus_per_node + g for g in ctx.state["gpus"]]


@dataclass
class Healthy(Scenario):
    """No problem injected."""


@dataclass
class IoStarvation(Scenario):
    """The dataloader cannot keep up: the batch fetch before each step's timer grows.

    Fitted to the real run (bench/results/gpu_scenarios_2026-11-30_H200_*: a 5 s stall per
    batch on 1 and 2 H200s): the stall sits between two step lines, outside every
    ``timing_s/*`` key (verl fetches the batch before ``timing_s/step`` starts); the driver's
    busiest core reads ~100% and the GPUs idle meanwhile; the steps themselves are unchanged.
    Without line timestamps or arrival times it cannot be seen in the log (truth says so).
    """

    name: str = "io_starvation"
    kind: str | None = "io_starvation"
    related: tuple[str, ...] = ("throughput_regression", "low_utilization", "step_time_spikes",
                                "stalled")
    description: str = (
        "Dataloader starvation: the batch fetch before each step's timer grows (between the "
        "step lines, in no timer), one host core pegged near 100%, the GPUs idle meanwhile."
    )
    wait_share_start: float = 0.15
    wait_share_end: float = 0.45
    iowait: float = 2.0  # measured: CPU-bound preprocessing, the core pegged, little iowait

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Grow the wait before the step step by step; the host core is pegged."""
        super().apply(plan, k, n, ctx)
        frac = self.wait_share_start + (self.wait_share_end - self.wait_share_start) * (k + 1) / n
        plan.data_wait += frac * ctx.step_seconds
        plan.host = {"cpu_max": 99.5, "iowait": self.iowait, "disk_bps": 38e6, "cpu_avg": 14.0}

    def truth(self, seg: SegmentInfo) -> list[dict[str, Any]]:
        """As any scenario, marked as visible only with line timestamps or arrival times."""
        entries = super().truth(seg)
        for e in entries:
            e["needs"] = "times"
        return entries


@dataclass
class GpuImbalance(Scenario):
    """A straggler: one GPU (one node with several nodes) slows the synchronous phases.

    Fitted to the real runs (bench/results/gpu_scenarios_2026-11-30_H200_2gpu_run1: one rank
    with 2.5x the update work, and a second process on one GPU): the slow GPU keeps its SMs
    busy (SM activity 86-96% over the update) while its peers finish first and spin in the
    all-reduce at 99-100% utilization with SM activity 47-57% (x0.55-0.6 of the slow one);
    the update took 2.2x longer. Utilization alone cannot tell them apart.
    """

    name: str = "gpu_imbalance"
    kind: str | None = "gpu_imbalance"
    related: tuple[str, ...] = ("low_utilization", "util_overstates_sm", "step_time_spikes",
                                "throughput_regression")
    description: str = ("A straggler: the others wait for one GPU in collectives (util ~100%, "
                        "SM activity ~0.58x of the straggler's) in the training phases.")
    waiter_util: float = 1.06   # 94-95 -> ~100 (capped): spinning in the collective
    waiter_sm: float = 0.58     # 49/87 and 57/96 measured
    waiter_tensor: float = 0.5
    slowdown: float = 1.6       # training phases (the update grew 2.2x, log-probs less)

    def setup(self, ctx: ScenarioContext) -> None:
        """Choose the straggler."""
        _pick_target(ctx)
        ctx.state["node_name"] = ctx.node_names[ctx.state["node"]]
        ctx.state["global"] = _global_gpus(ctx)

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Everyone but the straggler waits in collectives during the training phases."""
        super().apply(plan, k, n, ctx)
        slow = set(ctx.state["global"])
        for g in range(ctx.n_gpus):
            if g not in slow:
                plan.gpu_factor[g] = (self.waiter_util, self.waiter_sm, self.waiter_tensor)
        plan.gpu_factor_phases = ("old_log_prob", "ref", "values", "update_critic", "update_actor")
        for p in ("old_log_prob", "ref", "values", "update_critic", "update_actor"):
            plan.durations[p] *= self.slowdown

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The straggling node and GPUs."""
        return _target_scope(ctx_state)


@dataclass
class StragglerElsewhere(GpuImbalance):
    """This node's GPUs all wait for a straggling GPU on another node of the job.

    For a job simulated one node per process (each exporter runs its own simulator, as on a
    real cluster each node samples its own GPUs): the straggler's node runs ``gpu_imbalance``
    (one GPU at full SM activity, its node peers waiting), every other node runs this. In a
    data-parallel job every rank waits for the slowest in the gradient all-reduce, so every GPU
    here shows the waiters' signature of the real run (bench/results/gpu_scenarios_2026-11-30_
    H200_2gpu_run1: util 99-100%, SM activity 47-57% against the straggler's 86-96%) and the
    training phases stretch by the same ``slowdown`` as on the straggler's node, so the nodes'
    step timelines stay together. Nothing is wrong with this node itself (``kind`` None).
    """

    name: str = "straggler_elsewhere"
    kind: str | None = None
    related: tuple[str, ...] = ()
    description: str = ("Every GPU here waits in collectives for a straggler on another node "
                        "(util ~100%, SM activity ~0.58x) in the training phases.")

    def setup(self, ctx: ScenarioContext) -> None:
        """No straggler on this node."""
        ctx.state["node"] = 0
        ctx.state["gpus"] = []
        ctx.state["node_name"] = ctx.node_names[0]
        ctx.state["global"] = []

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The waiting node (no GPU of its own at fault)."""
        return {"node": ctx_state.get("node_name", "node0"), "gpus": []}


@dataclass
class RolloutLongTail(Scenario):
    """During gen most GPUs fall idle one by one while a few keep decoding long responses."""

    name: str = "rollout_long_tail"
    kind: str | None = "rollout_long_tail"
    related: tuple[str, ...] = ("throughput_regression", "low_utilization", "phase_imbalance")
    description: str = (
        "Rollout long tail: gen 1.7x longer, most GPUs idle after 30-55% of gen, agent-loop "
        "slowest/mean about 5x, response_length max at the limit."
    )
    gen_factor: float = 1.7
    stragglers: int = 2
    max_response_length: float = 4096.0

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Stretch gen; most GPUs finish early, a few keep going."""
        super().apply(plan, k, n, ctx)
        plan.durations["gen"] *= self.gen_factor
        n_gpus = ctx.n_gpus
        finish = list(np.sort(ctx.rng.uniform(0.30, 0.55, n_gpus)))
        late = ctx.rng.choice(n_gpus, size=min(self.stragglers, n_gpus), replace=False)
        shuffled = ctx.rng.permutation(n_gpus)
        plan.gen_finish = [float(finish[int(i)]) for i in np.argsort(shuffled)]
        for j, g in enumerate(late):
            plan.gen_finish[int(g)] = 1.0 if j == 0 else float(ctx.rng.uniform(0.85, 0.98))
        plan.response_max = self.max_response_length
        plan.response_mean *= 0.95
        plan.clip_ratio = 0.04
        plan.slowest_ratio = 0.19
        # past the length of an ordinary gen only the few long sequences still decode
        plan.gen_thin = (1.0 / self.gen_factor, 0.6, 0.15)

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The gen phase."""
        return {"phase": "gen"}


@dataclass
class ReshardSpike(Scenario):
    """Weight sync takes ~9x longer and memory peaks while two copies are resident."""

    name: str = "reshard_spike"
    kind: str | None = "reshard_spike"
    related: tuple[str, ...] = ("memory_pressure", "throughput_regression", "phase_imbalance")
    description: str = "Reshard (weight sync) time about 9x its baseline, memory peak near 95%."
    factor: float = 9.0
    peak: float = 0.95

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Multiply the reshard time and raise its memory peak."""
        super().apply(plan, k, n, ctx)
        plan.durations["reshard"] *= self.factor
        plan.reshard_peak = self.peak

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The reshard phase."""
        return {"phase": "reshard"}


@dataclass
class CommHeavy(Scenario):
    """Collectives take a large share of the step (inside update_actor)."""

    name: str = "comm_heavy"
    kind: str | None = "comm_heavy"
    related: tuple[str, ...] = (
        "throughput_regression", "util_overstates_sm", "low_utilization", "phase_imbalance",
    )
    description: str = (
        "Communication about 30% of step time, at the end of update_actor (low SM activity, "
        "high NVLink); breakdown format: comm=."
    )
    comm_share: float = 0.42  # extra comm time as a share of step_seconds

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Add collective time to the end of update_actor."""
        super().apply(plan, k, n, ctx)
        plan.durations["comm"] += self.comm_share * ctx.step_seconds

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The update_actor phase (where the collectives run)."""
        return {"phase": "update_actor"}


@dataclass
class MemoryPressure(Scenario):
    """GPU memory near capacity in training phases; reserved peak near the total."""

    name: str = "memory_pressure"
    kind: str | None = "memory_pressure"
    # the run's memory climbs from its healthy level into the pressure: a creep on the way
    related: tuple[str, ...] = ("memory_creep",)
    description: str = "Memory used 95-98% of capacity in training phases, reserved peak near it."
    level: float = 0.965

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Raise memory to near capacity."""
        super().apply(plan, k, n, ctx)
        plan.mem_train = self.level
        plan.mem_gen = self.level - 0.025
        plan.reshard_peak = min(0.99, self.level + 0.02)


@dataclass
class MemoryCreep(Scenario):
    """GPU memory held across steps: each step's peak a fixed share of the capacity higher."""

    name: str = "memory_creep"
    kind: str | None = "memory_creep"
    related: tuple[str, ...] = ("memory_pressure",)
    description: str = ("Memory creep: every step's memory peak 7% of the capacity above the "
                        "last (from 30%, held below 91%), the forecast reaches the capacity.")
    start_level: float = 0.30
    per_step: float = 0.07
    ceiling: float = 0.91
    host_gib_per_step: float = 1.5  # the workers' host memory (RSS) grows too

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Raise the memory level of every phase by ``per_step`` each step."""
        super().apply(plan, k, n, ctx)
        level = min(self.start_level + self.per_step * k, self.ceiling)
        plan.mem_train = level
        plan.mem_gen = level - 0.03
        plan.host["train_rss_bytes"] = (24.0 + self.host_gib_per_step * k) * 2**30


@dataclass
class Oom(Scenario):
    """Memory climbs for a couple of steps, then update_actor runs out of memory; run stops."""

    name: str = "oom"
    kind: str | None = "oom"
    description: str = "CUDA out of memory in update_actor; the run stops."
    terminal: str | None = "oom"
    precursor_steps: int = 2
    gpu: int = 0

    def setup(self, ctx: ScenarioContext) -> None:
        """Choose the GPU that runs out of memory."""
        ctx.state["gpu"] = int(ctx.rng.integers(ctx.gpus_per_node))
        ctx.state["node"] = int(ctx.rng.integers(ctx.nodes))
        ctx.state["node_name"] = ctx.node_names[ctx.state["node"]]

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Memory rises toward capacity; the failing step goes to 99.5%."""
        super().apply(plan, k, n, ctx)
        level = 0.90 + 0.03 * k
        plan.mem_train = min(level, 0.995)
        plan.mem_gen = min(level - 0.04, 0.95)
        plan.response_max = 4096.0

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """Where the OOM happened."""
        return {"node": ctx_state["node_name"], "gpus": [ctx_state["gpu"]], "phase": "update_actor"}


@dataclass
class Stalled(Scenario):
    """Steps stop arriving: GPUs idle with memory held, the log goes silent."""

    name: str = "stalled"
    kind: str | None = "stalled"
    description: str = "No step completes: GPUs idle with memory held, the log is silent."
    terminal: str | None = "stall"


@dataclass
class Hang(Scenario):
    """One rank stops before a collective: its GPU idles, every other GPU spins in the
    collective (utilization 100%, SM activity ~2%, as on real H200s), the log goes silent."""

    name: str = "hang"
    kind: str | None = "hang"
    description: str = ("One rank stops before an all-reduce: its GPU idles, the others spin "
                        "in the collective (util 100%, SM 2%); the log is silent.")
    terminal: str | None = "hang"

    def setup(self, ctx: ScenarioContext) -> None:
        """Choose the rank (GPU) that stops."""
        ctx.state["node"] = int(ctx.rng.integers(ctx.nodes))
        ctx.state["gpus"] = [int(ctx.rng.integers(ctx.gpus_per_node))]
        ctx.state["node_name"] = ctx.node_names[ctx.state["node"]]
        ctx.state["global"] = _global_gpus(ctx)


@dataclass
class StepTimeSpikes(Scenario):
    """Every ``period`` steps one step takes ~1.8x as long."""

    name: str = "step_time_spikes"
    kind: str | None = "step_time_spikes"
    related: tuple[str, ...] = ("throughput_regression",)
    description: str = "Periodic step-time spikes (update_actor 2.4x, gen 1.25x) every 5 steps."
    period: int = 5

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Spike every ``period``-th step of the segment."""
        super().apply(plan, k, n, ctx)
        if (k + 1) % self.period == 0:
            plan.durations["update_actor"] *= 2.4
            plan.durations["gen"] *= 1.25
            plan.durations["old_log_prob"] *= 1.8
            ctx.state.setdefault("spikes", []).append(k)

    def detail(self, ctx_state: dict[str, Any]) -> str:
        """Say the period."""
        return f"Step-time spikes every {self.period} steps (update_actor 2.4x, gen 1.25x)."


@dataclass
class UtilOverstatesSm(Scenario):
    """Tiny kernels: util ~90% while SM activity ~10-15% in training phases."""

    name: str = "util_overstates_sm"
    kind: str | None = "util_overstates_sm"
    related: tuple[str, ...] = ("low_utilization", "throughput_regression", "phase_imbalance")
    description: str = "Training phases run tiny kernels: util ~90% but SM activity ~12%."
    slowdown: float = 1.6

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Override the training-phase signature; training takes longer."""
        super().apply(plan, k, n, ctx)
        plan.training_override = (90.0, 12.0, 4.0, 10.0)
        for p in TRAINING_TIMELINE:
            plan.durations[p] *= self.slowdown

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The training phases, named by the largest."""
        return {"phase": "update_actor"}


@dataclass
class ThroughputRegression(Scenario):
    """Tokens/s drops ~30% against the run's own baseline and stays there."""

    name: str = "throughput_regression"
    kind: str | None = "throughput_regression"
    related: tuple[str, ...] = ("low_utilization", "phase_imbalance")
    description: str = "Gen 1.55x and training 1.45x slower for the same tokens: tokens/s -30%."
    gen_factor: float = 1.55
    train_factor: float = 1.45

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Slow gen and training; gen runs at lower SM activity."""
        super().apply(plan, k, n, ctx)
        plan.durations["gen"] *= self.gen_factor
        for p in TRAINING_TIMELINE:
            plan.durations[p] *= self.train_factor
        plan.gen_scale = (0.97, 0.72, 0.7)


@dataclass
class PhaseImbalance(Scenario):
    """A slow scoring side: values 6x and reward 8x longer, gen:critic far below 4:1."""

    name: str = "phase_imbalance"
    kind: str | None = "phase_imbalance"
    related: tuple[str, ...] = ("throughput_regression",)
    description: str = "Critic/reward scoring slow: values 6x, reward 8x its baseline share."
    values_factor: float = 6.0
    reward_factor: float = 8.0

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Stretch values and reward."""
        super().apply(plan, k, n, ctx)
        plan.durations["values"] *= self.values_factor
        plan.durations["reward"] *= self.reward_factor

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The values phase."""
        return {"phase": "values"}


@dataclass
class RolloutWait(Scenario):
    """The trainer waits for rollout results: 2-5% of the step (well over 50 ms)."""

    name: str = "rollout_wait"
    kind: str | None = "rollout_wait"
    description: str = (
        "Trainer waits 2-5% of each step for rollout results (timing_s/rollout_wait; "
        "breakdown: rollout_wait=)."
    )
    uses_rollout_wait: bool = True
    low: float = 0.02
    high: float = 0.05

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Set the wait."""
        super().apply(plan, k, n, ctx)
        plan.durations["rollout_wait"] = float(ctx.rng.uniform(self.low, self.high)) * (
            ctx.step_seconds
        )

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The rollout_wait phase."""
        return {"phase": "rollout_wait"}


@dataclass
class LowUtilization(Scenario):
    """SM activity around 45% in training phases for minutes."""

    name: str = "low_utilization"
    kind: str | None = "low_utilization"
    related: tuple[str, ...] = ("throughput_regression", "phase_imbalance")
    description: str = "Training phases at SM activity ~45% and util ~65% (under-fed GPUs)."
    util_factor: float = 0.68
    sm_factor: float = 0.55
    tensor_factor: float = 0.5
    slowdown: float = 1.35

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Scale training-phase activity down; training takes longer."""
        super().apply(plan, k, n, ctx)
        plan.training_scale = (self.util_factor, self.sm_factor, self.tensor_factor)
        for p in TRAINING_TIMELINE:
            plan.durations[p] *= self.slowdown

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """Training phases, named by the largest."""
        return {"phase": "update_actor"}


@dataclass
class GpuFault(Scenario):
    """One GPU misbehaves: ``mode`` "xid" (XID 94 ECC errors plus thermal throttling,
    training goes on slightly slower) or "down" (the GPU stops answering; the run stalls)."""

    name: str = "gpu_fault"
    kind: str | None = "gpu_fault"
    related: tuple[str, ...] = ("gpu_imbalance",)
    description: str = "One GPU: XID 94 errors and thermal throttling (hw_thermal_slowdown)."
    mode: str = "xid"
    xid: int = 94
    slowdown: float = 1.06

    def __post_init__(self) -> None:
        if self.mode not in ("xid", "down"):
            raise ValueError(f"gpu_fault mode must be 'xid' or 'down', not {self.mode!r}")
        if self.mode == "down":
            self.terminal = "stall"
            self.xid = 79
            self.description = "One GPU falls off the bus (XID 79, up=0); the run stalls."

    def setup(self, ctx: ScenarioContext) -> None:
        """Choose the faulty GPU."""
        ctx.state["node"] = int(ctx.rng.integers(ctx.nodes))
        ctx.state["gpus"] = [int(ctx.rng.integers(ctx.gpus_per_node))]
        ctx.state["node_name"] = ctx.node_names[ctx.state["node"]]
        ctx.state["global"] = _global_gpus(ctx)

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Throttle the GPU; the step waits a little for it."""
        super().apply(plan, k, n, ctx)
        plan.thermal_gpus = tuple(ctx.state["global"])
        for g in ctx.state["global"]:
            plan.gpu_factor[g] = (0.97, 0.8, 0.78)
        for p in ("gen", "update_actor", "update_critic"):
            plan.durations[p] *= self.slowdown

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The faulty GPU."""
        return _target_scope(ctx_state)


# ------------------------------------------------------------------ today's trainers
# Server-mode rollout behind the agent loop (``agent_loop``) and the fully-async policy
# (``fully_async``): the rollout engines' own series come from monitor/sim/rollout_engines.py.


@dataclass
class AgentLoopHealthy(Scenario):
    """Server-mode rollout (vLLM servers behind the agent loop), sync trainer, all well."""

    name: str = "agent_loop"
    trainer_mode: str | None = "agent_loop"
    description: str = ("Healthy agent-loop run: vLLM servers colocated with the trainer, KV "
                        "cache ~55% at a full batch, no preemption, requests drain together.")


@dataclass
class FullyAsyncHealthy(Scenario):
    """Fully-async policy, all well: the trainer rarely waits for samples."""

    name: str = "fully_async"
    trainer_mode: str | None = "fully_async"
    description: str = ("Healthy fully-async run: the rollouter's servers stay busy, the "
                        "trainer waits ~7% of a step for samples (fully_async/trainer/"
                        "idle_ratio), weights synced every step in ~0.4 s.")


@dataclass
class KvCachePreemption(Scenario):
    """A full KV cache: the engines keep preempting requests, which queue and recompute."""

    name: str = "kv_cache_preemption"
    kind: str | None = "kv_cache_preemption"
    trainer_mode: str | None = "agent_loop"
    related: tuple[str, ...] = ("throughput_regression", "rollout_long_tail", "phase_imbalance",
                                "low_utilization")
    description: str = ("Full KV cache: usage 97-100% through gen, ~2 preemptions/s per "
                        "server, a fifth of each server's requests waiting; gen 1.45x longer.")
    gen_factor: float = 1.45

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Fill the KV cache and preempt; gen takes longer (recomputation)."""
        super().apply(plan, k, n, ctx)
        plan.durations["gen"] *= self.gen_factor
        plan.engine.kv_level = 0.985
        plan.engine.preempt_per_s = 2.0
        plan.engine.waiting_share = 0.2
        plan.engine.queue_time_s = 2.5
        plan.engine.preempted_mean = 1.6
        plan.gen_scale = (0.97, 0.85, 0.9)

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The gen phase."""
        return {"phase": "gen"}


@dataclass
class GenerationTail(Scenario):
    """A generation tail: after a third of gen only two requests still decode, on one server,
    while the other servers of the rollout pool idle."""

    name: str = "generation_tail"
    kind: str | None = "generation_tail"
    trainer_mode: str | None = "agent_loop"
    related: tuple[str, ...] = ("rollout_long_tail", "throughput_regression", "low_utilization",
                                "phase_imbalance")
    description: str = ("Generation tail: after 35% of gen only 2 requests run (one server), "
                        "the other servers idle; gen 1.6x longer, response_length max at the "
                        "limit.")
    gen_factor: float = 1.6

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Stretch gen into a tail; most GPUs idle after a third of it."""
        super().apply(plan, k, n, ctx)
        plan.durations["gen"] *= self.gen_factor
        plan.engine.tail_from = 0.35
        plan.engine.tail_running = 2
        finish = ctx.rng.uniform(0.3, 0.38, ctx.n_gpus)
        plan.gen_finish = [float(f) for f in finish]
        for g in range(min(2, ctx.n_gpus)):  # the tail server's tensor-parallel pair
            plan.gen_finish[g] = 1.0
        plan.response_max = 4096.0
        plan.clip_ratio = 0.03
        plan.slowest_ratio = 0.22

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The gen phase."""
        return {"phase": "gen"}


@dataclass
class AgentLoopOverhead(Scenario):
    """Tool calls and ``compute_score`` dominate each sample: the engines idle meanwhile."""

    name: str = "agent_loop_overhead"
    kind: str | None = "agent_loop_overhead"
    trainer_mode: str | None = "agent_loop"
    related: tuple[str, ...] = ("throughput_regression", "low_utilization", "phase_imbalance",
                                "generation_tail", "rollout_long_tail")
    description: str = ("Agent-loop overhead: tool calls ~45% and compute_score ~15% of each "
                        "sample's time, the engines half idle; gen 1.8x longer.")
    gen_factor: float = 1.8

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Stretch gen with tool and scoring time; the GPUs idle while they run."""
        super().apply(plan, k, n, ctx)
        plan.durations["gen"] *= self.gen_factor
        plan.engine.tool_share = 0.45
        plan.engine.score_share = 0.15
        plan.engine.kv_level = 0.3
        plan.gen_scale = (0.55, 0.45, 0.45)

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The gen phase (the agent loop runs inside it)."""
        return {"phase": "gen"}


@dataclass
class PoolImbalance(Scenario):
    """Fully async, the rollout pool too slow: the trainer's GPUs wait for samples ~55% of
    every step (``timing_s/gen``, ``fully_async/trainer/idle_ratio``) while the rollouter's
    servers run saturated with requests queued."""

    name: str = "pool_imbalance"
    kind: str | None = "pool_imbalance"
    trainer_mode: str | None = "fully_async"
    related: tuple[str, ...] = ("low_utilization", "throughput_regression", "phase_imbalance",
                                "rollout_long_tail", "kv_cache_preemption")
    description: str = ("Trainer waits for samples ~55% of each step (fully_async/trainer/"
                        "idle_ratio ~0.55); the rollout pool is saturated: KV ~93%, requests "
                        "queued, rollouter idle_ratio 0.")
    wait_share: float = 1.25  # the wait as a multiple of the trainer's own busy time

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Make the trainer wait; the rollout pool runs flat out."""
        super().apply(plan, k, n, ctx)
        busy = sum(v for p, v in plan.durations.items() if p != "gen")
        plan.durations["gen"] = self.wait_share * busy * float(ctx.rng.uniform(0.95, 1.05))
        plan.engine.saturated = True
        plan.engine.kv_level = 0.93
        plan.engine.waiting_share = 0.35
        plan.engine.queue_time_s = 4.0

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The trainer's wait (logged as gen)."""
        return {"phase": "gen"}


@dataclass
class RolloutIdle(Scenario):
    """Fully async, the other way round: the rollouter fills its quota early and idles ~45% of
    every version waiting for new weights (``fully_async/rollouter/idle_ratio``)."""

    name: str = "rollouter_idle"
    kind: str | None = "pool_imbalance"
    trainer_mode: str | None = "fully_async"
    related: tuple[str, ...] = ("throughput_regression",)
    description: str = ("Rollouter idle ~45% of each version waiting for weights (fully_async/"
                        "rollouter/idle_ratio ~0.45); its servers drain to 0 requests; the "
                        "trainer never waits.")

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Finish generating early; training takes longer than generating."""
        super().apply(plan, k, n, ctx)
        plan.durations["gen"] = 0.004 * ctx.step_seconds
        plan.engine.idle_share = 0.45

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The rollout side."""
        return {"phase": "gen"}


@dataclass
class StaleSamples(Scenario):
    """Fully async: staleness climbing, stale samples dropped every step, partial rollouts
    spanning several policy versions."""

    name: str = "stale_samples"
    kind: str | None = "stale_samples"
    trainer_mode: str | None = "fully_async"
    related: tuple[str, ...] = ("pool_imbalance",)
    description: str = ("Staleness climbing: 40-70% of trajectories from an older policy, "
                        "12 stale samples dropped per step, partial samples spanning 3 versions.")

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Raise the stale share step by step and drop samples."""
        super().apply(plan, k, n, ctx)
        plan.engine.stale_share = 0.4 + 0.3 * (k + 1) / n
        plan.engine.dropped_per_step = 12
        plan.engine.partial_span = 3


@dataclass
class WeightSyncPause(Scenario):
    """Fully async: each weight sync pauses the rollouter's requests for long
    (``timing_s/param_sync`` ~8x, requests ``paused`` on the servers meanwhile)."""

    name: str = "weight_sync_pause"
    kind: str | None = "weight_sync_pause"
    trainer_mode: str | None = "fully_async"
    related: tuple[str, ...] = ("reshard_spike", "throughput_regression", "pool_imbalance",
                                "memory_pressure")
    description: str = ("Weight sync pauses requests for long: timing_s/param_sync ~8x its "
                        "baseline, every in-flight request paused on the servers meanwhile.")
    factor: float = 8.0

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Stretch the parameter sync."""
        super().apply(plan, k, n, ctx)
        plan.durations["reshard"] *= self.factor

    def scope(self, ctx_state: dict[str, Any]) -> dict[str, Any]:
        """The weight sync."""
        return {"phase": "reshard"}


@dataclass
class SeparateAsyncHealthy(Scenario):
    """The V1 separate-async trainer (verl 0.9), all well: standalone rollout keeps up."""

    name: str = "separate_async"
    trainer_mode: str | None = "separate_async"
    description: str = ("Healthy V1 separate-async run: standalone rollout replicas keep the "
                        "replay buffer filled, the trainer waits ~7% of a step (timing_s/gen), "
                        "trajectories at most one version old.")


@dataclass
class SeparateAsyncWait(PoolImbalance):
    """V1 separate-async, the standalone rollout too slow: the trainer waits for a trainable
    batch ~55% of every step and its hybrid replicas are lent to the rollout (switching)."""

    name: str = "separate_async_wait"
    trainer_mode: str | None = "separate_async"
    description: str = ("V1 trainer waits for a trainable batch ~55% of each step "
                        "(timing_s/gen); the switch lends its replicas to the rollout "
                        "(separate_async/switch/idle 1, timing_s/switch_wait).")

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Wait as the fully-async trainer does; the switch decides to lend the replicas."""
        super().apply(plan, k, n, ctx)
        plan.engine.switching = True


@dataclass
class SeparateAsyncEvictions(Scenario):
    """V1 separate-async: trajectories grow stale and prompt groups are evicted
    (``training/off_policy/evicted_samples``), staleness climbing toward the threshold."""

    name: str = "separate_async_evictions"
    kind: str | None = "stale_samples"
    trainer_mode: str | None = "separate_async"
    related: tuple[str, ...] = ("pool_imbalance",)
    description: str = ("Off-policy staleness climbing to 6 versions and 16 samples evicted "
                        "per step (training/off_policy/evicted_samples).")

    def apply(self, plan: StepPlan, k: int, n: int, ctx: ScenarioContext) -> None:
        """Raise staleness step by step and evict samples."""
        super().apply(plan, k, n, ctx)
        plan.engine.stale_share = 0.5 + 0.4 * (k + 1) / n
        plan.engine.dropped_per_step = 16
        plan.engine.partial_span = 3


#: Every scenario by name, with default parameters.
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Healthy(),
        IoStarvation(),
        GpuImbalance(),
        StragglerElsewhere(),
        RolloutLongTail(),
        ReshardSpike(),
        CommHeavy(),
        MemoryPressure(),
        MemoryCreep(),
        Oom(),
        Stalled(),
        Hang(),
        StepTimeSpikes(),
        UtilOverstatesSm(),
        ThroughputRegression(),
        PhaseImbalance(),
        RolloutWait(),
        LowUtilization(),
        GpuFault(),
        AgentLoopHealthy(),
        FullyAsyncHealthy(),
        KvCachePreemption(),
        GenerationTail(),
        AgentLoopOverhead(),
        PoolImbalance(),
        RolloutIdle(),
        StaleSamples(),
        WeightSyncPause(),
        SeparateAsyncHealthy(),
        SeparateAsyncWait(),
        SeparateAsyncEvictions(),
    )
}

#: Scripted scenarios: a list of (scenario, n_steps) segments.
SCRIPTS: dict[str, list[tuple[str, int]]] = {
    # About ten minutes of wall time at step_seconds=12.
    "demo": [
        ("healthy", 8),
        ("io_starvation", 6),
        ("healthy", 5),
        ("reshard_spike", 5),
        ("gpu_imbalance", 6),
        ("rollout_long_tail", 6),
        ("healthy", 6),
    ],
    # The demo in two minutes at 1x (tests/e2e/test_headline.py): healthy steps (six, so the
    # healthy moment lasts long enough to open two dashboards on a loaded machine), a slow
    # weight sync, then a healthy step to the end.
    "demo_short": [
        ("healthy", 6),
        ("reshard_spike", 3),
        ("healthy", 1),
    ],
    # Server-mode rollout behind the agent loop: a full KV cache, then a generation tail.
    "agent_loop_demo": [
        ("agent_loop", 8),
        ("kv_cache_preemption", 7),
        ("agent_loop", 5),
        ("generation_tail", 7),
        ("agent_loop", 5),
        ("agent_loop_overhead", 6),
        ("agent_loop", 5),
    ],
    # Fully-async policy: a slow rollout pool, a long weight sync, staleness, an idle rollouter.
    "fully_async_demo": [
        ("fully_async", 10),
        ("pool_imbalance", 8),
        ("fully_async", 6),
        ("weight_sync_pause", 6),
        ("fully_async", 5),
        ("stale_samples", 6),
        ("rollouter_idle", 7),
        ("fully_async", 5),
    ],
    # V1 separate-async trainer: standalone rollout too slow, then stale samples evicted.
    "separate_async_demo": [
        ("separate_async", 10),
        ("separate_async_wait", 8),
        ("separate_async", 6),
        ("separate_async_evictions", 7),
        ("separate_async", 5),
    ],
}

#: Default step length per script (seconds), used when the caller keeps the default.
SCRIPT_STEP_SECONDS: dict[str, float] = {"demo": 12.0, "demo_short": 12.0,
                                         "agent_loop_demo": 12.0,
                                         "fully_async_demo": 12.0, "separate_async_demo": 12.0}

#: Trainer modes the simulator plays (``monitor.logs.modes`` names): ``sync`` (the colocated
#: trainer of every release), ``agent_loop`` (server-mode rollout behind the agent loop, sync
#: trainer), ``fully_async`` (the fully-async policy's trainer node, a separate rollout pool)
#: and ``separate_async`` (verl 0.9's V1 separate-async trainer, standalone rollout replicas).
SIM_MODES: tuple[str, ...] = ("sync", "agent_loop", "fully_async", "separate_async")
#: Modes whose rollout runs on a pool of its own: the trainer's ``timing_s/gen`` is its wait.
SPLIT_POOL_MODES: frozenset[str] = frozenset({"fully_async", "separate_async"})


def script_mode(segments: list[tuple[Scenario, int]]) -> str:
    """The trainer mode of a resolved script: the one its scenarios name (``sync`` when none
    does); raises UnknownScenario when two segments need different modes."""
    modes = {sc.trainer_mode for sc, _ in segments if sc.trainer_mode is not None}
    if len(modes) > 1:
        raise UnknownScenario(
            f"a script cannot mix trainer modes ({', '.join(sorted(modes))}): run them apart"
        )
    return modes.pop() if modes else "sync"


class UnknownScenario(ValueError):
    """A scenario name the simulator does not know; the message lists the valid ones."""


def list_scenarios() -> list[str]:
    """Every scenario and script name, sorted (healthy first)."""
    names = sorted(set(SCENARIOS) | set(SCRIPTS))
    names.remove("healthy")
    return ["healthy", *names]


def describe(name: str) -> str:
    """One line describing a scenario or script."""
    if name in SCRIPTS:
        return "script: " + ", ".join(f"{s} x{n}" for s, n in SCRIPTS[name])
    return get_scenario(name).description


def get_scenario(name: str | Scenario) -> Scenario:
    """The scenario object for a name (or the object itself); raises UnknownScenario."""
    if isinstance(name, Scenario):
        return name
    if name not in SCENARIOS:
        raise UnknownScenario(
            f"unknown scenario {name!r}; valid: {', '.join(list_scenarios())}"
        )
    return SCENARIOS[name]


def resolve_script(
    scenario: str | Scenario | list[tuple[str | Scenario, int]],
    steps: int | None,
    onset: float,
) -> list[tuple[Scenario, int]]:
    """Turn a scenario name, script name, ``"a:5,b:3"`` string or list into segments.

    A single problem scenario gets a healthy baseline of ``onset`` x steps first (at least
    one third). A script keeps its own lengths unless ``steps`` is given, which rescales them.
    """
    if isinstance(scenario, str) and scenario in SCRIPTS:
        raw: list[tuple[str | Scenario, int]] = list(SCRIPTS[scenario])
        return _scale([(get_scenario(s), n) for s, n in raw], steps)
    if isinstance(scenario, str) and ":" in scenario:
        raw = []
        for part in scenario.split(","):
            name, _, count = part.strip().partition(":")
            try:
                n = int(count)
            except ValueError as exc:
                raise UnknownScenario(f"bad script segment {part!r}: want NAME:STEPS") from exc
            if n < 1:
                raise UnknownScenario(f"bad script segment {part!r}: steps must be >= 1")
            raw.append((name.strip(), n))
        return _scale([(get_scenario(s), n) for s, n in raw], steps)
    if isinstance(scenario, list):
        return _scale([(get_scenario(s), int(n)) for s, n in scenario], steps)
    sc = get_scenario(scenario)
    total = 60 if steps is None else int(steps)
    if total < 1:
        raise ValueError("steps must be >= 1")
    if sc.kind is None:
        return [(sc, total)]
    base = max(1, int(np.ceil(total * max(onset, 1.0 / 3.0))))
    if total - base < 1:
        base = max(1, total - 1)
    rest = total - base
    if rest < 1:
        return [(sc, total)]
    return [(get_scenario("healthy"), base), (sc, rest)]


def _scale(segments: list[tuple[Scenario, int]], steps: int | None) -> list[tuple[Scenario, int]]:
    if steps is None:
        return segments
    total = sum(n for _, n in segments)
    scaled = [(s, max(1, round(n * steps / total))) for s, n in segments]
    return scaled
