"""Advice: the concrete levers for each flag kind, named by real verl config keys.

Every key named here appears in ``REAL_KEYS`` (VERL_SIGNALS.md section 6); the keys some tuning
guides invent (``INVENTED_KEYS``) must never appear. A test checks both.
"""

from __future__ import annotations

import re

REAL_KEYS: tuple[str, ...] = (
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "data.dataloader_num_workers",
    "data.max_response_length",
    "trainer.logger",
    "trainer.save_freq",
    "trainer.test_freq",
    "global_profiler.tool",
    "trainer.balance_batch",
)

INVENTED_KEYS: tuple[str, ...] = (
    "trainer.engine_type",
    "actor.remeshing",
    "offload_params_layers",
    "data.num_workers",
    "data.prefetch_factor",
    "reward_model.device",
    "trainer.save_steps",
    "trainer.log_steps",
    "trainer.enable_profiling",
    "trainer.gradient_accumulation_steps",
    "fsdp.sync_module_states",
    "verl.trainer.main_fastrl",
)

ADVICE: dict[str, list[str]] = {
    "gpu_imbalance": [
        "Turn on trainer.balance_batch=True so each data-parallel rank gets a similar token count.",
        "Use actor_rollout_ref.actor.use_dynamic_bsz=True with actor_rollout_ref.actor."
        "ppo_max_token_len_per_gpu so micro-batches are packed by tokens, not by sequences.",
        "If one GPU stays low whatever the data, check it for throttling or a bad link "
        "(nvidia-smi -q, dmesg for XID errors) and compare it with its peers.",
    ],
    "rollout_long_tail": [
        "Cap the tail with a lower data.max_response_length; a few very long responses keep the "
        "other GPUs waiting.",
        "Raise actor_rollout_ref.rollout.gpu_memory_utilization so the engine batches more "
        "sequences at once, or lower actor_rollout_ref.rollout.tensor_model_parallel_size for "
        "more, smaller engines.",
        "Trade fewer samples per prompt (actor_rollout_ref.rollout.n) for a larger "
        "data.train_batch_size so the rollout batch has more independent work.",
    ],
    "phase_imbalance": [
        "Size the scoring side to the generation side: raise actor_rollout_ref.rollout."
        "log_prob_micro_batch_size_per_gpu and turn on actor_rollout_ref.actor.use_dynamic_bsz.",
        "Use actor_rollout_ref.model.use_remove_padding=True so scoring does not spend time on "
        "padding tokens.",
        "Profile the slow phase with global_profiler.tool (nsys or torch) to see where it goes.",
    ],
    "rollout_wait": [
        "The trainer is waiting for rollout batches: raise actor_rollout_ref.rollout."
        "gpu_memory_utilization or lower actor_rollout_ref.rollout.tensor_model_parallel_size "
        "to speed generation up.",
        "Balance the work per step with data.train_batch_size and actor_rollout_ref.rollout.n so "
        "generation and training take similar time.",
    ],
    "io_starvation": [
        "Feed the GPUs faster: raise data.dataloader_num_workers (default 8) if one CPU core is "
        "pegged.",
        "Save checkpoints less often (trainer.save_freq) and validate less often "
        "(trainer.test_freq) if disk or CPU work blocks the steps.",
        "Keep trainer.logger to what you read (e.g. console and file): remote loggers block the "
        "step on slow networks.",
    ],
    "reshard_spike": [
        "Weight sync keeps two copies of the weights for a moment: lower actor_rollout_ref."
        "rollout.gpu_memory_utilization to leave headroom, or enable actor_rollout_ref.actor."
        "fsdp_config.param_offload.",
        "A lower actor_rollout_ref.rollout.tensor_model_parallel_size means less resharding "
        "traffic per switch.",
    ],
    "comm_heavy": [
        "Communication dominates the step: lower actor_rollout_ref.rollout."
        "tensor_model_parallel_size if the model fits, so fewer GPUs talk per layer.",
        "Larger micro-batches (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) amortise "
        "each all-reduce over more tokens.",
        "Check the NCCL layout and links with global_profiler.tool (nsys) to find the slow "
        "collective.",
    ],
    "low_utilization": [
        "Give each GPU more work: raise actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or "
        "use actor_rollout_ref.actor.use_dynamic_bsz with a higher actor_rollout_ref.actor."
        "ppo_max_token_len_per_gpu.",
        "Turn off offloading you do not need (actor_rollout_ref.actor.fsdp_config.param_offload, "
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload): it stalls the GPUs on PCIe.",
        "Use actor_rollout_ref.model.use_remove_padding=True so the kernels do useful work.",
    ],
    "util_overstates_sm": [
        "The GPUs run many tiny kernels: larger micro-batches (actor_rollout_ref.actor."
        "ppo_micro_batch_size_per_gpu, actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)"
        " keep more SMs busy per kernel.",
        "actor_rollout_ref.model.use_remove_padding=True and actor_rollout_ref.actor."
        "use_dynamic_bsz=True pack tokens densely.",
        "Confirm with global_profiler.tool (nsys) which kernels are short.",
    ],
    "step_time_spikes": [
        "Regular spikes usually come from periodic work: check trainer.save_freq and "
        "trainer.test_freq against the period.",
        "Irregular spikes often follow sequence-length swings: actor_rollout_ref.actor."
        "use_dynamic_bsz=True with actor_rollout_ref.actor.ppo_max_token_len_per_gpu evens the "
        "micro-batches out.",
    ],
    "memory_pressure": [
        "Lower actor_rollout_ref.rollout.gpu_memory_utilization (default 0.5) to leave headroom "
        "for the trainer.",
        "Turn on actor_rollout_ref.model.enable_gradient_checkpointing, or offload with "
        "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload.",
        "Lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or actor_rollout_ref.actor."
        "ppo_max_token_len_per_gpu.",
    ],
    "oom": [
        "Lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or actor_rollout_ref.actor."
        "ppo_max_token_len_per_gpu, and lower actor_rollout_ref.rollout.gpu_memory_utilization.",
        "Turn on actor_rollout_ref.model.enable_gradient_checkpointing and, if needed, "
        "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload.",
    ],
    "throughput_regression": [
        "Compare the phases of recent steps with the baseline to see which one grew; profile it "
        "with global_profiler.tool.",
        "Longer responses cost more time per step: check data.max_response_length and the "
        "response lengths.",
    ],
    "gpu_fault": [
        "Drain the node and check the GPU (nvidia-smi -q, dmesg for XID errors, temperatures "
        "and power); resume from the last checkpoint (trainer.save_freq sets how much is lost).",
    ],
    "stalled": [
        "The run has stopped making progress: look at the end of the log for a traceback or a "
        "hang in a collective, and at the GPUs for a faulted device.",
        "A lower trainer.save_freq limits the work lost when a hung run must be restarted.",
    ],
}

_KEY_RE = re.compile(r"\b(?:[a-z_]{2,}\.)+[a-z_*]+\b")


def named_keys(text: str) -> list[str]:
    """Dotted config-like names in a piece of advice text."""
    return _KEY_RE.findall(text)


def advice_for(kind: str) -> list[str]:
    """The advice sentences for a flag kind (an empty list for unknown kinds)."""
    return list(ADVICE.get(kind, []))
