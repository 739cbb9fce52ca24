"""Detectors: turn steps, GPU/host frames and log events into flags.

``run_all`` prepares the shared tables once (step table, GPU activity labelled by phase,
analysis windows: each step, or fixed windows where no step covers the GPU data) and runs
every detector in ``DETECTORS``; each is a pure function of that context returning ``Flag``s
with persistence, hysteresis, evidence and advice. Last, a symptom flag is dropped while a flag
naming its cause overlaps it in time (``suppress`` in defaults.yaml: slower steps are not
reported as a throughput regression when a straggler GPU explains them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd

from monitor.config import Config, load_config
from monitor.detect.async_pools import (
    detect_agent_loop_overhead,
    detect_pool_imbalance,
    detect_stale_samples,
    detect_weight_sync_pause,
)
from monitor.detect.detector_base import Context
from monitor.detect.engine_detectors import detect_generation_tail, detect_kv_cache_preemption
from monitor.detect.fatal_error import detect_fatal_error
from monitor.detect.gpu_activity import (
    detect_gpu_imbalance,
    detect_low_utilization,
    detect_util_overstates_sm,
)
from monitor.detect.hang import detect_hang
from monitor.detect.health import (
    detect_gpu_fault,
    detect_memory_pressure,
    detect_oom,
    detect_stalled,
)
from monitor.detect.io import detect_io_starvation
from monitor.detect.memory import detect_memory_creep
from monitor.detect.phases import detect_comm_heavy, detect_phase_imbalance, detect_reshard_spike
from monitor.detect.premises import Judged, advice_premises
from monitor.detect.rollout_detectors import detect_rollout_long_tail, detect_rollout_wait
from monitor.detect.skipped_updates import detect_skipped_updates
from monitor.detect.step_detectors import detect_step_time_spikes, detect_throughput_regression
from monitor.detect.window import latest_time
from monitor.frames import (
    GPU_COLUMNS,
    HOST_COLUMNS,
    NCCL_COLUMNS,
    empty_gpu_frame,
    empty_host_frame,
    empty_nccl_frame,
    rollout_frame,
)
from monitor.logs.gaps import fill_data_wait
from monitor.records import Event, Flag, StepRecord

log = logging.getLogger(__name__)

#: Flag kind -> detector, in FLAG_KINDS order.
DETECTORS: dict[str, Callable[[Context], list[Flag]]] = {
    "gpu_imbalance": detect_gpu_imbalance,
    "rollout_long_tail": detect_rollout_long_tail,
    "phase_imbalance": detect_phase_imbalance,
    "rollout_wait": detect_rollout_wait,
    "io_starvation": detect_io_starvation,
    "reshard_spike": detect_reshard_spike,
    "comm_heavy": detect_comm_heavy,
    "low_utilization": detect_low_utilization,
    "util_overstates_sm": detect_util_overstates_sm,
    "step_time_spikes": detect_step_time_spikes,
    "memory_pressure": detect_memory_pressure,
    "memory_creep": detect_memory_creep,
    "oom": detect_oom,
    "throughput_regression": detect_throughput_regression,
    "gpu_fault": detect_gpu_fault,
    "stalled": detect_stalled,
    "fatal_error": detect_fatal_error,
    "hang": detect_hang,
    "kv_cache_preemption": detect_kv_cache_preemption,
    "generation_tail": detect_generation_tail,
    "pool_imbalance": detect_pool_imbalance,
    "stale_samples": detect_stale_samples,
    "weight_sync_pause": detect_weight_sync_pause,
    "agent_loop_overhead": detect_agent_loop_overhead,
    "skipped_updates": detect_skipped_updates,
}


def make_context(
    steps: list[StepRecord],
    gpu: pd.DataFrame | None,
    host: pd.DataFrame | None,
    events: list[Event],
    config: Config | None = None,
    now: float | None = None,
    reference_steps: list[StepRecord] | None = None,
    nccl: pd.DataFrame | None = None,
    rollout: pd.DataFrame | None = None,
    printed_mode: str | None = None,
    job_config: Mapping[str, Any] | None = None,
    actors: Iterable[str] = (),
) -> Context | None:
    """The shared detector context, or None when there is nothing to look at.

    ``reference_steps``: the run's first steps when ``steps`` is only a recent window of it;
    ``nccl``: NCCL Inspector records (the store's ``nccl.csv``), when the plugin ran;
    ``rollout``: rollout-engine samples (``monitor.frames.ROLLOUT_COLUMNS``), when scraped;
    ``printed_mode``: the trainer mode the job's printed config names (``printed_mode``; taken
    from ``job_config`` when not given); ``job_config``: the config the job printed (nested, as
    verl prints it), which the premises read; ``actors``: the Ray actor names of the log's
    prefixes (``TaskRunner``, ``TaskRunnerV1``)."""
    from monitor.logs.job_config import flatten
    from monitor.logs.modes import printed_mode as mode_of

    if printed_mode is None and job_config:
        printed_mode = mode_of(job_config)
    gpu = empty_gpu_frame() if gpu is None else _with_columns(gpu, GPU_COLUMNS)
    host = empty_host_frame() if host is None else _with_columns(host, HOST_COLUMNS)
    steps = fill_data_wait(list(steps or []))  # the batch fetch before each step's timer
    events = list(events or [])
    if now is None:
        now = latest_time(steps, gpu, host, events)
    if now is None and rollout is not None and len(rollout):
        now = float(pd.to_numeric(rollout["ts"], errors="coerce").max())  # engine samples only
    if now is None and events:
        now = 0.0  # only events, none with a time (a pasted traceback): they are placed at 0
    if now is None:
        return None
    nccl = empty_nccl_frame() if nccl is None else _with_columns(nccl, NCCL_COLUMNS)
    rollout = rollout_frame([]) if rollout is None else rollout
    return Context(steps, gpu, host, events, config or load_config(), float(now),
                   reference_steps=list(reference_steps or []), nccl=nccl, rollout=rollout,
                   printed_mode=printed_mode, job=flatten(job_config) if job_config else {},
                   actors=frozenset(actors))


def _with_columns(df: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """The frame with every canonical column present (missing ones NaN), nodes as strings."""
    missing = [c for c in columns if c not in df.columns]
    if missing or ("node" in df.columns and df["node"].dtype != object):
        df = df.copy()
        for c in missing:
            df[c] = "" if c in ("node", "coll", "comm") else float("nan")
        df["node"] = df["node"].astype(str)
    return df


def _suppress(flags: list[Flag], rules: dict[str, list[str]]) -> list[Flag]:
    def overlaps(a: Flag, b: Flag) -> bool:
        a_end = a.end if a.end is not None else float("inf")
        b_end = b.end if b.end is not None else float("inf")
        return a.start <= b_end and b.start <= a_end

    out = []
    for f in flags:
        by = rules.get(f.kind) or []
        if any(o.kind in by and overlaps(f, o) for o in flags if o is not f):
            continue
        out.append(f)
    return out


def run_all(
    steps: list[StepRecord],
    gpu: pd.DataFrame,
    host: pd.DataFrame,
    events: list[Event],
    config: Config | None = None,
    now: float | None = None,
    reference_steps: list[StepRecord] | None = None,
    nccl: pd.DataFrame | None = None,
    rollout: pd.DataFrame | None = None,
    on_error: Callable[[str, Exception], None] | None = None,
    printed_mode: str | None = None,
    job_config: Mapping[str, Any] | None = None,
    actors: Iterable[str] = (),
    judged: list[Judged] | None = None,
) -> list[Flag]:
    """Run every detector and return their flags, sorted by start time.

    ``now`` defaults to the latest timestamp in any input. A detector that fails is logged and
    skipped so the others still report. ``reference_steps``: the run's first steps, from a live
    caller whose ``steps`` are a rolling window (a throughput drop older than the window is
    still measured against the run's start, not against itself). ``on_error(kind, exc)``,
    when given, is told of each detector that fails (instead of logging it here).
    ``printed_mode``: the trainer mode the job's printed config names
    (``monitor.logs.modes.printed_mode``), for the detectors that judge by the mode.
    ``job_config``, ``actors``: what the job printed, for the premises (``make_context``).
    A detector's flags are raised only where its premises hold (``monitor.detect.premises``:
    judged when it has something to raise, so the report lists only the readings a premise
    stopped); ``judged``, when given, receives those verdicts, for the "not judged" list.
    """
    ctx = make_context(steps, gpu, host, events, config, now, reference_steps, nccl, rollout,
                       printed_mode, job_config, actors)
    if ctx is None:
        return []
    flags: list[Flag] = []
    for kind, fn in DETECTORS.items():
        try:
            found = fn(ctx)
            if found and not ctx.holds(kind):
                continue  # a premise fails or cannot be judged: nothing is raised (and said)
            flags.extend(found)
        except Exception as exc:  # noqa: BLE001 - one broken detector must not silence the rest
            if on_error is None:
                log.exception("detector %s failed", kind)
            else:
                on_error(kind, exc)
    flags = _suppress(flags, ctx.config.section("suppress"))
    for flag in flags:
        flag.advice = advice_premises(ctx, flag.advice)
    if judged is not None:
        judged.extend(ctx.judged)
    return sorted(flags, key=lambda f: (f.start, f.kind))


__all__ = ["DETECTORS", "make_context", "run_all"]
