"""fatal_error and oom flags from the failure fixtures, through parse_file and run_all."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import load_config
from monitor.detect import make_context, run_all
from monitor.detect.fatal_error import detect_fatal_error
from monitor.detect.flag_advice import (
    FAILURE_ADVICE,
    INVENTED_KEYS,
    OOM_PHASE_ADVICE,
    REAL_KEYS,
    failure_advice,
    named_keys,
    oom_advice,
)
from monitor.detect.health import detect_oom
from monitor.frames import empty_gpu_frame, empty_host_frame
from monitor.logs.canonical_records import LogParser, parse_file
from monitor.records import Event

FIXTURES = Path(__file__).parent / "fixtures" / "logs" / "failures"
LOG_END = 1_750_000_000.0


def _flags(name: str) -> list:
    parsed = parse_file(FIXTURES / name, log_end=LOG_END)
    return run_all(parsed.steps, empty_gpu_frame(), empty_host_frame(), parsed.events)


def _only(name: str, kind: str):
    flags = [f for f in _flags(name) if f.severity in ("warning", "critical")]
    assert [f.kind for f in flags] == [kind], [(f.kind, f.evidence) for f in flags]
    assert flags[0].severity == "critical"
    return flags[0]


# --- oom ---------------------------------------------------------------------------------------


def test_oom_pasted_alone_is_a_critical_flag_with_sizes_and_phase_advice() -> None:
    f = _only("oom_compute_log_prob_traceback.log", "oom")
    assert "in compute_log_prob (phase old_log_prob)" in f.evidence
    assert "asked for 13.91 GiB with 8.85 GiB free of 79.11 GiB on GPU 0" in f.evidence
    assert "no time for it, so it is placed at the end of the log" in f.evidence
    assert f.start == LOG_END and f.end is None and f.scope["phase"] == "old_log_prob"
    assert "log_prob_micro_batch_size_per_gpu" in f.advice[0]


@pytest.mark.parametrize(
    ("name", "phase", "lever"),
    [
        ("oom_update_actor_ray_task.log", "update_actor", "ppo_micro_batch_size_per_gpu"),
        ("oom_old_format_generate.log", "gen", "rollout.gpu_memory_utilization"),
    ],
)
def test_oom_advice_fits_the_phase(name: str, phase: str, lever: str) -> None:
    f = _only(name, "oom")
    assert f.scope["phase"] == phase and lever in f.advice[0]
    assert "free" in f.evidence and "asked for" in f.evidence


def test_vllm_cache_blocks_oom_asks_for_more_engine_memory() -> None:
    f = _only("oom_vllm_kv_cache.log", "oom")
    assert f.advice[0].startswith("The rollout engine found no memory for its KV cache")
    assert "raise actor_rollout_ref.rollout.gpu_memory_utilization" in f.advice[0]


def test_oom_events_without_any_time_are_placed_at_zero_and_say_so() -> None:
    parser = LogParser()
    events = parser.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."
                         " GPU 0 has a total capacity of 79.11 GiB of which 0.50 GiB is free.")
    assert events[0].time is None
    flags = run_all([], empty_gpu_frame(), empty_host_frame(), events)
    assert [(f.kind, f.start) for f in flags] == [("oom", 0.0)]
    assert "placed at time 0" in flags[0].evidence


def test_the_old_detector_skipped_untimed_ooms() -> None:
    """The case issue 15 reports: an oom event with no time used to raise nothing."""
    ctx = make_context([], empty_gpu_frame(), empty_host_frame(),
                       [Event("oom", None, None, "CUDA out of memory")], load_config(), now=100.0)
    flags = detect_oom(ctx)
    assert len(flags) == 1 and flags[0].start == 100.0
    assert "placed at the end of the data" in flags[0].evidence


# --- fatal_error -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "evidence", "advice"),
    [
        ("nccl_watchdog_timeout.log",
         "NCCL watchdog timeout on rank 38: ALLREDUCE (sequence number 10) ran 2.0 h against a "
         "2 h timeout (worker at 172.26.143.83), after step 41; 3 failure lines in all "
         "(7 nccl_timeout, 1 worker_killed)", "never reached that sequence number"),
        ("nccl_watchdog_stuck.log", "the NCCL watchdog was stuck for 480 s on rank 6",
         "NCCL_DEBUG=INFO"),
        ("nccl_unhandled_cuda_error.log", "NCCL error ncclUnhandledCudaError (unhandled cuda "
         "error) (worker at 10.0.1.12)", "ncclUnhandledCudaError is a CUDA failure"),
        ("nccl_remote_error.log", "NCCL error ncclRemoteError", "a peer or the network failed"),
        ("nccl_system_error.log", "NCCL error ncclSystemError", "a peer or the network failed"),
        ("nccl_internal_error.log", "NCCL error ncclInternalError", "NCCL_DEBUG=INFO"),
        ("ray_actor_died.log", "exit type SYSTEM_ERROR (Worker unexpectedly exits with a "
         "connection error code 2), after step 7; 2 failure lines in all (1 actor_died, "
         "1 worker_killed)", "host OOM killer"),
        ("ray_task_error_illegal_memory.log", "CUDA error: illegal memory access; 2 failure "
         "lines in all (1 actor_died, 1 cuda_error)", "CUDA_LAUNCH_BLOCKING=1"),
        ("raylet_worker_died.log", "a worker died of a system error", "host OOM killer"),
        ("ray_memory_pressure.log", "1 worker(s) killed for lack of host memory, after step 118",
         "The host ran out of memory"),
        ("ray_host_oom_task.log", "killed for lack of host memory", "param_offload"),
        ("kernel_oom_killer.log", "a worker (pid 48213) killed for lack of host memory",
         "The host ran out of memory"),
        ("shell_killed.log", "a worker (pid 6544) killed by SIGKILL, after step 15", "dmesg"),
        ("segfault.log", "crashed with a segmentation fault", "A native crash"),
        ("dataloader_bus_error.log", "bus error (SIGBUS)", "/dev/shm"),
        ("cuda_illegal_memory_watchdog.log", "CUDA error: illegal memory access on rank 2",
         "CUDA_LAUNCH_BLOCKING=1"),
        ("cuda_device_side_assert.log", "CUDA error: device-side assert", "index out of range"),
        ("cuda_ecc_error.log", "CUDA error: ECC (worker at 10.8.0.3)", "nvidia-smi -q -d ECC"),
        ("xid_fallen_off_bus.log", "GPU XID 79 on 0000:3b:00", "drain the node"),
    ],
)
def test_each_failure_is_one_critical_fatal_error(name: str, evidence: str, advice: str) -> None:
    f = _only(name, "fatal_error")
    assert evidence in f.evidence, f.evidence
    assert f.evidence.startswith("The run hit a fatal error: ")
    assert advice in f.advice[0], f.advice[0]
    assert f.advice[-1].startswith("Resume from the last checkpoint")
    assert f.end is None  # the run did not go on


def test_failures_after_a_cuda_oom_are_left_to_the_oom_flag() -> None:
    t = 1000.0
    events = [Event("oom", t, 5, "CUDA out of memory. Tried to allocate 2.00 GiB"),
              Event("actor_died", t + 3, 5, "ActorDiedError", {"exception": "ActorDiedError"}),
              Event("nccl_timeout", t + 590, 5, "Watchdog", {"collective": "ALLREDUCE", "seq": 1})]
    flags = run_all([], empty_gpu_frame(), empty_host_frame(), events)
    assert [f.kind for f in flags] == ["oom"]
    later = events + [Event("cuda_error", t + 4000, 9, "ECC", {"error": "ECC"})]
    flags = run_all([], empty_gpu_frame(), empty_host_frame(), later)
    assert [f.kind for f in flags] == ["oom", "fatal_error"]


def test_bursts_far_apart_are_two_flags_and_a_run_that_went_on_closes_the_first() -> None:
    from detect_builders import make_steps

    steps = make_steps(20)
    t1 = steps[4].end_time + 1
    t2 = steps[-1].end_time + 5
    events = [Event("nccl_error", t1, 4, "x", {"code": "ncclRemoteError"}),
              Event("nccl_error", t1 + 2, 4, "x", {"code": "ncclRemoteError", "rank": 3}),
              Event("worker_killed", t2, 19, "x", {"reason": "segfault"})]
    ctx = make_context(steps, empty_gpu_frame(), empty_host_frame(), events, load_config())
    flags = detect_fatal_error(ctx)
    assert [(f.start, f.end) for f in flags] == [(t1, steps[5].end_time), (t2, None)]
    assert "training continued afterwards" in flags[0].evidence
    assert "2 failure lines in all (2 nccl_error)" in flags[0].evidence


def test_non_fatal_failure_lines_raise_nothing() -> None:
    events = [Event("cuda_error", 10.0, None, "Xid 13", {"error": "Xid", "xid": 13,
                                                       "fatal": False}),
              Event("worker_killed", 11.0, None, "exit", {"reason": "intended_exit",
                                                          "fatal": False})]
    ctx = make_context([], empty_gpu_frame(), empty_host_frame(), events, load_config())
    assert detect_fatal_error(ctx) == []


def test_failure_and_oom_advice_name_only_real_keys() -> None:
    sentences = [s for v in FAILURE_ADVICE.values() for s in v]
    sentences += [s for v in OOM_PHASE_ADVICE.values() for s in v]
    sentences += oom_advice(None, {"where": "rollout engine KV cache"})
    for sentence in sentences:
        for key in named_keys(sentence):
            assert key in REAL_KEYS, key
        for key in INVENTED_KEYS:
            assert key not in sentence
    assert failure_advice("worker_killed", {"reason": "bus_error"})[0].startswith("SIGBUS")
    assert failure_advice("worker_killed", {"reason": "unknown"})[0].startswith("A worker process")


# --- a task's own exception, quoted with where it happened (issue 28 item 10) -----------------


def test_a_tasks_exception_is_quoted_with_its_task_and_frame_and_advised_by_its_message():
    """Real verl 0.5.0.dev on the H200 with parameter offload and the HF rollout failed at its
    first generation; Ray re-raised the worker's AssertionError through TaskRunner.run. The flag
    said "a Ray worker died ... the host OOM killer"; it now quotes the exception, the worker
    method and the deepest frames, and advises the offload with the HF rollout."""
    parsed = parse_file(FIXTURES / "ray_task_assertion_hf_offload.log", log_end=LOG_END)
    (flag,) = [f for f in run_all(parsed.steps, None, None, parsed.events)
               if f.kind == "fatal_error"]
    assert ("AssertionError: Expects tensor to be on the compute device cuda:0, was on cpu, "
            "in WorkerDict.actor_rollout_generate_sequences (gen)") in flag.evidence
    assert "at torch/distributed/utils.py:167 in _p_assert" in flag.evidence
    assert "verl/workers/rollout/hf_rollout.py:112 in _generate_minibatch" in flag.evidence
    first = flag.advice[0]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=False" in first
    assert "HF rollout" in first
    assert not any("OOM killer" in a for a in flag.advice)
    # a bare worker death still gets the worker-death advice
    died = failure_advice("actor_died", {"exception": "RayActorError", "cause": None})
    assert died[0].startswith("A Ray worker died")


def test_the_same_device_error_outside_generation_gets_the_general_offload_advice():
    data = {"exception": "RayTaskError", "cause": "AssertionError", "phase": "old_log_prob",
            "task": "WorkerDict.actor_rollout_compute_log_prob",
            "message": "AssertionError: Expects tensor to be on the compute device cuda:0, was "
                       "on cpu"}
    advice = failure_advice("actor_died", data)
    assert advice[0].startswith("A module was on the CPU when its pass ran")
    assert "HF rollout" not in advice[0]


def test_analyze_tells_the_advice_what_the_printed_config_already_has(capsys):
    import json

    from cli.main import main

    assert main(["analyze", str(FIXTURES / "ray_task_assertion_hf_offload.log"), "--json"]) == 0
    (flag,) = json.loads(capsys.readouterr().out)["flags"]
    first = flag["advice"][0]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload (True in this job)" in first
    assert "actor_rollout_ref.rollout.name ('hf' in this job)" in first
    assert "trainer.save_freq (-1 in this job)" in flag["advice"][-1]


# --- a printed exception that ends the run (issue 37 item 4) ---------------------------------


def _parsed(lines: list[str]) -> tuple[list, list]:
    """Steps and events of ``lines``, each line arriving one second after the one before."""
    parser = LogParser()
    items = [i for n, line in enumerate(lines) for i in parser.feed(line, 1000.0 + n)]
    items += parser.flush(1000.0 + len(lines))
    return ([i for i in items if not isinstance(i, Event)],
            [i for i in items if isinstance(i, Event)])


_STEPS = [f"step:{n} - timing_s/gen:1.0 - timing_s/step:2.0" for n in (1, 2, 3)]
_CRASH = ["Traceback (most recent call last):",
          '  File "/srv/rl/verl/trainer/ppo/ray_trainer.py", line 950, in fit',
          "    scores = my_reward(batch)",
          '  File "/srv/rl/rewards/judge.py", line 12, in my_reward',
          "    return table[name]",
          "KeyError: 'gsm_hard'"]


def test_a_plain_traceback_that_ends_the_run_is_a_fatal_error_quoting_it() -> None:
    """No Ray line, no failure line: the driver's own traceback, then nothing."""
    steps, events = _parsed(_STEPS + _CRASH)
    (flag,) = [f for f in run_all(steps, None, None, events) if f.kind == "fatal_error"]
    assert flag.severity == "critical" and flag.end is None
    assert "KeyError: 'gsm_hard', at /srv/rl/rewards/judge.py:12 in my_reward" in flag.evidence
    assert "after step 3" in flag.evidence
    assert flag.advice[0].startswith("The run raised KeyError at /srv/rl/rewards/judge.py:12")
    assert not any("OOM killer" in a for a in flag.advice)


def test_an_exception_the_run_went_on_after_raises_nothing() -> None:
    """The premise fails: a step completed after the traceback, so it did not end the run."""
    steps, events = _parsed(_STEPS[:2] + _CRASH + _STEPS[2:])
    assert [e.kind for e in events].count("traceback") == 1
    assert [f.kind for f in run_all(steps, None, None, events)] == []


def test_the_same_error_printed_again_at_the_end_raises_nothing() -> None:
    """A worker prints the same traceback for sample after sample while steps complete; the
    copy of the log ends after one more: it is not what ended the run."""
    def said(n: int) -> list[str]:
        return ["(CursorWorker pid=5) Traceback (most recent call last):",
                '(CursorWorker pid=5)   File "/srv/app/parse.py", line 40, in parse',
                f"(CursorWorker pid=5) ValueError: step {n} - could not parse answer {n * 7}"]

    steps, events = _parsed([*said(1), _STEPS[0], *said(2), _STEPS[1], *said(3)])
    assert [e.kind for e in events].count("traceback") == 3
    assert run_all(steps, None, None, events) == []


def test_an_exceptions_line_alone_among_the_steps_raises_nothing() -> None:
    """A worker's print of an error it handled (the line, no traceback) after the last step:
    a run that dies of an exception prints its traceback. The same line quoted alone, with no
    step record, is all a quote has, and is read (tests/test_detect_crash_causes.py)."""
    steps, events = _parsed([*_STEPS, "(Worker pid=5) ValueError: no <answer> tag in reply"])
    assert [e.kind for e in events].count("traceback") == 1
    assert run_all(steps, None, None, events) == []


def test_an_exception_after_the_run_finished_raises_nothing_and_says_why() -> None:
    """The last bar drawing at its total and the final validation: a DataLoader worker killed
    as the job shuts down is the premise run_not_finished failing, listed as such."""
    from monitor.detect import make_context
    from monitor.detect.fatal_error import detect_fatal_error

    lines = [_STEPS[0],
             "Training Progress: 100%|██████████| 1/1 [03:00<00:00, 180.0s/it]",
             "'Final validation metrics: None'",
             "Traceback (most recent call last):",
             '  File "/env/site-packages/torch/utils/data/_utils/signal_handling.py", line 73, '
             "in handler",
             "RuntimeError: DataLoader worker (pid 34604) is killed by signal: Killed."]
    steps, events = _parsed(lines)
    ctx = make_context(steps, None, None, events, load_config())
    assert detect_fatal_error(ctx) == []
    (judged,) = [j for j in ctx.judged if j.reading == "fatal_error.exception"]
    assert judged.holds is False and judged.premise == "run_not_finished"


def test_a_traceback_a_logger_printed_was_caught_and_raises_nothing() -> None:
    lines = ["ERROR:2026-03-01 10:00:00,000:Traceback (most recent call last):",
             '  File "/srv/app/env.py", line 10, in update',
             "TypeError: cannot unpack non-iterable NoneType object"]
    steps, events = _parsed(_STEPS + lines)
    assert [e.data.get("logged") for e in events if e.kind == "traceback"] == [True]
    assert run_all(steps, None, None, events) == []


def test_a_warning_that_names_a_missing_module_is_not_a_failure() -> None:
    """vLLM's RuntimeWarning 'Failed to read commit hash: No module named vllm._version' is
    caught by vLLM (verl issue 393): no exception, no flag."""
    steps, events = _parsed([
        "(pid=88) /env/site-packages/vllm/connections.py:8: RuntimeWarning: Failed to read "
        "commit hash:",
        "(pid=88) No module named 'vllm._version'",
        "(pid=88)   from vllm.version import __version__ as VLLM_VERSION"])
    assert [e for e in events if e.kind == "traceback"] == []
    assert run_all(steps, None, None, events) == []
