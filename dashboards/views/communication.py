"""Communication: comm share over time, NCCL time and bus bandwidth by collective, node skew."""

from __future__ import annotations

import streamlit as st

from dashboards import charts, common

#: The page's charts, one drawn at a time (the first by default).
VIEWS = ["Share over time", "Time by collective", "Bandwidth by collective", "Node skew"]

settings = common.settings()
st.title("Communication")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """NCCL and comm panels; reruns on the live refresh."""
    steps = common.load_steps_frame(key, start, end)
    nccl = common.load_nccl(key, start, end)
    if not nccl.empty:
        # the sources sum NCCL seconds over the ranks of a node; one rank drives one GPU, so
        # the share of wall time is that sum over the node's GPUs (else 8 busy ranks read 800%)
        gpus = common.load_node_summary(key, start, end)
        per_node = dict(zip(gpus["node"].astype(str), gpus["gpus"], strict=False))
        ranks = nccl["node"].astype(str).map(per_node).astype(float)
        nccl = nccl.assign(exec_share=nccl["exec_share"] / ranks.where(ranks > 0, 1.0).fillna(1.0))
        share = nccl.groupby(["ts", "node"])["exec_share"].sum().groupby("ts").mean()
        c1, c2, c3 = st.columns(3)
        c1.metric("NCCL busy (window mean)", f"{100 * share.mean():.1f}% of wall time",
                  help="NCCL execution seconds per wall second, averaged over the GPUs (ranks)")
        top = nccl.groupby("coll")["exec_share"].sum().sort_values(ascending=False)
        c2.metric("Busiest collective", str(top.index[0]))
        bw = nccl["busbw_bps"].dropna()
        c3.metric("Bus bandwidth (mean)", f"{bw.mean() / 1e9:.1f} GB/s" if len(bw) else "-")
    # one chart at a time: the view picked (bound to the URL as ``comm_view``)
    label, tab = common.chosen_tab(VIEWS, "comm_view")
    with tab:
        if label == "Share over time":
            st.plotly_chart(charts.comm_share(steps, nccl), key="comm_share")
        elif label == "Time by collective":
            st.plotly_chart(charts.nccl_by_op(nccl, "exec_share", "NCCL time by collective "
                                              "(% of wall time)", scale=100, unit="%"),
                            key="comm_exec")
        elif label == "Bandwidth by collective":
            st.plotly_chart(charts.nccl_by_op(nccl, "busbw_bps", "Bus bandwidth by collective",
                                              scale=1e-9, unit="GB/s"), key="comm_busbw")
        else:
            st.plotly_chart(charts.node_skew(nccl), key="comm_skew")
    st.caption("NCCL Inspector execution time includes waiting for peers: in a collective the "
               "rank that arrives last (the straggler) shows the shortest time.")


live()
