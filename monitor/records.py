"""Canonical records shared by every part of verl-monitor.

Parsing turns any verl version's output into these; detectors, the store, the exporter and the
dashboards speak only this vocabulary (see ARCHITECTURE.md, "Canonical names").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Canonical phases in the order verl runs them inside a step.
PHASES: tuple[str, ...] = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "reshard",
    "testing",
    "save_checkpoint",
)

#: Phases derived by the monitor rather than read from a single verl timer.
DERIVED_PHASES: tuple[str, ...] = ("rollout_wait", "comm", "other")

ALL_PHASES: tuple[str, ...] = PHASES + DERIVED_PHASES

#: Phases during which the trainer (FSDP/Megatron) does the GPU work.
TRAINING_PHASES: tuple[str, ...] = ("old_log_prob", "ref", "values", "update_critic", "update_actor")

#: One vocabulary for detectors, exported metrics, alert rules and the UI.
FLAG_KINDS: tuple[str, ...] = (
    "gpu_imbalance",
    "rollout_long_tail",
    "phase_imbalance",
    "rollout_wait",
    "io_starvation",
    "reshard_spike",
    "comm_heavy",
    "low_utilization",
    "util_overstates_sm",
    "step_time_spikes",
    "memory_pressure",
    "memory_creep",  # GPU memory grows every step: the rate and the forecast to the capacity
    "oom",
    "throughput_regression",
    "gpu_fault",
    "stalled",
    "fatal_error",  # the log reports a failure that ends the run (NCCL, Ray, signal, CUDA)
    "hang",  # no progress while the job waits in a collective; names the rank holding it
    "kv_cache_preemption",  # a rollout server's KV cache full while the engine keeps preempting
    "generation_tail",  # few requests still running on the rollout servers while the rest idle
    # today's trainers, from the log (monitor/detect/async_pools.py)
    "pool_imbalance",  # one GPU pool waits on the other (trainer on samples, rollouter on weights)
    "stale_samples",  # samples trained too old, or evicted / dropped as stale or failed
    "weight_sync_pause",  # a weight sync that pauses generation for long
    "agent_loop_overhead",  # tool calls or compute_score dominate the agent loop
    "skipped_updates",  # grad_norm NaN/inf: verl skipped the optimizer step (weights unchanged)
)

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")

#: Event kinds the parser emits besides step records.
EVENT_KINDS: tuple[str, ...] = (
    "oom",
    "traceback",
    "resume",  # "Setting global step to N", or a step number going backwards
    "checkpoint_load",
    "validation",  # step-0 validation line or Initial/Final validation block
    "progress",  # tqdm heartbeat: data has current, total, percent, elapsed_s, eta_s, s_per_it
    "reshard",  # [HybridEngine] switch or [ParameterSynchronizer] sync: data has seconds
    "truncated",  # the followed file was truncated or replaced
    "memory",  # DEBUG memory lines
    # verl skipped an optimizer step ("WARN: rank 0 grad_norm is not finite: nan"): value,
    # rank, role, worker, pid (monitor.logs.events.grad_not_finite_event)
    "grad_not_finite",
    # failures (monitor.logs.failure_lines.FAILURE_KINDS); data has their numbers and "fatal"
    "nccl_timeout",  # NCCL watchdog: collective, seq, rank, timeout_s, ran_s
    "nccl_error",  # ncclUnhandledCudaError, ncclRemoteError, ...: code, detail, rank
    "actor_died",  # Ray ActorDiedError / RayTaskError: exception, cause, task
    "worker_killed",  # host OOM killer, SIGKILL, segfault, SYSTEM_ERROR exit: reason, pid
    "cuda_error",  # illegal memory access, device-side assert, ECC, XID: error, xid
    # from the exporter's GPU sampler (exporters.gpu.processes): node, gpu, pid, name, used_bytes
    "gpu_process_started",  # a compute process appeared on a GPU after the first reading
    "gpu_process_exited",  # ... and left it
    # from the exporter's flight_recorder collector (monitor/hang): a Flight Recorder or
    # py-spy round taken when a hang opened; message names the culprit, data has "culprits",
    # "waiting", "method", "problems"
    "hang_dump",
    # the job's attempts (monitor/logs/attempt_marks.py): verl-monitor run started the job /
    # the job exited (data: source, pid, offset / status)
    "attempt_start",
    "attempt_end",
    # --on-hang (monitor/live/hang_action.py): the evidence saved; the job ended, or why not
    "hang_evidence",
    "hang_action",
)


@dataclass
class StepRecord:
    """One training step, in canonical form.

    ``end_time`` is unix seconds: from a timestamp on the line, the time the line arrived, or
    rebuilt from cumulative step times (``time_source`` says which: "line", "arrival",
    "rebuilt"). ``phases`` maps canonical phase names (ALL_PHASES) to seconds; only phases the
    log gave (or that were derived) are present. ``metrics`` is the raw key->value dict, untouched.
    """

    step: int
    end_time: float | None = None
    total: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    throughput: float | None = None  # tokens/s per GPU as verl reports perf/throughput
    mem_allocated_peak_bytes: float | None = None
    mem_reserved_peak_bytes: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    time_source: str = "arrival"
    source: str = "console"  # console | jsonl | breakdown
    #: Seconds before this step's timer started that no verl timer covers: the wall time from
    #: the previous step line to this one, less ``total`` (and, since 0.6, ``testing`` and
    #: ``save_checkpoint``). verl fetches the next batch before ``timing_s/step`` starts, so a
    #: data stall shows only here. None where the log has neither timestamps nor arrival times.
    data_wait: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form used by ``analyze --json`` and the store."""
        return asdict(self)


@dataclass
class Event:
    """Something notable in the log that is not a step: OOM, traceback, resume, heartbeat..."""

    kind: str
    time: float | None
    step: int | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)


@dataclass
class Flag:
    """A detected problem, with the evidence and the advice a person acts on.

    ``scope`` holds bounded descriptors: {"node": "n0", "gpus": [3], "phase": "gen",
    "steps": [120, 140]} (any subset). ``end`` is None while the flag is still open.
    ``advice`` is a list of sentences naming real verl config keys.
    """

    kind: str
    severity: str
    start: float
    end: float | None
    scope: dict[str, Any] = field(default_factory=dict)
    evidence: str = ""
    advice: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form used by ``analyze --json``, the store and Slack."""
        return asdict(self)

    @property
    def scope_label(self) -> str:
        """A short, bounded label for the scope ("node=n0 gpus=3,5 phase=gen")."""
        parts = []
        for key in ("node", "gpus", "phase"):
            val = self.scope.get(key)
            if val is None or val == []:
                continue
            if isinstance(val, (list, tuple)):
                val = ",".join(str(v) for v in val)
            parts.append(f"{key}={val}")
        return " ".join(parts)
