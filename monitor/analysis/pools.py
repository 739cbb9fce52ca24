"""The goodput ledger per GPU pool: trainer and rollout (or one colocated pool), and overall.

Today's verl trainers split the GPUs: the fully-async policy, the V1 separate-async trainer and
one-step-off run the rollout on a pool of its own. Each pool's wall time is split into what its
GPUs did and what they waited for, from the log's own timers (docs/goodput.md, "Per pool"):

- trainer pool: the step (``timing_s/step``) as its phases; in the split modes ``gen`` is
  ``waiting_for_samples`` and the weight sync ``parameter_sync``; the gap before the step timer
  (the batch fetch, where timestamps allow) is ``data_loading``;
- rollout pool: the fully-async rollouter's ``active_time`` against ``version_time``
  (``waiting_for_weights`` the rest), or one-step-off's ``generate_async`` against the step;
- preempted work: the engine's ``preemptions_total`` (the rollout frame) where scraped, else
  ``timing_s/agent_loop/num_preempted/mean`` x the samples; a count of requests whose work was
  recomputed (the engines do not say how many tokens that threw away).

With GPU samples of the trainer's node (``--gpu``) the trainer pool comes from the GPU ledger
(:mod:`monitor.analysis.goodput`), which also splits its compute time into productive and low
activity. Every cause is in seconds per GPU of the pool; ``gpus`` (given, or counted in the GPU
samples) turns them into GPU-seconds and lets the pools add up to the overall figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from monitor.logs.gaps import fill_data_wait
from monitor.logs.keys import async_value, timers
from monitor.logs.modes import SPLIT_POOL_MODES, run_mode, waits_in_gen
from monitor.records import TRAINING_PHASES, StepRecord

#: The busy categories of the log-based ledger (the log cannot tell productive from slow work).
BUSY: tuple[str, ...] = ("generation", "training")
#: Causes of the log-based ledger, in report order.
POOL_CAUSES: tuple[str, ...] = (
    "generation", "training", "waiting_for_samples", "waiting_for_weights", "parameter_sync",
    "weight_sync", "data_loading", "cpu_phases", "validation_checkpoint", "rollout_long_tail",
    "unattributed",
)
_PHASE_CAUSE = {"reward": "cpu_phases", "adv": "cpu_phases", "testing": "validation_checkpoint",
                "save_checkpoint": "validation_checkpoint", "rollout_wait": "rollout_long_tail",
                "other": "unattributed", "comm": "training"}


def _merged(steps: list[StepRecord]) -> list[tuple[StepRecord, dict[str, Any]]]:
    """Step records with a step time, each with the metrics of every line of its step number
    (the fully-async trainer prints the rollouter's figures on a line of their own)."""
    by_step: dict[int, dict[str, Any]] = {}
    for rec in steps:
        by_step.setdefault(int(rec.step), {}).update(rec.metrics)
    return [(rec, by_step[int(rec.step)]) for rec in steps if rec.total is not None]


def trainer_pool(steps: list[StepRecord], mode: str) -> dict[str, float]:
    """Seconds per trainer GPU by cause, summed over the steps (log timers only)."""
    out = dict.fromkeys(POOL_CAUSES, 0.0)
    split = waits_in_gen(mode)
    for rec, _ in _merged(steps):
        for phase, sec in rec.phases.items():
            sec = float(sec or 0.0)
            if phase == "gen":
                out["waiting_for_samples" if split else "generation"] += sec
            elif phase == "reshard":
                out["parameter_sync" if split else "weight_sync"] += sec
            elif phase in TRAINING_PHASES:
                out["training"] += sec
            elif phase in _PHASE_CAUSE:
                out[_PHASE_CAUSE[phase]] += sec
        out["data_loading"] += float(rec.data_wait or 0.0)
        if mode == "fully_async_trainer":
            # dynamic resource scheduling (in "other"): the hybrid GPUs roll out meanwhile
            lent = min(out["unattributed"], timers(rec.metrics).get("wait_for_enough_samples", 0.0))
            out["unattributed"] -= lent
            out["generation"] += lent
        if mode == "separate_async":
            # V1's hybrid switches (in "other"): lending the trainer's GPUs to the rollout
            t = timers(rec.metrics)
            lent = t.get("switch_wait", 0.0)
            switch = t.get("switch_to_rollout", 0.0) + t.get("switch_to_trainer", 0.0)
            moved = min(out["unattributed"], lent + switch)
            if moved > 0:
                out["unattributed"] -= moved
                out["generation"] += lent * moved / (lent + switch)
                out["weight_sync"] += switch * moved / (lent + switch)
    return out


def rollout_pool(steps: list[StepRecord], mode: str) -> dict[str, float] | None:
    """Seconds per rollout GPU by cause, or None when the log says nothing of that pool."""
    out = dict.fromkeys(POOL_CAUSES, 0.0)
    seen = False
    if mode in ("fully_async_trainer", "fully_async_rollouter"):
        versions: dict[int, tuple[float, float]] = {}
        for rec in steps:
            active = async_value(rec.metrics, "fully_async/rollouter/active_time")
            whole = async_value(rec.metrics, "fully_async/rollouter/version_time")
            if active is not None and whole is not None and whole > 0:
                versions[int(rec.step)] = (min(active, whole), whole)
        for active, whole in versions.values():
            out["generation"] += active
            out["waiting_for_weights"] += whole - active
            seen = True
    elif mode == "one_step_off":
        for rec, m in _merged(steps):
            gen = timers(m).get("generate_async")
            if gen is None or not rec.total:
                continue
            out["generation"] += min(gen, float(rec.total))
            out["waiting_for_weights"] += max(0.0, float(rec.total) - gen)
            seen = True
    return out if seen else None


def preempted_requests(steps: list[StepRecord], rollout: pd.DataFrame | None) -> float | None:
    """Requests the rollout engines preempted: the rise of ``preemptions_total`` per server in
    the rollout frame, else the agent loop's ``num_preempted`` mean x the batch's samples."""
    if rollout is not None and len(rollout) and "preemptions_total" in rollout.columns:
        df = rollout[["server", "ts", "preemptions_total"]].dropna()
        if len(df):
            total = 0.0
            for _, grp in df.sort_values("ts").groupby("server"):
                rise = grp["preemptions_total"].astype(float).diff().clip(lower=0.0)
                total += float(rise.sum())  # counter resets count as 0, never negative
            return total
    found = False
    total = 0.0
    for _, m in _merged(steps):
        mean = timers(m).get("agent_loop/num_preempted/mean")
        if mean is None or mean < 0:
            continue
        samples = _batch_samples(m)
        if samples is None:
            continue
        found = True
        total += mean * samples
    return total if found else None


def _batch_samples(m: Mapping[str, Any]) -> float | None:
    """Samples in a step's batch: total tokens / (mean prompt + mean response length)."""
    tokens = m.get("perf/total_num_tokens")
    p, r = m.get("prompt_length/mean"), m.get("response_length/mean")
    if not all(isinstance(v, (int, float)) for v in (tokens, p, r)) or (p + r) <= 0:
        return None
    return float(tokens) / float(p + r)


def _add_untimed_wall(causes: dict[str, float], steps: list[StepRecord]) -> None:
    """Book the measured wall time that no step timer or batch fetch accounts for (restarts,
    what the log does not say) as ``unattributed``, so the pool spans the run's wall time as
    the summary measures it (``summary.wall_time``)."""
    from monitor.analysis.summary import wall_time

    wall = wall_time(steps)
    if not wall["measured"] or wall["span_s"] is None:
        return
    rest = float(wall["span_s"]) - sum(causes.values())
    if rest > 0:
        causes["unattributed"] += rest


def _pool_doc(name: str, causes: Mapping[str, float], gpus: int | None, source: str,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    wall = float(sum(causes.values()))
    doc = {
        "pool": name, "source": source, "gpus": gpus,
        "seconds_per_gpu": round(wall, 3),
        "gpu_seconds": round(wall * gpus, 3) if gpus else None,
        "causes": {c: round(float(v), 3) for c, v in causes.items() if v > 0},
        "shares": {c: round(float(v) / wall, 4) for c, v in causes.items() if v > 0 and wall > 0},
        "busy_share": round(sum(float(causes.get(c, 0.0)) for c in BUSY) / wall, 4)
        if wall > 0 else None,
    }
    doc.update(extra or {})
    return doc


def _from_gpu_ledger(gp: Mapping[str, Any]) -> dict[str, float]:
    """The GPU ledger's totals as seconds per GPU, in its own cause names."""
    n = max(1, int(gp.get("gpus") or 1))
    secs = {"productive": gp.get("productive") or 0.0, **(gp.get("lost") or {}),
            "unattributed": gp.get("unattributed") or 0.0}
    return {c: float(v) / n for c, v in secs.items()}


def document(
    steps: list[StepRecord],
    *,
    rollout: pd.DataFrame | None = None,
    gpu_ledger: Mapping[str, Any] | None = None,
    trainer_gpus: int | None = None,
    rollout_gpus: int | None = None,
    mode: str | None = None,
) -> dict[str, Any]:
    """The ``pools`` object of ``analyze --json``: the trainer mode (``mode`` when the caller
    judged it, e.g. with the printed config: ``judge_mode``), one ledger per pool
    (``pools``: trainer and rollout, or one ``colocated`` pool) and ``overall`` when the GPU
    count of every pool is known. ``gpu_ledger``: the GPU ledger's document for the trainer's
    node (its GPU count is the trainer pool's unless ``trainer_gpus`` says otherwise)."""
    fill_data_wait(steps)  # the batch fetch before each step timer, where the clocks tell it
    mode = mode or run_mode(steps)
    split = mode in SPLIT_POOL_MODES
    pools: list[dict[str, Any]] = []
    if gpu_ledger and gpu_ledger.get("gpu_seconds_total"):
        gpus = trainer_gpus or int(gpu_ledger.get("gpus") or 0) or None
        causes = _from_gpu_ledger(gpu_ledger)
        pools.append(_pool_doc("trainer" if split else "colocated", causes, gpus, "gpu"))
        pools[-1]["busy_share"] = gpu_ledger.get("goodput_share")
    elif mode != "fully_async_rollouter":
        causes = trainer_pool(steps, mode)
        _add_untimed_wall(causes, steps)
        if sum(causes.values()) > 0:
            pools.append(_pool_doc("trainer" if split else "colocated", causes, trainer_gpus,
                                   "log"))
    preempted = preempted_requests(steps, rollout)
    if split:
        ro = rollout_pool(steps, mode)
        extra = {"preempted_requests": preempted} if preempted is not None else {}
        if ro is not None:
            pools.append(_pool_doc("rollout", ro, rollout_gpus, "log", extra))
        else:
            pools.append({"pool": "rollout", "source": None, "gpus": rollout_gpus,
                          "note": "the log has no rollout-pool timers for this trainer", **extra})
    elif preempted is not None and pools:
        pools[0]["preempted_requests"] = preempted
    overall = None
    known = [p for p in pools if p.get("seconds_per_gpu") is not None]
    if known and all(p.get("gpus") for p in known) and len(known) == len(pools):
        total = sum(p["seconds_per_gpu"] * p["gpus"] for p in known)
        merged: dict[str, float] = {}
        for p in known:
            for c, v in p["causes"].items():
                merged[c] = merged.get(c, 0.0) + v * p["gpus"]
        overall = {"gpus": sum(p["gpus"] for p in known), "gpu_seconds": round(total, 3),
                   "shares": {c: round(v / total, 4) for c, v in merged.items()}
                   if total > 0 else {}}
    return {"mode": mode, "pools": pools, "overall": overall}
