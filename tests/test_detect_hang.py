"""monitor/detect/hang.py: a silence the GPUs show as waiting is a hang; long phases are not."""

from __future__ import annotations

import pandas as pd
from detect_builders import make_gpu, make_steps

from monitor.detect import make_context, run_all
from monitor.detect.hang import detect_hang
from monitor.records import Event

STEP_S = 20.0


def _run(tail_s: float, edit_tail=None, n_gpus: int = 2, events=(), steps=None, nccl=None):
    steps = steps or make_steps(n=10, step_s=STEP_S)
    end = steps[-1].end_time

    def edit(df: pd.DataFrame) -> None:
        if edit_tail is not None:
            edit_tail(df, df["ts"] > end)

    gpu = make_gpu(steps, n_gpus=n_gpus, tail_s=tail_s, edit=edit)
    ctx = make_context(steps, gpu, None, list(events), now=end + tail_s, nccl=nccl)
    return ctx, end


def _one_waits(df, tail):
    df.loc[tail & (df["gpu"] == 0), ["util", "sm_active"]] = [100.0, 2.0]


def test_a_rank_stopped_before_a_collective_is_a_critical_hang_within_the_limit():
    ctx, end = _run(90.0, _one_waits)
    flags = detect_hang(ctx)
    assert len(flags) == 1
    f = flags[0]
    assert f.kind == "hang" and f.severity == "critical" and f.end is None
    assert f.start == end + 60.0  # 3 x the recent 20 s step
    assert "1 of 2 GPUs wait in a collective" in f.evidence and "n0/GPU 0" in f.evidence
    assert "after step 10" in f.evidence
    assert "Who: most likely the rank on n0/GPU 1: its GPU idles" in f.evidence


def test_with_no_gpu_to_suspect_the_flag_says_how_to_get_a_name():
    def all_wait(df, tail):
        df.loc[tail, ["util", "sm_active"]] = [100.0, 2.0]
    f = detect_hang(_run(90.0, all_wait)[0])[0]
    assert "2 of 2 GPUs wait" in f.evidence and "Who: unknown" in f.evidence


def test_the_silence_below_the_limit_is_not_a_hang():
    ctx, _ = _run(50.0, _one_waits)
    assert detect_hang(ctx) == []


def test_a_gpu_busy_while_the_other_waits_is_named_as_stuck_in_gpu_work():
    def edit(df, tail):
        _one_waits(df, tail)
        df.loc[tail & (df["gpu"] == 1), ["util", "sm_active"]] = [100.0, 95.0]
    f = detect_hang(_run(90.0, edit)[0])[0]
    assert "n0/GPU 1 stays busy while the others wait" in f.evidence


def test_a_flight_recorder_round_names_the_rank():
    ctx, end = _run(90.0, _one_waits)
    ev = Event("hang_dump", end + 55.0, message="rank 1 (node n0, GPU 1, PID 77): never issued "
               "nccl:all_reduce #14", data={"waiting": {"0": "nccl:all_reduce #14"}})
    ctx.events.append(ev)
    f = detect_hang(ctx)[0]
    assert "Who: rank 1 (node n0, GPU 1, PID 77)" in f.evidence
    assert "Flight Recorder shows collectives pending" in f.evidence


def test_long_validation_with_every_gpu_computing_is_not_a_hang():
    def busy(df, tail):
        df.loc[tail, ["util", "sm_active"]] = [98.0, 70.0]
    assert detect_hang(_run(150.0, busy)[0]) == []


def test_a_checkpoint_written_while_the_gpus_idle_is_not_a_hang():
    assert detect_hang(_run(150.0)[0]) == []


def test_past_checkpoint_times_extend_the_limit():
    def edit(i, phases):
        if i == 5:
            phases["save_checkpoint"] = 100.0
    steps = make_steps(n=10, step_s=STEP_S, edit=edit)
    ctx, _ = _run(150.0, _one_waits, steps=steps)
    assert detect_hang(ctx) == []  # 60 s + 1.5 x 100 s: still within a checkpoint's time


def test_nccl_inspector_silence_agrees_without_sm_activity():
    steps = make_steps(n=10, step_s=STEP_S)
    end = steps[-1].end_time
    nccl = pd.DataFrame({"ts": [end - 30.0, end - 10.0, end - 1.0], "node": "n0",
                         "coll": "AllReduce", "comm": "c", "ops": 1.0, "bytes": 1e6,
                         "exec_s": 0.01, "busbw_bps": 1e9})
    gpu = make_gpu(steps, n_gpus=2, tail_s=90.0, sm=False)
    ctx = make_context(steps, gpu, None, [], now=end + 90.0, nccl=nccl)
    f = detect_hang(ctx)[0]
    assert "NCCL Inspector recorded no collective" in f.evidence


def test_run_all_reports_the_hang_and_hides_stalled_and_low_utilization():
    steps = make_steps(n=10, step_s=STEP_S)
    end = steps[-1].end_time
    gpu = make_gpu(steps, n_gpus=2, tail_s=400.0,
                   edit=lambda df: _one_waits(df, df["ts"] > end))
    kinds = {f.kind for f in run_all(steps, gpu, None, [], now=end + 400.0)}
    assert "hang" in kinds
    assert not kinds & {"stalled", "low_utilization", "util_overstates_sm"}


# ---------------------------------------------------------------------------- py-spy: where
def _where_event(t: float, place: str, stuck: bool, long_phase: bool = False,
                 node: str = "n0") -> Event:
    who = [{"pid": 4242, "role": "driver", "place": place, "phase": "reward",
            "frame": "normalize_final_answer (user_reward.py:5)", "detail": "", "node": node,
            "stuck": stuck}]
    return Event("hang_dump", t, message="the driver (PID 4242, node n0) is scoring rewards "
                 "[phase reward], at normalize_final_answer (user_reward.py:5). No rank waits "
                 "in a collective: NCCL is not the cause.",
                 data={"method": "py-spy", "node": node, "waiting": {}, "culprits": [],
                       "where": {"stuck": stuck, "place": place, "long_phase": long_phase,
                                 "who": who, "others": [], "collective": False}})


def test_a_driver_stuck_scoring_rewards_is_a_hang_at_the_stack_limit_whatever_the_gpus_do():
    def busy(df, tail):
        df.loc[tail, ["util", "sm_active"]] = [98.0, 70.0]
    ctx, end = _run(50.0, busy)  # GPUs computing: the old evidence would say nothing
    ctx.events.append(_where_event(end + 46.0, "reward", True))
    f = detect_hang(ctx)[0]
    assert f.severity == "critical" and f.start == end + 45.0  # max(1.3 x 20 s, 45 s)
    assert "Where (py-spy): the driver (PID 4242, node n0) is scoring rewards" in f.evidence
    assert "No rank waits in a collective" in f.evidence and f.scope == {"node": "n0"}
    assert "compute_score_timeout" in " ".join(f.advice)  # the reward's own advice first
    assert "normalize_final_answer" in f.evidence


def test_a_stack_round_in_a_long_checkpoint_keeps_the_hang_quiet():
    ctx, end = _run(150.0, _one_waits)  # the GPUs even look like waiting
    ctx.events.append(_where_event(end + 100.0, "checkpoint", False, long_phase=True))
    assert detect_hang(ctx) == []


def test_without_a_stuck_round_the_stack_limit_alone_is_no_hang():
    ctx, end = _run(50.0, _one_waits)
    ctx.events.append(_where_event(end + 46.0, "unknown", False))
    assert detect_hang(ctx) == []


def test_the_silence_after_the_runs_last_progress_line_is_no_hang_nor_stalled():
    steps = make_steps(n=10, step_s=STEP_S)
    end = steps[-1].end_time
    done = Event("progress", end, 10, "Training Progress: 100%|##| 10/10",
                 {"current": 10, "total": 10, "percent": 100})
    gpu = make_gpu(steps, n_gpus=2, tail_s=900.0,
                   edit=lambda df: _one_waits(df, df["ts"] > end))
    kinds = {f.kind for f in run_all(steps, gpu, None, [done], now=end + 900.0)}
    assert not kinds & {"hang", "stalled"}
    half = Event("progress", end, 10, "Training Progress: 50%|##| 10/20",
                 {"current": 10, "total": 20, "percent": 50})
    kinds = {f.kind for f in run_all(steps, gpu, None, [half], now=end + 900.0)}
    assert "hang" in kinds  # not at its total: a real hang is still a hang


def test_the_slack_message_carries_who_and_where_and_the_advice_in_one_post():
    from monitor.notify.slack import build_message

    def busy(df, tail):
        df.loc[tail, ["util", "sm_active"]] = [98.0, 70.0]
    ctx, end = _run(50.0, busy)
    ctx.events.append(_where_event(end + 46.0, "reward", True))
    msg = build_message(detect_hang(ctx)[0], "opened")
    text = str(msg)
    assert "the driver (PID 4242, node n0) is scoring rewards" in text
    assert "normalize_final_answer (user_reward.py:5)" in text
    assert "No rank waits in a collective" in text and "compute_score_timeout" in text


def test_a_call_no_local_worker_runs_is_a_hang_only_after_the_longer_limit():
    def lost(t):
        ev = _where_event(t, "worker_call", False)
        ev.data["where"]["suspect"] = True  # its workers may run on another node
        return ev
    ctx, end = _run(55.0)
    ctx.events.append(lost(end + 46.0))
    assert detect_hang(ctx) == []  # past the stack limit (45 s), not the 60 s one
    ctx, end = _run(70.0)
    ctx.events.append(lost(end + 66.0))
    f = detect_hang(ctx)[0]
    assert f.start == end + 60.0 and "Where (py-spy)" in f.evidence


def test_stalled_in_a_very_long_checkpoint_says_where_and_names_the_target_storage():
    ev = _where_event(0.0, "checkpoint", False, long_phase=True)
    ev.message = ("the driver (PID 4242, node n0) is in checkpoint I/O [phase save_checkpoint], "
                  "at save_checkpoint (verl/utils/checkpoint/checkpoint_manager.py:3).")
    ctx, end = _run(400.0)
    ev.time = end + 100.0
    ctx.events.append(ev)
    flags = [f for f in run_all(ctx.steps, ctx.gpu, None, ctx.events, now=end + 400.0)
             if f.kind == "stalled"]
    assert flags and "Where (py-spy): the driver (PID 4242, node n0) is in checkpoint I/O" in \
        flags[0].evidence
    assert "trainer.default_local_dir" in flags[0].advice[0]
    assert not [f for f in run_all(ctx.steps, ctx.gpu, None, ctx.events, now=end + 400.0)
                if f.kind == "hang"]


# ---------------------------------------------------------------------------- a rank gone
def test_a_rank_that_left_its_gpu_in_the_silence_is_named_as_gone_with_its_logs_advice():
    ctx, end = _run(90.0, _one_waits)  # GPU 0 spins in the collective, GPU 1 idles
    ctx.events.append(Event("gpu_process_exited", end + 3.0, message="process 4321 left GPU 1",
                            data={"node": "n0", "gpu": 1, "pid": 4321, "name": "python"}))
    ctx.events.append(Event("gpu_process_exited", end - 30.0, message="process 99 left GPU 0",
                            data={"node": "n0", "gpu": 0, "pid": 99, "name": ""}))
    f = detect_hang(ctx)[0]
    assert ("Who: the process python (PID 4321, GPU 1, node n0) is gone: it left its GPU 3 s "
            "after the last step (killed or crashed); the others wait in a collective for it."
            ) in f.evidence
    assert "PID 99" not in f.evidence  # it left before the last step: not this silence's
    assert "ray logs worker --pid 4321 --suffix err" in f.advice[0] and "dmesg" in f.advice[0]
    assert "actor_rollout_ref.nccl_timeout" in f.advice[1]


def test_a_py_spy_round_with_a_rank_gone_is_the_hang_at_the_stack_limit():
    from monitor.hang.stacks import StackRound
    from monitor.hang.where import classify, gone_where

    ctx, end = _run(50.0, _one_waits)  # past the stack limit (45 s), not the 60 s one
    waiting = classify('Process 9: ray::WorkerDict.update_actor\nThread 9 (idle): "MainThread"\n'
                       "    all_reduce (torch/distributed/distributed_c10d.py:1)\n"
                       "    main (hang_job.py:144)\n", node="n0")
    dead = gone_where(4321, "worker", "n0", exited_after=3.2)
    rnd = StackRound([waiting], gone=[dead])
    ctx.events.append(rnd.to_event(end + 46.0, "n0"))
    f = detect_hang(ctx)[0]
    assert f.start == end + 45.0 and f.scope == {"node": "n0"}
    assert ("Where (py-spy): the worker (PID 4321, node n0) is gone: it exited 3 s after the "
            "last step (killed or crashed); the others wait in a collective for it.") in f.evidence
    assert "ray logs worker --pid 4321" in f.advice[0]
    alone = StackRound([waiting])  # the survivor alone: no hang at the stack limit
    ctx.events[-1] = alone.to_event(end + 46.0, "n0")
    assert detect_hang(ctx) == []
