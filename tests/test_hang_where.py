"""monitor/hang/where.py on real py-spy dumps of real stand-in processes (tests/fixtures/
hang_where: the verl-shaped job of tests/hang_standins.py, dumped by py-spy 0.4.3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.hang.dump import Frame
from monitor.hang.where import (
    Where,
    classify,
    is_own,
    judge,
    parse,
    role_of,
)

FIX = Path(__file__).parent / "fixtures" / "hang_where"


def _where(name: str) -> Where:
    return classify((FIX / f"{name}.txt").read_text(), node="n0")


def test_every_thread_and_the_ray_title_are_read():
    d = parse((FIX / "driver_http.txt").read_text())
    assert d.title.startswith("ray::TaskRunner.run") and d.pid is not None
    assert d.threads[0].name == "MainThread" and d.threads[0].frames[0].name == \
        "SocketIO.readinto"
    assert role_of(d.title) == ("driver", "")
    assert role_of("ray::WorkerDict.actor_rollout_generate_sequences") == (
        "worker", "actor_rollout_generate_sequences")
    assert role_of("ray::IDLE") == ("idle", "") and role_of("python train.py", "x") == ("x", "")


def test_a_driver_stuck_in_compute_score_names_the_users_frame():
    w = _where("driver_reward")
    assert (w.role, w.place, w.phase, w.stuck) == ("driver", "reward", "reward", True)
    assert (w.frame.name, w.frame.filename, w.frame.line) == (
        "normalize_final_answer", "user_reward.py", 5)  # re.sub (stdlib) skipped
    assert w.describe().startswith(f"the driver (PID {w.pid}, node n0) is scoring rewards")


def test_a_reward_waiting_on_an_http_server_says_so():
    w = _where("driver_http")
    assert w.place == "reward" and "HTTP answer" in w.detail
    assert w.frame.name == "compute_score"  # requests, urllib3, http.client skipped


def test_a_data_loader_blocked_in_the_dataset():
    w = _where("driver_data")
    assert w.place == "dataloader" and w.stuck
    assert w.frame.name == "BlockingDataset.__getitem__" and w.frame.filename == "user_dataset.py"


def test_a_driver_waiting_on_a_worker_group_call_names_its_caller_not_the_plumbing():
    w = _where("driver_worker")
    assert w.place == "worker_call"
    assert w.frame.filename == "job.py"  # verl/single_controller frames skipped


def test_workers_idle_in_rays_loop_or_in_a_method_that_never_returns():
    idle, method = _where("worker_idle"), _where("worker_method")
    assert idle.place == "ray_idle" and not idle.stuck
    assert method.place == "method" and method.phase == "gen" and method.stuck
    assert method.frame.filename == "verl/workers/fsdp_workers.py"


def test_judge_the_driver_scoring_is_the_answer_and_nccl_is_ruled_out():
    v = judge([_where("driver_reward"), _where("worker_idle")])
    assert v.stuck and v.place == "reward" and v.who[0].role == "driver"
    text = v.summary()
    assert "normalize_final_answer (user_reward.py:5)" in text
    assert "1 worker(s) idle in Ray's task loop" in text
    assert "No rank waits in a collective: NCCL is not the cause" in text


def test_judge_a_worker_call_that_no_worker_runs_or_a_method_that_never_returns():
    lost = judge([_where("driver_worker"), _where("worker_idle")])
    assert not lost.stuck and lost.suspect and lost.place == "worker_call"  # maybe elsewhere
    held = judge([_where("driver_worker"), _where("worker_method")])
    assert held.stuck and held.place == "method" and held.who[0].role == "worker"
    assert held.phase == "gen"


def _frames(*specs: tuple[str, str]) -> str:
    body = "\n".join(f"    {n} ({f}:{i + 1})" for i, (n, f) in enumerate(specs))
    return f'Process 7: ray::TaskRunner.run x\nThread 7 (idle): "MainThread"\n{body}\n'


def test_long_healthy_phases_are_not_stuck():
    ckpt = classify(_frames(("_save", "torch/serialization.py"), ("save", "torch/serialization.py"),
                            ("save_checkpoint", "verl/utils/checkpoint/fsdp_checkpoint_manager.py"),
                            ("RayPPOTrainer._save_checkpoint", "verl/trainer/ppo/ray_trainer.py"),
                            ("RayPPOTrainer.fit", "verl/trainer/ppo/ray_trainer.py")))
    assert ckpt.place == "checkpoint" and not ckpt.stuck and ckpt.phase == "save_checkpoint"
    val = classify(_frames(("get", "ray/_private/worker.py"),
                           ("func_generator.<locals>.Functor.__call__",
                            "verl/single_controller/ray/base.py"),
                           ("RayPPOTrainer._validate", "verl/trainer/ppo/ray_trainer.py")))
    assert val.place == "worker_call" and val.phase == "testing"
    gen = classify("Process 8: ray::WorkerDict.actor_rollout_generate_sequences\n"
                   'Thread 8 (active): "MainThread"\n    step (vllm/engine/llm_engine.py:1)\n'
                   "    generate (vllm/entrypoints/llm.py:2)\n")
    v = judge([val, gen])
    assert not v.stuck and v.long_phase and v.place == "validation"


def test_a_rank_outside_the_collective_the_others_wait_in_is_named():
    coll = ('Process 9: ray::WorkerDict.actor_rollout_update_actor\nThread 9 (idle): "MainThread"\n'
            "    all_reduce (torch/distributed/distributed_c10d.py:1)\n"
            "    clip_grad_norm_ (verl/workers/actor/dp_actor.py:2)\n")
    late = ('Process 10: ray::WorkerDict.actor_rollout_update_actor\n'
            'Thread 10 (idle): "MainThread"\n    __getitem__ (my_data.py:3)\n')
    v = judge([classify(coll), classify(late)])
    assert v.stuck and v.place == "collective" and v.collective
    assert [w.pid for w in v.who] == [10]
    assert "No rank waits" not in v.summary()


def test_own_code_is_the_users_or_verls_not_libraries_or_stdlib():
    assert is_own(Frame("f", "verl/trainer/ppo/ray_trainer.py", 1))
    assert is_own(Frame("f", "/usr/lib/python3.12/site-packages/verl/x.py", 1))
    assert is_own(Frame("compute_score", "my_reward.py", 1))
    assert not is_own(Frame("get", "ray/_private/worker.py", 1))
    assert not is_own(Frame("wait", "threading.py", 1))
    assert not is_own(Frame("post", "requests/api.py", 1))


def test_an_empty_or_foreign_text_is_unknown_in_words():
    w = classify("Error: Failed to find python version from target process")
    assert w.place == "unknown" and "no frame" in w.detail
    assert not judge([w]).stuck


def test_a_healthy_validation_and_checkpoint_are_long_phases_not_stuck():
    val = judge([_where("driver_validate"), _where("worker_gen")])
    assert not val.stuck and val.long_phase and val.place == "validation"
    assert _where("worker_gen").place == "generation"
    ckpt = judge([_where("driver_ckpt")])
    assert not ckpt.stuck and ckpt.long_phase and ckpt.place == "checkpoint"
    assert ckpt.who[0].frame.filename == "verl/utils/checkpoint/checkpoint_manager.py"


def test_analyze_stacks_says_where_each_process_was(tmp_path, capsys):
    """`verl-monitor analyze LOG --stacks DIR` judges the py-spy dumps an exporter saved."""
    from cli.main import main

    assert main(["simulate", "--scenario", "healthy:6", "--gpus-per-node", "1",
                 "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    saved = tmp_path / "stacks"
    saved.mkdir()
    for name, role in (("driver_reward", "driver"), ("worker_idle", "worker")):
        text = (FIX / f"{name}.txt").read_text()
        (saved / f"1796160000_{role}_{parse(text).pid}.txt").write_text(text)
    (saved / "notes.txt").write_text("not a dump")  # other files are skipped
    assert main(["analyze", str(tmp_path / "run" / "train.log"), "--stacks", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "Who holds the others" in out and "py-spy rounds: 1; the newest: the driver" in out
    assert "is scoring rewards [phase reward], at normalize_final_answer (user_reward.py:5)" \
        in out and "No rank waits in a collective" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["analyze", str(tmp_path / "run" / "train.log"), "--stacks", str(empty)]) == 2
    assert "no py-spy dump" in capsys.readouterr().err


def test_a_worker_running_a_method_through_verls_decorator_computes_not_waits():
    text = ("Process 11: ray::WorkerDict.actor_rollout_generate_sequences\n"
            'Thread 11 (active): "MainThread"\n'
            "    forward (torch/nn/modules/linear.py:125)\n"
            "    generate (transformers/generation/utils.py:2)\n"
            "    _generate_minibatch (verl/workers/rollout/hf_rollout.py:3)\n"
            "    generate_sequences (verl/workers/fsdp_workers.py:4)\n"
            "    func (verl/single_controller/base/decorator.py:5)\n"
            "    main_loop (ray/_private/worker.py:6)\n")
    w = classify(text)
    assert w.place == "generation" and not w.stuck
    assert w.frame.filename == "verl/workers/rollout/hf_rollout.py"
    upd = text.replace("generate_sequences", "update_actor").replace(
        "    _generate_minibatch (verl/workers/rollout/hf_rollout.py:3)\n", "")
    assert classify(upd).place == "kernel"  # torch computing: a long phase


def test_full_paths_read_as_py_spys_short_names():
    full = ('Process 12: ray::WorkerDict\nThread 12 (idle): "MainThread"\n'
            "    main_loop (/usr/lib/python3.12/site-packages/ray/_private/worker.py:946)\n"
            "    <module> (/usr/lib/python3.12/site-packages/ray/_private/workers/"
            "default_worker.py:330)\n")
    assert classify(full).place == "ray_idle"
    drv = ('Process 13: ray::TaskRunner.run\nThread 13 (idle): "MainThread"\n'
           "    get (/opt/venv/lib/python3.12/site-packages/ray/_private/worker.py:2800)\n"
           "    fit (/opt/venv/lib/python3.12/site-packages/verl/trainer/ppo/ray_trainer.py:9)\n")
    w = classify(drv)
    assert w.place == "worker_call" and w.frame.name == "fit"


# ---------------------------------------------------------------------------- real verl
REAL = Path(__file__).parent / "fixtures" / "real_verl"  # verl 0.5.0.dev on one H200


def _rounds(case: str):
    import json

    from monitor.hang.stacks import read_stacks_dir

    meta = json.loads((REAL / case / "meta.json").read_text())
    return [(ts, judge(ws)) for ts, ws in read_stacks_dir(REAL / case / "stacks")], meta


def test_real_verl_a_reward_stuck_in_its_verifier_names_the_taskrunner_and_frame():
    rounds, meta = _rounds("hang_reward")
    hang, end = meta["injected"]["reward_hang"], meta["injected"]["reward_hang_end"]
    during = [v for ts, v in rounds if hang["ts"] + 1 < ts < end["ts"]]
    assert len(during) >= 5
    for v in during:
        assert v.stuck and v.place == "reward" and v.phase == "reward"
        assert (v.who[0].role, v.who[0].pid) == ("driver", hang["pid"])
        assert str(v.who[0].frame) == "_stuck_in_verifier (rewards.py:96)"
        assert "No rank waits in a collective" in v.summary()
    after = [v for ts, v in rounds if ts > end["ts"] + 1]
    assert after and not any(v.stuck for v in after)  # the run went on: computing again


def test_real_verl_a_reward_blocked_on_http_says_so():
    rounds, meta = _rounds("hang_http")
    block = meta["injected"]["reward_http_block"]
    during = [v for ts, v in rounds if ts > block["ts"] + 1]
    assert during and all(v.stuck and v.place == "reward" for v in during)
    w = during[-1].who[0]
    assert w.pid == block["pid"] and "HTTP answer" in w.detail
    assert str(w.frame).startswith("http_block (rewards.py:")


def test_real_verl_a_blocked_loader_names_its_worker_process_not_the_driver():
    rounds, meta = _rounds("hang_data")
    block = meta["injected"]["data_block"]
    v = [v for ts, v in rounds if ts > block["ts"] + 10][-1]
    assert v.stuck and v.place == "dataloader" and v.phase == "data_wait"
    named = {w.pid: w for w in v.who}
    assert named[block["pid"]].role == "data loader worker"
    assert str(named[block["pid"]].frame) == "_wait_for_shard (blocking_dataset.py:53)"
    assert v.who[-1].role == "driver"  # the driver waits for its loader


@pytest.mark.parametrize("case", ["healthy", "healthy_val_ckpt", "mem_grow"])
def test_real_verl_healthy_runs_are_never_stuck_and_their_phases_are_read(case):
    rounds, _ = _rounds(case)
    assert not [(ts, v.place) for ts, v in rounds if v.stuck]
    assert {"gen"} <= {v.phase for _, v in rounds}


# ---------------------------------------------------------------------------- a rank gone
_WAITING = ('Process 9: ray::WorkerDict.actor_rollout_update_actor\nThread 9 (idle): "MainThread"\n'
            "    all_reduce (torch/distributed/distributed_c10d.py:1)\n"
            "    clip_grad_norm_ (verl/workers/actor/dp_actor.py:2)\n")


def test_a_rank_killed_while_the_other_waits_in_the_collective_is_named_as_gone():
    from monitor.hang.where import gone_where

    dead = gone_where(4321, "worker", "n0", exited_after=6.4, gpu=1, rank=1)
    alone = judge([classify(_WAITING, node="n0")])
    assert not alone.stuck  # the survivor alone in its collective says nothing
    v = judge([classify(_WAITING, node="n0")], [dead])
    assert v.stuck and v.place == "gone" and v.collective and [w.pid for w in v.who] == [4321]
    text = v.summary()
    assert text.startswith("rank 1 (PID 4321, GPU 1, node n0) is gone: it exited 6 s after "
                           "the last step (killed or crashed); the others wait in a collective "
                           "for it.")
    assert "the worker (PID 9, node n0) waits in a collective" in text
    assert "NCCL is not the cause" not in text
    assert v.to_dict()["who"][0] | {"place": "gone", "rank": 1, "gpu": 1} == \
        v.to_dict()["who"][0]


def test_a_gone_process_with_nothing_left_is_only_suspect_and_a_stuck_driver_stays_first():
    from monitor.hang.where import gone_where

    dead = gone_where(77, "worker")
    v = judge([], [dead])
    assert not v.stuck and v.suspect and v.place == "gone"
    assert "the worker (PID 77) is gone: it exited after the last step (killed or crashed); " \
        "no other process of the job is left on this node" in v.summary()
    reward = classify((FIX / "driver_reward.txt").read_text(), node="n0")
    v = judge([reward], [dead])
    assert v.stuck and v.place == "reward" and dead in v.others
    ckpt = classify((FIX / "driver_ckpt.txt").read_text(), node="n0")
    v = judge([ckpt], [dead])  # a process gone while the driver writes its checkpoint
    assert not v.stuck and v.long_phase and v.place == "checkpoint"
    kernel = classify('Process 9: ray::WorkerDict.update_actor\nThread 9 (idle): "MainThread"\n'
                      "    synchronize (torch/cuda/__init__.py:1)\n    main (hang_job.py:145)\n")
    assert kernel.place == "kernel" and not judge([kernel]).stuck
    v = judge([kernel], [dead])  # NCCL: the survivor blocks in synchronize behind the collective
    assert v.stuck and v.place == "gone"
    assert "; the others wait on their GPUs (under NCCL: in the collective) for it." in \
        v.summary() and "NCCL is not the cause" not in v.summary()
