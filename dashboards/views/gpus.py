"""GPUs: heat maps GPU x time, per-phase attribution, imbalance highlighted."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, common
from monitor.sources import SourceError

#: A GPU this many utilization points below its node's median is highlighted.
IMBALANCE_POINTS = 15.0

settings = common.settings()
st.title("GPUs")

try:
    nodes = common.load_nodes(common.key()) if common.load_status(common.key()).ok else []
except SourceError:
    nodes = []
node_choice = None
if len(nodes) > 1:
    node_choice = st.selectbox("Node", nodes, key="node", bind="query-params",
                               help="Heat maps show one node's GPUs; the Nodes page compares nodes.")


#: The imbalance verdict looks at this many recent seconds (a straggler that started late
#: would be averaged away over a long window).
RECENT_S = 300.0


def gpu_table(gpu: pd.DataFrame, end: float) -> pd.DataFrame:
    """Per GPU: window means, the last five minutes, and the gap to the node's median (the
    worse of utilization and SM activity over the last five minutes)."""
    mem = "mem_used_bytes_max" if "mem_used_bytes_max" in gpu.columns else "mem_used_bytes"
    low = "util_min" if "util_min" in gpu.columns else "util"
    per = gpu.groupby(["node", "gpu"]).agg(util=("util", "mean"), sm_active=("sm_active", "mean"),
                                           util_lowest=(low, "min"), mem_gib=(mem, "max"))
    recent = gpu[gpu["ts"] >= end - RECENT_S].groupby(["node", "gpu"])
    per["util_recent"] = recent["util"].mean()
    per["sm_recent"] = recent["sm_active"].mean()
    per = per.reset_index()
    per["mem_gib"] = per["mem_gib"] / charts.GIB
    by_node = per.groupby("node")
    gap_util = per["util_recent"] - by_node["util_recent"].transform("median")
    gap_sm = per["sm_recent"] - by_node["sm_recent"].transform("median")
    per["vs_peers"] = pd.concat([gap_util, gap_sm], axis=1).min(axis=1)
    per["status"] = ["below peers" if d < -IMBALANCE_POINTS else "ok" for d in per["vs_peers"]]
    return per


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """Heat maps and attribution; reruns on the live refresh."""
    gpu = common.load_gpu(key, start, end, common.MAX_POINTS, node_choice)
    steps = common.load_steps(key, start, end)
    if gpu.empty:
        st.info("No GPU samples in this window yet.")
        return
    table = gpu_table(gpu, end)
    low = table[table["status"] != "ok"]
    if low.empty:
        st.success(f"GPUs balanced: over the last {RECENT_S / 60:.0f} min every GPU is within "
                   f"{IMBALANCE_POINTS:.0f} points of its node's median utilization and SM "
                   "activity.")
    else:
        names = ", ".join(f"{r.node}/GPU {r.gpu} ({r.vs_peers:+.0f} pts)" for r in low.itertuples())
        st.warning(f"Imbalance over the last {RECENT_S / 60:.0f} min: {names} below the node's "
                   "median (utilization or SM activity).", icon=":material/warning:")
    st.dataframe(
        table, hide_index=True, key="gpu_table",
        column_config={
            "util": st.column_config.ProgressColumn("util %", min_value=0, max_value=100,
                                                    format="%.0f"),
            "sm_active": st.column_config.NumberColumn("SM active %", format="%.0f"),
            "util_lowest": st.column_config.NumberColumn("lowest util %", format="%.0f"),
            "mem_gib": st.column_config.NumberColumn("peak memory GiB", format="%.1f"),
            "util_recent": st.column_config.NumberColumn("util % (5 min)", format="%.0f"),
            "sm_recent": st.column_config.NumberColumn("SM % (5 min)", format="%.0f"),
            "vs_peers": st.column_config.NumberColumn("vs node median (pts)", format="%+.0f"),
        },
    )
    flagged = {f"{r.node}/{r.gpu}" for r in low.itertuples()}
    st.plotly_chart(charts.gpu_heatmap(gpu, "util", "Utilization % (NVML: a kernel was running)",
                                       highlight=flagged), key="gpu_heat_util")
    st.plotly_chart(charts.gpu_heatmap(gpu, "sm_active", "SM active % (GPM)", highlight=flagged),
                    key="gpu_heat_sm")
    mem_col = "mem_used_bytes_max" if "mem_used_bytes_max" in gpu.columns else "mem_used_bytes"
    total = gpu["mem_total_bytes"].max()
    st.plotly_chart(charts.gpu_heatmap(gpu, mem_col, "Memory used (GiB)", scale=1 / charts.GIB,
                                       zmax=(total / charts.GIB) if pd.notna(total) else None,
                                       colorscale="Cividis"), key="gpu_heat_mem")
    st.subheader("Per-phase attribution")
    if not steps or steps[-1].end_time is None:
        st.info("No steps in this window to attribute GPU time to.")
        return
    summary = common.load_attribution(key, start, end, steps[-1].end_time, node_choice)
    st.plotly_chart(charts.phase_attribution_bars(summary), key="gpu_attrib")
    st.caption(f"Last {min(len(steps), 20)} steps; samples joined to each step's phases as verl laid "
               "them out (phases end at the step's end time).")


live()
