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


def gpu_table(gpu: pd.DataFrame) -> pd.DataFrame:
    """Per GPU window means, with the imbalance against the node's median."""
    per = gpu.groupby(["node", "gpu"]).agg(util=("util", "mean"), sm_active=("sm_active", "mean"),
                                           util_lowest=("util_min", "min"),
                                           mem_gib=("mem_used_bytes", "max")).reset_index()
    per["mem_gib"] = per["mem_gib"] / charts.GIB
    per["vs_peers"] = per["util"] - per.groupby("node")["util"].transform("median")
    per["status"] = ["below peers" if d < -IMBALANCE_POINTS else "ok" for d in per["vs_peers"]]
    return per


@st.fragment(run_every=settings.refresh_s)
def live() -> None:
    """Heat maps and attribution; reruns on the live refresh."""
    win = common.current_window(settings)
    if win is None:
        return
    start, end = win
    key = common.key()
    try:
        gpu = common.load_gpu(key, start, end, common.MAX_POINTS, node_choice)
        steps = common.load_steps(key, start, end)
    except SourceError as exc:
        common.source_error(exc)
        return
    if gpu.empty:
        st.info("No GPU samples in this window yet.")
        return
    table = gpu_table(gpu)
    low = table[table["status"] != "ok"]
    if low.empty:
        st.success(f"GPUs balanced: every GPU within {IMBALANCE_POINTS:.0f} points of its "
                   "node's median utilization.")
    else:
        names = ", ".join(f"{r.node}/GPU {r.gpu} ({r.vs_peers:+.0f} pts)" for r in low.itertuples())
        st.warning(f"Imbalance: {names} below the node's median utilization.", icon=":material/warning:")
    st.dataframe(
        table, hide_index=True, key="gpu_table",
        column_config={
            "util": st.column_config.ProgressColumn("util %", min_value=0, max_value=100,
                                                    format="%.0f"),
            "sm_active": st.column_config.NumberColumn("SM active %", format="%.0f"),
            "util_lowest": st.column_config.NumberColumn("lowest util %", format="%.0f"),
            "mem_gib": st.column_config.NumberColumn("peak memory GiB", format="%.1f"),
            "vs_peers": st.column_config.NumberColumn("vs node median (pts)", format="%+.0f"),
        },
    )
    st.plotly_chart(charts.gpu_heatmap(gpu, "util", "Utilization % (NVML: a kernel was running)"),
                    key="gpu_heat_util")
    st.plotly_chart(charts.gpu_heatmap(gpu, "sm_active", "SM active % (GPM)"),
                    key="gpu_heat_sm")
    mem_col = "mem_used_bytes_max" if "mem_used_bytes_max" in gpu.columns else "mem_used_bytes"
    total = gpu["mem_total_bytes"].max()
    st.plotly_chart(charts.gpu_heatmap(gpu, mem_col, "Memory used (GiB)", scale=1 / charts.GIB,
                                       zmax=(total / charts.GIB) if pd.notna(total) else None,
                                       colorscale="Cividis"), key="gpu_heat_mem")
    st.subheader("Per-phase attribution")
    try:
        from monitor.analysis.attribution import attribute, phase_summary
    except ImportError:
        st.info("Phase attribution is not installed in this build.")
        return
    recent = steps[-20:]
    if not recent or recent[0].end_time is None:
        st.info("No steps in this window to attribute GPU time to.")
        return
    a_start = min(s.end_time - (s.total or 0) for s in recent if s.end_time) - 1
    fine = common.load_gpu(key, max(a_start, start), end, common.MAX_POINTS, node_choice)
    summary = phase_summary(attribute(recent, fine))
    st.plotly_chart(charts.phase_attribution_bars(summary), key="gpu_attrib")
    st.caption(f"Last {len(recent)} steps; samples joined to each step's phases as verl laid "
               "them out (phases end at the step's end time).")


live()
