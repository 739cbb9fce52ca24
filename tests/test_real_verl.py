"""Real verl on one H200, judged offline: the recordings of ``bench/real_verl``.

Each ``tests/fixtures/real_verl/<case>`` folder is one run of verl itself (commit 4c3310db,
0.5.0.dev: GRPO, the HF rollout, FSDP, a random-init 55M Qwen2) under the project's own
``verl-monitor run`` with the NVML exporter: the console log it captured (``train.log``) and
its capture-time sidecar, the store exported (``train.jsonl``, ``gpu.csv``, ``host.csv``,
``events.json``), py-spy dumps of the TaskRunner, WorkerDict and DataLoader-worker processes
every 10 s (``stacks/``), and ``meta.json``: what was injected, at which step and when. They are
judged the way a user would, through ``verl-monitor analyze LOG --gpu --host --events --stacks
--json``: a healthy run raises no warning but the one its NaN gradients earn (with sdpa
attention every step's gradients were NaN and verl skipped every optimizer step: one critical
``skipped_updates`` flag; with eager attention nothing at all); each fault is named (hangs within 90 s of the last
progress, the others within 3 steps of the fault) with the right first line of advice. The
second session's recordings (``*_live``, ``healthy_val``, ``tiny_micro``: five runs side by side)
also carry the flags the live exporter raised while the run went on (``flags_live.json``) and
its own dumps (``stacks_live/``); those are judged too. The third session's (2026-12-02)
add a 0.4B and a 1.5B model with and without optimizer offload, and PPO with a critic (its
attention switched to sdpa by the harness: verl 4c3310db hard-codes flash_attention_2 there).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
from pathlib import Path

import pytest

from monitor.cli import main as cli

FIXTURES = Path(__file__).parent / "fixtures" / "real_verl"
#: Tests of one recording run on one worker under xdist (tests/scheduling.py): its analysis
#: is cached per process, so it is read once.
GROUP_BY_PARAM = "run"
#: Every recording replayed through the whole analysis: seconds of CPU in all, so ``make test``
#: runs it, not the fast loop.
pytestmark = pytest.mark.slow
RUNS = sorted(p.name for p in FIXTURES.iterdir() if (p / "meta.json").exists())
ALARM = ("warning", "critical")
HEALTHY = ["healthy", "healthy_val_ckpt", "healthy_val"]
#: The third session (2026-12-02): the 0.4B model with and without optimizer offload and PPO
#: with a critic (ppo_critic_sdpa), side by side; then the 1.5B model with and without it, one
#: after the other, and PPO with a critic beside the plain job, all with eager attention (sdpa
#: gave NaN gradients on every step, so verl skipped every optimizer step).
HEALTHY_NEW = ["healthy_big", "ppo_critic_sdpa", "healthy_xl", "ppo_critic", "healthy_eager"]
OFFLOAD = {"opt_offload": "healthy_big", "opt_offload_xl": "healthy_xl"}  # fault: its baseline
#: The second device session (monitor 0b9f693, five runs side by side on the one GPU): the hang
#: cases again, with the flags the live exporter itself raised (``flags_live.json``).
LIVE_HANGS = ["hang_reward_live", "hang_http_live", "hang_data_live"]
#: Runs with eager attention (meta ``attn``): finite gradients, verl stepped the optimizer.
#: The others (sdpa, the harness's default) had NaN gradients on every step; param_offload died
#: in generation before any update.
EAGER = ["healthy_xl", "opt_offload_xl", "ppo_critic", "healthy_eager"]
NO_UPDATE = ["param_offload"]
#: eager attention with a fault of its own (its gradients are finite too)
EAGER_FAULTS = ["tiny_micro_eager"]
NAN_GRADS = [r for r in RUNS if r not in EAGER + EAGER_FAULTS + NO_UPDATE]
SKIPPED = "skipped_updates"
TQDM = re.compile(r"Training Progress:\s+\d+%\|[^|]*\|\s*(\d+)/\d+ \[(\d+):(\d+)<")


@functools.cache
def _analyze(run: str, log: str = "train.log") -> dict:
    d = FIXTURES / run
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(["analyze", str(d / log), "--gpu", str(d / "gpu.csv"), "--host",
                  str(d / "host.csv"), "--events", str(d / "events.json"), "--stacks",
                  str(d / "stacks"), "--json"])
    assert rc == 0, out.getvalue()[-2000:]
    return json.loads(out.getvalue())


def _meta(run: str) -> dict:
    return json.loads((FIXTURES / run / "meta.json").read_text())


def _all_alarms(run: str) -> list[dict]:
    return [f for f in _analyze(run)["flags"] if f["severity"] in ALARM]


def _alarms(run: str) -> list[dict]:
    """The warnings and criticals but the skipped_updates flag of the sdpa runs' NaN gradients
    (judged on its own in ``test_nan_gradients_...``)."""
    return [f for f in _all_alarms(run) if f["kind"] != SKIPPED]


def _expected_skips(run: str) -> list[str]:
    return [SKIPPED] if run in NAN_GRADS else []


def _live_flags(run: str) -> list[dict]:
    """The flags the live exporter raised during the run (its store's ``flags`` table)."""
    path = FIXTURES / run / "flags_live.json"
    return json.loads(path.read_text()) if path.exists() else []


def _step_of(report: dict, t: float) -> int:
    """The step a time falls in: the first step that ends at or after it."""
    steps = sorted(report["steps"], key=lambda s: s["end_time"])
    for s in steps:
        if t <= s["end_time"] + 0.5:
            return s["step"]
    return steps[-1]["step"] + 1


def _last_progress_before(report: dict, t: float) -> float:
    return max(s["end_time"] for s in report["steps"] if s["end_time"] <= t)


def test_the_recordings_are_here():
    assert set(HEALTHY) <= set(RUNS)
    faults = {"hang_reward", "hang_http", "hang_data", "cpu_reward", "mem_grow", "param_offload",
              "tiny_micro", *LIVE_HANGS, *OFFLOAD, *HEALTHY_NEW, *EAGER_FAULTS}
    assert faults <= set(RUNS), sorted(faults - set(RUNS))
    for run in RUNS:
        meta = _meta(run)
        assert meta["verl_commit"].startswith("4c3310db") and meta["rollout"] == "hf"
        stacks = list((FIXTURES / run / "stacks").glob("*_*_*.txt"))
        assert any("_TaskRunner_" in f.name for f in stacks), run


@pytest.mark.parametrize("run", HEALTHY)
def test_a_healthy_real_run_raises_only_the_skipped_updates_flag(run):
    """Plain, with a validation every 2 steps and a checkpoint every 3, and with a validation
    every 2 steps beside four other jobs on the GPU: all quiet, offline and live, but for the
    skipped updates of their NaN gradients (sdpa)."""
    kinds = [f["kind"] for f in _all_alarms(run)]
    assert kinds == [SKIPPED], [(f["kind"], f["evidence"][:160]) for f in _all_alarms(run)]
    assert _analyze(run)["summary"]["steps"]["count"] == _meta(run)["steps"]
    assert [f for f in _live_flags(run) if f["severity"] in ALARM] == []


@pytest.mark.parametrize("run", ["healthy", "healthy_val_ckpt", "hang_reward", "cpu_reward",
                                 "mem_grow", "healthy_val", "tiny_micro", "hang_reward_live"])
def test_the_wall_time_is_the_logs_own_clock(run):
    """tqdm's elapsed time (whole seconds) against the time analyze measured."""
    text = (FIXTURES / run / "train.log").read_text(errors="replace")
    done, mm, ss = TQDM.findall(text)[-1]
    wall = _analyze(run)["summary"]["wall"]
    assert int(done) == _meta(run)["steps"]
    assert abs(wall["span_s"] - (int(mm) * 60 + int(ss))) <= 1.5, wall


def test_the_console_log_and_the_jsonl_give_one_version():
    console, jsonl = _analyze("healthy"), _analyze("healthy", "train.jsonl")
    assert console["version_guess"] == jsonl["version_guess"]
    assert "0.5" in console["version_guess"]


def test_a_cpu_heavy_reward_is_named_in_the_reward_phase_with_verls_async_reward_knob():
    report, meta = _analyze("cpu_reward"), _meta("cpu_reward")
    alarms = _alarms("cpu_reward")
    assert [f["kind"] for f in alarms] == ["phase_imbalance"], alarms
    f = alarms[0]
    assert f["scope"]["phase"] == "reward"
    assert _step_of(report, f["start"]) <= meta["fault_step"] + 3
    assert "CPU" in f["evidence"] and "reward" in f["evidence"]
    assert "reward_model.launch_reward_fn_async" in f["advice"][0]


HANGS = {
    # case: (what the evidence must name, words of the first advice line)
    "hang_reward": (["scoring rewards", "_stuck_in_verifier (rewards.py:", "[phase reward]"],
                    ["compute_score"]),
    "hang_http": (["HTTP", "http_block (rewards.py:", "[phase reward]"], ["timeout"]),
    "hang_data": (["data loader", "_wait_for_shard (blocking_dataset.py:"],
                  ["data loader", "dataloader_num_workers"]),
}


@pytest.mark.parametrize("run", sorted(HANGS) + LIVE_HANGS)
def test_a_real_hang_is_one_critical_flag_within_90_s_naming_the_process_and_frame(run):
    report, meta = _analyze(run), _meta(run)
    alarms = _alarms(run)
    assert [f["kind"] for f in alarms] == ["hang"], [(f["kind"], f["evidence"]) for f in alarms]
    f = alarms[0]
    assert f["severity"] == "critical"
    assert f["start"] - _last_progress_before(report, f["start"]) <= 90.0
    marker = next(iter(meta["injected"].values()))
    assert f"PID {marker['pid']}" in f["evidence"]  # the process that holds the fault
    words, advice = HANGS[run.removesuffix("_live")]
    assert all(w in f["evidence"] for w in words), f["evidence"]
    assert all(w in f["advice"][0] for w in advice), f["advice"][0]
    assert "No rank waits in a collective" in report["hang"]["stacks"]["summary"]


@pytest.mark.parametrize("run", ["hang_data", "hang_data_live"])
def test_a_blocked_loader_is_named_as_the_dataloader_worker_in_the_data_phase(run):
    f = _alarms(run)[0]
    worker = _meta(run)["injected"]["data_block"]["pid"]
    assert f"the driver (PID {worker}" not in f["evidence"]
    assert re.search(rf"(data[- ]?loader|DataLoader) worker \(PID {worker}[,)]", f["evidence"])
    assert "[phase data" in f["evidence"]


LIVE = {
    # case: (the role and what it does, the frame: function (file:line))
    "hang_reward_live": ("the driver", "is scoring rewards", "_stuck_in_verifier (rewards.py:96)"),
    "hang_http_live": ("the driver", "is scoring rewards (compute_score waits for an HTTP answer)",
                       "http_block (rewards.py:109)"),
    "hang_data_live": ("the data loader worker", "waits in the data loader",
                       "_wait_for_shard (blocking_dataset.py:53)"),
}


def _names(evidence: str, run: str) -> re.Match | None:
    """The clause of ``evidence`` naming the faulty process: its role, pid, node and frame."""
    role, doing, frame = LIVE[run]
    pid = next(iter(_meta(run)["injected"].values()))["pid"]
    return re.search(rf"{re.escape(role)} \(PID {pid}, node h200\) {re.escape(doing)}[^;]*?, "
                     rf"at {re.escape(frame)}", evidence)


@pytest.mark.parametrize("run", LIVE_HANGS)
def test_the_live_exporter_raised_one_critical_hang_within_90_s_naming_who_and_where(run):
    """What the user saw while it ran: the exporter's own flag, from its store."""
    live = _live_flags(run)
    assert [(f["kind"], f["severity"]) for f in live] == [("hang", "critical")], live
    f = live[0]
    opened = f["start"] - _last_progress_before(_analyze(run), f["start"])
    assert 0 < opened <= 90.0, opened
    assert _names(f["evidence"], run), f["evidence"]
    assert "No rank waits in a collective: NCCL is not the cause" in f["evidence"]
    assert all(w in f["advice"][0] for w in HANGS[run.removesuffix("_live")][1]), f["advice"][0]


@pytest.mark.parametrize("run", LIVE_HANGS)
def test_offline_analyze_names_the_same_process_and_frame_as_the_live_flag(run):
    offline = _alarms(run)[0]
    assert _names(offline["evidence"], run), offline["evidence"]
    assert offline["advice"][0].split(" (")[0] == _live_flags(run)[0]["advice"][0].split(" (")[0]


def test_a_reward_stuck_for_100_s_then_done_closes_the_live_flag_when_steps_resume():
    meta = _meta("hang_reward_live")
    f = _live_flags("hang_reward_live")[0]
    assert f["end"] is not None and f["end"] >= meta["injected"]["reward_hang_end"]["ts"]
    assert _analyze("hang_reward_live")["summary"]["steps"]["count"] == meta["steps"]


def test_micro_batches_of_one_are_named_low_utilization_with_the_knobs_as_first_advice():
    """ppo_micro_batch_size_per_gpu=1 and log_prob_micro_batch_size_per_gpu=1: the GPUs idle
    with no core pegged; the job's printed config says why. Step 1 is warm-up (not judged), so
    the fault is judged from step 2."""
    report = _analyze("tiny_micro")
    alarms = _alarms("tiny_micro")
    assert [f["kind"] for f in alarms] == ["low_utilization"], alarms
    f = alarms[0]
    assert f["severity"] == "critical"
    assert _step_of(report, f["start"]) <= 2 + 3
    assert f["advice"][0].startswith("ppo_micro_batch_size_per_gpu is 1 in this job "
                                     "(actor_rollout_ref.actor) and "
                                     "log_prob_micro_batch_size_per_gpu is 1"), f["advice"][0]
    assert "raise them" in f["advice"][0] and "use_dynamic_bsz" in f["advice"][0]


def test_micro_batches_of_one_live_the_flag_the_last_step_completes_reaches_the_store():
    """Recorded on the H200 after the live monitor learned to judge a finished run once more:
    micro-batches of one (eager attention, 5 steps) need 4 whole steps after the warm-up, so
    only the last step completes low utilization, and the run ends right after it. The live
    exporter's store has the flag (steps 2-5, critical, closed as run finished) with the
    job's printed values in its first advice, as offline analyze has it. The sdpa recording
    before it (``tiny_micro``) had no live flag at all."""
    live = [f for f in _live_flags("tiny_micro_eager") if f["severity"] in ALARM]
    assert [(f["kind"], f["severity"], f["scope"]) for f in live] == [
        ("low_utilization", "critical", {"steps": [2, 5]})], live
    assert "(run finished: " in live[0]["evidence"] and live[0]["end"] is not None
    assert live[0]["advice"][0].startswith("ppo_micro_batch_size_per_gpu is 1 in this job "
                                           "(actor_rollout_ref.actor)"), live[0]["advice"][0]
    offline = _all_alarms("tiny_micro_eager")
    assert [(f["kind"], f["severity"], f["scope"]) for f in offline] == [
        (f["kind"], f["severity"], f["scope"]) for f in live]
    assert offline[0]["advice"][0] == live[0]["advice"][0]
    assert [f for f in _live_flags("tiny_micro") if f["severity"] in ALARM
            and f["kind"] == "low_utilization"] == []


def test_runs_side_by_side_say_so():
    for run in [*LIVE_HANGS, "healthy_val", "tiny_micro"]:
        meta = _meta(run)
        assert len(meta["concurrent_with"]) == 4 and "side by side" in meta["side_by_side"]
        assert set(meta["concurrent_with"]) <= set(RUNS), meta["concurrent_with"]


def test_gpu_memory_kept_every_step_is_named_within_3_steps():
    # 2-3 s steps sampled each second: each step's floor (its lowest sample) climbs 4 GiB a step
    report, meta = _analyze("mem_grow"), _meta("mem_grow")
    hits = [f for f in _alarms("mem_grow") if f["kind"] == "memory_creep"]
    assert hits
    assert _step_of(report, hits[0]["start"]) <= meta["fault_step"] + 3
    assert hits[0]["evidence"].startswith("GPU 0 on node h200 (each step's lowest sample): "
                                          "memory grows steadily"), hits[0]["evidence"]
    assert "at +4.0 GiB per step" in hits[0]["evidence"]
    assert hits[0]["advice"][0].startswith("Memory that grows every step is kept across steps")
    # 34 of 141 GiB is no pressure
    assert not [f for f in _analyze("mem_grow")["flags"] if f["kind"] == "memory_pressure"]


def test_parameter_offload_with_the_hf_rollout_is_a_fatal_error_not_an_oom():
    alarms = _alarms("param_offload")
    assert [f["kind"] for f in alarms] == ["fatal_error"]
    f = alarms[0]
    assert f["severity"] == "critical" and "AssertionError" in f["evidence"]
    assert "OOM" not in f["advice"][0] and "out of memory" not in f["advice"][0]


def test_a_fatal_error_quotes_its_message_and_the_worker_call_that_raised_it():
    # the driver's traceback goes on past Ray's re-raised lines and their ^^^^ markers to the
    # worker's frames and the root exception
    f = _alarms("param_offload")[0]
    assert "Expects tensor to be on the compute device cuda:0, was on cpu" in f["evidence"]
    assert "WorkerDict.actor_rollout_generate_sequences" in f["evidence"]
    assert "verl/workers/rollout/hf_rollout.py:111 in _generate_minibatch" in f["evidence"]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=False" in f["advice"][0]
    assert "HF rollout" in f["advice"][0]


def _tqdm_elapsed(run: str) -> tuple[int, int]:
    """Steps done and whole seconds elapsed on the run's last tqdm line."""
    done, mm, ss = TQDM.findall((FIXTURES / run / "train.log").read_text(errors="replace"))[-1]
    return int(done), int(mm) * 60 + int(ss)


@pytest.mark.parametrize("run", HEALTHY_NEW)
def test_the_0_4b_and_1_5b_models_and_ppo_with_a_critic_raise_no_other_warning(run):
    """Nothing on the eager runs; only the skipped-updates flag on the sdpa ones."""
    kinds = [f["kind"] for f in _all_alarms(run)]
    assert kinds == _expected_skips(run), [(f["kind"], f["evidence"][:160])
                                           for f in _all_alarms(run)]
    assert _analyze(run)["summary"]["steps"]["count"] == _meta(run)["steps"]
    assert [f for f in _live_flags(run) if f["severity"] in ALARM] == []


@pytest.mark.parametrize("run", [*HEALTHY_NEW, *OFFLOAD, *EAGER_FAULTS])
def test_the_wall_time_is_tqdms_within_a_second(run):
    """tqdm prints whole seconds (rounded down, and its clock starts before step 1's timer)."""
    done, elapsed = _tqdm_elapsed(run)
    assert done == _meta(run)["steps"]
    span = _analyze(run)["summary"]["wall"]["span_s"]
    assert abs(span - elapsed) < 1.0, (span, elapsed)


@pytest.mark.parametrize("run,attn", [("ppo_critic", "eager"), ("ppo_critic_sdpa", "sdpa")])
def test_ppo_with_a_critic_reads_the_critics_phases_and_shares_add_up(run, attn):
    """GAE: verl times the critic's value pass (values) and its update (update_critic) in every
    step; the critic's attention was the harness's switch (for verl's flash_attention_2)."""
    report = _analyze(run)
    for step in report["steps"]:
        assert {"values", "update_critic", "update_actor", "gen"} <= set(step["phases"]), step
    shares = sum(p["share"] for p in report["summary"]["phases"])
    assert abs(shares - 1.0) <= 0.01, shares
    switched = _meta(run)["injected"]["critic_attn"]["switches"]
    assert {(s["call"], s["asked"], s["given"]) for s in switched} == {
        ("AutoConfig.from_pretrained", "flash_attention_2", attn),
        ("AutoModelForTokenClassification.from_pretrained", "flash_attention_2", attn)}


def _update_actor(run: str) -> list[float]:
    """update_actor seconds of each step, as analyze read them."""
    return [s["phases"]["update_actor"] for s in _analyze(run)["steps"]]


@pytest.mark.parametrize("run", sorted(OFFLOAD))
def test_optimizer_offload_whose_copies_overlap_the_next_phases_raises_no_other_warning(run):
    """Past the first step update_actor is within 1.5x of the same job without offload, and
    the monitor rightly names nothing. On the 1.5B model verl 4c3310db moves 12 GB of Adam
    state each way with non_blocking copies (to pinned host memory), which overlap the phases
    around the update; on the 0.4B model every gradient was NaN (sdpa), verl skipped every
    optimizer step and there was no state to move."""
    base = OFFLOAD[run]
    assert "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True" in _meta(run)["knobs"]
    later = sorted(_update_actor(run)[1:])[2] / sorted(_update_actor(base)[1:])[2]  # medians
    assert later < 1.5, later
    kinds = [f["kind"] for f in _all_alarms(run)]
    assert kinds == _expected_skips(run), [(f["kind"], f["evidence"][:200])
                                           for f in _all_alarms(run)]


def test_the_first_offload_of_12_gb_of_adam_state_is_booked_as_warm_up():
    """On the 1.5B model the first update_actor took 17.8 s against 0.8 s without offload
    (pinning 12 GB of host memory for the Adam state once); the ledger books that extra time as
    warm-up, not as productive time."""
    fault, base = _analyze("opt_offload_xl"), _analyze("healthy_xl")
    extra_first = fault["steps"][0]["total"] - base["steps"][0]["total"]
    assert _update_actor("opt_offload_xl")[0] > 10 * _update_actor("healthy_xl")[0]
    extra_warmup = fault["goodput"]["lost"]["warmup"] - base["goodput"]["lost"]["warmup"]
    assert abs(extra_warmup - extra_first) <= 0.1 * extra_first, (extra_warmup, extra_first)



def test_the_nan_runs_are_the_logs_own():
    """Which runs had NaN gradients, from verl's own text: every step line of the sdpa runs
    that reached an update prints actor/grad_norm:np.float64(nan) and the worker printed
    verl's warning; the eager runs print finite norms and no warning."""
    assert set(EAGER) <= set(RUNS) and NAN_GRADS
    for run in NAN_GRADS + EAGER:
        text = (FIXTURES / run / "train.log").read_text(errors="replace")
        norms = re.findall(r"actor/grad_norm:np\.float64\(([^)]*)\)", text)
        assert norms, run
        nan = run in NAN_GRADS
        assert all((n == "nan") == nan for n in norms), (run, norms)
        assert ("grad_norm is not finite" in text) == nan, run
        assert _meta(run).get("attn", "sdpa") == ("sdpa" if nan else "eager"), run


@pytest.mark.parametrize("run", EAGER)
def test_an_eager_run_with_finite_gradients_raises_no_warning_at_all(run):
    assert _all_alarms(run) == [], [(f["kind"], f["evidence"][:160]) for f in _all_alarms(run)]
    assert not [f for f in _analyze(run)["flags"] if f["kind"] == SKIPPED]


def _warn_pid(run: str) -> str:
    """The pid of the worker that printed verl's rank-0 warning."""
    text = (FIXTURES / run / "train.log").read_text(errors="replace")
    return re.search(r"\(WorkerDict pid=(\d+)\)\S* WARN: rank 0 grad_norm is not finite",
                     text).group(1)


@pytest.mark.parametrize("run", NAN_GRADS)
def test_nan_gradients_on_every_step_are_one_critical_skipped_updates_flag_within_3_steps(run):
    """verl skipped each optimizer step (dp_actor's _optimizer_step: the norm is not finite):
    one critical flag from the first steps, saying how many steps, that the weights did not
    change, which worker printed verl's warning, with the attention kernel as first advice."""
    report = _analyze(run)
    flags = [f for f in report["flags"] if f["kind"] == SKIPPED]
    assert len(flags) == 1, flags
    f = flags[0]
    assert f["severity"] == "critical"
    assert _step_of(report, f["start"]) <= 3
    n = len(report["steps"])
    assert f["evidence"].startswith(f"actor grad_norm was NaN in {n} of {n} steps (steps 1-{n})")
    assert "verl skipped each optimizer step, so the weights did not change" in f["evidence"]
    assert f'WorkerDict pid={_warn_pid(run)} printed "WARN: rank 0 grad_norm is not finite: ' \
           f'nan"' in f["evidence"], f["evidence"]
    assert "it began with the run's first step" in f["evidence"]
    assert "+actor_rollout_ref.model.override_config._attn_implementation=eager" in \
        f["advice"][0], f["advice"][0]
    assert "sdpa" in f["advice"][0] and "left-padded prompts" in f["advice"][0]
    assert any("actor_rollout_ref.actor.optim.lr" in a for a in f["advice"])


def test_the_critics_nan_gradients_are_named_with_the_critics_attention_switch():
    f = next(f for f in _analyze("ppo_critic_sdpa")["flags"] if f["kind"] == SKIPPED)
    assert "and critic grad_norm was NaN in 6 of 6 steps (steps 1-6)" in f["evidence"]
    assert "critic.model.override_config.attn_implementation=eager" in f["advice"][1]
    assert "update time went to updates that were thrown away" in f["evidence"]
