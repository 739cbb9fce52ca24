"""GPUs idle with no CPU core pegged, in a job that runs micro-batches of one: say so first.

The signature "idle" (no GPU work, no core pegged) reads as a step waiting on something outside
the GPUs, and advice for bigger kernels is ruled out there (``cause_advice.contradicted``). On
the H200 a real verl run with ``ppo_micro_batch_size_per_gpu=1`` and
``log_prob_micro_batch_size_per_gpu=1`` looked exactly so (SM 3%, busiest core 63%): each
micro-batch of one sample is a forward or backward too small to fill the GPU, and the time goes
between them. With the job's printed config the knob and its value are known, so the advice
names them before the idle sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.numbers import int_or_none

#: The idle sentence of ``cause_advice`` (its start): the advice that a tiny micro-batch explains.
IDLE_START = "The GPUs sat idle through"
#: Flag kinds whose idle advice a tiny micro-batch explains.
KINDS = ("low_utilization",)
#: A micro-batch this small, or at most this share of the batch it splits, is "tiny".
TINY_MAX = 2
TINY_SHARE = 1 / 16

_A = "actor_rollout_ref."
#: (dotted key, what it splits: samples per GPU, as a function of the config)
_KNOBS = (
    (_A + "actor.ppo_micro_batch_size_per_gpu", "mini"),
    (_A + "rollout.log_prob_micro_batch_size_per_gpu", "train"),
    (_A + "ref.log_prob_micro_batch_size_per_gpu", "train"),
    ("critic.ppo_micro_batch_size_per_gpu", "mini"),
)
_DYNAMIC = {"actor": _A + "actor.use_dynamic_bsz", "rollout": _A + "rollout.log_prob_use_dynamic_bsz",
            "ref": _A + "ref.log_prob_use_dynamic_bsz", "critic": "critic.use_dynamic_bsz"}


def _per_gpu(config: Mapping[str, Any], splits: str) -> int | None:
    """Samples per GPU in the batch a micro-batch splits (None when the config lacks a size)."""
    n = int_or_none(config.get(_A + "rollout.n")) or 1
    gpus = (int_or_none(config.get("trainer.nnodes")) or 1) * (
        int_or_none(config.get("trainer.n_gpus_per_node")) or 1)
    key = _A + "actor.ppo_mini_batch_size" if splits == "mini" else "data.train_batch_size"
    size = int_or_none(config.get(key))
    return None if size is None else size * n // max(gpus, 1)


def tiny_micro_batches(config: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(dotted key, value) of each micro-batch size the job set tiny: at most ``TINY_MAX``, or
    at most ``TINY_SHARE`` of the samples per GPU it splits; a role that packs by tokens
    (``use_dynamic_bsz``) ignores its micro-batch size and is left out."""
    out = []
    for key, splits in _KNOBS:
        value = int_or_none(config.get(key))
        role = key.split(".")[-2]
        if value is None or value <= 0 or config.get(_DYNAMIC[role]) is True:
            continue
        per_gpu = _per_gpu(config, splits)
        if value <= TINY_MAX or (per_gpu is not None and value <= per_gpu * TINY_SHARE):
            out.append((key, value))
    return out


def micro_batch_sentence(tiny: list[tuple[str, int]]) -> str:
    """The first advice line for tiny micro-batches: each knob with its value, then the fix."""
    by_name: dict[str, list[tuple[str, int]]] = {}
    for key, value in tiny:
        by_name.setdefault(key.rsplit(".", 1)[-1], []).append((key, value))
    parts = []
    for name, keys in by_name.items():
        values = sorted({v for _, v in keys})
        where = ", ".join(k.rsplit(".", 1)[0] for k, _ in keys)
        parts.append(f"{name} is {'/'.join(map(str, values))}"
                     + (" in this job" if not parts else "") + f" ({where})")
    it = "it" if len(tiny) == 1 else "them"
    return (f"{' and '.join(parts)}: raise {it} (8-32 samples per GPU, as memory allows), or pack "
            f"micro-batches by tokens with {_A}actor.use_dynamic_bsz=True and "
            f"{_A}actor.ppo_max_token_len_per_gpu: micro-batches this small leave the GPUs idle "
            "between kernels too small to fill them, with no CPU core pegged.")


def micro_batch_first(kind: str, advice: list[str], config: Mapping[str, Any]) -> list[str]:
    """``advice`` with the tiny-micro-batch line first when the flag's own first line says the
    GPUs sat idle with no core pegged and the job (``config``: dotted keys) runs tiny
    micro-batches; unchanged otherwise."""
    if kind not in KINDS or not advice or not any(s.startswith(IDLE_START) for s in advice[:2]):
        return list(advice)
    tiny = tiny_micro_batches(config)
    if not tiny:
        return list(advice)
    return [micro_batch_sentence(tiny), *advice]
