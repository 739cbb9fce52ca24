"""Failure lines as verl users post them become events with their numbers.

Every fixture under tests/fixtures/logs/failures/ is built from the shape of a line users and
maintainers posted in verl's issue tracker (values changed); each test reads one through the
real parser (``parse_file``) and checks the event a user would look for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.logs.canonical_records import LogParser, parse_file
from monitor.logs.failure_lines import FAILURE_KINDS, match_failure, oom_details, traceback_phase
from monitor.records import EVENT_KINDS

FIXTURES = Path(__file__).parent / "fixtures" / "logs" / "failures"
LOG_END = 1_750_000_000.0


def _events(name: str, kind: str | None = None) -> list:
    parsed = parse_file(FIXTURES / name, log_end=LOG_END)
    return [e for e in parsed.events if kind is None or e.kind == kind]


def test_failure_kinds_are_event_kinds() -> None:
    assert set(FAILURE_KINDS) <= set(EVENT_KINDS)


# --- CUDA out of memory ---------------------------------------------------------------------


def test_oom_traceback_alone_has_sizes_phase_and_the_logs_end_as_time() -> None:
    (ev,) = _events("oom_compute_log_prob_traceback.log", "oom")
    assert ev.data["tried_gib"] == 13.91 and ev.data["free_gib"] == 8.85
    assert ev.data["total_gib"] == 79.11 and ev.data["gpu"] == 0
    assert ev.data["allocated_gib"] == 60.49
    assert (ev.data["function"], ev.data["phase"]) == ("compute_log_prob", "old_log_prob")
    assert ev.time == LOG_END and ev.data["time_from"] == "log_end" and ev.step is None


def test_oom_reraised_by_ray_names_the_workers_phase() -> None:
    (ev,) = _events("oom_update_actor_ray_task.log", "oom")
    assert ev.data["phase"] == "update_actor" and ev.step == 2
    assert ev.data["tried_gib"] == 2.32 and ev.data["free_gib"] == 1.04 and ev.data["gpu"] == 3
    # the RayTaskError(OutOfMemoryError) line is the OOM itself, not a second failure
    assert not [e for e in _events("oom_update_actor_ray_task.log") if e.kind in FAILURE_KINDS]


def test_old_oom_message_format_in_generation() -> None:
    (ev,) = _events("oom_old_format_generate.log", "oom")
    assert ev.data["phase"] == "gen" and ev.data["gpu"] == 2
    assert ev.data["total_gib"] == 39.39 and ev.data["free_gib"] == 1.21
    assert ev.data["tried_gib"] == 1.53 and ev.data["allocated_gib"] == 35.71


def test_cuda_error_out_of_memory_and_vllm_cache_blocks_are_ooms() -> None:
    (ev,) = _events("oom_cuda_error_out_of_memory.log", "oom")
    assert ev.step == 12 and ev.time is not None
    assert not _events("oom_cuda_error_out_of_memory.log", "cuda_error")
    (kv,) = _events("oom_vllm_kv_cache.log", "oom")
    assert kv.data["where"] == "rollout engine KV cache"


def test_oom_sizes_in_mib_and_tib() -> None:
    data = oom_details("CUDA out of memory. Tried to allocate 512.00 MiB (GPU 1; 1.00 TiB total "
                       "capacity; 900.00 GiB already allocated; 256.00 MiB free; ...)")
    assert data == {"tried_gib": 0.5, "gpu": 1, "total_gib": 1024.0, "allocated_gib": 900.0,
                    "free_gib": 0.25}


def test_traceback_phase_takes_the_innermost_verl_method() -> None:
    frames = ['  File "x/ray_trainer.py", line 9, in fit',
              "ray.exceptions.RayTaskError(X): ray::WorkerDict.critic_compute_values() (pid=1)",
              '  File "x/fsdp_workers.py", line 3, in compute_values',
              '  File "x/torch/nn/modules/module.py", line 3, in _call_impl']
    assert traceback_phase(frames) == ("compute_values", "values")
    assert traceback_phase(['  File "x/ray_trainer.py", line 9, in fit']) is None


# --- NCCL -------------------------------------------------------------------------------------


def test_nccl_watchdog_timeout_with_rank_collective_sequence_and_timeout() -> None:
    evs = _events("nccl_watchdog_timeout.log", "nccl_timeout")
    # rank 38 prints it twice (log line and exception text): one event; rank 39 once, x6
    assert [(e.data["rank"], e.data.get("repeated", 1)) for e in evs] == [(38, 1), (39, 6)]
    first = evs[0]
    assert first.data["collective"] == "ALLREDUCE" and first.data["seq"] == 10
    assert first.data["timeout_s"] == 7200.0 and first.data["ran_s"] == 7200.015
    assert first.data["ip"] == "172.26.143.83" and first.step == 41


def test_nccl_watchdog_heartbeat_stuck() -> None:
    (ev,) = _events("nccl_watchdog_stuck.log", "nccl_timeout")
    assert ev.data["stuck_s"] == 480.0 and ev.data["rank"] == 6


@pytest.mark.parametrize(
    ("name", "code", "version"),
    [
        ("nccl_unhandled_cuda_error.log", "ncclUnhandledCudaError", "2.20.5"),
        ("nccl_remote_error.log", "ncclRemoteError", "2.21.5"),
        ("nccl_system_error.log", "ncclSystemError", "2.18.1"),
        ("nccl_internal_error.log", "ncclInternalError", "2.19.3"),
    ],
)
def test_nccl_errors_are_one_event_with_their_code(name: str, code: str, version: str) -> None:
    evs = _events(name, "nccl_error")
    assert [e.data["code"] for e in evs] == [code]  # the code line repeats it: one event
    assert evs[0].data["nccl_version"] == version


def test_nccl_error_from_vllm_megatron_and_a_communicator_abort() -> None:
    assert match_failure("RuntimeError: NCCL error: unhandled cuda error").data["code"] == (
        "ncclUnhandledCudaError")
    numbered = match_failure("[rank10]: RuntimeError: NCCL Error 2: unhandled system error (run "
                             "with NCCL_DEBUG=INFO for details)")
    assert numbered.data["code"] == "ncclSystemError" and numbered.data["rank"] == 10
    abort = match_failure("RuntimeError: NCCL communicator was aborted on rank 3.")
    assert abort.kind == "nccl_error" and abort.data["rank"] == 3


# --- Ray and killed workers -------------------------------------------------------------------


def test_ray_actor_died_and_its_worker_exit() -> None:
    evs = [e for e in _events("ray_actor_died.log") if e.kind in FAILURE_KINDS]
    assert [e.kind for e in evs] == ["actor_died", "worker_killed"]
    assert evs[0].data["exception"] == "ActorDiedError" and evs[0].step == 7
    assert evs[1].data["exit_type"] == "SYSTEM_ERROR"
    assert evs[1].data["detail"].startswith("Worker unexpectedly exits")
    # the traceback event still names the exception
    (tb,) = _events("ray_actor_died.log", "traceback")
    assert tb.data["type"] == "ray.exceptions.ActorDiedError"


def test_ray_unhandled_task_error_names_the_task() -> None:
    found = match_failure("(main_task pid=5634) Unhandled error (suppress with "
                          "'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::WorkerDict.ref_init_model() "
                          "(pid=866, ip=10.233.115.77)")
    assert found.kind == "actor_died" and found.data["task"] == "WorkerDict.ref_init_model"


def test_ray_task_error_names_its_cause_and_task() -> None:
    evs = [e for e in _events("ray_task_error_illegal_memory.log") if e.kind in FAILURE_KINDS]
    assert [e.kind for e in evs] == ["actor_died", "cuda_error"]
    assert evs[0].data["cause"] == "RuntimeError"
    assert evs[0].data["task"] == "WorkerDict.actor_rollout_generate_sequences"
    assert evs[1].data["error"] == "illegal memory access"


@pytest.mark.parametrize(
    ("name", "reason", "extra"),
    [
        ("raylet_worker_died.log", "system_error", {"exit_type": "SYSTEM_ERROR"}),
        ("ray_memory_pressure.log", "host_oom", {"count": 1}),
        ("ray_host_oom_task.log", "host_oom", {}),
        ("kernel_oom_killer.log", "host_oom", {"pid": 48213, "process": "ray::WorkerDict"}),
        ("shell_killed.log", "sigkill", {"pid": 6544}),
        ("segfault.log", "segfault", {}),
        ("dataloader_bus_error.log", "bus_error", {}),
    ],
)
def test_killed_or_crashed_workers(name: str, reason: str, extra: dict) -> None:
    evs = _events(name, "worker_killed")
    assert evs and evs[0].data["reason"] == reason and evs[0].data["fatal"] is True
    for key, value in extra.items():
        assert evs[0].data[key] == value


def test_intended_worker_exit_is_not_fatal() -> None:
    found = match_failure("Worker exit type: INTENDED_USER_EXIT Worker exit detail: Exit.")
    assert found.kind == "worker_killed" and found.data["fatal"] is False


# --- CUDA errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "error", "extra"),
    [
        ("cuda_illegal_memory_watchdog.log", "illegal memory access", {"rank": 2}),
        ("cuda_device_side_assert.log", "device-side assert", {}),
        ("cuda_ecc_error.log", "ECC", {"ip": "10.8.0.3"}),
        ("xid_fallen_off_bus.log", "Xid", {"xid": 79, "pci": "0000:3b:00"}),
    ],
)
def test_cuda_errors(name: str, error: str, extra: dict) -> None:
    (ev,) = _events(name, "cuda_error")
    assert ev.data["error"] == error and ev.data["fatal"] is True
    for key, value in extra.items():
        assert ev.data[key] == value


def test_application_xid_is_not_fatal() -> None:
    found = match_failure("NVRM: Xid (PCI:0000:1a:00): 13, pid=77, Graphics Exception")
    assert found.data["xid"] == 13 and found.data["fatal"] is False


def test_ordinary_lines_are_not_failures() -> None:
    for line in (
        "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
        "step:3 - actor/pg_loss:0.1 - timing_s/gen:10.0",
        "(WorkerDict pid=1) INFO: the watchdog timeout is set to 1800 s",
        "export NCCL_DEBUG=INFO",
        "loading /usr/lib/libnccl.so.2",
        "(TaskRunner pid=9)              'nccl_timeout': 600,",
        "Some common causes include: (1) the process was killed by the OOM killer due to high "
        "memory usage, (2) ray stop --force was called, or (3) the worker crashed unexpectedly "
        "due to SIGSEGV or another unexpected error.",
    ):
        assert match_failure(line) is None, line


def test_live_parser_gives_failures_their_arrival_time_and_dedups_until_a_step() -> None:
    parser = LogParser()
    line = ("[rank0]:[E1 00:00:00.0 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, "
            "NumelIn=544997376, NumelOut=68124672, Timeout(ms)=600000) ran for 600061 "
            "milliseconds before timing out.")
    (ev,) = parser.feed(line, arrival_time=50.0)
    assert ev.time == 50.0 and ev.data["collective"] == "_REDUCE_SCATTER_BASE"
    assert ev.data["numel"] == 544997376 and ev.data["timeout_s"] == 600.0
    assert parser.feed(line, arrival_time=51.0) == []
    parser.feed("step:5 - timing_s/gen:1.0 - timing_s/step:2.0", arrival_time=52.0)
    assert [e.kind for e in parser.feed(line, arrival_time=53.0)] == ["nccl_timeout"]


def test_a_traceback_names_the_innermost_ray_task_and_its_deepest_frames():
    """Ray re-raises a worker's exception through each caller (verl issue #1196's shape:
    RayTaskError(X): ray::WorkerDict.actor_rollout_generate_sequences() (pid=..., ip=...)
    then the worker's frames)."""
    from monitor.logs.failure_lines import short_path, traceback_origin

    lines = [
        "Traceback (most recent call last):",
        '  File "/opt/verl/verl/trainer/main_ppo.py", line 83, in run_ppo',
        "ray.exceptions.RayTaskError(OSError): ray::TaskRunner.run() (pid=1, ip=10.0.0.1)",
        '  File "/opt/verl/verl/single_controller/ray/base.py", line 48, in __call__',
        "ray.exceptions.RayTaskError(OSError): ray::WorkerDict.actor_rollout_generate_sequences()"
        " (pid=7948, ip=10.130.1.15, actor_id=8c21, repr=<WorkerDict object at 0x7f8b>)",
        '  File "verl/verl/workers/fsdp_workers.py", line 574, in generate_sequences',
        '  File "/cpfs/verl/verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py", line 262, '
        "in generate_sequences",
        '  File "/env/lib/python3.10/site-packages/vllm/entrypoints/llm.py", line 1397, in '
        "_run_engine",
        "OSError: [Errno 28] No space left on device",
    ]
    assert traceback_origin(lines) == {
        "task": "WorkerDict.actor_rollout_generate_sequences",
        "phase": "gen",
        "frame": "vllm/entrypoints/llm.py:1397 in _run_engine",
        "verl_frame": "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:262 in "
                      "generate_sequences",
        # the worker's frames (after its RayTaskError line), deepest last
        "frames": ["verl/workers/fsdp_workers.py:574 in generate_sequences",
                   "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:262 in "
                   "generate_sequences",
                   "vllm/entrypoints/llm.py:1397 in _run_engine"],
    }
    assert short_path("/usr/lib/python3/dist-packages/torch/x.py") == "torch/x.py"
    assert traceback_origin(["KeyError: 'x'"]) == {}


def test_a_ray_traceback_goes_on_past_the_carets_under_its_re_raised_lines():
    """Python 3.11+ marks each frame's failing expression (``^^^^``, ``~~^^``); real verl's
    driver traceback (0.5.0.dev on the H200, parameter offload with the HF rollout) has them
    right under Ray's re-raised ``RayTaskError(X): ray::...`` lines. The traceback used to end
    there, quoting ``RayTaskError(AssertionError): ray::TaskRunner.run()``; it now reaches the
    worker's frames and the root exception."""
    lines = [
        "Traceback (most recent call last):",
        '  File "/opt/verl/verl/trainer/main_ppo.py", line 83, in run_ppo',
        "    ray.get(runner.run.remote(config))",
        "ray.exceptions.RayTaskError(AssertionError): \x1b[36mray::TaskRunner.run()\x1b[39m "
        "(pid=3138, ip=127.0.0.1)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/opt/verl/verl/single_controller/ray/base.py", line 48, in __call__',
        "    output = ray.get(output)",
        "             ^^^^^^^^^^^^^^^",
        "           ~~~~~~~^^^^^^^^",
        "ray.exceptions.RayTaskError(AssertionError): ray::WorkerDict.actor_rollout_generate_"
        "sequences() (pid=4271, ip=127.0.0.1)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/opt/verl/verl/workers/rollout/hf_rollout.py", line 111, in _generate_minibatch',
        "    with param_ctx, torch.autocast(device_type=get_device_name(), dtype=torch.bfloat16):",
        '  File "/env/site-packages/torch/distributed/utils.py", line 164, in _p_assert',
        "    raise AssertionError(s)",
        "AssertionError: Expects tensor to be on the compute device cuda:0, was on cpu",
        "step:1 - timing_s/step:2.0",
    ]
    parser = LogParser()
    items = [item for line in lines for item in parser.feed(line)] + parser.flush()
    (ev,) = [e for e in items if getattr(e, "kind", "") == "traceback"]
    assert ev.message == ("AssertionError: Expects tensor to be on the compute device cuda:0, "
                          "was on cpu")
    assert ev.data["task"] == "WorkerDict.actor_rollout_generate_sequences"
    assert ev.data["verl_frame"] == ("verl/workers/rollout/hf_rollout.py:111 in "
                                     "_generate_minibatch")
