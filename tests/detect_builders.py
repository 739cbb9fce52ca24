"""Hand-made inputs for the detector tests: steps with phases, GPU and host frames.

A run is a list of ``StepRecord``s laid end to end; GPU samples follow the phase each instant
falls in (``monitor.analysis.attribution.phase_timeline``), with per-phase util/SM levels a
test can override for chosen GPUs, steps or phases.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from monitor.analysis.attribution import label_samples, phase_timeline
from monitor.frames import GPU_COLUMNS, HOST_COLUMNS
from monitor.records import StepRecord

T0 = 1_800_000_000.0
CAPACITY = 80e9

#: Healthy (util, sm_active) per phase.
LEVELS: dict[str, tuple[float, float]] = {
    "gen": (93.0, 60.0),
    "reward": (10.0, 5.0),
    "old_log_prob": (90.0, 80.0),
    "ref": (90.0, 79.0),
    "values": (90.0, 78.0),
    "update_actor": (95.0, 85.0),
    "update_critic": (95.0, 84.0),
    "reshard": (45.0, 12.0),
    "comm": (88.0, 15.0),
    "rollout_wait": (3.0, 1.0),
    "other": (3.0, 1.0),
}

SHARES: dict[str, float] = {
    "gen": 0.5,
    "old_log_prob": 0.1,
    "ref": 0.08,
    "update_actor": 0.27,
    "other": 0.05,
}


def make_steps(
    n: int = 30,
    step_s: float = 30.0,
    shares: dict[str, float] | None = None,
    edit: Callable[[int, dict[str, float]], None] | None = None,
    metrics: Callable[[int], dict] | None = None,
    throughput: Callable[[int], float | None] | None = None,
    t0: float = T0,
) -> list[StepRecord]:
    """``n`` consecutive steps; ``edit(step, phases)`` may change a step's phase seconds."""
    out = []
    t = t0
    for i in range(1, n + 1):
        phases = {k: v * step_s for k, v in (shares or SHARES).items()}
        if edit:
            edit(i, phases)
        total = sum(phases.values())
        t += total
        out.append(StepRecord(
            step=i, end_time=t, total=total, phases=phases,
            throughput=throughput(i) if throughput else 1000.0,
            metrics=metrics(i) if metrics else {},
        ))
    return out


def make_gpu(
    steps: list[StepRecord],
    n_gpus: int = 8,
    nodes: tuple[str, ...] = ("n0",),
    interval: float = 1.0,
    edit: Callable[[pd.DataFrame], None] | None = None,
    sm: bool = True,
    tail_s: float = 0.0,
    mem_frac: float = 0.6,
) -> pd.DataFrame:
    """GPU samples every ``interval`` s over the steps (plus ``tail_s`` idle seconds after).

    ``edit(df)`` gets the frame with ``phase`` and ``step`` columns and may change util,
    sm_active or memory in place (use ``.loc``).
    """
    start = steps[0].end_time - steps[0].total if steps else T0
    end = (steps[-1].end_time if steps else T0) + tail_s
    ts = np.arange(start, end, interval)
    keys = [(node, g) for node in nodes for g in range(n_gpus)]
    df = pd.DataFrame({
        "ts": np.repeat(ts, len(keys)),
        "node": [k[0] for k in keys] * len(ts),
        "gpu": [k[1] for k in keys] * len(ts),
    })
    df = label_samples(df, phase_timeline(steps))
    util = df["phase"].map(lambda p: LEVELS.get(p, (2.0, 1.0))[0]).astype(float)
    smv = df["phase"].map(lambda p: LEVELS.get(p, (2.0, 1.0))[1]).astype(float)
    rng = np.random.default_rng(0)
    df["util"] = np.clip(util + rng.normal(0, 1.5, len(df)), 0, 100)
    df["sm_active"] = np.clip(smv + rng.normal(0, 2.0, len(df)), 0, 100)
    df["mem_total_bytes"] = CAPACITY
    df["mem_used_bytes"] = mem_frac * CAPACITY
    df["power_w"] = np.nan
    df["tensor_active"] = np.nan
    df["dram_active"] = np.nan
    for col in ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps"):
        df[col] = np.nan  # GPM link rates: unread unless ``edit`` sets them
    if edit:
        edit(df)
    if not sm:
        df["sm_active"] = np.nan
    extra = [c for c in df.columns if c not in GPU_COLUMNS and c not in ("phase", "step")]
    return df[list(GPU_COLUMNS) + extra].reset_index(drop=True)


def make_host(
    gpu: pd.DataFrame,
    cpu_max: float = 50.0,
    iowait: float = 1.0,
    edit: Callable[[pd.DataFrame], None] | None = None,
) -> pd.DataFrame:
    """Host samples at the GPU frame's instants, one row per node."""
    base = gpu[["ts", "node"]].drop_duplicates().reset_index(drop=True)
    base["cpu_max_core_pct"] = cpu_max
    base["cpu_avg_pct"] = 10.0
    base["iowait_pct"] = iowait
    base["disk_read_bps"] = 1e6
    base["train_rss_bytes"] = np.nan  # the training process tree's RSS: set it with ``edit``
    if edit:
        edit(base)
    return base[list(HOST_COLUMNS)]
