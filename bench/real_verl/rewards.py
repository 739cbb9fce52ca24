"""Reward functions for the real-verl recordings (``custom_reward_function.path`` of verl).

verl's naive reward manager calls ``compute_score(data_source, solution_str, ground_truth,
extra_info)`` once per response, in the driver (the Ray ``TaskRunner``). Each function here
scores like the healthy one and injects one fault from a given training step on; the step is
counted from the training samples seen (``extra_info['split'] == 'train'``, batch x n a step).
Knobs come from the environment (set by ``run_cases.sh``):

- ``VERL_REAL_SAMPLES_PER_STEP``: responses a step (train_batch_size x rollout.n);
- ``VERL_REAL_FAULT_STEP``: the first step with the fault;
- ``VERL_REAL_MARKERS``: folder where the moment a fault starts is written (``<name>.json``);
- ``VERL_REAL_CPU_MS``: pure-Python work per response for :func:`cpu_heavy`;
- ``VERL_REAL_HANG_S``: how long :func:`hang_once` sleeps (once);
- ``VERL_REAL_HTTP_URL``: the server :func:`http_block` asks (it accepts and never answers).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import zlib

_seen = {"train": 0}
_fired: set[str] = set()


def _step_of(extra_info) -> int:
    """Count one training response; return the training step (1-based) it belongs to."""
    if not isinstance(extra_info, dict) or extra_info.get("split") != "train":
        return 0
    _seen["train"] += 1
    per_step = int(os.environ.get("VERL_REAL_SAMPLES_PER_STEP", "128"))
    return (_seen["train"] - 1) // per_step + 1


def _mark(name: str, step: int, **more) -> None:
    """Write when a fault starts (once per name), for the recording's meta.json."""
    if name in _fired:
        return
    _fired.add(name)
    folder = os.environ.get("VERL_REAL_MARKERS", "/tmp/verl_real/markers")
    os.makedirs(folder, exist_ok=True)
    rec = {"event": name, "ts": time.time(), "step": step, "pid": os.getpid(), **more}
    with open(os.path.join(folder, f"{name}.json"), "w") as f:
        json.dump(rec, f)


def _fault_on(step: int) -> bool:
    return step >= int(os.environ.get("VERL_REAL_FAULT_STEP", "4"))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Healthy score in [0, 1]: how many of the answer's digits the response holds, plus a
    small deterministic spread so that GRPO's group advantages are not all zero."""
    _step_of(extra_info)
    return _score(solution_str, ground_truth)


def _score(solution_str: str, ground_truth: str) -> float:
    digits = [c for c in str(ground_truth) if c.isdigit()] or ["0"]
    hit = sum(1 for c in digits if c in solution_str) / len(digits)
    spread = (zlib.crc32(solution_str.encode("utf-8", "replace")) % 1000) / 1000.0
    return 0.7 * hit + 0.3 * spread


def cpu_heavy(data_source, solution_str, ground_truth, extra_info=None):
    """From the fault step on, burn ``VERL_REAL_CPU_MS`` of pure Python per response (a slow
    verifier on one core) while the GPU waits."""
    step = _step_of(extra_info)
    if step and _fault_on(step):
        _mark("cpu_reward", step)
        end = time.perf_counter() + float(os.environ.get("VERL_REAL_CPU_MS", "30")) / 1000.0
        x = 0
        while time.perf_counter() < end:
            for i in range(2000):
                x = (x * 31 + i) % 1000003
    return _score(solution_str, ground_truth)


def hang_once(data_source, solution_str, ground_truth, extra_info=None):
    """At the fault step, the first response's scoring sleeps ``VERL_REAL_HANG_S`` seconds
    (a verifier stuck on one input), then the run goes on."""
    step = _step_of(extra_info)
    if step and _fault_on(step) and "reward_hang" not in _fired:
        hang = float(os.environ.get("VERL_REAL_HANG_S", "120"))
        _mark("reward_hang", step, seconds=hang)
        _stuck_in_verifier(hang)
        _mark("reward_hang_end", step)
    return _score(solution_str, ground_truth)


def _stuck_in_verifier(seconds: float) -> None:
    """The frame a stack should name: a verifier that does not return."""
    time.sleep(seconds)


def http_block(data_source, solution_str, ground_truth, extra_info=None):
    """From the fault step on, ask a judge over HTTP with no timeout; the server accepts the
    connection and never answers, so the driver blocks in the socket read."""
    step = _step_of(extra_info)
    if step and _fault_on(step):
        url = os.environ.get("VERL_REAL_HTTP_URL", "http://127.0.0.1:18099/judge")
        _mark("reward_http_block", step, url=url)
        body = json.dumps({"response": solution_str[:200], "answer": str(ground_truth)})
        req = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as resp:  # no timeout: the fault
            return float(json.loads(resp.read())["score"])
    return _score(solution_str, ground_truth)
