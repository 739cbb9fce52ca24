"""The real-verl cases: verl 0.5.0.dev (commit 4c3310db) GRPO with the HF rollout on one GPU.

Each case is the same small job (``COMMON``) with verl's own knobs changed, a custom reward,
dataset or worker hook (files beside this one), and how the runner ends it. A knob may name
``{data}`` (the folder of the models and parquet files). One case needs a switch that is the
harness's, not verl's: ``ppo_critic``'s critic attention (see ``hooks/sitecustomize.py``). ``overrides(case,
work, data)`` gives the Hydra command line, ``environment(case, work)`` the variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCH, N = 32, 4  # prompts a step, responses a prompt


@dataclass(frozen=True)
class Case:
    """One recording: knobs, the fault injected and how long it may take."""

    name: str
    what: str
    steps: int = 8
    model: str = "small"
    reward: str = "compute_score"
    knobs: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    fault_step: int | None = None     # first step with the fault (None: from the start / none)
    hold_after_silence: float = 0.0   # hang cases: end the run this long after the last step
    estimate_s: float = 90.0          # what the runner budgets for it
    timeout_s: float = 300.0          # hard limit of the case
    expect: tuple[str, ...] = ()      # flag kinds that are the right diagnosis (empty: healthy)
    hooks: bool = False               # put hooks/ (sitecustomize.py) on PYTHONPATH
    batch: int = BATCH                # prompts a step (and the PPO mini-batch)
    attn: str = "sdpa"                # actor's and ref's attention (verl's override_config)
    kill_after_step: int | None = None  # SIGKILL the job once this step's line is out ...
    resume_knobs: tuple[str, ...] = ()  # ... and start it again with these knobs added


CASES = [
    Case("healthy", "no fault", steps=8, estimate_s=120),
    Case("hang_reward", "compute_score sleeps 100 s once at step 4 (a verifier stuck on one "
         "input), then the run goes on", reward="hang_once", fault_step=4,
         env={"VERL_REAL_HANG_S": "100"}, estimate_s=230, timeout_s=330, expect=("hang",)),
    Case("hang_http", "compute_score asks a judge over HTTP with no timeout from step 3; the "
         "local server accepts and never answers; the run is ended 95 s after its last step",
         reward="http_block", fault_step=3, hold_after_silence=95, estimate_s=230,
         timeout_s=330, expect=("hang",)),
    Case("hang_data", "verl's RLHFDataset (data.custom_cls) blocks in __getitem__ in the 2 "
         "DataLoader workers once each has served one batch (step 3 never gets its batch); "
         "the run is ended 95 s after its last step",
         knobs=("data.custom_cls.path=" + str(HERE / "blocking_dataset.py"),
                "data.custom_cls.name=BlockingRLHFDataset"),
         env={"VERL_REAL_BLOCK_AFTER": str(BATCH)}, fault_step=3,
         hold_after_silence=95, estimate_s=230, timeout_s=330, expect=("hang",)),
    Case("param_offload", "actor and ref parameter offload with the HF rollout: fails at the "
         "first generation (AssertionError: Expects tensor to be on the compute device)",
         knobs=("actor_rollout_ref.actor.fsdp_config.param_offload=True",
                "actor_rollout_ref.ref.fsdp_config.param_offload=True"),
         steps=4, estimate_s=110, timeout_s=240, expect=("fatal_error",)),
    Case("mem_grow", "a hook in the WorkerDict process keeps 4 GiB more GPU memory after each "
         "update_actor from step 2", hooks=True, fault_step=2, steps=8,
         env={"VERL_REAL_FAULT": "mem_grow", "VERL_REAL_GROW_GIB": "4"}, estimate_s=130,
         expect=("memory_creep",)),
    Case("cpu_reward", "compute_score burns 30 ms of pure Python per response from step 3 "
         "(~3.8 s a step on one core) while the GPU waits", reward="cpu_heavy", fault_step=3,
         steps=6, env={"VERL_REAL_CPU_MS": "30"}, estimate_s=115,
         expect=("phase_imbalance",)),
    Case("healthy_val_ckpt", "validation every 2 steps (trainer.test_freq=2) and a checkpoint "
         "every 3 (trainer.save_freq=3)", knobs=("trainer.test_freq=2", "trainer.save_freq=3"),
         steps=6, estimate_s=115),
    Case("tiny_micro", "micro-batches of one: ppo_micro_batch_size_per_gpu=1 and "
         "log_prob_micro_batch_size_per_gpu=1 (rollout and ref)",
         knobs=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1"),
         steps=5, estimate_s=125, expect=("low_utilization",)),
    Case("tiny_micro_eager", "micro-batches of one, as tiny_micro, with eager attention (finite "
         "gradients): recorded to show the live flag its last step completes reach the store",
         knobs=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1"),
         attn="eager", steps=5, estimate_s=125, expect=("low_utilization",)),
    Case("healthy_val", "validation every 2 steps (trainer.test_freq=2)",
         knobs=("trainer.test_freq=2",), steps=6, estimate_s=115),
    Case("healthy_ckpt", "a checkpoint every 3 steps (trainer.save_freq=3)",
         knobs=("trainer.save_freq=3",), steps=6, estimate_s=115),
    Case("opt_offload", "optimizer offload (actor.fsdp_config.optimizer_offload=True) on a "
         "0.4B model, sdpa attention: every gradient was NaN, so verl skipped every optimizer "
         "step and there was no Adam state to move (opt_offload_xl moves it)", model="big",
         knobs=("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",),
         steps=6, estimate_s=200, expect=("phase_imbalance",)),
    Case("healthy_big", "no fault, the 0.4B model of opt_offload with its batch and steps (the "
         "baseline its update_actor is measured against)", model="big", steps=6,
         estimate_s=190),
    Case("opt_offload_xl", "optimizer offload (actor.fsdp_config.optimizer_offload=True) on a "
         "1.5B model with 16 prompts a step, eager attention (sdpa's fully masked rows of the "
         "left-padded prompts give NaN gradients on this GPU: verl then skips every "
         "optimizer step, there is no Adam state and nothing to offload): 12 GB of Adam state "
         "to the host and back every update",
         model="xl", batch=16, attn="eager",
         knobs=("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",),
         steps=6, estimate_s=220, expect=("phase_imbalance",)),
    Case("healthy_xl", "no fault, the 1.5B model of opt_offload_xl with its batch, steps and "
         "eager attention (its baseline)", model="xl", batch=16, attn="eager", steps=6,
         estimate_s=210),
    Case("ppo_critic", "PPO with a critic (algorithm.adv_estimator=gae; the critic is the same "
         "55M model with a value head), eager attention for actor, ref and critic (sdpa gave NaN "
         "gradients). verl 4c3310db hard-codes flash_attention_2 for the critic (fsdp_workers.py "
         "CriticWorker._build_critic_model_optimizer and utils/model.py load_valuehead_model) "
         "and never applies critic.model.override_config to it; the harness's hook "
         "(hooks/sitecustomize.py, VERL_REAL_CRITIC_ATTN=eager) loads it with eager instead: a "
         "switch of this harness, not a verl knob",
         hooks=True, steps=6, estimate_s=170, attn="eager",
         env={"VERL_REAL_CRITIC_ATTN": "eager"},
         knobs=("algorithm.adv_estimator=gae", "critic.model.path={data}/model_small",
                "critic.ppo_micro_batch_size_per_gpu=32", "critic.optim.lr=1e-5")),
    Case("healthy_eager", "no fault, the plain job with eager attention (its gradients are "
         "finite; with sdpa every step's were NaN and verl skipped the update)", attn="eager",
         steps=6, estimate_s=150),
    Case("kill_resume", "a checkpoint every 2 steps (trainer.save_freq=2, into "
         "trainer.default_local_dir under the case's folder), eager attention; once step 5's "
         "line is out the job's process group (verl's launcher, Ray and its workers) is "
         "SIGKILLed, as a lost node would end it (its last checkpoint is step 4: step 5 is "
         "lost, step 6 never finishes); Ray is stopped, then the same command with "
         "trainer.resume_mode=auto runs under a second verl-monitor run (the same --log, "
         "appended, and the same --store) to the end: verl loads global_step_4 and does "
         "step 5 again", knobs=("trainer.save_freq=2",), attn="eager", steps=8,
         kill_after_step=5, resume_knobs=("trainer.resume_mode=auto",), estimate_s=260,
         timeout_s=420),
]
BY_NAME = {c.name: c for c in CASES}


def models(names: str) -> str:
    """The model sizes the cases named (``a+b,c``; empty: all) need, for setup_job.py."""
    cases = [BY_NAME[n] for n in names.replace("+", ",").split(",") if n] or CASES
    return ",".join(sorted({c.model for c in cases}))


def overrides(case: Case, work: Path, data: Path, resume: bool = False) -> list[str]:
    """The Hydra overrides of ``python3 -m verl.trainer.main_ppo`` for this case (``resume``:
    its second attempt, with ``case.resume_knobs``)."""
    common = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        f"data.train_batch_size={case.batch}", "data.max_prompt_length=64",
        "data.max_response_length=128", "data.filter_overlong_prompts=False",
        "data.truncation=left", "data.dataloader_num_workers=2",
        f"actor_rollout_ref.model.path={data}/model_{case.model}",
        f"+actor_rollout_ref.model.override_config._attn_implementation={case.attn}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={case.batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={HERE / 'rewards.py'}",
        f"custom_reward_function.name={case.reward}",
        "trainer.logger=[console]", "trainer.project_name=verl_real",
        f"trainer.experiment_name={case.name}", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        f"trainer.total_training_steps={case.steps}", "trainer.total_epochs=100",
        f"trainer.default_local_dir={work}/ckpt",
        "+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        "+ray_kwargs.ray_init.object_store_memory=4000000000",
        f"+ray_kwargs.ray_init._temp_dir=/tmp/ray_{case.name}",
        f"hydra.run.dir={work}/hydra",
    ]
    knobs = case.knobs + (case.resume_knobs if resume else ())
    return _merge(common, [k.format(data=data) for k in knobs])


def _merge(common: list[str], knobs: list[str]) -> list[str]:
    """Later ``key=value`` wins (Hydra refuses a key given twice)."""
    out: dict[str, str] = {}
    for item in common + knobs:
        out[item.split("=", 1)[0]] = item
    return list(out.values())


def environment(case: Case, work: Path) -> dict[str, str]:
    """Variables for the verl command (Ray workers started by a local ray.init inherit them)."""
    env = {
        "VERL_REAL_SAMPLES_PER_STEP": str(case.batch * N),
        "VERL_REAL_MARKERS": str(work / "markers"),
        "VERL_REAL_FAULT_STEP": str(case.fault_step or 1),
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1",
        "HYDRA_FULL_ERROR": "1", "TOKENIZERS_PARALLELISM": "true",
        "TORCH_FR_BUFFER_SIZE": "20000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(work / "fr" / "pipe_"),
        "TORCH_FR_DUMP_TEMP_FILE": str(work / "fr" / "fr_"),
    }
    env.update(case.env)
    return env
