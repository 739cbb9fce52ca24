"""verl metric keys: renames across versions, canonical phases, and version guessing.

Everything here works on the raw ``key -> value`` dict of one step (as printed on the console
line or written by the file logger). The key map follows VERL_SIGNALS.md sections 3 and 4.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from monitor.records import PHASES

#: Old key -> current key (VERL_SIGNALS.md section 3, "Renames to accept").
_RENAMES: dict[str, str] = {
    "mfu/actor": "perf/mfu/actor",
    "critic/kl": "actor/reward_kl_penalty",
    "actor/entropy_loss": "actor/entropy",
}

#: Timers that measure the weight sync (the "reshard") on their own, newest first.
_OWN_RESHARD_TIMERS: tuple[str, ...] = ("update_weights", "sync_rollout_weights", "param_sync")

#: Phases left out of ``other`` because verl 0.6+ leaves them out of ``timing_s/step``.
_OUTSIDE_STEP: frozenset[str] = frozenset({"testing", "save_checkpoint"})

#: Keys that only verl before 0.6 prints; with them ``timing_s/step`` includes testing/saving.
_PRE_06_KEYS: tuple[str, ...] = ("timing_s/reshard", "mfu/actor", "critic/kl", "actor/entropy_loss")


def normalise_key(key: str) -> str:
    """The current name of a verl metric key that older versions printed differently.

    ``timing/x`` -> ``timing_s/x``; ``mfu/actor`` -> ``perf/mfu/actor``; ``critic/kl`` ->
    ``actor/reward_kl_penalty``; ``actor/entropy_loss`` -> ``actor/entropy``;
    ``actor/perf/max_memory_*`` (0.8+) and ``actor/perf/cpu_memory_used_gb`` -> ``perf/...``.
    Any other key comes back unchanged.
    """
    if key.startswith("timing/"):
        return "timing_s/" + key[7:]
    renamed = _RENAMES.get(key)
    if renamed is not None:
        return renamed
    if key.startswith("actor/perf/") and (
        key.startswith("actor/perf/max_memory_") or key == "actor/perf/cpu_memory_used_gb"
    ):
        return key[6:]
    return key


def _number(value: Any) -> float | None:
    """A finite float from a metric value, or None (bools, NaN, inf and non-numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return None
    return value


#: Every timer name canonical phases read, with both spellings of its key.
_TIMER_NAMES: tuple[str, ...] = PHASES + (
    "rollout_wait",
    "comm",
    "update_weights",
    "sync_rollout_weights",
    "param_sync",
    "switch_to_rollout",
    "switch_to_trainer",
    "generate_sequences",
    "agent_loop/slowest/generate_sequences",
    "agent_loop/slowest/tool_calls",
    "agent_loop/slowest/compute_score",
    "step",
)
_TIMER_KEYS: tuple[tuple[str, str, str], ...] = tuple(
    (name, "timing_s/" + name, "timing/" + name) for name in _TIMER_NAMES
)


#: The fully-async trainer's weight-sync timer as verl prints it (a prefixed timer name).
_DOUBLED_PARAM_SYNC = "timing_s/timing_s/param_sync"


def timers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The step's timers as ``name -> seconds``, from ``timing_s/<name>`` or ``timing/<name>``.

    When both spellings are present ``timing_s/`` wins. Non-finite values are left out.
    """
    found: dict[str, float] = {}
    for key, value in metrics.items():
        if key.startswith("timing_s/"):
            name = key[9:]
            if name.startswith("timing_s/"):
                name = name[9:]  # timing_s/timing_s/param_sync (fully-async trainer)
        elif key.startswith("timing/"):
            name = key[7:]
            if name in found:
                continue
        else:
            continue
        num = _number(value)
        if num is not None:
            found[name] = num
    return found


def _known_timers(metrics: Mapping[str, Any]) -> tuple[dict[str, float], bool]:
    """The timers canonical phases use (direct look-ups, fast); True when the step used the
    old ``timing/`` prefix (verl before 0.2)."""
    found: dict[str, float] = {}
    get = metrics.get
    old_prefix = "timing/step" in metrics or "timing/gen" in metrics
    for name, new_key, old_key in _TIMER_KEYS:
        value = get(new_key)
        if value is None:
            if not old_prefix:
                continue
            value = get(old_key)
            if value is None:
                continue
        if type(value) is float:
            if value >= 0.0 and value - value == 0.0:  # finite, not negative
                found[name] = value
            continue
        num = _number(value)
        if num is not None and num >= 0.0:
            found[name] = num
    if "param_sync" not in found:
        # the fully-async trainer times its weight sync under the key "timing_s/param_sync",
        # which verl's compute_timing_metrics prefixes once more
        doubled = _number(get(_DOUBLED_PARAM_SYNC))
        if doubled is not None and doubled >= 0.0:
            found["param_sync"] = doubled
    if not found and not old_prefix and any(key.startswith("timing/") for key in metrics):
        old = {key: value for key, value in metrics.items() if key.startswith("timing/")}
        old["timing/step"] = old.get("timing/step")  # marks the old prefix for the retry
        found, _ = _known_timers(old)
        return found, True
    return found, old_prefix


def _is_old_era(metrics: Mapping[str, Any], version_hint: str | None, old_prefix: bool) -> bool:
    if old_prefix or (version_hint and version_hint.startswith("<=")):
        return True
    return any(key in metrics for key in _PRE_06_KEYS)


def canonical_phases(
    metrics: Mapping[str, Any], *, version_hint: str | None = None
) -> dict[str, float]:
    """Canonical phase seconds (names in ``monitor.records.ALL_PHASES``) from a step's metrics.

    ``timing_s/<phase>`` (or the old ``timing/<phase>``) maps by name. The weight sync becomes
    ``reshard`` whatever the version calls it: ``timing_s/reshard`` (0.4.1-0.5.x, nested inside
    ``gen``, so it is subtracted from ``gen``), ``update_weights`` (0.7.1+), ``sync_rollout_weights``
    (one-step-off), ``param_sync`` (fully async), ``switch_to_rollout`` + ``switch_to_trainer``
    (0.9 separate-async). Verl 0.6.0-0.7.0 has no key: ``gen - generate_sequences`` (or ``gen``
    less the agent loop's slowest sample: its generation, tool calls and scoring, see
    ``generation_seconds``) when positive is the reshard, taken out of ``gen``.
    Logs before 0.4.1 (``version_hint`` starting with ``"<="``, or old keys) get no reshard.

    Timers that are negative, NaN or infinite are ignored (they stay in the raw metrics).
    ``other`` is ``timing_s/step`` minus the known phases, clamped at 0, only when the step time is
    known. Since 0.6 the step time excludes ``testing`` and ``save_checkpoint``, so they are not
    subtracted then; for older logs (``timing_s/reshard``, old key names) they are.
    """
    return phases_and_total(metrics, version_hint=version_hint)[0]


def phases_and_total(
    metrics: Mapping[str, Any], *, version_hint: str | None = None
) -> tuple[dict[str, float], float | None]:
    """``(canonical_phases(metrics), step seconds or None)`` in one pass over the keys."""
    timer, old_prefix = _known_timers(metrics)
    phases: dict[str, float] = {}
    for name in PHASES:
        if name in timer:
            phases[name] = timer[name]
    for name in ("rollout_wait", "comm"):
        if name in timer:
            phases[name] = timer[name]

    old_era = _is_old_era(metrics, version_hint, old_prefix)
    if "reshard" in timer:
        if "gen" in phases:
            phases["gen"] = max(0.0, phases["gen"] - timer["reshard"])
    else:
        own = next((timer[name] for name in _OWN_RESHARD_TIMERS if name in timer), None)
        if own is not None:
            phases["reshard"] = own
        elif "switch_to_rollout" in timer or "switch_to_trainer" in timer:
            phases["reshard"] = timer.get("switch_to_rollout", 0.0) + timer.get(
                "switch_to_trainer", 0.0
            )
        elif not old_era and "gen" in phases:
            generate = generation_seconds(timer)
            if generate is not None and phases["gen"] - generate > 0:
                phases["reshard"] = phases["gen"] - generate
                phases["gen"] = generate

    total = timer.get("step")
    if total is not None:
        phases["other"] = other_seconds(
            total, phases, include_outside_step=old_era or _step_holds_outside(total, phases))
    return phases, total


def _step_holds_outside(total: float, phases: Mapping[str, float]) -> bool:
    """Whether a step time already holds its testing/checkpointing (verl < 0.6, and the V1
    trainer of 0.9, which saves inside its step timer): it exceeds the other phases by at least
    half of them (the rule of ``monitor.logs.gaps.covered_seconds``)."""
    extra = sum(phases.get(p) or 0.0 for p in _OUTSIDE_STEP)
    if extra <= 0:
        return False
    core = sum(v for k, v in phases.items() if k not in _OUTSIDE_STEP and k != "other")
    return total - core >= 0.5 * extra


#: The agent loop's slowest sample, timer by timer: verl's ``AgentLoopManager`` picks the
#: sample with the largest generation + tool time (``_performance_metrics``: "batch sequence
#: generation is bounded by the slowest sample") and prints its parts; later releases add its
#: ``compute_score`` (the reward, run inside the loop since verl#3055).
_SLOWEST_SAMPLE_PARTS: tuple[str, ...] = (
    "agent_loop/slowest/generate_sequences",
    "agent_loop/slowest/tool_calls",
    "agent_loop/slowest/compute_score",
)


def generation_seconds(timer: Mapping[str, float]) -> float | None:
    """The seconds of ``gen`` that generation itself took, from a step's timers (names without
    ``timing_s/``), or None: ``generate_sequences`` (the rollout worker's own timer), else the
    agent loop's slowest sample as a whole (its generation, tool calls and scoring).

    ``gen`` less this is what verl 0.6-0.7.0 leaves for the weight sync: the rollout's wake-up
    (where the weights are loaded) and sleep, plus the batch's gathering and padding. It is an
    estimate of the sync, never its own timer: see ``reshard_is_derived``.
    """
    generate = timer.get("generate_sequences")
    if generate is not None:
        return generate
    if _SLOWEST_SAMPLE_PARTS[0] not in timer:
        return None
    return sum(timer[name] for name in _SLOWEST_SAMPLE_PARTS if name in timer)


def reshard_is_derived(metrics: Mapping[str, Any]) -> bool:
    """True when a step's ``reshard`` phase is ``gen`` less its generation (verl 0.6-0.7.0
    prints no sync timer) rather than a timer of the sync itself."""
    timer, _ = _known_timers(metrics)
    if "reshard" in timer or any(name in timer for name in _OWN_RESHARD_TIMERS):
        return False
    if "switch_to_rollout" in timer or "switch_to_trainer" in timer:
        return False
    return "gen" in timer and generation_seconds(timer) is not None


def other_seconds(
    total: float, phases: Mapping[str, float], *, include_outside_step: bool = False
) -> float:
    """Step time not explained by ``phases`` (clamped at 0).

    ``testing`` and ``save_checkpoint`` count only with ``include_outside_step`` (verl < 0.6).
    """
    known = 0.0
    for name, seconds in phases.items():
        if name == "other":
            continue
        if name in _OUTSIDE_STEP and not include_outside_step:
            continue
        known += seconds
    return max(0.0, total - known)


# --- version guessing -------------------------------------------------------------------------

# A bound is (sortable version tuple, label). "x" labels sort above any patch release.
_Bound = tuple[tuple[int, int, int], str]

#: After the v0.5.0 tag and before v0.6.0: verl's main said "0.5.0.dev" there (the HF-rollout
#: commit 4c3310db that runs on our H200 is one of them).
_POST_050: _Bound = ((0, 5, 50), "0.5.x")

#: Keys and the first release that prints them, each checked in verl's history:
#: ``timing_s/reshard`` from 70bd3d3d6 (2025-06-07, before v0.4.1) until the sharding managers
#: went (19020f618, 2025-09-03, before v0.6.0); ``response/aborted_ratio`` from ea885f32f
#: (2025-08-13, after v0.5.0: the 0.5.0.dev main, not 0.6.0).
_LOWER_KEY_HINTS: tuple[tuple[str, _Bound], ...] = (
    ("timing_s/reshard", ((0, 4, 1), "0.4.1")),
    ("response/aborted_ratio", _POST_050),
    ("perf/mfu/actor_infer", ((0, 7, 0), "0.7.0")),
    ("timing_s/update_weights", ((0, 7, 1), "0.7.1")),
)
_UPPER_KEY_HINTS: tuple[tuple[str, _Bound], ...] = (
    ("mfu/actor", ((0, 2, 99), "0.2")),
    ("critic/kl", ((0, 3, 99), "0.3")),
    ("actor/entropy_loss", ((0, 4, 0), "0.4.0")),
    ("timing_s/reshard", ((0, 5, 99), "0.5.x")),
)
#: Key families of the V1 trainers (TaskRunnerV1, verl-project/verl 45632b5fa, in v0.9.0):
#: ``training/off_policy/`` from v0.9.0, ``separate_async/`` after it.
_V1_PREFIXES = ("training/off_policy/", "separate_async/")
_ASYNC_RESHARD_KEYS: tuple[str, ...] = (
    "timing_s/sync_rollout_weights",
    "timing_s/param_sync",
    "timing_s/switch_to_rollout",
    "timing_s/switch_to_trainer",
)


def _key_bounds(keyset: set[str]) -> tuple[list[_Bound], list[_Bound]]:
    """(lower, upper) bounds the metric keys give."""
    lowers = [bound for key, bound in _LOWER_KEY_HINTS if key in keyset]
    uppers = [bound for key, bound in _UPPER_KEY_HINTS if key in keyset]
    if any(key.startswith("timing/") for key in keyset):
        uppers.append(((0, 2, 99), "0.2"))
    if any(key.startswith("actor/perf/max_memory_") for key in keyset):
        lowers.append(((0, 8, 0), "0.8"))
    if any(key.startswith(_V1_PREFIXES) for key in keyset):
        lowers.append(((0, 9, 0), "0.9"))
    return lowers, uppers


def _console_bounds(prefixset: set[str], number_format: str | None,
                    known_uppers: list[_Bound]) -> tuple[list[_Bound], list[_Bound]]:
    """(lower, upper) bounds only a console log gives: Ray actor names and the number format."""
    lowers: list[_Bound] = []
    uppers: list[_Bound] = []
    if "TaskRunnerV1" in prefixset:
        lowers.append(((0, 9, 0), "0.9"))
    if "main_task" in prefixset:
        uppers.append(((0, 2, 99), "0.2"))
    if "TaskRunner" in prefixset:
        lowers.append(((0, 3, 0), "0.3"))
    if number_format == "3dec":
        uppers.append(((0, 4, 1), "0.4.1"))
    elif number_format in ("repr", "numpy") and not any(
            bound[0] < (0, 5, 0) for bound in known_uppers + uppers):
        # Full-precision values are weak evidence (forks and custom loggers print them too):
        # a key or prefix that only verl before 0.5 printed outweighs them.
        lowers.append(((0, 5, 0), "0.5"))
    return lowers, uppers


def guess_version(
    keys: Iterable[str], prefixes: Iterable[str] = (), *, number_format: str | None = None
) -> str:
    """A verl version range from the keys a log printed, its Ray prefixes and its number format.

    Returns strings such as ``"<=0.2"``, ``"0.3-0.4.0"``, ``"0.4.1-0.5.x"``, ``"0.5.x"``,
    ``"0.5.x-0.7.0"``, ``"0.7.1+"``, ``"0.8+"``, ``"0.9+"``, or ``"unknown"`` when nothing hints.

    The keys decide each bound they give, so a run's console log and its JSONL (the same keys)
    give the same range. What only a console line shows speaks for a bound the keys leave
    open: ``prefixes`` are Ray actor names (``TaskRunnerV1`` means 0.9+, ``main_task`` 0.2 or
    older, ``TaskRunner`` 0.3+); ``number_format`` is ``"3dec"`` (every value with 3 decimals:
    0.4.1 or older), ``"repr"`` (0.5+, unless a key or prefix says older) or ``"numpy"``:
    ``np.float64(...)`` is numpy 2's repr through the same ``pprint.pformat`` of verl 0.5+, so
    it says what ``"repr"`` says and nothing about verl 0.9.
    """
    keyset = set(keys)
    key_lowers, key_uppers = _key_bounds(keyset)
    weak_lowers, weak_uppers = _console_bounds(set(prefixes), number_format, key_uppers)
    lowers = key_lowers or weak_lowers
    uppers = key_uppers or weak_uppers
    lo = max(lowers) if lowers else None
    hi = min(uppers) if uppers else None
    key_lo = max(key_lowers) if key_lowers else None
    # From the sharding managers' removal (before 0.6.0) to 0.7.0 verl printed no reshard
    # timer, nor did the HF rollout before it; 0.7.1+ times update_weights. A full training step
    # without any sync timer, from a release after v0.5.0 by its keys, caps the range at 0.7.0,
    # if that stays consistent.
    if (
        "timing_s/step" in keyset
        and "timing_s/update_weights" not in keyset
        and "timing_s/reshard" not in keyset
        and not any(key in keyset for key in _ASYNC_RESHARD_KEYS)
        and key_lo is not None
        and key_lo[0] >= _POST_050[0]
        and (hi is None or hi[0] > (0, 7, 0))
    ):
        hi = ((0, 7, 0), "0.7.0")
    return _format_range(lo, hi)

def _version_tuple(text: str) -> tuple[int, ...] | None:
    parts = []
    for piece in text.strip().split("."):
        if piece in ("x", "X"):
            parts.append(99)
        elif piece.isdigit():
            parts.append(int(piece))
        else:
            return None
    return tuple(parts) if parts else None


def version_below(version_range: str, version: str) -> bool:
    """Whether a range ``guess_version`` wrote (``"<=0.5.x"``, ``"0.3-0.4.0"``, ``"0.8"``) lies
    wholly below ``version`` (``"0.9"``): False when its upper end is open or unknown."""
    text = version_range.strip()
    if not text or text == "unknown" or text.endswith("+"):
        return False
    upper = text.split("-")[-1].lstrip("<=")
    hi, want = _version_tuple(upper), _version_tuple(version)
    if hi is None or want is None:
        return False
    return hi < want


def _format_range(lo: _Bound | None, hi: _Bound | None) -> str:
    if lo is not None and hi is not None and lo[0] > hi[0]:
        # Contradicting hints: trust the newest evidence (keys only appear in newer versions).
        return f"{lo[1]}+"
    if lo is None and hi is None:
        return "unknown"
    if hi is None:
        return f"{lo[1]}+"
    if lo is None:
        return f"<={hi[1]}"
    if lo[1] == hi[1]:
        return lo[1]
    if hi[1].endswith(".x") and hi[1][:-2] == lo[1]:
        return hi[1]
    return f"{lo[1]}-{hi[1]}"


# --- what the keys of today's trainers mean (docs/verl_modes.md) -------------------------------

#: ``(key or prefix, family, meaning)``; a key ending in ``/`` is a prefix. Looked up longest
#: first; the fully-async keys also match without their ``fully_async/`` prefix (the
#: rollouter's own ``get_statistics`` and verl's README spell them so).
KEY_MEANINGS: tuple[tuple[str, str, str], ...] = (
    # agent loop (server-mode rollout), per batch: min/max/mean over samples
    ("timing_s/agent_loop/generate_sequences/", "agent_loop",
     "seconds a sample spent generating in the rollout server (min/max/mean over the batch)"),
    ("timing_s/agent_loop/tool_calls/", "agent_loop",
     "seconds a sample spent in tool calls (min/max/mean over the batch)"),
    ("timing_s/agent_loop/compute_score/", "agent_loop",
     "seconds a sample spent in the reward's compute_score inside the agent loop"),
    ("timing_s/agent_loop/num_preempted/", "agent_loop",
     "times a sample's request was preempted by the engine (-1: the engine does not say)"),
    ("timing_s/agent_loop/slowest/", "agent_loop",
     "the slowest sample (generate + tool calls + score): its parts, preemptions and lengths; "
     "the batch's generation waits for it"),
    # V1 separate-async trainer
    ("timing_s/switch_wait", "separate_async",
     "seconds the hybrid trainer GPUs stay lent to the rollout until enough groups are sampleable"),
    ("timing_s/switch_to_rollout", "separate_async",
     "seconds to hand the hybrid trainer GPUs to the rollout (weights in, replicas registered)"),
    ("timing_s/switch_to_trainer", "separate_async",
     "seconds to take the hybrid GPUs back for training (remove, abort, sleep the replicas)"),
    ("timing_s/update_weights", "weight_sync",
     "seconds to send the new weights to the rollout replicas (V1, sync trainer 0.7.1+)"),
    ("separate_async/switch/", "separate_async",
     "the hybrid switch: threshold ratio, samples waited for, whether the step idled"),
    ("separate_async/decision/", "separate_async",
     "the switch decision: sampleable groups, remaining, per-sample time, switch cost"),
    ("training/off_policy/trajectory_staleness/", "staleness",
     "model versions a trained trajectory lags the current policy (from its newest part)"),
    ("training/off_policy/trajectory_staleness_worst/", "staleness",
     "model versions a trained trajectory lags the current policy (from its oldest part)"),
    ("training/off_policy/trajectory_spans/", "staleness",
     "model versions one trajectory was generated across (1 = one version)"),
    ("training/off_policy/evicted_samples_staleness/", "staleness",
     "age in versions of the groups evicted as too stale"),
    ("training/off_policy/evicted_samples", "staleness",
     "prompt groups evicted because they passed trainer.v1.sampler.max_off_policy_threshold"),
    ("training/rollout_failure/evicted_samples", "staleness",
     "prompt groups evicted because their rollout failed"),
    ("training/filter_groups/", "staleness", "groups evicted or discarded by DAPO group filtering"),
    # fully-async policy
    ("fully_async/trainer/idle_ratio", "fully_async",
     "timing_s/gen / timing_s/step over a sync cycle: the share of the trainer's time spent "
     "waiting for samples"),
    ("fully_async/total_wait_time", "fully_async",
     "seconds the trainer waited on the message queue for one batch of samples"),
    ("fully_async/rollouter/idle_ratio", "fully_async",
     "share of a weight version's time the rollouter sat paused (staleness bound reached), "
     "waiting for new weights"),
    ("fully_async/rollouter/active_time", "fully_async",
     "seconds the rollouter generated within one weight version"),
    ("fully_async/rollouter/version_time", "fully_async", "seconds one weight version lasted"),
    ("fully_async/rollouter/step_generated_samples", "fully_async",
     "samples the rollouter produced in one weight version"),
    ("fully_async/count/staleness_samples", "staleness",
     "samples generated (in flight or queued) since the last weight update"),
    ("fully_async/count/dropped_stale_samples", "staleness",
     "samples the rollouter dropped (the queue refused them as too stale), cumulative"),
    ("fully_async/count/stale_trajectory_processed", "staleness",
     "trained trajectories older than the current weights, cumulative"),
    ("fully_async/count/", "fully_async", "rollouter counters (generated samples, versions)"),
    ("fully_async/static/", "fully_async",
     "rollouter settings (staleness_threshold, required and max queue samples, concurrency)"),
    ("fully_async/monitor/", "fully_async", "rollouter queue sizes and active tasks"),
    ("fully_async/partial/", "staleness",
     "partial rollouts: samples continued across a weight update, their share and version span"),
    ("fully_async/processing_time/", "fully_async",
     "seconds per sample in the agent loop (avg/max/min/tp50/tp95/tp99)"),
    ("timing_s/param_sync", "weight_sync",
     "seconds of the fully-async weight sync, trainer to rollouter (printed as "
     "timing_s/timing_s/param_sync)"),
    ("timing_s/wait_for_enough_samples", "fully_async",
     "seconds the trainer lets its hybrid GPUs roll out before taking them back (dynamic "
     "resource scheduling)"),
    ("timing_s/wait_last_valid", "fully_async", "seconds waiting for the last validation"),
    ("dynamic_resource/", "fully_async",
     "dynamic resource scheduling: train/rollout resource utilization, queue size"),
    # one-step-off policy
    ("timing_s/generate_async", "one_step_off",
     "seconds the next batch took to generate on the rollout pool, overlapped with training"),
    ("timing_s/sync_rollout_weights", "weight_sync",
     "seconds of the one-step-off weight sync, trainer to rollout pool"),
    ("timing_s/gen", "phase",
     "generation in the sync trainer; in one-step-off, separate-async and fully-async trainers "
     "the wait for samples from the rollout pool"),
)
_MEANINGS_BY_LENGTH = sorted(KEY_MEANINGS, key=lambda row: -len(row[0]))
#: Unprefixed spellings of fully-async keys (the rollouter's own statistics, the README).
_UNPREFIXED = ("rollouter/", "count/", "static/", "monitor/", "partial/", "processing_time/",
               "trainer/idle_ratio", "total_wait_time")


def key_meaning(key: str) -> tuple[str, str] | None:
    """``(family, meaning)`` of a key of today's trainers, or None when it is not one of them.

    Families: ``agent_loop``, ``separate_async``, ``staleness``, ``fully_async``,
    ``one_step_off``, ``weight_sync``, ``phase``."""
    key = normalise_key(key)
    if key == _DOUBLED_PARAM_SYNC:
        key = "timing_s/param_sync"
    if key.startswith(_UNPREFIXED):
        key = "fully_async/" + key
    for name, family, meaning in _MEANINGS_BY_LENGTH:
        if key == name or (name.endswith("/") and key.startswith(name)) or (
                not name.endswith("/") and key.startswith(name + "/")):
            return family, meaning
    return None


def async_value(metrics: Mapping[str, Any], name: str) -> float | None:
    """A fully-async value by its ``fully_async/`` name, in either spelling (finite or None)."""
    value = _number(metrics.get(name))
    if value is None and name.startswith("fully_async/"):
        value = _number(metrics.get(name[len("fully_async/"):]))
    return value
