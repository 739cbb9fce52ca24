"""Nodes, one view at a time: one row per node, sortable, the nodes an open flag names marked;
a heat map by node over time; drill-down to one node's GPUs. Marks come from the open flags only (the detectors' thresholds
in ``monitor/defaults.yaml``), so this page cannot contradict the Flags page."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, common
from dashboards.escape import escape_markdown
from dashboards.sources.base import mark_outliers

#: The page's views, one drawn at a time (the first by default).
VIEWS = ["Table", "Over time", "One node"]
#: Width of the Nodes table's "open flags" column (px): the other columns and this one fit the
#: main area of a 1400 px window.
NODE_FLAGS_PX = 260

settings = common.settings()
st.title("Nodes")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """Headline counts and warnings, then the view picked: node table, node heat map or one
    node's GPUs; reruns on the live refresh."""
    summary = common.load_node_summary(key, start, end)
    if summary.empty:
        st.info("No GPU samples in this window yet.")
        return
    summary = mark_outliers(summary, common.open_flags(common.load_flags(key, True, start, end)))
    marked = summary[summary["outlier"]]
    c1, c2, c3 = st.columns(3)
    c1.metric("Nodes", f"{len(summary)}")
    c2.metric("GPUs", f"{int(summary['gpus'].sum())}")
    c3.metric("Nodes with open flags", f"{len(marked)}")
    for row in marked.itertuples():
        st.warning(f"**{escape_markdown(row.node)}**: {escape_markdown(row.reason)}",
                   icon=":material/warning:")
    # one view at a time, picked in tabs (bound to the URL as ``nodes_view``): the table by
    # default (at 128 nodes it is what tells nodes apart; a chart costs the browser more)
    label, tab = common.chosen_tab(VIEWS, "nodes_view")
    with tab:
        if label == "Table":
            node_table(summary)
            return
        if label == "Over time":
            frame = common.load_node_frame(key, start, end)
            st.plotly_chart(charts.end_at(charts.node_heatmap(frame), start, end),
                            key="node_heat")
            return
        nodes = list(summary["node"])
        default = list(marked["node"])[:1] or nodes[:1]
        drill = st.selectbox("Drill down to node", nodes, index=nodes.index(default[0]),
                             key="drill", bind="query-params",
                             help="Show this node's GPUs one by one.")
        gpu = common.load_gpu(key, start, end, 500, drill)
        st.plotly_chart(charts.end_at(charts.gpu_heatmap(gpu, "util",
                                                         f"{drill}: utilization % per GPU"),
                                      start, end), key="node_drill_heat")


def node_table(summary: pd.DataFrame) -> None:
    """One row per node over the window, the open flags naming it last."""
    table = summary.assign(mem_used_max_ratio=100 * summary["mem_used_max_ratio"])
    # every column, the open flags last, fits a 1400 px window: the flags' words are cut
    # inside their cell at worst (they are in full in the warnings above), never the column
    st.dataframe(
        table[["node", "gpus", "util_mean", "util_min_gpu", "util_spread", "sm_active_mean",
               "mem_used_max_ratio", "iowait_mean", "reason"]],
        hide_index=True, key="node_table", width="stretch",
        column_config={
            "node": st.column_config.TextColumn("node"),
            "gpus": st.column_config.NumberColumn("GPUs", format="%d"),
            "util_mean": st.column_config.ProgressColumn("util %", min_value=0, max_value=100,
                                                         format="%.0f", width=110),
            "util_min_gpu": st.column_config.NumberColumn("lowest GPU %", format="%.0f",
                                                          help="lowest GPU's window mean"),
            "util_spread": st.column_config.NumberColumn(
                "spread pts", format="%.0f",
                help="highest GPU's window mean minus the lowest's (points)"),
            "sm_active_mean": st.column_config.NumberColumn("SM active %", format="%.0f"),
            "mem_used_max_ratio": st.column_config.NumberColumn("peak mem %", format="%.0f"),
            "iowait_mean": st.column_config.NumberColumn("iowait %", format="%.1f"),
            "reason": st.column_config.TextColumn(
                "open flags", width=NODE_FLAGS_PX,
                help="open flags naming the node (empty: none, the node is ok)"),
        },
    )


live()
