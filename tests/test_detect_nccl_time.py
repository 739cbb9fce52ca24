"""Time in collectives per step from NCCL Inspector records, and comm_heavy judging it."""

from __future__ import annotations

import pandas as pd
from detect_builders import make_gpu, make_steps

from monitor.config import load_config
from monitor.detect import make_context, run_all
from monitor.detect.nccl_time import nccl_step_share
from monitor.detect.phases import detect_comm_heavy
from monitor.frames import empty_host_frame


def _inspector(steps, per_gpu_s, n_gpus=2, node="n0", coll="AllReduce"):
    """The store's NCCL rows: every 2 s of each step, execution seconds summed over the node's
    ``n_gpus`` ranks, adding up to ``per_gpu_s(step)`` per rank per step."""
    rows = []
    for s in steps:
        start = s.end_time - s.total
        dumps = [start + t for t in range(2, int(s.total), 2)]
        for ts in dumps:
            rows.append({"ts": ts, "node": node, "coll": coll, "comm": "0x1", "ops": 8.0,
                         "bytes": 1e9, "exec_s": per_gpu_s(s.step) * n_gpus / len(dumps),
                         "busbw_bps": 3e11})
    return pd.DataFrame(rows)


def _ctx(steps, gpu, nccl):
    return make_context(steps, gpu, empty_host_frame(), [], load_config(), nccl=nccl)


def test_share_is_per_rank_seconds_over_the_step():
    steps = make_steps(6, step_s=10.0)
    gpu = make_gpu(steps, n_gpus=2)
    share = nccl_step_share(_ctx(steps, gpu, _inspector(steps, lambda i: 3.0)))
    assert share["share"].round(2).tolist() == [0.3] * 6
    assert share["top"].tolist() == ["AllReduce"] * 6


def test_oversized_collectives_are_flagged_from_the_inspector_with_its_evidence():
    steps = make_steps(12, step_s=10.0)
    gpu = make_gpu(steps, n_gpus=2)
    nccl = _inspector(steps, lambda i: 3.0 if i >= 6 else 0.2)
    flags = detect_comm_heavy(_ctx(steps, gpu, nccl))
    assert len(flags) == 1
    f = flags[0]
    assert f.scope["steps"][0] == 6
    assert "NCCL Inspector timed 3.00 s of collectives per GPU per step, mostly AllReduce" in \
        f.evidence and "30% of the step" in f.evidence


def test_short_collectives_and_no_inspector_raise_nothing():
    steps = make_steps(12, step_s=10.0)
    gpu = make_gpu(steps, n_gpus=2)
    assert detect_comm_heavy(_ctx(steps, gpu, _inspector(steps, lambda i: 0.3))) == []
    assert nccl_step_share(_ctx(steps, gpu, None))["share"].isna().all()


def test_collectives_waiting_for_a_named_straggler_are_not_called_heavy():
    """A rank that waits in the all-reduce for a slow peer shows long collectives: with the
    straggler flagged, comm_heavy stays quiet (suppress in defaults.yaml)."""
    steps = make_steps(12, step_s=10.0)

    def slow_gpu1(df):
        sel = (df["phase"] == "update_actor") & (df["step"] >= 6)
        df.loc[sel & (df["gpu"] == 1), ["util", "sm_active"]] = [99.0, 92.0]
        df.loc[sel & (df["gpu"] == 0), ["util", "sm_active"]] = [99.0, 50.0]

    gpu = make_gpu(steps, n_gpus=2, interval=0.5, edit=slow_gpu1)
    nccl = _inspector(steps, lambda i: 3.0 if i >= 6 else 0.2)
    kinds = {f.kind for f in run_all(steps, gpu, empty_host_frame(), [], nccl=nccl)}
    assert "gpu_imbalance" in kinds and "comm_heavy" not in kinds
