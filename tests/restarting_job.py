"""A job that plays verl's checkpoint and resume, for the attempt tests: a real process that
prints what verl prints and fails as it is told, one attempt per start.

Like verl (``RayPPOTrainer._load_checkpoint``, ``_save_checkpoint``): at start it prints its
config, then ``Load from checkpoint folder: <dir>/global_step_N`` and ``Setting global step
to N`` when ``<dir>/latest_checkpointed_iteration.txt`` names a checkpoint (else ``Training
from scratch``), and goes on from step N + 1; every ``--save-freq`` steps it saves (a
``global_step_N`` folder, then the tracker file) inside the step, timed as
``timing_s/save_checkpoint``. ``--plan`` says how each attempt ends, one word per start:
``crash:K`` (a CUDA OOM traceback half-way through step K, exit 1), ``hang:K`` (step K's
reward never returns: ``compute_score`` waits forever) or ``finish``.

What it really did goes to ``<state>/truth.jsonl``, one line per attempt start and per step
(its own clock), so a test can compute the ledger by hand and compare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path


def _say(text: str) -> None:
    print(f"(TaskRunner pid={os.getpid()}) {text}", flush=True)


def _truth(state: Path, record: dict) -> None:
    with open(state / "truth.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")


def compute_score(solution: str) -> float:
    """The reward function; in a ``hang`` attempt it waits for an answer that never comes."""
    while True:
        time.sleep(0.05)


def _crash(step: int) -> None:
    print("Traceback (most recent call last):", flush=True)
    print('  File "verl/trainer/ppo/ray_trainer.py", line 1212, in fit', flush=True)
    print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (step "
          f"{step})", flush=True)
    sys.exit(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--state", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-freq", type=int, default=3)
    p.add_argument("--step-s", type=float, default=0.4)
    p.add_argument("--save-s", type=float, default=0.3)
    p.add_argument("--data-s", type=float, default=0.1)
    p.add_argument("--startup-s", type=float, default=0.6)
    p.add_argument("--plan", required=True, help="e.g. crash:5,crash:8,hang:10,finish")
    a = p.parse_args()
    start = time.time()
    state = Path(a.state)
    ckpt = state / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    done = state / "attempts"
    attempt = len(done.read_text().split()) if done.exists() else 0
    with open(done, "a") as fh:
        fh.write("x\n")
    plan = a.plan.split(",")[min(attempt, len(a.plan.split(",")) - 1)]
    _truth(state, {"attempt": attempt + 1, "start": start, "pid": os.getpid(), "plan": plan})
    _say(f"TaskRunner hostname: test, PID: {os.getpid()}")
    _say(str({"trainer": {"save_freq": a.save_freq, "resume_mode": "auto",
                          "total_training_steps": a.steps}}))
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    step = 0
    if tracker.exists():
        step = int(tracker.read_text())
        _say(f"Load from checkpoint folder: {ckpt / f'global_step_{step}'}")
        _say(f"Setting global step to {step}")
    else:
        _say("Training from scratch")
    time.sleep(a.startup_s)  # Ray, the models, the engines
    kind, _, at = plan.partition(":")
    while step < a.steps:
        step += 1
        time.sleep(a.data_s)  # the next batch, before the step timer
        t0 = time.time()
        time.sleep(a.step_s / 2)  # generation
        if kind == "crash" and step == int(at):
            _crash(step)
        if kind == "hang" and step == int(at):
            compute_score("the answer")
        time.sleep(a.step_s / 2)  # the update
        save = 0.0
        if step % a.save_freq == 0 or step == a.steps:
            s0 = time.time()
            (ckpt / f"global_step_{step}").mkdir(exist_ok=True)
            time.sleep(a.save_s)
            tracker.write_text(str(step))
            save = time.time() - s0
        t1 = time.time()
        _truth(state, {"attempt": attempt + 1, "step": step, "start": t0, "end": t1,
                       "save": save})
        keys = [f"step:{step}", f"timing_s/step:{t1 - t0:.6f}",
                f"timing_s/gen:{a.step_s / 2:.6f}", f"timing_s/update_actor:{a.step_s / 2:.6f}",
                f"actor/pg_loss:{random.random():.6f}"]
        if save:
            keys.append(f"timing_s/save_checkpoint:{save:.6f}")
        _say(" - ".join(keys))
    _say(f"Training Progress: 100%|##########| {a.steps}/{a.steps} [00:10<00:00, 0.4s/it]")


if __name__ == "__main__":
    main()
