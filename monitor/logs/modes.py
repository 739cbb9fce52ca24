"""Which verl trainer wrote a log, recognised from the metric keys it printed.

verl's trainers print different timers and key families (docs/verl_modes.md):

- ``sync``: the colocated trainer with the rollout in the driver (``timing_s/gen`` is generation);
- ``agent_loop``: server-mode rollout (vLLM/SGLang behind the agent loop, verl's default
  ``actor_rollout_ref.rollout.mode: async``) under the sync trainer (``timing_s/agent_loop/*``);
- ``one_step_off``: one-step-off policy (``timing_s/generate_async``, ``sync_rollout_weights``);
- ``separate_async``: the V1 separate-async trainer (``separate_async/*``, ``switch_wait``,
  ``switch_to_rollout``/``switch_to_trainer``);
- ``fully_async_trainer``: the fully-async policy's trainer (``fully_async/*``, ``param_sync``);
- ``fully_async_rollouter``: a stream of the fully-async rollouter's own statistics only
  (``count/*``, ``static/*``, ``rollouter/*``, with or without the ``fully_async/`` prefix,
  and no ``timing_s/step``);
- ``unknown``: nothing that any trainer prints (no step lines, or step lines with no verl timer
  and no key of the families above): the text is not read as one trainer or another.

In ``one_step_off``, ``separate_async`` and ``fully_async_trainer`` the rollout runs on its own
GPU pool and ``timing_s/gen`` is the time the trainer *waits for samples*
(:data:`WAITING_GEN_MODES`).

Where the keys are the same for every mode the job's printed config decides
(:func:`judge_mode`): verl 0.9's V1 trainer (``trainer.use_v1: True``) prints the same step keys
in its ``sync``, ``colocate_async`` and ``separate_async`` modes (before the ``switch_*`` timers
were added), and runs the trainer ``trainer.v1.trainer_mode`` names
(verl/trainer/main_ppo.py: ``get_trainer_cls(config.trainer.v1.trainer_mode)``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from monitor.records import StepRecord

#: Every mode ``trainer_mode`` returns.
TRAINER_MODES: tuple[str, ...] = (
    "sync", "agent_loop", "one_step_off", "separate_async", "fully_async_trainer",
    "fully_async_rollouter", "unknown",
)
#: Modes whose ``timing_s/gen`` is the trainer waiting for samples from a separate rollout pool.
WAITING_GEN_MODES: frozenset[str] = frozenset({"one_step_off", "separate_async",
                                               "fully_async_trainer"})
#: Modes with separate trainer and rollout GPU pools.
SPLIT_POOL_MODES: frozenset[str] = WAITING_GEN_MODES | {"fully_async_rollouter"}

_FULLY_ASYNC_TRAINER_KEYS = ("fully_async/trainer/idle_ratio", "timing_s/param_sync",
                             "timing_s/timing_s/param_sync", "fully_async/total_wait_time",
                             "timing_s/wait_for_enough_samples", "total_wait_time",
                             "trainer/idle_ratio")
_ROLLOUTER_PREFIXES = ("fully_async/rollouter/", "rollouter/", "fully_async/count/", "count/",
                       "fully_async/static/", "static/", "fully_async/monitor/", "monitor/",
                       "dynamic_resource/rollout_")
_SEPARATE_KEYS = ("timing_s/switch_wait", "timing_s/switch_to_rollout",
                  "timing_s/switch_to_trainer")
_ONE_STEP_OFF_KEYS = ("timing_s/generate_async", "timing_s/sync_rollout_weights")
#: The timing breakdown of tuning guides (``Step N: total=...ms | actor_gen=...``): a sync trainer.
_BREAKDOWN_KEYS = frozenset({"actor_gen", "critic_score", "loss_comp", "rollout_wait"})


def trainer_mode(metrics_keys: Iterable[str]) -> str:
    """The trainer mode (one of :data:`TRAINER_MODES`) a set of metric keys comes from.

    Keys of one step line are enough; more lines only make the answer surer. The old
    ``timing/`` spelling is accepted. Keys with no verl timer (``timing_s/*``) and none of the
    families above give ``"unknown"``: a sync trainer is only said when its timers say so.
    """
    keys = {("timing_s/" + k[7:]) if k.startswith("timing/") else k for k in metrics_keys}
    has_step = "timing_s/step" in keys
    if any(k.startswith("separate_async/") for k in keys) or any(k in keys for k in _SEPARATE_KEYS):
        return "separate_async"
    if any(k in keys for k in _FULLY_ASYNC_TRAINER_KEYS) or (
            has_step and any(k.startswith("fully_async/") for k in keys)):
        return "fully_async_trainer"
    if not has_step and keys and all(k.startswith(_ROLLOUTER_PREFIXES) or k.startswith("val-")
                                     or k.startswith("timing_s/rollouter/")
                                     or k.startswith("dynamic_resource/") for k in keys) and any(
            k.startswith(("fully_async/rollouter/", "rollouter/", "count/", "fully_async/count/"))
            for k in keys):
        return "fully_async_rollouter"
    if any(k in keys for k in _ONE_STEP_OFF_KEYS):
        return "one_step_off"
    if any(k.startswith("timing_s/agent_loop/") for k in keys):
        return "agent_loop"
    if any(k.startswith("timing_s/") for k in keys) or keys & _BREAKDOWN_KEYS:
        return "sync"
    return "unknown"


def step_modes(steps: Iterable[StepRecord]) -> list[str]:
    """Each step's trainer mode, in order."""
    return [trainer_mode(s.metrics) for s in steps]


#: verl's V1 trainer modes (``trainer.v1.trainer_mode``) that are a mode here. Its ``sync`` is
#: what the keys say already (sync, or agent_loop); ``colocate_async`` (the rollout lent the
#: trainer's GPUs between steps) has no mode of its own here, and the keys' answer stays.
_V1_TRAINER_MODES = {"separate_async": "separate_async"}
#: Modes the keys give for any trainer that prints only the common timers: where the printed
#: config names a trainer, it decides.
_UNTELLING_MODES = frozenset({"sync", "agent_loop"})


def printed_mode(config: Mapping[str, Any] | None) -> str | None:
    """The trainer mode the job's printed config (``monitor.logs.job_config``) names, or None
    when it names none of :data:`TRAINER_MODES`: ``trainer.v1.trainer_mode`` where
    ``trainer.use_v1`` is true (verl 0.9's V1 trainer; without ``use_v1`` verl runs its
    legacy trainer whatever ``v1`` says)."""
    trainer = (config or {}).get("trainer")
    if not isinstance(trainer, Mapping) or trainer.get("use_v1") is not True:
        return None
    v1 = trainer.get("v1")
    name = v1.get("trainer_mode") if isinstance(v1, Mapping) else None
    return _V1_TRAINER_MODES.get(name) if isinstance(name, str) else None


class JudgedMode(NamedTuple):
    """A run's trainer mode and where it came from."""

    mode: str
    #: ``"keys"`` (the step lines' metric keys) or ``"config"`` (the printed config)
    source: str


def judge_mode(steps: Iterable[StepRecord], printed: str | None = None) -> JudgedMode:
    """The run's mode and where it came from. Keys that tell a trainer
    (fully-async, one-step-off, separate-async timers) decide; where they are only the timers
    every trainer prints (``sync``, ``agent_loop``), ``printed`` (:func:`printed_mode` of the
    job's config) decides. Without step lines the run is ``unknown`` whatever the config says:
    no step ran."""
    mode = _keys_mode(list(steps))
    if printed in TRAINER_MODES and printed != mode and mode in _UNTELLING_MODES:
        return JudgedMode(printed, "config")
    return JudgedMode(mode, "keys")


def run_mode(steps: Iterable[StepRecord], printed: str | None = None) -> str:
    """The mode of a run (:func:`judge_mode`; ``printed``: the printed config's mode)."""
    return judge_mode(steps, printed).mode


def _keys_mode(steps: list[StepRecord]) -> str:
    """The mode of a run's keys: the fully-async trainer when any line says so (its
    rollouter lines say less), else the most common mode of its step lines with a step time,
    else of all; ``"unknown"`` without step lines."""
    timed = [s for s in steps if s.total is not None] or steps
    if not timed:
        return "unknown"
    modes = Counter(step_modes(timed))
    for strong in ("fully_async_trainer", "separate_async", "one_step_off"):
        if modes.get(strong):
            return strong
    if any(m == "fully_async_trainer" for m in step_modes(steps)):
        return "fully_async_trainer"
    return modes.most_common(1)[0][0]


def waits_in_gen(mode: str) -> bool:
    """Whether ``timing_s/gen`` of this mode is the trainer waiting for samples."""
    return mode in WAITING_GEN_MODES
