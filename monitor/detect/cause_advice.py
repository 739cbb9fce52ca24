"""Advice chosen by phase and signature: the most likely cause first, contradicted advice out.

A slow phase's levers depend on the phase and on what the GPUs and the host did during it
(``monitor.analysis.signature``): a CPU-bound reward points to the reward function, a
PCIe-bound log-prob pass to parameter offload, a slow generation to the rollout settings,
validation and checkpoints to their frequencies, a slow actor update to its micro-batches.
``cause_advice`` gives those sentences; ``contradicted`` says which general advice the
evidence rules out (no micro-batch advice for a phase whose GPUs wait on the CPU or on PCIe).
``monitor.detect.flag_advice.advice_for`` puts the two together. Keys renamed between verl versions
(the reward section) are named as the log's version spells them, or both ways when unknown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

#: phase_imbalance's general advice about generation against the critic: shown only where the
#: flag's phase is one of the two (or unknown). Kept here, beside ``contradicted`` which judges
#: it; ``monitor.detect.flag_advice`` lists it among the kind's advice.
GEN_VS_CRITIC = (
    "Generation far longer than the critic's scoring: speed the rollout up (raise "
    "actor_rollout_ref.rollout.gpu_memory_utilization, lower actor_rollout_ref.rollout."
    "tensor_model_parallel_size, cap data.max_response_length), or give the critic fewer "
    "GPUs; scoring longer than generation: raise the critic's micro-batch, turn on "
    "actor_rollout_ref.actor.use_dynamic_bsz and actor_rollout_ref.model.use_remove_padding."
)

#: verl 0.7.1 moved reward settings to a ``reward`` section (``reward.num_workers``,
#: ``reward.reward_manager``, ``reward.custom_reward_function``); 0.4.1-0.7.0 have
#: ``reward_model.launch_reward_fn_async``, ``reward_model.reward_manager`` and a top-level
#: ``custom_reward_function``.
REWARD_SECTION_SINCE = (0, 7, 1)

_REWARD_NEW = (
    "verl 0.7.1 and newer: spread the scoring over more reward workers (reward.num_workers), "
    "pick a reward manager that does not score one response at a time "
    "(reward.reward_manager), and make compute_score cheaper (the function named by "
    "reward.custom_reward_function.path)"
)
_REWARD_OLD = (
    "verl 0.7.0 and older: run it on the CPU while the log-prob pass runs "
    "(reward_model.launch_reward_fn_async=True), verify in parallel with "
    "reward_model.reward_manager=prime when compute_score is safe to run in several "
    "processes, and make compute_score cheaper (the function named by "
    "custom_reward_function.path)"
)
_REWARD_HEAD = ("The reward is computed on the CPU while the GPUs wait: {levers}; cache or "
                "batch its slow checks (a sandboxed code run, a remote judge).")


def _version_bounds(version: str | None) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(lowest, highest) verl version a ``guess_version`` string allows (None: unbounded)."""
    if not version or version == "unknown":
        return None, None

    def parse(text: str, high: bool) -> tuple[int, ...] | None:
        nums = re.findall(r"\d+|x", text)
        if not nums:
            return None
        out = tuple(99 if n == "x" else int(n) for n in nums)
        pad = 99 if high else 0
        return (out + (pad, pad, pad))[:3]

    v = version.strip()
    if v.startswith("<="):
        return None, parse(v[2:], True)
    if v.endswith("+"):
        return parse(v[:-1], False), None
    if "-" in v:
        lo, hi = v.split("-", 1)
        return parse(lo, False), parse(hi, True)
    return parse(v, False), parse(v, True)


def reward_era(version: str | None) -> str | None:
    """``"new"`` (the ``reward`` section), ``"old"`` (``reward_model``) or None (either)."""
    lo, hi = _version_bounds(version)
    if lo is not None and lo >= REWARD_SECTION_SINCE:
        return "new"
    if hi is not None and hi < REWARD_SECTION_SINCE:
        return "old"
    return None


def _reward(version: str | None, phase: str) -> list[str]:
    era = reward_era(version)
    levers = {"new": _REWARD_NEW, "old": _REWARD_OLD}.get(era or "",
                                                          _REWARD_NEW + "; " + _REWARD_OLD)
    return [_REWARD_HEAD.format(levers=levers)]


_OFFLOAD_ACTOR = (
    "{phase} waits on host-device copies over PCIe: offloaded parameters (and optimizer state) "
    "travel to the GPU and back every pass. If the model fits in GPU memory, turn offload off: "
    "actor_rollout_ref.actor.fsdp_config.param_offload=False and "
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False."
)
_OFFLOAD_REF = (
    "The reference model's log-prob pass waits on PCIe copies: its parameters are offloaded "
    "(actor_rollout_ref.ref.fsdp_config.param_offload); turn that off if the reference model "
    "fits in GPU memory, and the actor's offload too (actor_rollout_ref.actor.fsdp_config."
    "param_offload, actor_rollout_ref.actor.fsdp_config.optimizer_offload)."
)
_GEN = (
    "Generation is slow: let the engine batch more (raise actor_rollout_ref.rollout."
    "gpu_memory_utilization and actor_rollout_ref.rollout.max_num_seqs), use more, smaller "
    "engines (a lower actor_rollout_ref.rollout.tensor_model_parallel_size) if the model fits, "
    "and cap data.max_response_length."
)
_GEN_THIN = (
    "Generation has thinned to a few long responses decoding alone: cap "
    "data.max_response_length, or stop waiting for the last ones with "
    "actor_rollout_ref.rollout.over_sample_rate (agent-loop rollouts)."
)
_TESTING = ("Validation runs inside the step: validate less often (trainer.test_freq) or on a "
            "smaller validation set.")
_SAVE = ("Checkpoint saves hold the step: save less often (trainer.save_freq), or to faster "
         "local storage.")
_UPDATE = (
    "The actor update is slow: raise actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, or "
    "pack micro-batches by tokens with actor_rollout_ref.actor.use_dynamic_bsz=True and a "
    "higher actor_rollout_ref.actor.ppo_max_token_len_per_gpu; actor_rollout_ref.model."
    "use_remove_padding=True drops the padding tokens."
)
_LOG_PROB = (
    "The log-prob pass is slow: raise actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    " (actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu for the reference model), or "
    "pack by tokens with actor_rollout_ref.actor.use_dynamic_bsz=True and "
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu."
)
_CPU = (
    "The GPUs idle while one CPU core works through {phase}: the driver does this part on the "
    "host (advantages, collation, logging, a data fetch). Find the slow call with py-spy dump "
    "on the driver and move it off the step's path; if it is data loading, raise "
    "data.dataloader_num_workers."
)
_SPIN = (
    "The GPUs spin in a collective through {phase}: they wait for a late rank or a slow link "
    "(see any gpu_imbalance or comm_heavy flag); profile the phase with global_profiler.tool "
    "(nsys) to find the collective."
)
_IDLE = (
    "The GPUs sat idle through {phase} with no CPU core pegged: the step waits on something "
    "outside the GPUs (another worker, the network, a remote reward or tool); profile the "
    "driver with global_profiler.tool to see what it waits for."
)

Advice = list[str] | Callable[[str | None, str], list[str]]

#: (phase or "*", signature or "*") -> sentences (or a function of version and phase). Looked
#: up most specific first: (phase, signature), (phase, "*"), ("*", signature).
CAUSE_ADVICE: dict[tuple[str, str], Advice] = {
    ("reward", "*"): _reward,
    ("old_log_prob", "pcie_bound"): [_OFFLOAD_ACTOR],
    ("update_actor", "pcie_bound"): [_OFFLOAD_ACTOR],
    ("ref", "pcie_bound"): [_OFFLOAD_REF],
    ("*", "pcie_bound"): [_OFFLOAD_ACTOR],
    ("gen", "thin"): [_GEN_THIN, _GEN],
    ("gen", "*"): [_GEN],
    ("testing", "*"): [_TESTING],
    ("save_checkpoint", "*"): [_SAVE],
    ("update_actor", "*"): [_UPDATE],
    ("old_log_prob", "*"): [_LOG_PROB],
    ("ref", "*"): [_LOG_PROB],
    ("*", "cpu_bound"): [_CPU],
    ("*", "collective_spin"): [_SPIN],
    ("*", "idle"): [_IDLE],
}

#: Phases whose own advice already covers host-side work (no general CPU-bound sentence).
_OWN_HOST_PHASES = ("reward",)

#: Phases named in evidence-style words for the {phase} slot.
_PHASE_WORDS = {"old_log_prob": "the log-prob pass (old_log_prob)",
                "ref": "the reference log-prob pass (ref)",
                "update_actor": "the actor update", "update_critic": "the critic update",
                "values": "the critic's scoring (values)", "gen": "generation",
                "adv": "the advantage computation (adv)"}


def _words(phase: str | None) -> str:
    return _PHASE_WORDS.get(phase or "", phase or "this stretch")


def cause_advice(phase: str | None, signature: str | None, version: str | None = None
                 ) -> list[str]:
    """The sentences that fit a phase and its signature, most specific first."""
    out: list[str] = []
    keys = [(phase or "*", signature or "*"), (phase or "*", "*")]
    if phase not in _OWN_HOST_PHASES:
        keys.append(("*", signature or "*"))
    for key in keys:
        if key == ("*", "*") or key not in CAUSE_ADVICE:
            continue
        entry = CAUSE_ADVICE[key]
        sentences = entry(version, phase or "") if callable(entry) else entry
        for s in sentences:
            text = s.replace("{phase}", _words(phase))
            text = text[:1].upper() + text[1:]
            if text not in out:
                out.append(text)
    return out


#: Keys whose advice is "give each GPU bigger kernels": pointless while the GPUs wait on the
#: host or on PCIe.
_KERNEL_KEYS = ("micro_batch_size_per_gpu", "use_dynamic_bsz", "ppo_max_token_len_per_gpu",
                "use_remove_padding")
_WAITING = ("cpu_bound", "pcie_bound", "idle")
_OFFLOAD_OFF = re.compile(r"turn (?:off|offload off)|offload_?\w*=False|turn that off",
                          re.IGNORECASE)


def contradicted(sentence: str, phase: str | None, signature: str | None,
                 measured: Collection[str] = ()) -> bool:
    """True when the evidence rules the sentence out.

    - bigger kernels (micro-batches, dynamic batch size, padding removal) while the GPUs wait on
      the CPU, on PCIe, or on nothing at all;
    - turning offload off while the GPUs were not waiting on PCIe (CPU-bound or idle, or PCIe
      read and found quiet);
    - generation against the critic's scoring in a flag about another phase.
    """
    if sentence == GEN_VS_CRITIC and phase not in (None, "gen", "values"):
        return True
    if signature in _WAITING and any(k in sentence for k in _KERNEL_KEYS) \
            and "offload" not in sentence:
        return True
    offload_off = "offload" in sentence and bool(_OFFLOAD_OFF.search(sentence))
    if offload_off and signature is not None and signature != "pcie_bound":
        if signature in ("cpu_bound", "idle") or "pcie" in measured:
            return True
    return False
