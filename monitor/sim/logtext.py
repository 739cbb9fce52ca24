"""Console text of a simulated run: step lines, tqdm heartbeats, validation, OOM tracebacks.

Pure functions from numbers to strings; the engine decides what is printed when.
"""

from __future__ import annotations

import math
import pprint
from datetime import datetime, timezone
from typing import Any

from monitor.sim.metrics import is_numpy_scalar
from monitor.sim.versions import VersionProfile, format_value


def console_line(profile: VersionProfile, step: int, metrics: dict[str, Any]) -> str:
    """``step:N - key:value - ...`` as that release's console logger prints it."""
    parts = [f"step:{step}"]
    for key, value in metrics.items():
        parts.append(f"{key}:{format_value(value, profile.number_format, is_numpy_scalar(key))}")
    return " - ".join(parts)


def breakdown_line(step: int, total: float, fields: dict[str, float]) -> str:
    """The tuning guides' breakdown format: ``Step N: total=Xms | actor_gen=Yms | ...``."""
    items = [f"total={round(total * 1000)}ms"]
    items += [f"{k}={round(v * 1000)}ms" for k, v in fields.items()]
    return f"Step {step}: " + " | ".join(items)


def hybrid_engine_lines() -> list[str]:
    """The three ``[HybridEngine]`` lines of one trainer-to-rollout switch (first, middle, last)."""
    return [
        "[HybridEngine] Resharding actor from TP=2 to FSDP...",
        "[HybridEngine] Old tensor_parallel group destroyed.",
        "[HybridEngine] New FSDP process group initialized.",
    ]


def _clock(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def tqdm_line(done: int, total: int, elapsed: float) -> str:
    """A ``Training Progress`` tqdm line as Ray forwards it (one per update)."""
    total = max(total, 1)
    frac = min(1.0, done / total)
    blocks = " ▏▎▍▌▋▊▉█"
    width = 10
    filled = frac * width
    full = int(filled)
    bar = "█" * full
    if full < width:
        bar += blocks[int((filled - full) * 8)] + " " * (width - full - 1)
    if done <= 0:
        return f"Training Progress:   0%|{' ' * width}| 0/{total} [00:00<?, ?it/s]"
    rate = elapsed / done
    remaining = rate * (total - done)
    rate_txt = f"{rate:.2f}s/it" if rate >= 1 else f"{1 / rate:.2f}it/s"
    return (
        f"Training Progress: {int(frac * 100):3d}%|{bar}| {done}/{total} "
        f"[{_clock(elapsed)}<{_clock(remaining)}, {rate_txt}]"
    )


def validation_metrics(score: float) -> dict[str, float]:
    """The step-0 validation metrics of a GSM8K-style run."""
    return {
        "val-aux/openai/gsm8k/reward/mean@1": score,
        "val-core/openai/gsm8k/acc/mean@1": score,
        "val-aux/num_turns/min": 2,
        "val-aux/num_turns/max": 2,
        "val-aux/num_turns/mean": 2.0,
    }


def initial_validation_block(profile: VersionProfile, metrics: dict[str, Any]) -> list[str]:
    """``pprint(f"Initial validation metrics: {...}")``: a string pprint splits over lines."""
    body = ", ".join(
        f"{k!r}: {format_value(v, 'numpy' if profile.number_format == 'numpy' else 'repr')}"
        for k, v in metrics.items()
    )
    return pprint.pformat(f"Initial validation metrics: {{{body}}}").splitlines()


def oom_traceback(gpu: int, ip: str, worker_pid: int, rng_bytes: float) -> list[str]:
    """A Ray-wrapped ``torch.OutOfMemoryError`` from the actor update."""
    tried = 2.0 + rng_bytes * 2.0
    free = 0.4 + rng_bytes
    return [
        "Error executing job with overrides: ['algorithm.adv_estimator=gae', "
        "'data.train_batch_size=1024', 'actor_rollout_ref.actor.ppo_mini_batch_size=256']",
        "Traceback (most recent call last):",
        '  File "/workspace/verl/verl/trainer/main_ppo.py", line 42, in main',
        "    run_ppo(config)",
        '  File "/workspace/verl/verl/trainer/main_ppo.py", line 96, in run_ppo',
        "    ray.get(runner.run.remote(config))",
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() "
        f"(pid={worker_pid - 17}, ip={ip})",
        '  File "/workspace/verl/verl/trainer/ppo/ray_trainer.py", line 1287, in fit',
        "    actor_output = self.actor_rollout_wg.update_actor(batch)",
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() "
        f"(pid={worker_pid}, ip={ip})",
        '  File "/workspace/verl/verl/workers/fsdp_workers.py", line 731, in update_actor',
        "    metrics = self.actor.update_policy(data=data)",
        '  File "/workspace/verl/verl/workers/actor/dp_actor.py", line 418, in update_policy',
        "    loss.backward()",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU {gpu} "
        f"has a total capacity of 139.81 GiB of which {free:.2f} GiB is free. Including "
        f"non-PyTorch memory, this process has {139.81 - free:.2f} GiB memory in use. Of the "
        f"allocated memory {131.4 - free:.2f} GiB is allocated by PyTorch, and 6.12 GiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]


def iso_timestamp(t: float) -> str:
    """ISO 8601 with milliseconds and an explicit UTC offset."""
    dt = datetime.fromtimestamp(t, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds")


def jsonable(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metric values as the file logger writes them: NaN and inf become ``None``."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            out[k] = None
        else:
            out[k] = v
    return out
