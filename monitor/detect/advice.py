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
        "Generation far longer than the critic's scoring: speed the rollout up (raise "
        "actor_rollout_ref.rollout.gpu_memory_utilization, lower actor_rollout_ref.rollout."
        "tensor_model_parallel_size, cap data.max_response_length), or give the critic fewer "
        "GPUs; scoring longer than generation: raise the critic's micro-batch, turn on "
        "actor_rollout_ref.actor.use_dynamic_bsz and actor_rollout_ref.model.use_remove_padding.",
        "A phase whose share of the step jumped: compare its inputs (response lengths against "
        "data.max_response_length, batch sizes) with the steps before.",
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
    "fatal_error": [
        "The run died: the first failure in time is usually the cause and the rest (other "
        "ranks timing out, Ray reporting dead actors) follow from it; read that rank's or "
        "worker's own log (Ray keeps them under /tmp/ray/session_latest/logs).",
        "Resume from the last checkpoint once the cause is fixed; trainer.save_freq sets how "
        "much work a crash loses.",
    ],
}

#: Advice for one failure (``monitor.logs.failures``), by event kind or ``kind:reason``; it
#: comes before the general ``fatal_error`` advice.
FAILURE_ADVICE: dict[str, list[str]] = {
    "nccl_timeout": [
        "A collective waited past its timeout: one rank stopped (crashed, stuck in a kernel, or "
        "its node lost the network) while the others waited. Find the rank that never reached "
        "that sequence number; re-run with NCCL_DEBUG=INFO to see the link it stalled on.",
        "Timeouts during generation on several nodes: keep actor_rollout_ref.rollout."
        "tensor_model_parallel_size within one node so the engine does not talk across nodes.",
    ],
    "nccl_error": [
        "ncclRemoteError and ncclSystemError mean a peer or the network failed: check the other "
        "nodes' logs and the InfiniBand/RoCE links (NCCL_DEBUG=INFO names the interface); "
        "ncclUnhandledCudaError is a CUDA failure underneath: look for an XID or an illegal "
        "memory access on that GPU.",
        "Keep actor_rollout_ref.rollout.tensor_model_parallel_size within one node while the "
        "links are suspect.",
    ],
    "actor_died": [
        "A Ray worker died: its own log says why; the common causes are the host OOM killer "
        "(give each GPU plenty of host memory), a segmentation fault, or a node leaving the "
        "cluster.",
        "If host memory is the limit, offloading costs it: turn off actor_rollout_ref.actor."
        "fsdp_config.param_offload / optimizer_offload, and lower data.dataloader_num_workers.",
    ],
    "worker_killed": [
        "A worker process was killed or crashed: dmesg on its node shows the kernel's OOM "
        "killer and segmentation faults; the job scheduler's log shows a time or memory limit.",
        "If host memory is the limit, offloading costs it: turn off actor_rollout_ref.actor."
        "fsdp_config.param_offload / optimizer_offload, and lower data.dataloader_num_workers.",
    ],
    "worker_killed:system_error": [
        "A Ray worker exited with a system error: its own log says why; the common causes are "
        "the host OOM killer (give each GPU plenty of host memory), a segmentation fault, or a "
        "node leaving the cluster.",
        "If host memory is the limit, offloading costs it: turn off actor_rollout_ref.actor."
        "fsdp_config.param_offload / optimizer_offload, and lower data.dataloader_num_workers.",
    ],
    "worker_killed:host_oom": [
        "The host ran out of memory: give each GPU more host memory, or use less: turn off "
        "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload, lower "
        "data.dataloader_num_workers, and look for a reward function that leaks memory.",
    ],
    "worker_killed:bus_error": [
        "SIGBUS in a data-loading worker usually means /dev/shm is full: give the container "
        "more shared memory (docker --shm-size) or lower data.dataloader_num_workers.",
    ],
    "worker_killed:segfault": [
        "A native crash: the stack trace names the library (vLLM, SGLang, flash-attn, NCCL); "
        "check that its version matches the one verl's install guide pins, and try "
        "actor_rollout_ref.model.use_remove_padding=False to rule out the packed kernels.",
    ],
    "cuda_error": [
        "A kernel faulted: re-run with CUDA_LAUNCH_BLOCKING=1 to see the kernel; if it keeps "
        "happening on the same GPU, drain the node and check it (nvidia-smi -q, dmesg for XID "
        "errors), else suspect the attention kernels (actor_rollout_ref.model."
        "use_remove_padding=False rules the packed path out).",
    ],
    "cuda_error:device-side assert": [
        "A device-side assert is usually an index out of range: a token id beyond the model's "
        "vocabulary (tokenizer and model do not match) or a sequence longer than the model's "
        "positions (check data.max_response_length and the prompt length).",
    ],
    "cuda_error:ECC": [
        "An uncorrectable memory error is hardware: drain the node, check the GPU "
        "(nvidia-smi -q -d ECC) and resume elsewhere from the last checkpoint "
        "(trainer.save_freq).",
    ],
    "cuda_error:Xid": [
        "An XID error is reported by the driver: drain the node and check the GPU "
        "(nvidia-smi -q, dmesg); resume elsewhere from the last checkpoint (trainer.save_freq).",
    ],
}

#: CUDA out-of-memory advice by the phase the traceback names (before the general advice).
OOM_PHASE_ADVICE: dict[str, list[str]] = {
    "gen": [
        "Out of memory during generation: the rollout engine and the trainer's weights share "
        "the GPU; lower actor_rollout_ref.rollout.gpu_memory_utilization, or turn on "
        "actor_rollout_ref.actor.fsdp_config.param_offload; longer responses need more "
        "(data.max_response_length, actor_rollout_ref.rollout.n).",
    ],
    "old_log_prob": [
        "Out of memory in compute_log_prob (the log-prob pass over the rollout, which builds "
        "[tokens x vocabulary] logits): lower actor_rollout_ref.rollout."
        "log_prob_micro_batch_size_per_gpu, or with actor_rollout_ref.actor.use_dynamic_bsz "
        "lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu; "
        "actor_rollout_ref.model.use_remove_padding=True drops the padding tokens.",
    ],
    "ref": [
        "Out of memory in the reference model's log-prob pass: it runs the same micro-batches "
        "as compute_log_prob (actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu, "
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu with use_dynamic_bsz); offloading "
        "the reference model's parameters frees its weights between calls.",
    ],
    "values": [
        "Out of memory in the critic's scoring pass: lower the critic's own micro-batch size "
        "(its ppo_micro_batch_size_per_gpu) or its token budget with dynamic batching, and turn "
        "on actor_rollout_ref.model.use_remove_padding for the same model family.",
    ],
    "update_critic": [
        "Out of memory in the critic update: lower the critic's micro-batch size, and turn on "
        "gradient checkpointing and offloading in the critic's own config section "
        "(the same switches as actor_rollout_ref.model.enable_gradient_checkpointing).",
    ],
    "update_actor": [
        "Out of memory in the actor update (forward, backward and optimizer state): lower "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or, with "
        "actor_rollout_ref.actor.use_dynamic_bsz, actor_rollout_ref.actor."
        "ppo_max_token_len_per_gpu; turn on actor_rollout_ref.model."
        "enable_gradient_checkpointing and actor_rollout_ref.actor.fsdp_config."
        "optimizer_offload.",
    ],
    "reshard": [
        "Out of memory while syncing weights to the rollout engine (two copies for a moment): "
        "lower actor_rollout_ref.rollout.gpu_memory_utilization or turn on "
        "actor_rollout_ref.actor.fsdp_config.param_offload.",
    ],
}

_KEY_RE = re.compile(r"\b(?:[a-z_]{2,}\.)+[a-z_*]+\b")


def named_keys(text: str) -> list[str]:
    """Dotted config-like names in a piece of advice text."""
    return _KEY_RE.findall(text)


def advice_for(kind: str) -> list[str]:
    """The advice sentences for a flag kind (an empty list for unknown kinds)."""
    return list(ADVICE.get(kind, []))


def oom_advice(phase: str | None, data: dict | None = None) -> list[str]:
    """Advice for a CUDA out-of-memory error: the phase's own levers first, then the general
    ``oom`` advice. vLLM's "no memory for the cache blocks" at start-up asks for the opposite
    of a generation OOM (more engine memory), and is told so."""
    data = data or {}
    if data.get("where") == "rollout engine KV cache":
        head = [
            "The rollout engine found no memory for its KV cache at start-up: raise "
            "actor_rollout_ref.rollout.gpu_memory_utilization, or shard the model over more "
            "GPUs with actor_rollout_ref.rollout.tensor_model_parallel_size."
        ]
    else:
        head = list(OOM_PHASE_ADVICE.get(phase or "", []))
    return head + advice_for("oom")


def failure_advice(kind: str, data: dict | None = None) -> list[str]:
    """Advice for one failure event: its specific cause (``kind:reason``/``kind:error``)
    first, then its kind, then the general ``fatal_error`` advice; no sentence twice."""
    data = data or {}
    keys = []
    for detail in (data.get("reason"), data.get("error")):
        if detail:
            keys.append(f"{kind}:{detail}")
    keys.append(kind)
    out: list[str] = []
    for key in keys:
        for sentence in FAILURE_ADVICE.get(key, []):
            if sentence not in out:
                out.append(sentence)
        if out and key != kind:
            break  # the specific advice replaces the kind's general one
    return out + advice_for("fatal_error")
