"""A process that joins a GPU mid-run and slows the steps: gpu_imbalance naming that GPU.

The exporter's GPU sampler reports compute processes that start or leave a GPU after its first
reading (``gpu_process_started``/``gpu_process_exited`` events, ``exporters.gpu.processes``).
verl starts its workers before the first step, so a process that appears on a GPU after the
first step has ended is not the job's, unless the job's own processes left before it (a restart)
or the log says it resumed. When the steps it overlaps run slower than the steps
before it (the run's warm-up step left out), that process is why: on a single GPU there is no
peer to compare with, and this is the one signal that names the cause. Measured on an H200
(bench/results/gpu_scenarios_*_1gpu_*): a second process running bf16 matmuls took the step
from 4.6 s to 5.1-7.3 s, and log-prob passes from 0.24 s to 0.57 s.
"""

from __future__ import annotations

import numpy as np

from monitor.detect.detector_base import Context, make_flag, steps_text
from monitor.records import Event, Flag

ADVICE = [
    "Stop or move the other process: it shares the GPU with the training job (nvidia-smi shows "
    "every process on each GPU; CUDA_VISIBLE_DEVICES or the scheduler keeps jobs apart).",
    "If it is part of the job (an extra server or reward model started mid-run), give it its "
    "own GPUs, e.g. a separate resource pool, instead of sharing the training GPUs.",
]


def _same(a: Event, b: Event) -> bool:
    return all(a.data.get(k) == b.data.get(k) for k in ("node", "gpu", "pid"))


def contention_flags(ctx: Context) -> list[Flag]:
    """gpu_imbalance flags for processes that joined a GPU after the first step and slowed
    the steps they overlap by at least ``gpu_imbalance.process_slowdown``."""
    cfg = ctx.cfg("gpu_imbalance")
    sf = ctx.sf
    started = [e for e in ctx.events if e.kind == "gpu_process_started" and e.time is not None]
    if not started or len(sf) < 2:
        return []
    exited = [e for e in ctx.events if e.kind == "gpu_process_exited" and e.time is not None]
    start_t = sf["start"].to_numpy(float)
    end_t = sf["end"].to_numpy(float)
    total = sf["total"].to_numpy(float)
    stepno = sf["step"].to_numpy()
    slowdown = cfg.get_float("process_slowdown")
    flags = []
    foreign = [e for e in started if float(e.time) > end_t[0]]
    # the job's own processes leaving (a restart or resume), or a resume in the log: processes
    # that start after that are the job coming back, not another process
    restarts = [float(x.time) for x in exited if x.time > end_t[0]
                and not any(_same(x, e) for e in foreign)]
    restarts += [float(e.time) for e in ctx.events if e.kind == "resume" and e.time is not None]
    for ev in foreign:
        t = float(ev.time)
        if any(r <= t for r in restarts):
            continue
        gone = [x.time for x in exited if _same(x, ev) and x.time >= t]
        until = min(gone) if gone else None
        before = total[1:][end_t[1:] <= t]  # the warm-up step left out
        if len(before) == 0:
            continue
        base = float(np.median(before))
        during = (end_t > t) & ((start_t < until) if until is not None else True)
        slow = during & (total >= base * (1.0 + slowdown))
        if not slow.any() or base <= 0:
            continue
        idx = np.flatnonzero(during)
        rng = [int(stepno[idx[0]]), int(stepno[idx[-1]])]
        mean = float(total[during].mean())
        pid, gpu, node = ev.data.get("pid"), ev.data.get("gpu"), ev.data.get("node")
        name = ev.data.get("name") or ""
        used = ev.data.get("used_bytes")
        who = f"process {pid}" + (f" ({name})" if name else "") + (
            f", holding {float(used) / 2**30:.1f} GiB," if used else "")
        gone_txt = "" if until is None else " and left it"
        up = mean / base - 1.0
        f = make_flag(
            "gpu_imbalance", "critical" if up >= cfg.get_float("process_critical_slowdown")
            else "warning", t, until, {"node": node, "gpus": [gpu], "steps": rng},
            f"Another {who} started on GPU {gpu} during step {rng[0]}{gone_txt}: "
            f"{steps_text(rng)} took {mean:.1f} s on average against {base:.1f} s before "
            f"(+{up * 100:.0f}%).",
        )
        f.advice = list(ADVICE)
        flags.append(f)
    return flags
