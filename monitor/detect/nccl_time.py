"""Time in NCCL collectives per step, from the NCCL Inspector's records.

The Inspector reports each collective's execution time per rank; the store keeps them summed
per node, collective and communicator for each dump interval (``monitor.frames.NCCL_COLUMNS``).
A step's share is its records' execution seconds (those dumped between the step's start and
end) per rank, over the step's duration, averaged over the nodes that report. Ranks per node
are the node's GPUs in the samples (one rank per GPU, as verl places them).

Execution time includes waiting for late peers: a rank that waits for a straggler shows long
collectives. ``gpu_imbalance`` names that case; the suppression rules in ``defaults.yaml``
keep ``comm_heavy`` quiet while it is open.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from monitor.detect.detector_base import Context


def ranks_per_node(ctx: Context) -> dict[str, int]:
    """GPUs seen per node in the samples (at least 1 for a node with NCCL records)."""
    counts = ctx.gpu.groupby("node")["gpu"].nunique() if len(ctx.gpu) else pd.Series(dtype=int)
    return {str(n): max(1, int(c)) for n, c in counts.items()}


def nccl_step_share(ctx: Context) -> pd.DataFrame:
    """Per step (aligned with ``ctx.sf``): ``share`` of the step in collectives per rank (NaN
    without Inspector records), ``seconds`` per rank, and the ``top`` collective by time."""
    sf = ctx.sf
    out = pd.DataFrame({"share": np.nan, "seconds": np.nan, "top": None}, index=sf.index)
    nc = ctx.nccl
    if len(nc) == 0 or len(sf) == 0 or nc["exec_s"].notna().sum() == 0:
        return out
    nc = nc[nc["exec_s"].notna()]
    ranks = ranks_per_node(ctx)
    per_rank = nc["exec_s"].to_numpy(float) / nc["node"].map(
        lambda n: ranks.get(str(n), 1)).to_numpy(float)
    nc = nc.assign(per_rank=per_rank)
    nodes = nc["node"].nunique()
    first = float(nc["ts"].min())
    for i, (start, end) in enumerate(zip(sf["start"].to_numpy(float), sf["end"].to_numpy(float),
                                         strict=True)):
        dur = end - start
        if not dur > 0 or end < first:
            continue  # before the Inspector's first dump: unknown, not zero
        rows = nc[(nc["ts"] > start) & (nc["ts"] <= end)]
        secs = float(rows["per_rank"].sum()) / nodes
        out.iloc[i, 0] = min(1.0, secs / dur)
        out.iloc[i, 1] = secs
        if len(rows):
            out.iloc[i, 2] = str(rows.groupby("coll")["per_rank"].sum().idxmax())
    return out
