"""What must be true of a job for a reading to apply, and how each is judged on its evidence.

A detector reads the job in one or more ways ("readings": ``comm_heavy``, or
``io_starvation.data_wait``, the gap before the step timer). Each reading needs some facts of
the job to mean what its flag says: communication can only be heavy where more than one GPU
talks; a gap before verl's step timer is a data stall only in a trainer that fetches its
batch there; a silence is a stall only while the run has not finished. Those facts are the
reading's *premises*, declared in one table per detector beside its code (``PREMISES`` in each
``monitor/detect`` module, gathered in :data:`TABLES`) and judged here on what the job printed
(its config, its Ray actors, its keys) and what was measured:

- a premise that holds lets the reading run;
- one that fails stops it: the reading does not apply to this job;
- one that cannot be judged stops it too, and the report says what could not be judged and
  why ("unknown is a valid answer": nothing is raised on a premise taken on trust).

``Context.holds(reading)`` judges a reading's premises once per context and keeps every
verdict (``Context.judged``), which ``run_all`` hands to the report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from monitor.numbers import int_or_none

if TYPE_CHECKING:
    from monitor.detect.detector_base import Context


class Verdict(NamedTuple):
    """A premise judged: ``holds`` True, False, or None (cannot be judged), and why."""

    holds: bool | None
    why: str


@dataclass(frozen=True)
class Premise:
    """One fact a reading needs: its key, what it needs in words, and its judge."""

    key: str
    needs: str
    judge: Callable[[Context], Verdict]


class Judged(NamedTuple):
    """A reading's premise as judged on one job (what ``run_all`` reports)."""

    reading: str
    premise: str
    needs: str
    holds: bool | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``analyze --json``'s ``premises``)."""
        return self._asdict()


# --- the job's facts, from its printed config and its evidence --------------------------------

def configured_gpus(job: Mapping[str, Any]) -> int | None:
    """GPUs the printed config gives the job (``trainer.n_gpus_per_node`` x ``trainer.nnodes``,
    plus a separate rollout pool's ``rollout.n_gpus_per_node`` x ``rollout.nnodes`` where the
    fully-async trainer has one), None when it does not say."""
    per_node = int_or_none(job.get("trainer.n_gpus_per_node"))
    if per_node is None:
        return None
    total = per_node * (int_or_none(job.get("trainer.nnodes")) or 1)
    rollout = int_or_none(job.get("rollout.n_gpus_per_node"))
    if rollout is not None:
        total += rollout * (int_or_none(job.get("rollout.nnodes")) or 1)
    return total


def _sampled_gpus(ctx: Context) -> int:
    gpu = ctx.gpu
    if gpu is None or len(gpu) == 0:
        return 0
    return int(gpu[["node", "gpu"]].drop_duplicates().shape[0])


def _nccl_ranks(ctx: Context) -> int:
    nccl = ctx.nccl
    if nccl is None or len(nccl) == 0 or "n_ranks" not in nccl.columns:
        return 0
    import pandas as pd

    ranks = pd.to_numeric(nccl["n_ranks"], errors="coerce").max()
    return int(ranks) if ranks == ranks else 0


def _several_gpus(ctx: Context) -> Verdict:
    n = configured_gpus(ctx.job)
    if n is not None:
        return Verdict(n > 1, f"the printed config gives the job {n} GPU"
                       f"{'s' if n != 1 else ''} (trainer.n_gpus_per_node x trainer.nnodes)")
    ranks = _nccl_ranks(ctx)
    if ranks > 1:
        return Verdict(True, f"the NCCL Inspector saw collectives over {ranks} ranks")
    sampled = _sampled_gpus(ctx)
    if sampled > 1:
        return Verdict(True, f"{sampled} GPUs were sampled")
    if "comm" in ctx.sf.columns and ctx.sf["comm"].notna().any():
        return Verdict(True, "the log's own breakdown times communication (comm)")
    return Verdict(None, "no printed config, no NCCL record and no GPU sample says how many "
                   "GPUs the job has")


#: Modes whose trainer takes its samples from a rollout pool inside ``timing_s/gen``.
_NO_BATCH_FETCH = {
    "fully_async_trainer": "the fully-async trainer takes its samples from the message queue "
                           "inside timing_s/gen: it fetches no batch before its step timer",
    "fully_async_rollouter": "a fully-async rollouter trains nothing: it fetches no batch "
                             "before a step timer",
    "one_step_off": "the one-step-off trainer fetches the next batch in its generation task, "
                    "inside the step timer",
    "separate_async": "verl's V1 separate-async trainer fetches its batch inside the step timer",
}


def _fetches_batches_before_timer(ctx: Context) -> Verdict:
    mode = ctx.mode
    if mode in _NO_BATCH_FETCH:
        return Verdict(False, _NO_BATCH_FETCH[mode])
    use_v1 = ctx.job.get("trainer.use_v1")
    if use_v1 is True or "TaskRunnerV1" in ctx.actors:
        how = "trainer.use_v1 is True" if use_v1 is True else "its driver is TaskRunnerV1"
        return Verdict(False, f"verl's V1 trainer ({how}) fetches its batch inside the step "
                       "timer")
    legacy = "verl's synchronous trainer (ray_trainer.fit) fetches the next batch before its " \
             "step timer"
    if use_v1 is False:
        return Verdict(True, f"trainer.use_v1 is False: {legacy}")
    if ctx.job:
        return Verdict(True, f"the printed config has no trainer.use_v1 (verl before 0.9): "
                       f"{legacy}")
    if ctx.actors & {"TaskRunner", "main_task"}:
        return Verdict(True, f"its driver is {sorted(ctx.actors & {'TaskRunner', 'main_task'})[0]}"
                       f": {legacy}")
    if ctx.version_upper_below("0.9"):
        return Verdict(True, f"verl {ctx.verl_version} (by its keys): {legacy}")
    return Verdict(None, "neither the printed config (trainer.use_v1), the driver's name nor "
                   "the keys say whether the trainer fetches its batch before the step timer "
                   "(verl's V1 trainer, the default since 0.9, fetches it inside)")


def _run_not_finished(ctx: Context) -> Verdict:
    end = ctx.finished_at
    if end is None:
        return Verdict(True, "no final progress line, final validation or exit says the run "
                       "ended")
    return Verdict(False, "the run finished (its last progress line, final validation or "
                   "exit): a silence after its end is no stall")


def _gpu_samples(ctx: Context) -> Verdict:
    if _sampled_gpus(ctx):
        return Verdict(True, "GPU samples are there")
    return Verdict(None, "no GPU samples (analyze --gpu, or an exporter on the node)")


def _clock_in_text(ctx: Context) -> Verdict:
    from monitor.logs.clocks import MEASURED

    if any(s.time_source in MEASURED for s in ctx.steps):
        return Verdict(True, "step ends are measured (dated lines, tqdm, capture times)")
    if not ctx.steps:
        return Verdict(None, "no step record")
    return Verdict(None, "no line of the log carries a time (no date, no tqdm bar, no capture "
                   "time): its step ends are rebuilt from the step timers, so a silence "
                   "between them cannot be measured")


def _loads_batches(ctx: Context) -> Verdict:
    if ctx.mode == "fully_async_trainer":
        return Verdict(False, "the fully-async trainer loads no batches: it takes samples from "
                       "the rollouter's message queue")
    if ctx.mode == "unknown":
        return Verdict(None, "the trainer is not known")
    return Verdict(True, f"the {ctx.mode} trainer loads its batches with verl's dataloader")


def _serial_phases(ctx: Context) -> Verdict:
    mode = ctx.mode
    if mode in ("sync", "agent_loop"):
        return Verdict(True, f"the {mode} trainer runs its phases one after another: while "
                       "one runs on the driver, the GPUs wait")
    if mode == "unknown":
        return Verdict(None, "the trainer is not known")
    return Verdict(False, f"the {mode} trainer overlaps its phases with a separate rollout "
                   "pool: a phase's share of its step is not the GPUs' wait")


#: Every premise a table may name, by key.
PREMISE_LIBRARY: dict[str, Premise] = {p.key: p for p in (
    Premise("several_gpus", "more than one GPU talking (a collective needs two)",
            _several_gpus),
    Premise("fetches_batches_before_timer",
            "a trainer that fetches its next batch before verl's step timer starts",
            _fetches_batches_before_timer),
    Premise("run_not_finished", "a run that has not finished (silences after its end are "
            "no stall)", _run_not_finished),
    Premise("gpu_samples", "GPU samples over the steps", _gpu_samples),
    Premise("loads_batches", "a trainer that loads its batches with verl's dataloader",
            _loads_batches),
    Premise("serial_phases", "a trainer whose phases run one after another (a phase on the "
            "driver holds the GPUs)", _serial_phases),
    Premise("measured_clock", "step ends measured by a clock (not rebuilt from the step "
            "timers alone)", _clock_in_text),
)}


# --- advice: a sentence applies only where the knob it names can move that way ---------------

#: Premises of advice sentences by the config key they name (``ADVICE_PREMISES``).
ADVICE_PREMISES: dict[str, tuple[str, ...]] = {
    "data.dataloader_num_workers": ("loads_batches",),
}
#: The lowest value each knob takes: advice to lower it further does not apply.
KNOB_FLOORS: dict[str, float] = {
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.n": 1,
    "data.dataloader_num_workers": 0,
    "reward.num_workers": 1,
}
_LOWER_WORDS = re.compile(r"\b(?:lower|reduce|decrease|fewer)\b")
_RAISE_WORDS = re.compile(r"\b(?:raise|increase|more|higher|larger)\b")


def _asks_lower(sentence: str, at: int) -> bool:
    """Whether the clause before position ``at`` asks to lower what is named there."""
    clause = re.split(r"[;:.](?:\s|$)|\bor\b|\band\b", sentence[:at].lower())[-1]
    lower = [m.start() for m in _LOWER_WORDS.finditer(clause)]
    if not lower:
        return False
    raise_ = [m.start() for m in _RAISE_WORDS.finditer(clause)]
    return not raise_ or max(lower) > max(raise_)


def _at_floor(job: Mapping[str, Any], key: str) -> bool:
    value = job.get(key)
    floor = KNOB_FLOORS.get(key)
    if floor is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value <= floor


def advice_premises(ctx: Context, advice: list[str]) -> list[str]:
    """``advice`` without the sentences whose premises fail on this job: a sentence naming a key
    of ``ADVICE_PREMISES`` whose premises fail (not one that cannot be judged: advice is kept
    where the job may need it), or one whose every knob it asks to
    lower is already at its floor (``KNOB_FLOORS``: "lower tensor_model_parallel_size" in a
    job where it is 1)."""
    from monitor.detect.flag_advice import named_keys

    kept = []
    for sentence in advice:
        keys = named_keys(sentence)
        if any(ctx.fails(f"advice:{k}") for k in keys if k in ADVICE_PREMISES):
            continue
        lowered = [k for k in keys if k in KNOB_FLOORS
                   and _asks_lower(sentence, sentence.find(k))]
        if lowered and all(_at_floor(ctx.job, k) for k in lowered):
            continue
        kept.append(sentence)
    return kept


def advice_tables() -> dict[str, tuple[str, ...]]:
    """The advice premises as readings (``advice:<key>``), for ``build_tables``."""
    return {f"advice:{key}": keys for key, keys in ADVICE_PREMISES.items()}


def build_tables(*tables: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[Premise, ...]]:
    """One dict of reading -> premises from the detectors' ``PREMISES`` tables; a key no
    premise has is a programming error, raised at import."""
    out: dict[str, tuple[Premise, ...]] = {}
    for table in tables:
        for reading, keys in table.items():
            if reading in out:
                raise ValueError(f"reading {reading!r} declared twice")
            out[reading] = tuple(PREMISE_LIBRARY[k] for k in keys)
    return out


def judge(ctx: Context, reading: str, premises: tuple[Premise, ...]) -> list[Judged]:
    """Each premise of ``reading`` judged on ``ctx``."""
    out = []
    for p in premises:
        verdict = p.judge(ctx)
        out.append(Judged(reading, p.key, p.needs, verdict.holds, verdict.why))
    return out


def not_holding(judged: list[Judged]) -> list[Judged]:
    """The verdicts that stopped a reading (failed or not judged), one per reading and premise."""
    seen: set[tuple[str, str]] = set()
    out = []
    for j in judged:
        if j.holds is not True and (j.reading, j.premise) not in seen:
            seen.add((j.reading, j.premise))
            out.append(j)
    return out


__all__ = ["PREMISE_LIBRARY", "Judged", "Premise", "Verdict", "build_tables",
           "configured_gpus", "judge", "not_holding"]
