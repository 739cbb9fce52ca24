"""Advice: the concrete levers for each flag kind, named by real verl config keys.

Every key named here appears in ``REAL_KEYS`` (VERL_SIGNALS.md section 6); the keys some tuning
guides invent (``INVENTED_KEYS``) must never appear. A test checks both.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from monitor.detect.cause_advice import GEN_VS_CRITIC, cause_advice, contradicted

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
    "actor_rollout_ref.nccl_timeout",
    "ray_kwargs.ray_init.runtime_env.env_vars",  # Ray's runtime_env, merged by verl
    "trainer.test_freq",
    "global_profiler.tool",
    "trainer.balance_batch",
    # today's trainers (issue 21; verl-project/verl main): pools, staleness, agent loop
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "rollout.nnodes",
    "rollout.n_gpus_per_node",
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.partial_rollout",
    "async_training.require_batches",
    "async_training.use_dynamic_resource_scheduling",
    "actor_rollout_ref.rollout.nnodes",
    "actor_rollout_ref.rollout.n_gpus_per_node",
    "actor_rollout_ref.rollout.checkpoint_engine.backend",
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "actor_rollout_ref.rollout.agent.num_workers",
    "reward.num_workers",
    "reward.reward_manager",
    "trainer.v1.sampler.max_off_policy_threshold",
    "trainer.v1.sampler.max_off_policy_strategy",
    "trainer.v1.separate_async.parameter_sync_step",
    "trainer.v1.separate_async.hybrid_rollout.enable_switch",
    "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio",
    # rollout engines (verl/trainer/config/rollout/rollout.yaml; kv_cache_preemption,
    # generation_tail, docs/rollout_engines.md)
    "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.over_sample_rate",
    "actor_rollout_ref.rollout.disable_log_stats",
    "actor_rollout_ref.rollout.prometheus.enable",
    "actor_rollout_ref.rollout.prometheus.file",
    # advice by phase and signature (issue 23; checked in verl's config: the ref keys in 0.5.0
    # and main; reward_model.* in 0.4.1-0.7.0, reward.* from 0.7.1 on, custom_reward_function.*
    # at the top level in 0.4.1-0.7.0 and under reward in main)
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "reward_model.launch_reward_fn_async",
    "reward_model.reward_manager",
    "custom_reward_function.path",
    "reward.custom_reward_function.path",
    # the rollout's engine (hf in 0.5.x and before, vllm, sglang; rollout.yaml ``name``)
    "actor_rollout_ref.rollout.name",
    # skipped_updates (checked in verl 4c3310db and main: _generated_ppo_trainer.yaml and
    # fsdp_workers.py). override_config is a free dict handed to the HF model config
    # (update_model_config, so ``+...override_config._attn_implementation=eager`` works in both);
    # main also reads override_config.attn_implementation for the actor and the critic (0.5's
    # critic loads flash_attention_2 whatever it says). grad_clip is what _optimizer_step clips
    # with in dp_actor/dp_critic (both versions).
    "actor_rollout_ref.model.override_config._attn_implementation",
    "actor_rollout_ref.model.override_config.attn_implementation",
    "critic.model.override_config.attn_implementation",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.grad_clip",
    "critic.optim.lr",
    "critic.grad_clip",
    # crash triage (monitor/detect/crash_causes.py; checked in verl 0.3.0 to main): the data
    # keys of ppo_trainer.yaml (filter_overlong_prompts from 0.3, its workers from 0.4), the
    # actor's checkpoint contents (``contents`` in 0.3-0.4.0, ``save_contents`` from 0.4.1),
    # the weight-sync bucket (rollout.update_weights_bucket_megabytes in 0.5-0.7, under
    # rollout.checkpoint_engine from 0.8), the reward function's name, Ray's runtime_env
    "data.max_prompt_length",
    "data.filter_overlong_prompts",
    "data.filter_overlong_prompts_workers",
    "data.truncation",
    "data.train_files",
    "data.val_files",
    "custom_reward_function.name",
    "reward.custom_reward_function.name",
    "actor_rollout_ref.actor.checkpoint.save_contents",
    "actor_rollout_ref.actor.checkpoint.contents",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    "ray_kwargs.ray_init.runtime_env",
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

#: skipped_updates: the attention kernel (real verl on the H200: sdpa gave NaN gradients on
#: every step with left-padded prompts, eager gave finite ones).
_ATTENTION_ADVICE = (
    "NaN from the first step is mostly the attention kernel, not the model: sdpa with "
    "left-padded prompts can give NaN for the rows that are all padding; load the model with "
    "eager attention (+actor_rollout_ref.model.override_config._attn_implementation=eager; verl "
    "main also reads actor_rollout_ref.model.override_config.attn_implementation) or with "
    "flash_attention_2 (verl's default) where it is installed."
)
_CRITIC_ATTENTION_ADVICE = (
    "The critic's gradients too: on verl main set "
    "critic.model.override_config.attn_implementation=eager (verl 0.5 loads the critic with "
    "flash_attention_2 whatever its config says)."
)

ADVICE: dict[str, list[str]] = {
    # --- rollout engines (issue 21): vLLM / SGLang servers' own series -------------------------
    "kv_cache_preemption": [
        "Give the engine more KV cache: raise actor_rollout_ref.rollout.gpu_memory_utilization "
        "(the share of GPU memory vLLM/SGLang take for weights and KV cache), or raise "
        "actor_rollout_ref.rollout.tensor_model_parallel_size so each GPU holds less of the "
        "weights and more cache.",
        "Admit fewer sequences at once: lower actor_rollout_ref.rollout.max_num_seqs (and "
        "actor_rollout_ref.rollout.max_num_batched_tokens); a smaller batch that never preempts "
        "finishes sooner than a full one that recomputes.",
        "Long responses fill the cache: cap data.max_response_length.",
    ],
    "generation_tail": [
        "Stop waiting for the last few responses: actor_rollout_ref.rollout.over_sample_rate "
        "aborts the remaining requests once (1 - rate) of them have finished.",
        "Cap the tail with a lower data.max_response_length; a few very long responses keep "
        "the other servers idle.",
        "Give the pool more independent work per rollout: a larger data.train_batch_size with "
        "fewer samples per prompt (actor_rollout_ref.rollout.n).",
    ],
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
        GEN_VS_CRITIC,
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
    "memory_creep": [
        "Memory that grows every step is kept across steps: look for tensors held in lists, "
        "metrics summed on the GPU or caches never emptied in the reward function and custom "
        "code; compare the per-worker GPU and host memory curves (verl's maintainers ask for "
        "them) and whether the growth starts after a checkpoint save.",
        "A jump right after each save or validation: save less often (trainer.save_freq) or "
        "validate less often (trainer.test_freq) until the memory kept by it is freed.",
        "Until it is fixed, buy time: lower actor_rollout_ref.rollout.gpu_memory_utilization or "
        "offload with actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload.",
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
    "hang": [
        "Look at the rank named in the evidence first: its frame is where it stopped (a data "
        "loader, a reward call, a branch only some ranks take, a kernel that never ends); the "
        "others only wait for it, and restarting them alone does not help.",
        "Without a named rank, let each rank dump its Flight Recorder on request: add "
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE and TORCH_FR_DUMP_TEMP_FILE to "
        "ray_kwargs.ray_init.runtime_env.env_vars (see the hangs page of the docs) and run "
        "the exporter with "
        "--fr-dir.",
        "actor_rollout_ref.nccl_timeout (600 s by default) bounds how long NCCL waits before "
        "its watchdog ends the job; a lower trainer.save_freq limits the work a hang loses.",
    ],
    "fatal_error": [
        "The run died: the first failure in time is usually the cause and the rest (other "
        "ranks timing out, Ray reporting dead actors) follow from it; read that rank's or "
        "worker's own log (Ray keeps them under /tmp/ray/session_latest/logs).",
        "Resume from the last checkpoint once the cause is fixed; trainer.save_freq sets how "
        "much work a crash loses.",
    ],
    "skipped_updates": [
        _ATTENTION_ADVICE,
        "Gradients that turn NaN or inf after finite steps point to instability: lower the "
        "learning rate (actor_rollout_ref.actor.optim.lr, critic.optim.lr for the critic) and "
        "keep the gradient clipping tight (actor_rollout_ref.actor.grad_clip, critic.grad_clip; "
        "1.0 by default); resume from a checkpoint saved before the first bad step.",
        "Check the data of the bad steps: empty responses, prompts that are all padding, or "
        "rewards and advantages that are NaN (critic/score, critic/advantages in the same step "
        "lines) make the loss NaN.",
    ],
    # --- today's trainers (issue 21): pools, staleness, weight sync, agent loop ---------------
    "pool_imbalance": [
        "The two GPU pools are out of balance: move GPUs to the side that is waited on "
        "(fully-async: rollout.nnodes and rollout.n_gpus_per_node against trainer.nnodes and "
        "trainer.n_gpus_per_node; V1 separate-async and one-step-off: "
        "actor_rollout_ref.rollout.nnodes and actor_rollout_ref.rollout.n_gpus_per_node).",
        "Let the sides overlap more: a higher async_training.staleness_threshold or "
        "async_training.trigger_parameter_sync_step lets the rollouter run further ahead "
        "(fresher samples are traded for less waiting).",
    ],
    "stale_samples": [
        "Samples are too old when trained, or thrown away: a fully-async run bounds the lag "
        "with async_training.staleness_threshold and async_training.trigger_parameter_sync_step "
        "(async_training.partial_rollout continues samples across an update); V1 evicts groups "
        "older than trainer.v1.sampler.max_off_policy_threshold "
        "(trainer.v1.sampler.max_off_policy_strategy=wait keeps them instead of dropping).",
        "Evictions mean generation is wasted: give the trainer more GPUs (trainer.nnodes, "
        "trainer.n_gpus_per_node) so samples are consumed sooner, or fewer to the rollout.",
    ],
    "weight_sync_pause": [
        "Generation is paused while weights are synced: between separate pools, sync over "
        "the NCCL checkpoint engine (actor_rollout_ref.rollout.checkpoint_engine.backend=nccl).",
        "Sync less often, so fewer steps pause: async_training.trigger_parameter_sync_step "
        "(fully-async), trainer.v1.separate_async.parameter_sync_step (V1 separate-async).",
    ],
    "agent_loop_overhead": [
        "Tool calls or reward scoring, not generation, take the agent loop's time: run more "
        "tool calls at once (actor_rollout_ref.rollout.multi_turn.max_parallel_calls), cap "
        "the turns (actor_rollout_ref.rollout.multi_turn.max_assistant_turns) and the tool "
        "output (actor_rollout_ref.rollout.multi_turn.max_tool_response_length).",
        "A slow compute_score: raise reward.num_workers, or move scoring out of the loop's "
        "path with another reward.reward_manager; more agent-loop workers "
        "(actor_rollout_ref.rollout.agent.num_workers) overlap the waits.",
    ],
}

#: Advice for ``pool_imbalance`` by direction and trainer mode (replaces the kind's general
#: advice where it applies): ``trainer_waits`` (the rollout pool is the bottleneck) or
#: ``rollouter_waits`` (the trainer pool is).
POOL_ADVICE: dict[tuple[str, str], list[str]] = {
    ("trainer_waits", "fully_async_trainer"): [
        "The trainer waits on the rollout pool: give the rollouter more GPUs (rollout.nnodes, "
        "rollout.n_gpus_per_node) or the trainer fewer (trainer.nnodes, "
        "trainer.n_gpus_per_node).",
        "Let the rollouter run further ahead: raise async_training.staleness_threshold or "
        "async_training.trigger_parameter_sync_step, keep async_training.partial_rollout=True; "
        "async_training.use_dynamic_resource_scheduling lends idle trainer GPUs to the rollout.",
        "Micro-batch settings do not help here: the trainer's GPUs are idle because no samples "
        "have arrived, not because its kernels are small.",
    ],
    ("trainer_waits", "separate_async"): [
        "The trainer waits on the rollout pool: give it more GPUs "
        "(actor_rollout_ref.rollout.nnodes, actor_rollout_ref.rollout.n_gpus_per_node), or lend "
        "the trainer's GPUs to the rollout between steps "
        "(trainer.v1.separate_async.hybrid_rollout.enable_switch=True, "
        "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio).",
        "A higher trainer.v1.sampler.max_off_policy_threshold lets older samples train instead "
        "of being waited for.",
    ],
    ("trainer_waits", "one_step_off"): [
        "Generation of the next batch outlasts training of this one: give the rollout pool "
        "more GPUs (rollout.nnodes, rollout.n_gpus_per_node) or the trainer fewer "
        "(trainer.nnodes, trainer.n_gpus_per_node).",
    ],
    ("rollouter_waits", "fully_async_trainer"): [
        "The rollouter sits paused waiting for new weights: the trainer pool is the "
        "bottleneck. Give the trainer more GPUs (trainer.nnodes, trainer.n_gpus_per_node) or "
        "the rollout fewer (rollout.nnodes, rollout.n_gpus_per_node).",
        "Or let the rollouter generate further ahead of the weights: a higher "
        "async_training.staleness_threshold (at the cost of staler samples).",
    ],
    ("rollouter_waits", "one_step_off"): [
        "The rollout pool finishes long before training does: move GPUs from the rollout "
        "(rollout.nnodes, rollout.n_gpus_per_node) to the trainer (trainer.nnodes, "
        "trainer.n_gpus_per_node).",
    ],
}


def pool_advice(direction: str, mode: str) -> list[str]:
    """``pool_imbalance`` advice for one direction and trainer mode (the general advice when
    the mode has none of its own)."""
    return list(POOL_ADVICE.get((direction, mode)) or advice_for("pool_imbalance"))

#: Advice for one failure (``monitor.logs.failure_lines``), by event kind or ``kind:reason``; it
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

#: Advice for an exception a worker's task raised (``RayTaskError(X)``), by a pattern of its
#: message and the phases it fits (None: any); the first that matches is used.
_DEVICE_MISMATCH = r"Expects tensor to be on the compute device|Expected all tensors to be on " \
    r"the same device|was on cpu"
EXCEPTION_ADVICE: tuple[tuple[str, frozenset[str] | None, list[str]], ...] = (
    (_DEVICE_MISMATCH, frozenset({"gen"}), [
        "Generation found the model's parameters on the CPU: with parameter offload on "
        "(actor_rollout_ref.actor.fsdp_config.param_offload) the HF rollout "
        "(actor_rollout_ref.rollout.name) generates from the FSDP module whose parameters the "
        "offload left on the CPU; this verl does not load them back for it. Set "
        "actor_rollout_ref.actor.fsdp_config.param_offload=False (the optimizer state can stay "
        "offloaded: actor_rollout_ref.actor.fsdp_config.optimizer_offload), or roll out with "
        "vLLM or SGLang.",
    ]),
    (_DEVICE_MISMATCH, None, [
        "A module was on the CPU when its pass ran: offloading (actor_rollout_ref.actor."
        "fsdp_config.param_offload, actor_rollout_ref.ref.fsdp_config.param_offload) moves "
        "parameters to the CPU between passes and back before each; a worker, model or "
        "rollout that skips the loading trips this. Run once with offload off to confirm.",
    ]),
)

#: Ray's own causes of a task failure (the worker died): not an exception of the task's code.
_RAY_DEATHS = frozenset({"unhandled error", "RayActorError", "ActorDiedError",
                         "ActorUnavailableError", "WorkerCrashedError", "NodeDiedError"})


def exception_advice(data: dict) -> list[str]:
    """Advice for an exception a task raised: the message's own cause first (``message``,
    ``phase`` in ``data``), then where to read the rest. Empty when ``data`` is not one."""
    cause = data.get("cause")
    if data.get("exception") != "RayTaskError" or not cause or cause in _RAY_DEATHS:
        return []
    message = str(data.get("message") or "")
    out: list[str] = []
    for pattern, phases, sentences in EXCEPTION_ADVICE:
        if re.search(pattern, message) and (phases is None or data.get("phase") in phases):
            out.extend(sentences)
            break
    task = f" in {data['task']}" if data.get("task") else ""
    out.append(
        f"The task raised {cause}{task}; its worker did not die of memory or a signal: the "
        "quoted message and frame say what failed, and the worker's log (under "
        "/tmp/ray/session_latest/logs) holds the whole traceback."
    )
    return out


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

_KEY_RE = re.compile(r"\b(?:[a-z_][a-z0-9_]+\.)+[a-z_*][a-z0-9_*]*\b")  # trainer.v1.*


def named_keys(text: str) -> list[str]:
    """Dotted config-like names in a piece of advice text."""
    return _KEY_RE.findall(text)


def advice_for(
    kind: str,
    phase: str | None = None,
    signature: str | None = None,
    version: str | None = None,
    measured: Collection[str] = (),
) -> list[str]:
    """The advice sentences for a flag kind (an empty list for unknown kinds).

    With the flag's ``phase`` and its GPU/host ``signature`` (``monitor.analysis.signature``),
    the advice that fits them comes first (most likely cause first) and the kind's general
    advice that the evidence contradicts is left out (``monitor.detect.cause_advice``);
    ``version`` is verl's version range as ``monitor.logs.keys.guess_version`` writes it, for
    keys that were renamed; ``measured`` names the counters the signature read (``"pcie"``).
    """
    general = list(ADVICE.get(kind, []))
    if phase is None and signature is None:
        return general
    out: list[str] = []
    for sentence in cause_advice(phase, signature, version) + general:
        if sentence not in out and not contradicted(sentence, phase, signature, measured):
            out.append(sentence)
    return out


def skipped_updates_advice(roles: Collection[str], from_start: bool) -> list[str]:
    """Advice for skipped optimizer steps: the attention kernel first when the gradients were
    NaN from the run's first step (the critic's switch too when its gradients were), else the
    learning rate and clipping first; then the data."""
    attention, instability, data = ADVICE["skipped_updates"]
    head = [attention, _CRITIC_ATTENTION_ADVICE] if "critic" in roles else [attention]
    if from_start:
        return [*head, instability, data]
    return [instability, *head, data]


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
    raised = exception_advice(data) if kind == "actor_died" else []
    if raised:
        return raised + advice_for("fatal_error")
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


# --- advice that knows the job's config (issue 28 item 9) --------------------------------------

_SETTING_RE = re.compile(r"\b((?:[a-z_][a-z0-9_]*\.)+[a-z_][a-z0-9_]*)=([\w+-]+(?:\.\d+)?)")
_OFF_WORDS = ("turn off", "turn offload off", "disable", "turn that off")
_ON_WORDS = ("turn on", "enable", "use ")
_JOINERS = (" and {}", "{} and ", ", {}", "{}, ", " / {}", "{} / ", " or {}", "{} or ")


def _same(value: object, text: str) -> bool:
    """Whether a config value is what ``text`` (as advice writes it) sets."""
    if isinstance(value, bool):
        return text in (str(value), str(value).lower())
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value) == text


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _wanted(sentence: str, at: int) -> bool | None:
    """The value a bare mention of a switch at ``at`` asks for (turn off/on, enable/disable),
    read from its clause; None when the clause says neither."""
    clause = re.split(r"[;:.](?:\s|$)", sentence[:at].lower())[-1]
    off = max(clause.rfind(w) for w in _OFF_WORDS)
    on = max(clause.rfind(w) for w in _ON_WORDS)
    if off < 0 and on < 0:
        return None
    return off < on


def _drop_setting(sentence: str, token: str) -> str:
    for joiner in _JOINERS:
        piece = joiner.format(token)
        if piece in sentence:
            return sentence.replace(piece, "", 1)
    return sentence


def with_job_config(sentence: str, config: Mapping[str, Any]) -> str | None:
    """One advice sentence told what the job already has (``config``: dotted keys, as
    ``monitor.logs.job_config.flatten`` writes them). A ``key=value`` the job already has is
    taken out (and said to be so); a knob the job sets is named with its value; a sentence
    that only asks for what is already set is None (left out)."""
    asks = already = 0
    notes: list[str] = []
    for match in list(_SETTING_RE.finditer(sentence)):
        key, text = match.groups()
        if key not in config:
            continue
        asks += 1
        if _same(config[key], text):
            already += 1
            sentence = _drop_setting(sentence, f"{key}={text}")
            notes.append(f"{key.rsplit('.', 1)[-1]} is already {_shown(config[key])}")
        elif key not in _KEY_RE.findall(_SETTING_RE.sub("", sentence)):  # not named bare too
            notes.append(f"{key.rsplit('.', 1)[-1]} is {_shown(config[key])} in this job")
    seen: set[str] = set()
    bare_already: list[tuple[str, str]] = []

    def name(m: re.Match[str]) -> str:
        nonlocal asks, already
        key = m.group(0)
        end = m.end()
        if key not in config or key in seen or sentence[end:end + 1] == "=":
            return key
        seen.add(key)
        value = config[key]
        if isinstance(value, bool):
            want = _wanted(sentence, m.start())
            if want is not None:
                asks += 1
                if want == value:
                    already += 1
                    bare_already.append((f"{key} (already {value} in this job)", key))
                    return bare_already[-1][0]
        else:
            asks += 1  # a knob to turn, named with its value: the sentence still asks that
        return f"{key} ({_shown(value)} in this job)"

    sentence = _KEY_RE.sub(name, sentence)
    for shown, key in bare_already:  # a list of switches to flip: leave out the flipped ones
        dropped = _drop_setting(sentence, shown)
        if dropped != sentence:
            sentence = dropped
            notes.append(f"{key.rsplit('.', 1)[-1]} is already {config[key]}")
    if asks and already == asks:
        return None
    if notes:
        sentence = sentence.rstrip(".") + " (" + "; ".join(notes) + ")."
    return sentence


def advice_with_job_config(advice: list[str], config: Mapping[str, Any] | None) -> list[str]:
    """``with_job_config`` over a flag's advice (unchanged without a config)."""
    if not config:
        return list(advice)
    out = []
    for sentence in advice:
        told = with_job_config(sentence, config)
        if told is not None and told not in out:
            out.append(told)
    return out


def tell_job_config(flags: list, config: Mapping[str, Any] | None) -> None:
    """Tell each flag's advice (in place) what the job's printed config already has (see
    ``with_job_config``; ``config`` nested as verl prints it, or None: unchanged)."""
    if not config:
        return
    from monitor.detect.micro_batch_advice import micro_batch_first
    from monitor.logs.job_config import flatten

    flat = flatten(config)
    for flag in flags:
        flag.advice = micro_batch_first(flag.kind, advice_with_job_config(flag.advice, flat),
                                        flat)
