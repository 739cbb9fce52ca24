"""Each cause of the crash table, read from a short text shaped like the failures verl's users
post (our own paths, names and numbers): the fatal_error flag quotes the exception and its first
advice names the cause's lever; the advice names real verl keys only (names quoted from the
log aside). The real failures themselves are judged in tests/test_real_logs.py."""

from __future__ import annotations

import pytest

from monitor.detect import run_all
from monitor.detect.crash_causes import CAUSES, Raised, diagnose
from monitor.detect.flag_advice import INVENTED_KEYS, REAL_KEYS, named_keys
from monitor.logs.canonical_records import LogParser
from monitor.records import Event, Flag, StepRecord

#: cause id -> (the text, what the first advice must say, what the evidence must quote)
CASES: dict[str, tuple[str, str, str]] = {
    "cuda_oom": (
        "Traceback (most recent call last):\n"
        '  File "/srv/rl/verl/trainer/main_ppo.py", line 40, in main\n'
        "    run_ppo(cfg)\n"
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::main_task() (pid=77, ip=10.2.3.4)\n"
        '  File "/srv/rl/verl/trainer/ppo/ray_trainer.py", line 812, in fit\n'
        "    out = self.actor_rollout_wg.update_actor(batch)\n",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "RayTaskError(OutOfMemoryError)"),
    "host_oom": (
        '  File "/srv/rl/verl/trainer/ppo/ray_trainer.py", line 990, in _save_checkpoint\n'
        "    self.actor_rollout_wg.save_checkpoint(path)\n"
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n",
        "while saving a checkpoint", "killed for lack of host memory"),
    "dataloader_killed": (
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n",
        "data.dataloader_num_workers", "DataLoader worker (pid 4242)"),
    "offload_device_mismatch": (
        "ray.exceptions.RayTaskError(AssertionError): ray::WorkerDict.actor_rollout_compute_log_"
        "prob() (pid=5, ip=1.1.1.1)\n"
        '  File "/env/site-packages/torch/distributed/utils.py", line 160, in _p_assert\n'
        "    raise AssertionError(s)\n"
        "AssertionError: Expects tensor to be on the compute device cuda:3, was on cpu\n",
        "A module was on the CPU", "was on cpu"),
    "torch_abi_mismatch": (
        "ImportError: /opt/py/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-"
        "linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n",
        "built for another torch", "flash_attn_2_cuda"),
    "torch_ops_missing": (
        "AttributeError: '_OpNamespace' '_C' object has no attribute 'silu_and_mul'\n",
        "torch version", "silu_and_mul"),
    "native_symbol_missing": (
        "ImportError: /opt/py/lib/python3.11/site-packages/apex_C.cpython-311-x86_64-linux-gnu.so"
        ": undefined symbol: cublasLtMatmulDescCreate\n",
        "'apex_C'", "cublasLtMatmulDescCreate"),
    "missing_module": (
        "ModuleNotFoundError: No module named 'verl.workers.old_rollout'\n",
        "'verl.workers.old_rollout'", "No module named"),
    "import_name_missing": (
        "ImportError: cannot import name 'SamplingHint' from 'sglang.srt.managers.io_struct'\n",
        "'sglang' version", "SamplingHint"),
    "datasets_feature_type": (
        "ValueError: Feature type 'Json' not found. Available feature types: ['Value', ...]\n",
        "'datasets'", "Feature type 'Json'"),
    "config_key_missing": (
        '  File "/srv/proj/verl/trainer/main_ppo.py", line 88, in run\n'
        "    if config.critic.use_fancy:\n"
        "omegaconf.errors.ConfigAttributeError: Key 'use_fancy' is not in struct\n"
        "    full_key: critic.use_fancy\n"
        "    object_type=dict\n",
        "'critic.use_fancy'", "ConfigAttributeError"),
    "config_override_rejected": (
        "hydra.errors.ConfigCompositionException: Could not override "
        "'actor_rollout_ref.actor.fsdp_config.turbo'. To append to your config use "
        "+actor_rollout_ref.actor.fsdp_config.turbo=True\n",
        "'actor_rollout_ref.actor.fsdp_config.turbo'", "Could not override"),
    "reward_not_implemented": (
        "NotImplementedError: Reward function is not implemented for data_source='my_math'\n",
        "custom_reward_function.path", "my_math"),
    "reward_not_implemented_frame": (
        '  File "/srv/rl/verl/utils/reward_score/__init__.py", line 41, in '
        "_default_compute_score\n"
        "    raise NotImplementedError\n"
        "NotImplementedError\n",
        "data_source", "_default_compute_score"),
    "prompt_too_long": (
        "ValueError: Prompt length of 1300 is longer than the maximum model length of 1024.\n",
        "data.filter_overlong_prompts=True", "Prompt length of 1300"),
    "batch_length_mismatch": (
        '  File "/env/site-packages/tensordict/_torch_func.py", line 300, in _cat\n'
        "    out[key] = torch.cat(items, dim)\n"
        "RuntimeError: Sizes of tensors must match except in dimension 0. Expected size 3072 "
        "but got size 3100 for tensor number 5 in the list.\n",
        "data.max_prompt_length", "Expected size 3072"),
    "batch_not_divisible": (
        "AssertionError: only support equal chunk. Got size of DataProto 24 and chunk 16.\n",
        "data.train_batch_size", "equal chunk"),
    "mini_batch_zero": (
        "AssertionError: ppo_mini_batch_size 0 should be larger than 0 after normalization\n",
        "raise actor_rollout_ref.actor.ppo_mini_batch_size", "ppo_mini_batch_size 0"),
    "weight_bucket_too_small": (
        "AssertionError: Weight lm_head.weight(torch.Size([152064, 3584]), torch.bfloat16) is "
        "too large to fit in the bucket.\n",
        "update_weights_bucket_megabytes", "lm_head.weight"),
    "ray_gpus_unavailable": (
        "ValueError: Total available GPUs 4 is less than total desired GPUs 16\n",
        "ray status", "Total available GPUs 4"),
    "checkpoint_file_missing": (
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/data/ckpt/global_step_30/actor/extra_state_world_size_8_rank_0.pt'\n",
        "earlier, complete checkpoint", "global_step_30"),
    "install_file_missing": (
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/venv/lib/python3.10/site-packages/verl/trainer/config/ppo_trainer.yaml'\n",
        "Reinstall", "site-packages/verl"),
    "data_file_missing": (
        "FileNotFoundError: Unable to find '/home/me/data/math/train.parquet'\n",
        "data.train_files", "train.parquet"),
    "chat_template": (
        "jinja2.exceptions.TemplateError: Conversation roles must alternate user/assistant\n",
        "chat template", "roles must alternate"),
    "hccl_init": (
        "(TaskRunner pid=7) RuntimeError: create_config:torch_npu/csrc/x.cpp:99 HCCL function "
        "error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &comm), error "
        "code is 7\n",
        "HCCL_SOCKET_IFNAME", "hcclCommInitRootInfoConfig"),
    "nccl_unavailable": (
        "RuntimeError: Distributed package doesn't have NCCL built in\n",
        "CUDA_VISIBLE_DEVICES", "NCCL built in"),
    "collective_on_cpu": (
        "Traceback (most recent call last):\n"
        '  File "/srv/rl/verl/workers/rollout/my_rollout.py", line 77, in __init__\n'
        "    dist.broadcast(ids, src=0)\n"
        '  File "/env/site-packages/torch/distributed/distributed_c10d.py", line 2700, in '
        "broadcast\n"
        "    work = group.broadcast([tensor], opts)\n"
        "RuntimeError: No backend type associated with device type cpu\n",
        "verl/workers/rollout/my_rollout.py:77", "device type cpu"),
    "nccl_backend_error": (
        "ray.exceptions.RayTaskError(DistBackendError): ray::WorkerDict.actor_rollout_init_model()"
        " (pid=1, ip=2.2.2.2)\n"
        '  File "/env/site-packages/torch/distributed/distributed_c10d.py", line 2300, in '
        "all_gather\n"
        "    work = group.allgather([tensor_list], [tensor])\n",
        "NCCL_DEBUG=INFO", "DistBackendError"),
    "rendezvous_unreachable": (
        "(WorkerDict pid=9, ip=10.0.0.2) [W101 10:00:00.000 TCPStore.cpp:358] [c10d] TCP client "
        "failed to connect/validate to host 10.0.0.1:29500 - retrying (try=0, timeout=600000ms,"
        " delay=1000ms): The client socket has timed out after 600000ms while trying to connect "
        "to (10.0.0.1, 29500).\n",
        "10.0.0.1:29500", "TCP client failed"),
    "peer_closed": (
        '  File "/env/site-packages/torch/distributed/distributed_c10d.py", line 4000, in barrier'
        "\n    work.wait()\n"
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
        "by peer [10.9.9.9]:5555\n",
        "another rank died first", "Connection closed by peer"),
    "verl_assertion": (
        '  File "/srv/rl/verl/workers/fsdp_workers.py", line 300, in __init__\n'
        "    assert self.config.rollout.n >= 1, 'rollout.n must be at least 1'\n"
        "AssertionError: rollout.n must be at least 1\n",
        "verl's own check failed at verl/workers/fsdp_workers.py:300", "rollout.n must be"),
    "library_assertion": (
        '  File "/env/site-packages/sglang/srt/configs/model_config.py", line 210, in __init__\n'
        '    assert "type" in rope_scaling\n'
        "AssertionError\n",
        "inside 'sglang'", "sglang/srt/configs/model_config.py:210"),
    "message_says_fix": (
        "RuntimeError: Engine init failed: graph capture needs more memory, please set "
        "ENGINE_GRAPH_POOL=2g before starting.\n",
        "please set ENGINE_GRAPH_POOL=2g before starting", "Engine init failed"),
}


def _read(text: str) -> tuple[list[StepRecord], list[Event]]:
    parser = LogParser()
    items = [item for line in text.splitlines() for item in parser.feed(line)]
    items += parser.flush()
    return ([i for i in items if isinstance(i, StepRecord)],
            [i for i in items if isinstance(i, Event)])


def _flags(text: str) -> list[Flag]:
    steps, events = _read(text)
    return run_all(steps, None, None, events)


def _fatal(text: str) -> Flag:
    flags = [f for f in _flags(text) if f.kind == "fatal_error"]
    assert len(flags) == 1, [(f.kind, f.evidence) for f in _flags(text)]
    return flags[0]


def test_every_cause_of_the_table_has_a_case() -> None:
    assert set(CASES) == {c.id for c in CAUSES}


@pytest.mark.parametrize("cause", sorted(CASES))
def test_each_cause_gives_its_first_advice_from_the_printed_exception(cause: str) -> None:
    text, lever, quoted = CASES[cause]
    flag = _fatal(text)
    assert flag.severity == "critical"
    assert quoted in flag.evidence, flag.evidence
    assert lever in flag.advice[0], flag.advice[0]
    assert not flag.advice[0].startswith("A Ray worker")


@pytest.mark.parametrize("cause", sorted(CASES))
def test_the_cause_that_fires_is_the_tables_own(cause: str) -> None:
    """The table's own reading of the text names the cause (not a neighbour's row)."""
    _, events = _read(CASES[cause][0])
    raised = [Raised.from_event(e.data) for e in events if e.kind == "traceback"]
    ids = {h.cause.id for h in (diagnose(r) for r in raised) if h is not None}
    assert cause in ids, ids


@pytest.mark.parametrize("cause", sorted(CASES))
def test_advice_names_real_verl_keys_and_quotes_the_rest_from_the_log(cause: str) -> None:
    text = CASES[cause][0]
    for sentence in _fatal(text).advice:
        for key in named_keys(sentence):
            assert key in REAL_KEYS or key in text, (key, sentence)
        for key in INVENTED_KEYS:
            assert key not in sentence


def test_the_first_printed_cause_wins_over_the_worker_deaths_after_it() -> None:
    """flash-attn built for another torch (the worker's import fails), then the raylet's
    'worker died ... SYSTEM_ERROR' and the driver's own AssertionError: the first advice is the
    torch mismatch, not the host OOM killer of Ray's report."""
    text = (
        "(raylet) Traceback (most recent call last):\n"
        '  File "/env/site-packages/ray/_private/function_manager.py", line 600, in load\n'
        "    raise RuntimeError(\n"
        "RuntimeError: The actor with name WorkerDict failed to import on the worker.\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/env/site-packages/flash_attn/flash_attn_interface.py", line 15, in <module>\n'
        "    import flash_attn_2_cuda as flash_attn_gpu\n"
        "ImportError: /env/site-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: "
        "undefined symbol: _ZNK3c1010TensorImpl4sizeEv\n"
        "(raylet) A worker died or was killed while executing a task by an unexpected system "
        "error. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly.\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/rl/verl/single_controller/ray/base.py", line 270, in _init_with_pool\n'
        "    assert register_center_actor is not None\n"
        "AssertionError: failed to get register_center_actor\n")
    flag = _fatal(text)
    assert "flash_attn_2_cuda" in flag.evidence and "undefined symbol" in flag.evidence
    assert "built for another torch" in flag.advice[0]
    assert not any("OOM killer" in a for a in flag.advice)


def test_a_worker_death_with_no_cause_printed_keeps_the_worker_death_advice() -> None:
    text = ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this "
            "task.\n"
            "The actor is dead because its worker process has died. Worker exit type: "
            "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection "
            "error code 2.\n")
    flag = _fatal(text)
    assert "/tmp/ray" in flag.advice[0] or "own log" in flag.advice[0]


@pytest.mark.parametrize(("text", "not_cause", "instead"), [
    # the missing symbol is not torch's: not "built for another torch"
    (CASES["native_symbol_missing"][0], "torch_abi_mismatch", "native_symbol_missing"),
    # Ray's OutOfMemoryError is the host's memory, not the GPU's
    (CASES["host_oom"][0], "cuda_oom", "host_oom"),
    # an AssertionError whose deepest frame is a library's is not verl's own check
    (CASES["library_assertion"][0], "verl_assertion", "library_assertion"),
    # a NotImplementedError outside verl's scorer says nothing of data_source
    ('  File "/srv/app/model.py", line 5, in forward\n    raise NotImplementedError\n'
     "NotImplementedError\n", "reward_not_implemented_frame", None),
    # a tensor size mismatch outside a batch's concatenation is not an over-long prompt
    ('  File "/srv/app/model.py", line 9, in forward\n    x = a + b\n'
     "RuntimeError: Sizes of tensors must match except in dimension 0. Expected size 4 but got "
     "size 5 for tensor number 1 in the list.\n", "batch_length_mismatch", None),
])
def test_a_cause_whose_premise_fails_is_not_read(text: str, not_cause: str,
                                                 instead: str | None) -> None:
    _, events = _read(text)
    hits = [diagnose(Raised.from_event(e.data)) for e in events if e.kind == "traceback"]
    ids = {h.cause.id for h in hits if h is not None}
    assert not_cause not in ids
    assert (instead in ids) if instead else not ids
